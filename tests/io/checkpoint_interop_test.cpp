// Checkpoints move both ways between nanoddp and Python: files that PyTorch and
// safetensors.numpy wrote (tests/golden/, made by make_safetensors_golden.py, and one
// written at test time) load with exact values, and Python's safetensors reads what
// nanoddp writes, value for value. Needs `python3 -c "import safetensors, numpy"`;
// reports itself SKIPPED otherwise.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "harness.h"

using namespace nd;
using nd::testing::to_vector;
namespace fs = std::filesystem;

namespace {

const fs::path kGolden = fs::path(NANODDP_SOURCE_DIR) / "tests" / "golden";

bool python_has_safetensors() {
  static const bool ok = std::system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") == 0;
  return ok;
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("nanoddp_checkpoint_interop_" + std::to_string(::getpid()));
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// Runs `script` with python3; returns its exit code.
int run_python(const TempDir& dir, const std::string& script, const std::string& args) {
  const std::string py = dir.file("check.py");
  std::ofstream(py) << script;
  const int rc = std::system(("python3 " + py + " " + args).c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

// The closed forms of make_safetensors_golden.py.
std::vector<double> floats(int64_t n) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<double>(i % 17) * 0.25 - 2);
  return v;
}
std::vector<double> ints(int64_t n) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<double>(3 * i - 7));
  return v;
}

void check_tensor(const TensorDict& d, const std::string& name, ScalarType dtype, const Shape& shape,
                  const std::vector<double>& values) {
  REQUIRE_MESSAGE(d.count(name), name);
  const Tensor& t = d.at(name);
  CHECK_MESSAGE(t.dtype() == dtype, name);
  CHECK_MESSAGE(t.sizes() == shape, name);
  CHECK_MESSAGE(t.device() == Device(kCPU), name);
  CHECK_MESSAGE(to_vector(t) == values, name);
}

// Checks a golden state dict; `with_bf16` is false for the numpy file.
void check_golden(const TensorDict& d, bool with_bf16) {
  CHECK(d.size() == (with_bf16 ? 11u : 10u));
  check_tensor(d, "main.0.weight", kFloat32, {4, 3, 2, 2}, floats(48));
  check_tensor(d, "main.0.bias", kFloat32, {4}, floats(4));
  check_tensor(d, "main.1.running_mean", kFloat64, {4}, floats(4));
  check_tensor(d, "main.1.num_batches_tracked", kInt64, {}, {12345});
  if (with_bf16) check_tensor(d, "half.bf16", kBFloat16, {3, 5}, floats(15));
  check_tensor(d, "half.f16", kFloat16, {2, 7}, floats(14));
  std::vector<double> i64 = ints(5);
  i64[0] = static_cast<double>((int64_t{1} << 62) + 1);
  check_tensor(d, "int.i64", kInt64, {5}, i64);
  CHECK(d.at("int.i64").data_ptr<int64_t>()[0] == (int64_t{1} << 62) + 1);  // exact, not via double
  check_tensor(d, "int.i32", kInt32, {2, 3}, ints(6));
  std::vector<double> u8, mask;
  for (int i = 0; i < 10; ++i) u8.push_back((37 * i) % 256);
  for (int i = 0; i < 7; ++i) mask.push_back(i % 3 == 0);
  check_tensor(d, "int.u8", kUInt8, {10}, u8);
  check_tensor(d, "mask", kBool, {7}, mask);
  check_tensor(d, "empty", kFloat32, {0, 3}, {});
}

}  // namespace

TEST_CASE("golden files written by PyTorch and safetensors.numpy load exactly") {
  // Reading committed files needs no Python.
  const TensorDict torch_sd = load((kGolden / "torch_state_dict.safetensors").string());
  check_golden(torch_sd, /*with_bf16=*/true);
  CHECK(load_metadata((kGolden / "torch_state_dict.safetensors").string()) ==
        std::map<std::string, std::string>{{"format", "pt"}, {"step", "7"}});
  check_golden(load((kGolden / "numpy_arrays.safetensors").string(), "cpu"), /*with_bf16=*/false);
  CHECK(load_metadata((kGolden / "numpy_arrays.safetensors").string()).empty());
}

