// Safetensors checkpoints: exact round trips of every dtype and layout, metadata,
// map_location (device, map, function; CUDA targets fail clearly without a GPU), every
// malformed-file error (bytes crafted here), and atomic writes (a failing save and a
// SIGKILLed saver both leave a loadable old-or-new file).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "harness.h"

using namespace nd;
using nd::testing::check_close;
using nd::testing::error_message;
using nd::testing::to_vector;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test process (ctest runs test cases in parallel processes).
struct TempDir {
  inline static int count = 0;
  fs::path path = fs::temp_directory_path() /
                  ("nanoddp_checkpoint_test_" + std::to_string(::getpid()) + "_" + std::to_string(count++));
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// A safetensors file: 8-byte little-endian length (default: the header's), header, data.
std::string st_file(const std::string& header, const std::string& data = "", std::optional<uint64_t> length = {}) {
  const uint64_t n = length.value_or(header.size());
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

// The nd::Error message of loading `bytes` from a file (CHECKs that it names the file).
std::string load_error(const TempDir& dir, const std::string& bytes) {
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, bytes);
  const std::string msg = error_message([&] { load(path); });
  CHECK_MESSAGE(msg.find(path) != std::string::npos, msg);
  return msg;
}

void check_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  CHECK_MESSAGE(a.dtype() == b.dtype(), what);
  CHECK_MESSAGE(a.sizes() == b.sizes(), what);
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  const size_t n = static_cast<size_t>(a.numel()) * element_size(a.dtype());
  CHECK_MESSAGE((n == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), n) == 0), what);
}

}  // namespace

TEST_CASE("save/load round-trips every dtype exactly, with names, shapes and cpu placement") {
  TempDir dir;
  TensorDict d;
  const std::vector<double> values = {0.1, -2.5, 3e-5, 65504, -0.0, 1.0 / 3};
  for (ScalarType t : {kFloat32, kFloat64, kBFloat16, kFloat16})
    d[std::string("float.") + dtype_name(t)] = tensor(values, t).view({2, 3});
  Tensor i64 = empty({3}, kInt64);
  i64.data_ptr<int64_t>()[0] = std::numeric_limits<int64_t>::min();
  i64.data_ptr<int64_t>()[1] = (int64_t{1} << 53) + 1;  // not a double
  i64.data_ptr<int64_t>()[2] = -7;
  d["int.i64"] = i64;
  d["int.i32"] = tensor({-2147483648.0, 2147483647, 0}, kInt32);
  d["int.u8"] = tensor({0, 255, 7}, kUInt8);
  d["mask"] = tensor({1, 0, 1, 1}, kBool).view({2, 2});
  d["scalar"] = scalar_tensor(42.5);
  d["empty"] = zeros({0, 3});
  d["odd name \"quoted\" \\ é\n"] = ones({1});

  const std::string path = dir.file("all.safetensors");
  save(d, path);
  const TensorDict back = load(path);
  REQUIRE(back.size() == d.size());
  for (const auto& [name, t] : d) {
    REQUIRE_MESSAGE(back.count(name), name);
    const Tensor& b = back.at(name);
    check_equal(b, t, name);
    CHECK(b.device() == Device(kCPU));
    CHECK(b.name() == name);
    CHECK(b.is_contiguous());
    CHECK_FALSE(b.requires_grad());
  }

  // The layout the reference writes: length multiple of 8, header padded, deterministic bytes.
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  CHECK(n % 8 == 0);
  CHECK(bytes[8] == '{');
  save(d, dir.file("again.safetensors"));
  CHECK(read_bytes(dir.file("again.safetensors")) == bytes);
  CHECK(dir.entries() == std::vector<std::string>{"again.safetensors", "all.safetensors"});  // no temp files left
}

