#pragma once
// CUDA twins of kernels/cpu/elementwise.h: same operations, same enums, same argument
// lists plus the stream the kernel is queued on. Contracts as in the CPU header.
#include <cstdint>

#include "kernels/common/elementwise_math.h"
#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

using kernels::BinaryOp;
using kernels::CompareOp;
using kernels::UnaryOp;
using kernels::UnaryParams;

// out = op(x), N-d strided (ndim <= 10). In place (out == x, equal strides) is supported.
template <class T>
void unary(UnaryOp op, UnaryParams p, int64_t ndim, const int64_t* shape, const T* x, const int64_t* x_strides,
           T* out, const int64_t* out_strides, cudaStream_t stream);

// dx = dy * op'(x), contiguous, n elements; dx may alias dy.
template <class T>
void unary_backward(UnaryOp op, UnaryParams p, int64_t n, const T* x, const T* y, const T* dy, T* dx,
                    cudaStream_t stream);

// out = a (op) alpha*b (add/sub) or a (op) b, N-d strided with zero-stride broadcasting.
// In place (out == a, equal strides) is supported.
template <class T>
void binary(BinaryOp op, T alpha, int64_t ndim, const int64_t* shape, const T* a, const int64_t* a_strides,
            const T* b, const int64_t* b_strides, T* out, const int64_t* out_strides, cudaStream_t stream);

// out = a (op) s, or s (op) a when scalar_first, with the number s passed by value: one
// launch and no device tensor for s. In place (out == a, equal strides) is supported.
template <class T>
void binary_scalar(BinaryOp op, int64_t ndim, const int64_t* shape, const T* a, const int64_t* a_strides, T s,
                   bool scalar_first, T* out, const int64_t* out_strides, cudaStream_t stream);

// out = (a op b) as bool, N-d strided with broadcasting; out contiguous.
template <class T>
void compare(CompareOp op, int64_t ndim, const int64_t* shape, const T* a, const int64_t* a_strides, const T* b,
             const int64_t* b_strides, bool* out, cudaStream_t stream);

}  // namespace nd::kernels::cuda
