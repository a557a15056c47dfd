#pragma once
// Shared pieces of the emulation tests (tests/emu/*_emu_test.cpp): seeded inputs, bf16
// rounding, and element-wise comparisons against the CPU kernels that fail on an unexpected
// NaN (the emulated allocator and the tests poison outputs with NaN, so an unwritten element
// fails).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "emu_core.h"
#include "kernels/common/float16.h"

namespace nd::emu_test {

// n values uniform in [lo, hi), seeded.
template <class T = float>
std::vector<T> uniform(size_t n, unsigned seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(u(gen));
  return v;
}

// v's values converted to T (the inputs are drawn as floats, then cast to the tested type).
template <class T>
std::vector<T> cast(const std::vector<float>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <class T>
std::vector<T> nans(size_t n) {
  return std::vector<T>(n, static_cast<T>(NAN));
}

inline float round_bf16(float f) { return static_cast<float>(BFloat16(f)); }
inline std::vector<float> rounded_bf16(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}
inline std::vector<float> rounded_f16(std::vector<float> v) {
  for (auto& x : v) x = static_cast<float>(Half(x));
  return v;
}
inline std::vector<BFloat16> to_bf16(const std::vector<float>& v) { return {v.begin(), v.end()}; }
inline std::vector<Half> to_f16(const std::vector<float>& v) { return {v.begin(), v.end()}; }
inline std::vector<float> to_float(const std::vector<Half>& v) { return {v.begin(), v.end()}; }
inline std::vector<float> to_float(const std::vector<BFloat16>& v) { return {v.begin(), v.end()}; }

template <class T>
std::vector<double> abs_values(const std::vector<T>& v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = std::abs(static_cast<double>(v[i]));
  return r;
}

// |got[i] - ref[i]| <= tol[i] for every i; NaN in got fails unless ref is NaN there too (inf
// must match exactly).
// Reports the count of failures and the worst element.
template <class A, class B, class Tol>
void check_within(const std::string& what, const std::vector<A>& got, const std::vector<B>& ref, Tol tol_of) {
  REQUIRE_MESSAGE(got.size() == ref.size(), what, ": size ", got.size(), " vs ", ref.size());
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), r = static_cast<double>(ref[i]), tol = tol_of(i);
    bool ok;
    double ratio;
    if (std::isnan(r)) {  // a NaN the reference computed must be matched (not by an unwritten element, untestable)
      ok = std::isnan(g);
      ratio = ok ? 0 : INFINITY;
    } else if (std::isinf(g) || std::isinf(r)) {
      ok = g == r;
      ratio = ok ? 0 : INFINITY;
    } else {
      ok = std::abs(g - r) <= tol;  // false for NaN
      ratio = std::isnan(g - r) ? INFINITY : std::abs(g - r) / std::max(tol, 1e-300);
    }
    if (!ok) ++bad;
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (std::getenv("NANODDP_EMU_VERBOSE") != nullptr)  // margins: how close each check came to its tolerance
    MESSAGE(what, ": worst element at ", worst_ratio, " x its tolerance");
  INFO(what, ": ", got.size(), " elements, worst [", worst, "] got ", static_cast<double>(got[worst]), " expected ",
       static_cast<double>(ref[worst]), " (", worst_ratio, " x its tolerance)");
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " elements outside their tolerance");
}

template <class T>
double max_abs(const std::vector<T>& v) {
  double m = 0;
  for (const auto& x : v)
    if (std::isfinite(static_cast<double>(x))) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}
// |got[i] - ref[i]| <= rel * max|ref| (the tensor's largest finite value).
template <class A, class B>
void check_rel(const std::string& what, const std::vector<A>& got, const std::vector<B>& ref, double rel) {
  const double tol = rel * std::max(max_abs(ref), 1e-300);
  check_within(what, got, ref, [&](size_t) { return tol; });
}

// A contracted multiply-add changes a result by about an ulp of its largest intermediate
// term, which can exceed the result (cancellation); with inputs that keep every term within
// the tensor's largest |value|, 8 ulps of that bound the difference.
template <class T>
void check_ulps(const std::string& what, const std::vector<T>& got, const std::vector<T>& ref) {
  check_rel(what, got, ref, 8 * (sizeof(T) == 4 ? std::ldexp(1.0, -23) : std::ldexp(1.0, -52)));
}

// The relative tolerance of a short formula around sums of n values added in different
// orders: 4 (n + 16) u (u of T) bounds the sums' 2 gamma_n and the roundings.
template <class T>
double rel_for(int64_t n) {
  return 4.0 * double(n + 16) * (sizeof(T) == 4 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53));
}

// The same bits (floats compared as values, so +0 == -0; NaN fails).
template <class T>
void check_equal(const std::string& what, const std::vector<T>& got, const std::vector<T>& ref) {
  check_within(what, got, ref, [](size_t) { return 0.0; });
}

// A sum of n products in floating point with unit roundoff u, computed in two different
// orders (the CPU kernel's and the CUDA kernel's): each differs from the exact sum by at
// most gamma_n * sum|a_k b_k| with gamma_n = n u / (1 - n u) (Higham, Accuracy and
// Stability, 3.1), so the two differ by at most twice that. bound[i] = sum|a_k b_k| (+|bias|),
// computed by the CPU kernel itself on absolute values in double.
inline void check_sum_bound(const std::string& what, const std::vector<float>& got, const std::vector<float>& ref,
                            const std::vector<double>& bound, int64_t n, double u = std::ldexp(1.0, -24)) {
  const double gamma = 2.0 * (n * u) / (1.0 - n * u);
  check_within(what, got, ref, [&](size_t i) { return gamma * bound[i]; });
}
inline void check_sum_bound(const std::string& what, const std::vector<double>& got, const std::vector<double>& ref,
                            const std::vector<double>& bound, int64_t n) {
  // f64 results: the bound itself is computed in f64, so allow u of f64 plus the bound's own rounding.
  const double u = std::ldexp(1.0, -53), gamma = 2.0 * (n * u) / (1.0 - n * u) + 4 * u;
  check_within(what, got, ref, [&](size_t i) { return gamma * bound[i]; });
}

// The launches run() makes, as the cost model records them (grids, blocks, memory traffic).
template <class Run>
std::vector<emu_cost::LaunchCounts> launches_of(Run&& run) {
  emu_cost::clear();
  emu_cost::set_enabled(true);
  run();
  emu_cost::set_enabled(false);
  return emu_cost::launches();
}

// The same bits, NaN included (a rerun must repeat every bit: a deterministic order of adds).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace nd::emu_test