TEST_CASE("save copies non-contiguous tensors (transposed, strided, expanded) in logical order") {
  TempDir dir;
  const Tensor base = arange(24, kFloat64).view({4, 6});
  TensorDict d{{"t", base.t()},
               {"step", base.slice(1, 0, 6, 2)},
               {"expanded", tensor({1, 2, 3}).expand({2, 3})},
               {"row", base.select(0, 2)}};
  save(d, dir.file("nc.safetensors"));
  const TensorDict back = load(dir.file("nc.safetensors"));
  for (const auto& [name, t] : d) {
    CHECK(to_vector(back.at(name)) == to_vector(t));
    CHECK(back.at(name).sizes() == t.sizes());
  }
}

TEST_CASE("metadata round-trips, with nanoddp's devices and format version, and reserves the nanoddp. prefix") {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const std::map<std::string, std::string> meta = {
      {"epoch", "3"}, {"note", "a \"quote\", a \\ and\na newline, é"}, {"", ""}};
  save({{"w", ones({2})}, {"b", zeros({1}, kInt64)}}, path, meta);
  auto back = load_metadata(path);
  CHECK(back.at("nanoddp.devices") == R"({"b":"cpu","w":"cpu"})");
  CHECK(back.at("nanoddp.format_version") == "1");
  back.erase("nanoddp.devices");
  back.erase("nanoddp.format_version");
  CHECK(back == meta);

  const std::string msg = error_message([&] {
    save({{"w", ones({1})}}, dir.file("r.safetensors"), {{"nanoddp.devices", "{}"}});
  });
  CHECK(msg.find("metadata key 'nanoddp.devices' is reserved") != std::string::npos);
  CHECK(error_message([&] {
          save({{"__metadata__", ones({1})}}, dir.file("r.safetensors"));
        }).find("__metadata__") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.file("r.safetensors")));
  save({}, dir.file("empty.safetensors"));
  CHECK(load(dir.file("empty.safetensors")).empty());
}

TEST_CASE(
    "map_location: device, map and function, while saved CUDA devices and CUDA targets fail clearly without a GPU") {
  TempDir dir;
  // A checkpoint as a rank on cuda:0 would write it: w on cuda:0, step on cpu.
  const std::string header =
      R"({"__metadata__":{"nanoddp.devices":"{\"step\":\"cpu\",\"w\":\"cuda:0\"}","nanoddp.format_version":"1"},)"
      R"("step":{"dtype":"I64","shape":[],"data_offsets":[8,16]},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string data(16, '\0');
  const float w[2] = {1.5f, -2.f};
  const int64_t step = 1234;
  std::memcpy(data.data(), w, 8);
  std::memcpy(data.data() + 8, &step, 8);
  const std::string path = dir.file("rank0.safetensors");
  write_bytes(path, st_file(header, data));

  auto check_cpu = [&](const TensorDict& d) {
    CHECK(d.at("w").device() == Device(kCPU));
    CHECK(d.at("step").device() == Device(kCPU));
    CHECK(to_vector(d.at("w")) == std::vector<double>{1.5, -2});
    CHECK(d.at("step").item<int64_t>() == 1234);
  };
  check_cpu(load(path));  // a bare load gives cpu tensors
  check_cpu(load(path, "cpu"));
  check_cpu(load(path, kCPU));
  check_cpu(load(path, Device(kCPU)));
  check_cpu(load(path, {{"cuda:0", "cpu"}}));
  check_cpu(load(path, std::map<std::string, std::string>{{"cuda", "cpu"}}));  // "cuda" means cuda:0
  std::map<std::string, std::string> seen;
  check_cpu(load(path, [&](const std::string& name, const Device& saved) {
    seen[name] = saved.str();
    return Device(kCPU);
  }));
  CHECK(seen == std::map<std::string, std::string>{{"step", "cpu"}, {"w", "cuda:0"}});

  if (cuda::is_available()) {
    const TensorDict kept = load(path, {{"cuda:1", "cpu"}});  // unmapped cuda:0 stays on cuda:0
    CHECK(kept.at("w").device() == Device("cuda:0"));
    CHECK(kept.at("step").device() == Device(kCPU));
    CHECK(to_vector(kept.at("w").cpu()) == std::vector<double>{1.5, -2});
    const std::string gpu_path = dir.file("gpu.safetensors");
    save({{"w", kept.at("w")}}, gpu_path);  // copied to cpu for writing, device recorded
    CHECK(load_metadata(gpu_path).at("nanoddp.devices") == R"({"w":"cuda:0"})");
    check_close(load(gpu_path).at("w"), {1.5, -2}, 0, 0, "w saved from cuda:0");
    return;
  }
  // The map leaves cuda:0 alone, so w would stay on a device that does not exist here.
  std::string msg = error_message([&] { load(path, {{"cuda:1", "cpu"}}); });
  CHECK(msg.find("tensor 'w' was saved on cuda:0 and would be placed on cuda:0 by map_location {cuda:1 -> cpu}") !=
        std::string::npos);
  CHECK(msg.find("device cuda:0 requested") != std::string::npos);  // the engine's reason (no CUDA build / no GPU)
  CHECK(msg.find("Pass a map_location that names a device available here") != std::string::npos);
  CHECK(msg.find(R"({{"cuda:0", "cpu"}})") != std::string::npos);
  msg = error_message([&] { load(path, "cuda:0"); });
  CHECK(msg.find("would be placed on cuda:0 by map_location cuda:0") != std::string::npos);
  msg = error_message([&] { load(path, [](const std::string&, const Device&) { return Device("cuda:1"); }); });
  CHECK(msg.find("cuda:1") != std::string::npos);
  CHECK(error_message([&] { load(path, {{"gpu0", "cpu"}}); }).find("invalid device 'gpu0'") != std::string::npos);
}

