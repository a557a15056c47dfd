#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/float16.h"
#include "kernels/cpu/strided.h"

namespace nd::kernels::cpu {

namespace {

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kSqrt2_Pi = 0.79788456080286535588;  // sqrt(2/pi)

template <class T>
inline T apply_unary(UnaryOp op, UnaryParams p, T x) {
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::sqrt: return std::sqrt(x);
    case UnaryOp::rsqrt: return T(1) / std::sqrt(x);
    case UnaryOp::abs: return std::abs(x);
    case UnaryOp::tanh: return std::tanh(x);
    case UnaryOp::sigmoid: return T(1) / (T(1) + std::exp(-x));
    case UnaryOp::relu: return x > T(0) ? x : T(0);
    case UnaryOp::leaky_relu: return x > T(0) ? x : x * T(p.a);
    case UnaryOp::gelu: return x * T(0.5) * (T(1) + std::erf(x * T(kSqrt1_2)));
    case UnaryOp::gelu_tanh: return T(0.5) * x * (T(1) + std::tanh(T(kSqrt2_Pi) * (x + T(0.044715) * x * x * x)));
    case UnaryOp::clamp: return std::min(std::max(x, T(p.a)), T(p.b));
  }
  return x;
}

// d op(x) / dx, given x and y = op(x).
template <class T>
inline T derivative(UnaryOp op, UnaryParams p, T x, T y) {
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
      const T cdf = T(0.5) * (T(1) + std::erf(x * T(kSqrt1_2)));
      const T pdf = std::exp(T(-0.5) * x * x) * T(0.39894228040143267794);
      return cdf + x * pdf;
    }
    case UnaryOp::gelu_tanh: {
      const T u = T(kSqrt2_Pi) * (x + T(0.044715) * x * x * x);
      const T th = std::tanh(u);
      const T du = T(kSqrt2_Pi) * (T(1) + T(3 * 0.044715) * x * x);
      return T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du;
    }
    case UnaryOp::clamp: return (x >= T(p.a) && x <= T(p.b)) ? T(1) : T(0);
  }
  return T(1);
}

template <class T>
inline T apply_binary(BinaryOp op, T alpha, T a, T b) {
  switch (op) {
    case BinaryOp::add: return a + alpha * b;
    case BinaryOp::sub: return a - alpha * b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::pow: return std::pow(a, b);
    case BinaryOp::maximum: return (a != a || a > b) ? a : b;  // NaN propagates
    case BinaryOp::minimum: return (a != a || a < b) ? a : b;
  }
  return a;
}

template <class T>
inline bool apply_compare(CompareOp op, T a, T b) {
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

}  // namespace

template <class T>
void unary(UnaryOp op, UnaryParams p, int64_t ndim, const int64_t* shape, const T* x, const int64_t* x_strides,
           T* out, const int64_t* out_strides) {
  for_each_row<2>(ndim, shape, {x_strides, out_strides}, [&](auto off, int64_t n, auto st) {
    const T* xs = x + off[0];
    T* os = out + off[1];
    if (st[0] == 1 && st[1] == 1) {
      for (int64_t j = 0; j < n; ++j) os[j] = apply_unary(op, p, xs[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) os[j * st[1]] = apply_unary(op, p, xs[j * st[0]]);
    }
  });
}

template <class T>
void unary_backward(UnaryOp op, UnaryParams p, int64_t n, const T* x, const T* y, const T* dy, T* dx) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * derivative(op, p, x[i], y[i]);
}

template <class T>
void binary(BinaryOp op, T alpha, int64_t ndim, const int64_t* shape, const T* a, const int64_t* a_strides,
            const T* b, const int64_t* b_strides, T* out, const int64_t* out_strides) {
  for_each_row<3>(ndim, shape, {a_strides, b_strides, out_strides}, [&](auto off, int64_t n, auto st) {
    const T* as = a + off[0];
    const T* bs = b + off[1];
    T* os = out + off[2];
    if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
      for (int64_t j = 0; j < n; ++j) os[j] = apply_binary(op, alpha, as[j], bs[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) os[j * st[2]] = apply_binary(op, alpha, as[j * st[0]], bs[j * st[1]]);
    }
  });
}

template <class T>
void compare(CompareOp op, int64_t ndim, const int64_t* shape, const T* a, const int64_t* a_strides, const T* b,
             const int64_t* b_strides, bool* out) {
  std::vector<int64_t> out_strides(ndim);
  int64_t s = 1;
  for (int64_t d = ndim - 1; d >= 0; --d) {
    out_strides[d] = s;
    s *= shape[d];
  }
  for_each_row<3>(ndim, shape, {a_strides, b_strides, out_strides.data()}, [&](auto off, int64_t n, auto st) {
    for (int64_t j = 0; j < n; ++j)
      out[off[2] + j * st[2]] = apply_compare(op, a[off[0] + j * st[0]], b[off[1] + j * st[1]]);
  });
}

#define ND_FLOAT(T)                                                                                          \
  template void unary<T>(UnaryOp, UnaryParams, int64_t, const int64_t*, const T*, const int64_t*, T*,        \
                         const int64_t*);                                                                    \
  template void unary_backward<T>(UnaryOp, UnaryParams, int64_t, const T*, const T*, const T*, T*);          \
  template void binary<T>(BinaryOp, T, int64_t, const int64_t*, const T*, const int64_t*, const T*,          \
                          const int64_t*, T*, const int64_t*);
#define ND_COMPARE(T)                                                                                        \
  template void compare<T>(CompareOp, int64_t, const int64_t*, const T*, const int64_t*, const T*,           \
                           const int64_t*, bool*);
ND_FLOAT(float)
ND_FLOAT(double)
ND_COMPARE(float)
ND_COMPARE(double)
ND_COMPARE(int64_t)
ND_COMPARE(int32_t)
ND_COMPARE(uint8_t)
ND_COMPARE(bool)

}  // namespace nd::kernels::cpu
