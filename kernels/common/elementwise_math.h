#pragma once
// The scalar math of the elementwise ops, shared by the CPU kernels and the CUDA
// kernels so the two cannot drift apart: each op's value and its derivative.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/common/host_device.h"

namespace nd::kernels {

enum class UnaryOp {
  neg, exp, log, sqrt, rsqrt, abs, tanh, sigmoid, relu,
  leaky_relu,  // p.a = negative slope
  gelu,        // exact: x * Phi(x)
  gelu_tanh,   // tanh approximation
  clamp,       // p.a = min, p.b = max
  sign,        // (x > 0) - (x < 0), as PyTorch: 0 at 0 and at NaN
};
struct UnaryParams {
  double a = 0, b = 0;
};

enum class BinaryOp { add, sub, mul, div, pow, maximum, minimum };
enum class CompareOp { eq, ne, lt, le, gt, ge };

namespace math {

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kSqrt2_Pi = 0.79788456080286535588;    // sqrt(2/pi)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1/sqrt(2 pi)

// Vectorisable f32 exp and erf for the CPU's exact GELU, whose scalar libm calls (erff,
// expf) kept its loops from vectorising. Branch-free: both pieces are computed and one
// is selected, so GCC vectorises a loop over them. Host only: CUDA keeps its erff/expf.
// Coefficients: near-minimax fits (weighted least squares, relative error, mpmath
// reference) of the functions named at each polynomial, rounded to f32. Test:
// tests/kernels/gelu_erf_test.cpp (ulp sweeps against libm, special values).
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// requires: t <= 0 or NaN. ensures: e^t within ~1 ulp (subnormal results included), NaN stays NaN.
inline float exp_nonpositive_f32(float t) {
  t = t < -104.f ? -104.f : t;  // e^-104 rounds to 0; keeps n >= -150 below
  // t = n ln2 + r, |r| <= ln2/2; n = round(t / ln2) by adding 1.5 * 2^23 (spacing 1 there).
  const float kShift = 12582912.f;
  const float shifted = t * 1.44269504f + kShift;
  const float n = shifted - kShift;
  const float r = (t - n * 0.693145751953125f) - n * 1.42860677e-6f;  // ln2 = hi (exact n * hi) + lo
  // e^r on |r| <= ln2/2, relative error 1.9e-9
  const float p = 1.0f + r * (1.0f + r * (0.499999921f + r * (0.166664201f + r * (4.16682263e-2f +
                  r * (8.37482200e-3f + r * 1.38368221e-3f)))));
  // 2^n as 2^n1 * 2^n2 with n1, n2 >= -75 each a normal float, so results below 2^-126
  // come out subnormal instead of wrong.
  const int32_t ni = static_cast<int32_t>(f32_bits(shifted) - f32_bits(kShift));
  const int32_t n1 = ni / 2;
  const int32_t n2 = ni - n1;
  return p * f32_from_bits(static_cast<uint32_t>(n1 + 127) << 23) * f32_from_bits(static_cast<uint32_t>(n2 + 127) << 23);
}

// ensures: erf(x) within ~2 ulp for every x; erf(+-0) = +-0, erf(+-inf) = +-1, NaN stays NaN.
inline float erf_f32(float x) {
  const float ax = std::fabs(x);
  // |x| < 0.921875: erf(x) = x + x * P(x^2), 1 + P ~ erf(x) / x, relative error 4e-10 (x + small
  // correction: the rounding error of P weighs ~8 times less than in x * (1 + P))
  const float u = x * x;
  const float small = x + x * (0.128379167f + u * (-0.376126338f + u * (0.112836956f + u * (-2.68594032e-2f +
                      u * (5.20104195e-3f + u * (-8.14279474e-4f + u * 8.37042645e-5f))))));
  // |x| >= 0.921875: erf(|x|) = 1 - e^(-x^2) * Q(t), t = 1 / (1 + |x| / 2), Q ~ erfc(x) e^(x^2),
  // relative error 4e-10. Beyond |x| = 4, erf rounds to 1 in f32: clamp (NaN goes to 4).
  const float z = ax < 4.f ? ax : 4.f;
  const float t = 1.f / (1.f + 0.5f * z);
  const float q = -1.55166907e-4f + t * (0.284926904f + t * (0.259599988f + t * (0.348091524f +
                  t * (-0.104165414f + t * (0.563886239f + t * (-0.471569901f + t * 0.119440260f))))));
  const float large = std::copysign(1.f - exp_nonpositive_f32(-z * z) * q, x);
  return ax >= 0.921875f ? large : small;  // NaN: the comparison is false, and small is NaN
}

// e^v for v <= 0 (or NaN): exp_nonpositive_f32 for f32 on the host (it vectorises), the
// standard exp for other types and on CUDA devices. The exact GELU and the CPU attention's
// softmax use it.
template <class T>
ND_HOST_DEVICE T exp_nonpositive(T v) {
#ifndef __CUDA_ARCH__
  if constexpr (std::is_same_v<T, float>) return exp_nonpositive_f32(v);
#endif
  using std::exp;
  return exp(v);
}

// erf(v) (fn = erf) or e^v, v <= 0 (fn = exp), as the exact GELU uses them: the f32
// functions above on the host, the standard ones for other types and on CUDA devices.
enum class GeluMath { erf, exp };
template <GeluMath fn, class T>
ND_HOST_DEVICE T gelu_math(T v) {
  if constexpr (fn == GeluMath::exp) return exp_nonpositive(v);
#ifndef __CUDA_ARCH__
  if constexpr (std::is_same_v<T, float>) return erf_f32(v);
#endif
  using std::erf;
  return erf(v);
}

template <class T>
ND_HOST_DEVICE T apply_unary(UnaryOp op, UnaryParams p, T x) {
  using std::erf, std::exp, std::fabs, std::log, std::sqrt, std::tanh;
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return exp(x);
    case UnaryOp::log: return log(x);
    case UnaryOp::sqrt: return sqrt(x);
    case UnaryOp::rsqrt: return T(1) / sqrt(x);
    case UnaryOp::abs: return fabs(x);
    case UnaryOp::tanh: return tanh(x);
    case UnaryOp::sigmoid: return T(1) / (T(1) + exp(-x));
    case UnaryOp::relu: return x > T(0) ? x : T(0);
    case UnaryOp::leaky_relu: return x > T(0) ? x : x * T(p.a);
    case UnaryOp::gelu: return x * T(0.5) * (T(1) + gelu_math<GeluMath::erf>(x * T(kSqrt1_2)));
    case UnaryOp::gelu_tanh: return T(0.5) * x * (T(1) + tanh(T(kSqrt2_Pi) * (x + T(0.044715) * x * x * x)));
    case UnaryOp::clamp: {  // min(max(x, a), b): NaN stays NaN
      const T lo = x < T(p.a) ? T(p.a) : x;
      return T(p.b) < lo ? T(p.b) : lo;
    }
    case UnaryOp::sign: return T(x > T(0)) - T(x < T(0));
  }
  return x;
}

// d op(x) / dx, given x and y = op(x) (several derivatives are cheapest from y).
template <class T>
ND_HOST_DEVICE T derivative(UnaryOp op, UnaryParams p, T x, T y) {
  using std::erf, std::exp, std::tanh;
  switch (op) {
    case UnaryOp::neg: return T(-1);
    case UnaryOp::exp: return y;
    case UnaryOp::log: return T(1) / x;
    case UnaryOp::sqrt: return T(0.5) / y;
    case UnaryOp::rsqrt: return T(-0.5) * y * y * y;  // d x^-1/2 = -1/2 x^-3/2
    case UnaryOp::abs: return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
    case UnaryOp::tanh: return T(1) - y * y;
    case UnaryOp::sigmoid: return y * (T(1) - y);
    case UnaryOp::relu: return x > T(0) ? T(1) : T(0);
    case UnaryOp::leaky_relu: return x > T(0) ? T(1) : T(p.a);
    case UnaryOp::gelu: {  // Phi(x) + x * phi(x)
      const T cdf = T(0.5) * (T(1) + gelu_math<GeluMath::erf>(x * T(kSqrt1_2)));
      const T pdf = gelu_math<GeluMath::exp>(T(-0.5) * x * x) * T(kInvSqrt2Pi);
      return cdf + x * pdf;
    }
    case UnaryOp::gelu_tanh: {
      const T u = T(kSqrt2_Pi) * (x + T(0.044715) * x * x * x);
      const T th = tanh(u);
      const T du = T(kSqrt2_Pi) * (T(1) + T(3 * 0.044715) * x * x);
      return T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du;
    }
    case UnaryOp::clamp: return (x > T(p.a) && x < T(p.b)) ? T(1) : T(0);  // PyTorch: 0 at the bounds
    case UnaryOp::sign: return T(0);
  }
  return T(1);
}

template <class T>
ND_HOST_DEVICE T apply_binary(BinaryOp op, T alpha, T a, T b) {
  using std::pow;
  switch (op) {
    case BinaryOp::add: return a + alpha * b;
    case BinaryOp::sub: return a - alpha * b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::pow: return pow(a, b);
    case BinaryOp::maximum: return (a != a || a > b) ? a : b;  // NaN propagates
    case BinaryOp::minimum: return (a != a || a < b) ? a : b;
  }
  return a;
}

template <class T>
ND_HOST_DEVICE bool apply_compare(CompareOp op, T a, T b) {
  switch (op) {
    case CompareOp::eq: return a == b;
    case CompareOp::ne: return a != b;
    case CompareOp::lt: return a < b;
    case CompareOp::le: return a <= b;
    case CompareOp::gt: return a > b;
    case CompareOp::ge: return a >= b;
  }
  return false;
}

}  // namespace math
}  // namespace nd::kernels
