#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/common/float16.h"
#include "kernels/cpu/strided.h"

namespace nd::kernels::cpu {

using math::apply_binary;
using math::apply_compare;
using math::apply_unary;
using math::derivative;

// Runs f(std::integral_constant<Op, op>{}) for the run-time `op`, so that each element
// loop below is compiled once per op with the op a constant: the switch inside
// apply_unary / derivative / apply_binary folds away and the loop vectorises. (With the
// op read at run time, every element took a jump-table branch and nothing vectorised.)
// The arithmetic per element is unchanged. The lists below name every enumerator.
template <class Op, Op... kOps, class F>
void with_constant_op(Op op, F&& f) {
  (void)((op == kOps && (f(std::integral_constant<Op, kOps>{}), true)) || ...);
}
template <class F>
void dispatch(UnaryOp op, F&& f) {
  using U = UnaryOp;
  with_constant_op<U, U::neg, U::exp, U::log, U::sqrt, U::rsqrt, U::abs, U::tanh, U::sigmoid, U::relu,
                   U::leaky_relu, U::gelu, U::gelu_tanh, U::clamp, U::sign>(op, f);
}
template <class F>
void dispatch(BinaryOp op, F&& f) {
  using B = BinaryOp;
  with_constant_op<B, B::add, B::sub, B::mul, B::div, B::pow, B::maximum, B::minimum>(op, f);
}

template <class T>
void unary(UnaryOp op, UnaryParams p, int64_t ndim, const int64_t* shape, const T* x, const int64_t* x_strides,
           T* out, const int64_t* out_strides) {
  dispatch(op, [&](auto kop) {
    for_each_row<2>(ndim, shape, {x_strides, out_strides}, [&](auto off, int64_t n, auto st) {
      const T* xs = x + off[0];
      T* os = out + off[1];
      if (st[0] == 1 && st[1] == 1) {
        for (int64_t j = 0; j < n; ++j) os[j] = apply_unary(kop(), p, xs[j]);
      } else {
        for (int64_t j = 0; j < n; ++j) os[j * st[1]] = apply_unary(kop(), p, xs[j * st[0]]);
      }
    });
  });
}

template <class T>
void unary_backward(UnaryOp op, UnaryParams p, int64_t n, const T* x, const T* y, const T* dy, T* dx) {
  dispatch(op, [&](auto kop) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * derivative(kop(), p, x[i], y[i]);
  });
}

template <class T>
void binary(BinaryOp op, T alpha, int64_t ndim, const int64_t* shape, const T* a, const int64_t* a_strides,
            const T* b, const int64_t* b_strides, T* out, const int64_t* out_strides) {
  dispatch(op, [&](auto kop) {
    for_each_row<3>(ndim, shape, {a_strides, b_strides, out_strides}, [&](auto off, int64_t n, auto st) {
      const T* as = a + off[0];
      const T* bs = b + off[1];
      T* os = out + off[2];
      if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
        for (int64_t j = 0; j < n; ++j) os[j] = apply_binary(kop(), alpha, as[j], bs[j]);
      } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {  // b broadcast along the row (a bias, a scalar)
        const T bv = *bs;
        for (int64_t j = 0; j < n; ++j) os[j] = apply_binary(kop(), alpha, as[j], bv);
      } else if (st[0] == 0 && st[1] == 1 && st[2] == 1) {
        const T av = *as;
        for (int64_t j = 0; j < n; ++j) os[j] = apply_binary(kop(), alpha, av, bs[j]);
      } else {
        for (int64_t j = 0; j < n; ++j) os[j * st[2]] = apply_binary(kop(), alpha, as[j * st[0]], bs[j * st[1]]);
      }
    });
  });
}

template <class T>
void binary_scalar(BinaryOp op, int64_t ndim, const int64_t* shape, const T* a, const int64_t* a_strides, T s,
                   bool scalar_first, T* out, const int64_t* out_strides) {
  const std::vector<int64_t> zero(static_cast<size_t>(std::max<int64_t>(ndim, 1)), 0);
  if (scalar_first)
    binary<T>(op, T(1), ndim, shape, &s, zero.data(), a, a_strides, out, out_strides);
  else
    binary<T>(op, T(1), ndim, shape, a, a_strides, &s, zero.data(), out, out_strides);
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
                          const int64_t*, T*, const int64_t*);                                       \
  template void binary_scalar<T>(BinaryOp, int64_t, const int64_t*, const T*, const int64_t*, T, bool, T*,   \
                                 const int64_t*);
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