TEST_CASE("malformed files are nd::Errors that name the file and what was expected") {
  TempDir dir;
  auto has = [&](const std::string& bytes, const std::string& expected) {
    const std::string msg = load_error(dir, bytes);
    CHECK_MESSAGE(msg.find(expected) != std::string::npos, "expected '", expected, "' in: ", msg);
  };
  const std::string f32x2 = R"("dtype":"F32","shape":[2])";
  const std::string d8(8, '\0');
  // Sizes: truncated, header past the end, header over 100 MB.
  has("", "expected at least 8 bytes (the header length), found 0");
  has(std::string(5, '\0'), "found 5");
  has(st_file("{}", "", 100), "the header length says 100 bytes, but only 2 bytes follow");
  has(st_file("{}", "", 200'000'000), "header length 200000000 is over the limit of 100000000");
  has(st_file("{}", "", uint64_t(-1)), "is over the limit");
  // JSON syntax and shape.
  has(st_file("not json"), "is not valid JSON: expected a value at byte 0, found 'n'");
  has(st_file("{\"a\":"), "found end of header");
  has(st_file("{} x"), "expected end of JSON");
  has(st_file("[1, 2]"), "expected the header to be a JSON object, found an array");
  has(st_file(std::string(5000, '[') + std::string(5000, ']')), "levels of nesting");
  has(st_file("{\"a\\q\":1}"), "expected one of");
  has(st_file("{\"a\tb\":1}"), "no raw control characters");
  has(st_file("{\"\\ud800\":1}"), "low surrogate");
  // Fields.
  has(st_file(R"({"w":5})"), "tensor 'w': expected an object with dtype, shape, data_offsets, found a number");
  has(st_file(R"({"w":{"dtype":"F32","shape":[2]}})", d8), "tensor 'w': missing field \"data_offsets\"");
  has(st_file(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", d8), "missing field \"dtype\"");
  has(st_file(R"({"w":{"dtype":3,"shape":[2],"data_offsets":[0,8]}})", d8),
      "expected \"dtype\" to be a string, found a number");
  has(st_file(R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", d8),
      "expected \"shape\" to be an array, found a string");
  has(st_file(R"({"w":{)" + f32x2 + R"(,"data_offsets":[0]}})", d8),
      "expected \"data_offsets\" to be an array [begin, end], found an array of 1");
  has(st_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8), "non-negative integers, found -2");
  has(st_file(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}})", d8), "non-negative integers, found 1.5");
  has(st_file(R"({"w":{"dtype":"F32","shape":[null],"data_offsets":[0,8]}})", d8), "non-negative integers, found null");
  has(st_file(R"({"w":{)" + f32x2 + R"(,"data_offsets":[0,8],"extra":1}})", d8), "unknown field \"extra\"");
  has(st_file(R"({"w":{"dtype":"I8","shape":[8],"data_offsets":[0,8]}})", d8),
      "unsupported dtype \"I8\" (expected one of F32");
  has(st_file(R"({"__metadata__":{"a":1}})"),
      "\"__metadata__\": expected a string value for key \"a\", found a number");
  has(st_file(R"({"__metadata__":[]})"), "\"__metadata__\": expected an object of strings, found an array");
  has(st_file(R"({"__metadata__":{"nanoddp.devices":"{\"w\":\"tpu\"}"},"w":{)" + f32x2 + R"(,"data_offsets":[0,8]}})",
              d8),
      "metadata \"nanoddp.devices\": tensor 'w': invalid device 'tpu'");
  // Duplicate keys, at the top and inside an entry.
  has(st_file(R"({"w":{)" + f32x2 + R"(,"data_offsets":[0,8]},"w":{)" + f32x2 + R"(,"data_offsets":[0,8]}})", d8),
      "duplicate key \"w\"");
  has(st_file(R"({"w":{"dtype":"F32","dtype":"F64","shape":[2],"data_offsets":[0,8]}})", d8),
      "duplicate key \"dtype\"");
  // Sizes and offsets.
  has(st_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8),
      "F32 [3] needs 12 bytes, but data_offsets [0, 8] span 8");
  has(st_file(R"({"w":{)" + f32x2 + R"(,"data_offsets":[8,0]}})", d8), "data_offsets [8, 0]: expected begin <= end");
  has(st_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]},"b":{)" + f32x2 + R"(,"data_offsets":[4,12]}})",
              std::string(12, '\0')),
      "tensor 'b' data_offsets [4, 12] overlap tensor 'a' [0, 8]");
  has(st_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[0,8]},"b":{)" + f32x2 + R"(,"data_offsets":[12,20]}})",
              std::string(20, '\0')),
      "gap in the data: bytes [8, 12) belong to no tensor");
  has(st_file(R"({"a":{)" + f32x2 + R"(,"data_offsets":[4,12]}})", std::string(12, '\0')),
      "bytes [0, 4) belong to no tensor");
  has(st_file(R"({"w":{)" + f32x2 + R"(,"data_offsets":[0,8]}})", std::string(4, '\0')),
      "is truncated: tensor 'w' data_offsets [0, 8] reach past the 4 bytes of data");
  has(st_file(R"({"w":{)" + f32x2 + R"(,"data_offsets":[0,8]}})", std::string(12, '\0')),
      "(4 trailing bytes belong to no tensor)");
  has(st_file(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})", d8),
      "shape [4294967296, 4294967296, 4] has more elements than fit in int64");
  has(st_file(R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", d8),
      "has more bytes than fit in 64 bits");
  has(st_file(R"({"w":{"dtype":"U8","shape":[99999999999999999999],"data_offsets":[0,8]}})", d8),
      "\"shape\" value 99999999999999999999 is too large");
  has(st_file(R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[0,99999999999999999999]}})", d8), "is too large");
  has(st_file(R"({"w":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", std::string("\x01\x02", 2)),
      "element 1: expected byte 0 or 1, found 2");

  // A saved file cut short, a directory, a missing file; load_metadata checks as much.
  const std::string path = dir.file("cut.safetensors");
  save({{"w", ones({16})}}, path);
  const std::string full = read_bytes(path);
  has(full.substr(0, full.size() - 1), "is truncated");
  has(full.substr(0, 12), "is truncated: the header length says");
  write_bytes(path, full.substr(0, full.size() - 1));
  CHECK(error_message([&] { load_metadata(path); }).find("is truncated") != std::string::npos);
  std::string msg = error_message([&] { load(dir.path.string()); });
  CHECK(msg.find("expected a safetensors file, found a directory") != std::string::npos);
  msg = error_message([&] { load(dir.file("missing.safetensors")); });
  CHECK(msg.find("cannot open safetensors file '" + dir.file("missing.safetensors") + "': No such file") !=
        std::string::npos);
  CHECK(detail::parse_safetensors(st_file("{}  "), "mem").tensors.empty());  // trailing spaces are padding
}

