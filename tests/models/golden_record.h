#pragma once
// The two halves of the full-size goldens that tests/golden/make_models_golden.py writes
// without storing weights (see its docstring):
// - closed_form / fill_closed_form: the weights and inputs both sides compute, twins of
//   reference_models.py's closed_form and uniform01;
// - check_recorded: our tensor against an entry of its Record (values, every stride-th
//   when large, plus the shape and the L2 norm of the whole tensor).
#include <cmath>
#include <filesystem>
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

// The golden file tests/golden/<file> as one dict; a clear failure when it is missing.
inline TensorDict load_golden(const std::string& file) {
  const auto path = std::filesystem::path(NANODDP_SOURCE_DIR) / "tests" / "golden" / file;
  REQUIRE_MESSAGE(std::filesystem::exists(path), path.string(), " is missing (run tests/golden/make_models_golden.py)");
  return load(path.string());
}

}  // namespace nd::testing
