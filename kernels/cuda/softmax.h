#pragma once
// CUDA twins of kernels/cpu/softmax.h: softmax and log-softmax over the last dimension of
// a contiguous [M, D] array, one thread block per row (one warp for rows up to 32), the
// row maximum subtracted first as on the CPU. Same contracts, aliasing rules and math as
// the CPU header, plus the stream the kernels are queued on.
#include <cstdint>

#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

// y[m,d] = exp(x[m,d] - max_m) / sum_e exp(x[m,e] - max_m)
// requires: x, y [M, D] on the stream's device, D > 0.  ensures: writes y.  in-place: y may equal x.
template <typename T>
void softmax_forward(const T* x, int64_t M, int64_t D, T* y, cudaStream_t stream);

// y[m,d] = x[m,d] - max_m - log(sum_e exp(x[m,e] - max_m))
// requires: x, y [M, D], D > 0.  ensures: writes y.  in-place: y may equal x.
template <typename T>
void log_softmax_forward(const T* x, int64_t M, int64_t D, T* y, cudaStream_t stream);

// dx = y * (dy - sum_d dy * y), given the forward output y.
// requires: dy, y, dx [M, D].  ensures: writes dx.  in-place: dx may equal dy (not y).
template <typename T>
void softmax_backward(const T* dy, const T* y, int64_t M, int64_t D, T* dx, cudaStream_t stream);

// dx = dy - exp(y) * sum_d dy, given the forward output y = log_softmax(x).
// requires: dy, y, dx [M, D].  ensures: writes dx.  in-place: dx may equal dy (not y).
template <typename T>
void log_softmax_backward(const T* dy, const T* y, int64_t M, int64_t D, T* dx, cudaStream_t stream);

}  // namespace nd::kernels::cuda