TEST_CASE("JSON escapes in names decode, including surrogate pairs") {
  TempDir dir;
  const std::string path = dir.file("esc.safetensors");
  write_bytes(path,
              st_file(R"({"a\n\u00e9\ud83d\ude00\/\"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "\x05"));
  const TensorDict d = load(path);
  REQUIRE(d.size() == 1);
  CHECK(d.begin()->first == "a\n\xc3\xa9\xf0\x9f\x98\x80/\"");
  CHECK(d.begin()->second.item<uint8_t>() == 5);
}

TEST_CASE("a header with very many keys parses (duplicate detection is not quadratic)") {
  TempDir dir;
  std::map<std::string, std::string> meta;
  for (int i = 0; i < 200'000; ++i) meta["k" + std::to_string(i)] = std::to_string(i);
  const std::string path = dir.file("many.safetensors");
  save({{"w", ones({1})}}, path, meta);
  const auto back = load_metadata(path);
  CHECK(back.size() == meta.size() + 2);
  CHECK(back.at("k199999") == "199999");
}

TEST_CASE("a failing save leaves the existing file untouched and no temp file behind") {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  save({{"w", ones({4})}}, path);
  const std::string before = read_bytes(path);

  std::string msg = error_message([&] { save({{"a", ones({2})}, {"w", Tensor()}}, path); });
  CHECK(msg.find("save('" + path + "'): tensor 'w'") != std::string::npos);
  CHECK(read_bytes(path) == before);
  CHECK(dir.entries() == std::vector<std::string>{"ckpt.safetensors"});

  msg = error_message([&] { save({{"w", ones({4})}}, dir.file("no/such/dir/ckpt.safetensors")); });
  CHECK(msg.find("cannot create temp file") != std::string::npos);
  CHECK(msg.find("No such file or directory") != std::string::npos);

  // The rename fails after the whole temp file was written: it must be removed.
  fs::create_directories(dir.path / "taken" / "child");
  msg = error_message([&] { save({{"w", ones({1000})}}, dir.file("taken")); });
  CHECK(msg.find("cannot rename") != std::string::npos);
  CHECK(dir.entries() == std::vector<std::string>{"ckpt.safetensors", "taken"});
  CHECK(fs::is_directory(dir.path / "taken" / "child"));
  CHECK(load(path).at("w").numel() == 4);
}

TEST_CASE("a saver SIGKILLed mid-write leaves a file that loads as the old or the new checkpoint") {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  // 200 MB each, built before fork so the child only writes (no OpenMP after fork).
  const int64_t n = 50'000'000;
  const TensorDict old_ckpt{{"big", full({n}, 1.0)}, {"marker", tensor({1.0})}};
  const TensorDict new_ckpt{{"big", full({n}, 2.0)}, {"marker", tensor({2.0})}};
  std::mt19937 rng(20261130);
  int saw_old = 0, saw_new = 0;
  for (int round = 0; round < 3; ++round) {
    save(old_ckpt, path);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      try {
        for (;;) save(new_ckpt, path);
      } catch (...) {
      }
      ::_exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(50, 1500)(rng)));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));

    const TensorDict back = load(path);
    const float m = back.at("marker").item<float>();
    REQUIRE((m == 1.0f || m == 2.0f));
    (m == 1.0f ? saw_old : saw_new)++;
    const Tensor& big = back.at("big");
    REQUIRE(big.numel() == n);
    const float* p = big.data_ptr<float>();
    int64_t mismatches = 0;
    for (int64_t i = 0; i < n; ++i) mismatches += p[i] != m;
    CHECK_MESSAGE(mismatches == 0, "round ", round, ": file mixes old and new data");
  }
  MESSAGE("after SIGKILL the file held the old checkpoint ", saw_old, " times and the new one ", saw_new, " times");
}
