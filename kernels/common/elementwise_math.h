#pragma once
// The scalar math of the elementwise ops, shared by the CPU kernels and the CUDA
// kernels so the two cannot drift apart: each op's value and its derivative.
#include <cmath>

#include "kernels/common/counter_rng.h"  // ND_HOST_DEVICE

namespace nd::kernels {

enum class UnaryOp {
  neg, exp, log, sqrt, rsqrt, abs, tanh, sigmoid, relu,
  leaky_relu,  // p.a = negative slope
  gelu,        // exact: x * Phi(x)
  gelu_tanh,   // tanh approximation
  clamp,       // p.a = min, p.b = max
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
    case UnaryOp::gelu: return x * T(0.5) * (T(1) + erf(x * T(kSqrt1_2)));
    case UnaryOp::gelu_tanh: return T(0.5) * x * (T(1) + tanh(T(kSqrt2_Pi) * (x + T(0.044715) * x * x * x)));
    case UnaryOp::clamp: {  // min(max(x, a), b): NaN stays NaN
      const T lo = x < T(p.a) ? T(p.a) : x;
      return T(p.b) < lo ? T(p.b) : lo;
    }
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
      const T cdf = T(0.5) * (T(1) + erf(x * T(kSqrt1_2)));
      const T pdf = exp(T(-0.5) * x * x) * T(kInvSqrt2Pi);
      return cdf + x * pdf;
    }
    case UnaryOp::gelu_tanh: {
      const T u = T(kSqrt2_Pi) * (x + T(0.044715) * x * x * x);
      const T th = tanh(u);
      const T du = T(kSqrt2_Pi) * (T(1) + T(3 * 0.044715) * x * x);
      return T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du;
    }
    case UnaryOp::clamp: return (x >= T(p.a) && x <= T(p.b)) ? T(1) : T(0);
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