TEST_CASE("Python's safetensors reads what nanoddp writes, value for value") {
  if (!python_has_safetensors()) {
    MESSAGE("SKIPPED: python3 with safetensors and numpy is not available");
    return;
  }
  TempDir dir;
  const std::string path = dir.file("from_nanoddp.safetensors");
  const Tensor base = arange(-6, 6, 1, kFloat64).div(4).view({3, 4});
  TensorDict d{{"f32", base.to(kFloat32).t()},  // non-contiguous on purpose
               {"f64", base},
               {"f16", base.to(kFloat16)},
               {"i64", arange(-3, 9, 1, kInt64).view({2, 2, 3})},
               {"i32", arange(-3, 2, 1, kInt32)},
               {"u8", arange(250, 256, 1, kUInt8)},
               {"bool", tensor({1, 0, 0, 1}, kBool)},
               {"scalar", scalar_tensor(0.5, kFloat64)},
               {"empty", zeros({0, 2})}};
  save(d, path, {{"epoch", "9"}});
  // numpy has no bf16: the bf16 tensor is checked through its raw bits as uint16.
  save({{"bf16", base.to(kBFloat16)}}, dir.file("bf16.safetensors"));

  const std::string script = R"(
import json, sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file
t = load_file(sys.argv[1])
base = (np.arange(-6, 6, dtype=np.float64) / 4).reshape(3, 4)
want = {
    "f32": base.astype(np.float32).T, "f64": base, "f16": base.astype(np.float16),
    "i64": np.arange(-3, 9, dtype=np.int64).reshape(2, 2, 3), "i32": np.arange(-3, 2, dtype=np.int32),
    "u8": np.arange(250, 256, dtype=np.uint8), "bool": np.array([True, False, False, True]),
    "scalar": np.array(0.5), "empty": np.zeros((0, 2), dtype=np.float32),
}
assert sorted(t) == sorted(want), sorted(t)
for k, w in want.items():
    assert t[k].dtype == w.dtype and t[k].shape == w.shape and np.array_equal(t[k], w), (k, t[k], w)
with safe_open(sys.argv[1], "np") as f:
    m = f.metadata()
assert m["epoch"] == "9" and m["nanoddp.format_version"] == "1", m
assert json.loads(m["nanoddp.devices"]) == {k: "cpu" for k in want}, m
# bf16: the top 16 bits of the f32 value (exact for these values).
raw = open(sys.argv[2], "rb").read()
n = int.from_bytes(raw[:8], "little")
h = json.loads(raw[8:8 + n])
assert h["bf16"]["dtype"] == "BF16" and h["bf16"]["shape"] == [3, 4], h
bits = np.frombuffer(raw[8 + n:], dtype=np.uint16)
assert np.array_equal(bits, (base.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).ravel()), bits
)";
  CHECK(run_python(dir, script, path + " " + dir.file("bf16.safetensors")) == 0);
}

TEST_CASE("a file Python writes at test time loads exactly, including non-name data order") {
  if (!python_has_safetensors()) {
    MESSAGE("SKIPPED: python3 with safetensors and numpy is not available");
    return;
  }
  TempDir dir;
  const std::string path = dir.file("from_python.safetensors");
  const std::string script = R"(
import sys
import numpy as np
from safetensors.numpy import save_file
save_file({
    "z.first": np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5,
    "a.last": np.array([1, 0, 1], dtype=np.bool_),
    "m.i64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
    "m.f16": np.array([65504, -0.0, 2**-24], dtype=np.float16),
}, sys.argv[1], metadata={"who": "python"})
)";
  REQUIRE(run_python(dir, script, path) == 0);
  const TensorDict d = load(path);
  check_tensor(d, "z.first", kFloat32, {2, 3}, {-2.5, -1.5, -0.5, 0.5, 1.5, 2.5});
  check_tensor(d, "a.last", kBool, {3}, {1, 0, 1});
  CHECK(d.at("m.i64").data_ptr<int64_t>()[0] == std::numeric_limits<int64_t>::min());
  CHECK(d.at("m.i64").data_ptr<int64_t>()[1] == std::numeric_limits<int64_t>::max());
  check_tensor(d, "m.f16", kFloat16, {3}, {65504, -0.0, 0x1p-24});
  CHECK(load_metadata(path) == std::map<std::string, std::string>{{"who", "python"}});
}
