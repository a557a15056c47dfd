#pragma once
// The two halves of the full-size goldens that tests/golden/make_models_golden.py writes
// without storing weights (see its docstring):
// - closed_form / fill_closed_form: the weights and inputs both sides compute, twins of
//   reference_models.py's closed_form and uniform01;
// - check_recorded: our tensor against an entry of its Record (values, every stride-th
//   when large, plus the shape and the L2 norm of the whole tensor).
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "harness.h"

namespace nd::testing {

inline uint64_t fnv1a64(const std::string& text) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char byte : text) h = (h ^ byte) * 0x100000001B3ull;
  return h;
}

// n values in [0, 1): the top 53 bits of splitmix64(fnv1a64(name) + i).
inline std::vector<double> uniform01(const std::string& name, int64_t n) {
  std::vector<double> out(n);
  const uint64_t seed = fnv1a64(name);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = seed + static_cast<uint64_t>(i) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out[i] = static_cast<double>(z >> 11) * 0x1p-53;
  }
  return out;
}

inline int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Inputs: f32 values in [lo, hi).
inline Tensor closed_form_uniform(const std::string& name, const Shape& shape, double lo, double hi) {
  std::vector<double> v = uniform01(name, numel_of(shape));
  for (double& x : v) x = lo + (hi - lo) * x;
  return tensor(v, kFloat32).reshape(shape);
}

// Weights: 2+ dims v * sqrt(6 / (numel / shape[0] + shape[0])), a 1-D "*weight"
// 1 + 0.1 v, any other 1-D tensor 0.02 v, with v = 2 u - 1; f32.
inline Tensor closed_form(const std::string& name, const Shape& shape) {
  const int64_t n = numel_of(shape);
  std::vector<double> v = uniform01(name, n);
  const bool weight = name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
  const double bound = shape.size() >= 2 ? std::sqrt(6.0 / static_cast<double>(n / shape[0] + shape[0])) : 0;
  for (double& x : v) {
    x = 2 * x - 1;
    x = shape.size() >= 2 ? x * bound : weight ? 1 + 0.1 * x : 0.02 * x;
  }
  return tensor(v, kFloat32).reshape(shape);
}

// Every parameter (the fixed position embeddings are buffers here, parameters that
// never train in the reference, and are skipped there).
inline void fill_closed_form(nn::Module& module) {
  NoGradGuard no_grad;
  for (const auto& [name, p] : module.named_parameters()) p.copy_(closed_form(name, p.sizes()));
}

// CHECKs `actual` against Record entry `key` of `golden`: its shape, the recorded values
// (atol tol * their max + 1e-7, rtol tol) and the norm of all values (relative tol).
inline void check_recorded(const TensorDict& golden, const std::string& key, const Tensor& actual, double tol) {
  CAPTURE(key);
  REQUIRE_MESSAGE(golden.count(key), "no golden entry ", key);
  Shape shape;
  for (double d : to_vector(golden.at("shape." + key))) shape.push_back(static_cast<int64_t>(d));
  CHECK(actual.sizes() == shape);
  const auto stride = static_cast<int64_t>(golden.at("stride." + key).item());
  const Tensor sample = actual.detach().reshape({actual.numel()}).slice(0, 0, actual.numel(), stride);
  check_close_scaled(sample, golden.at(key), tol, key);
  const double norm = golden.at("norm." + key).item();
  const double ours = actual.detach().to(kFloat64).pow(2).sum().sqrt().item();
  CHECK_MESSAGE(std::abs(ours - norm) <= tol * norm + 1e-7, key, ": norm ", ours, ", expected ", norm);
}

// Runs `mae`, given closed-form weights, on Record `name`'s closed-form images and masking
// noise (make_models_golden.py's mae_result), one backward, and checks the loss,
// predictions, mask, encoder latent and every gradient against the Record, to tol.
inline void check_mae_recorded(const TensorDict& golden, const std::string& name, models::MAE& mae, int64_t batch,
                               double tol) {
  fill_closed_form(*mae);
  const models::MAEConfig& c = mae->config;
  const Tensor images = closed_form_uniform("images", {batch, c.in_chans, c.img_size, c.img_size}, -1, 1);
  const Tensor noise = closed_form_uniform("noise", {batch, c.num_patches()}, 0, 1);
  const models::MAEEncoderOutput enc = mae->forward_encoder(images, c.mask_ratio, noise);
  const Tensor pred = mae->forward_decoder(enc.latent, enc.ids_restore);
  const Tensor loss = mae->forward_loss(images, pred, enc.mask);
  loss.backward();
  check_recorded(golden, name + ".out.loss", loss, tol);
  check_recorded(golden, name + ".out.pred", pred, tol);
  check_recorded(golden, name + ".out.mask", enc.mask, 0);
  check_recorded(golden, name + ".out.latent", enc.latent, tol);
  const auto params = mae->named_parameters();
  for (const auto& [k, p] : params) check_recorded(golden, name + ".grad." + k, p.grad(), tol);
  int64_t recorded = 0;
  for (const auto& [k, v] : golden)
    if (k.rfind(name + ".grad.", 0) == 0) ++recorded;
  CHECK(recorded == static_cast<int64_t>(params.size()));
}

// "768x3x16x16"
inline std::string shape_text(const Shape& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

// tests/golden/mae_keys.txt (models_mae.py's state dicts): config -> key -> shape_text.
inline std::map<std::string, std::map<std::string, std::string>> mae_reference_keys() {
  const auto path = std::filesystem::path(NANODDP_SOURCE_DIR) / "tests" / "golden" / "mae_keys.txt";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), path.string(), " is missing (run tests/golden/make_models_golden.py)");
  std::map<std::string, std::map<std::string, std::string>> out;
  std::string config, key, shape;
  while (in >> config >> key >> shape) out[config][key] = shape;
  return out;
}

// python3 with torch, numpy and safetensors (what make_models_golden.py and
// models/mae_pth_to_safetensors.py import).
inline bool python_has_torch() {
  static const bool ok = std::system("python3 -c 'import torch, numpy, safetensors' >/dev/null 2>&1") == 0;
  return ok;
}

// A fresh directory under the system temp dir, removed with its contents.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / ("nanoddp_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// Runs `python3 <script under the source tree> <args>`, stdout and stderr into `log`;
// returns its exit status (-1 when it did not exit normally).
inline int run_python(const std::string& script, const std::string& args, const std::filesystem::path& log) {
  const auto path = std::filesystem::path(NANODDP_SOURCE_DIR) / script;
  const int rc = std::system(("python3 " + path.string() + " " + args + " > " + log.string() + " 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// The whole file, for failure messages.
inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The golden file tests/golden/<file> as one dict; a clear failure when it is missing.
inline TensorDict load_golden(const std::string& file) {
  const auto path = std::filesystem::path(NANODDP_SOURCE_DIR) / "tests" / "golden" / file;
  REQUIRE_MESSAGE(std::filesystem::exists(path), path.string(), " is missing (run tests/golden/make_models_golden.py)");
  return load(path.string());
}

}  // namespace nd::testing
