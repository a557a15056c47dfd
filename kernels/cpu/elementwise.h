#pragma once
// Elementwise math: unary ops with their derivatives, broadcasting binary ops and
// comparisons. Operands are strided (a broadcast dimension has stride 0), so the
// engine never materialises an expanded input.
#include <cstdint>

#include "kernels/common/elementwise_math.h"

namespace nd::kernels::cpu {

// The op enums and their scalar math live in kernels/common/elementwise_math.h, shared
// with the CUDA twins.
using kernels::BinaryOp;
using kernels::CompareOp;
using kernels::UnaryOp;
using kernels::UnaryParams;

// out = op(x), N-d strided. requires: out does not partially overlap x
// (out == x with equal strides, i.e. in place, is supported).
template <class T>
void unary(UnaryOp op, UnaryParams p, int64_t ndim, const int64_t* shape, const T* x, const int64_t* x_strides,
           T* out, const int64_t* out_strides);

// dx = dy * op'(x), contiguous, n elements. y = op(x) is passed because several
// derivatives are cheapest from the result (exp, tanh, sigmoid, sqrt, rsqrt).
// requires: x, y, dy, dx have n elements; dx may alias dy.
template <class T>
void unary_backward(UnaryOp op, UnaryParams p, int64_t n, const T* x, const T* y, const T* dy, T* dx);

// out = a (op) alpha*b for add/sub, a (op) b otherwise; N-d strided with broadcasting
// expressed as zero strides. requires: out does not partially overlap a or b
// (out == a with equal strides, i.e. in place, is supported).
template <class T>
void binary(BinaryOp op, T alpha, int64_t ndim, const int64_t* shape, const T* a, const int64_t* a_strides,
            const T* b, const int64_t* b_strides, T* out, const int64_t* out_strides);

// out = a (op) s, or s (op) a when scalar_first, for a number s: binary() with s
// broadcast (add and sub with alpha 1). The twin of a CUDA kernel that takes s by value,
// so `x * 2.0` needs no tensor for the 2.0. requires: as binary().
template <class T>
void binary_scalar(BinaryOp op, int64_t ndim, const int64_t* shape, const T* a, const int64_t* a_strides, T s,
                   bool scalar_first, T* out, const int64_t* out_strides);

// out = (a op b) as bool, N-d strided with broadcasting; out contiguous.
template <class T>
void compare(CompareOp op, int64_t ndim, const int64_t* shape, const T* a, const int64_t* a_strides, const T* b,
             const int64_t* b_strides, bool* out);

}  // namespace nd::kernels::cpu
