#pragma once
// CUDA twins of kernels/cpu/layer_norm.h: layer normalisation over the last D elements of
// a contiguous [M, D] array, one thread block per row, statistics in double as on the CPU.
// Same contracts, aliasing rules and math as the CPU header, plus the stream.
#include <cstdint>

#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

// Per row m:  mean = (1/D) sum_d x,  var = (1/D) sum_d (x - mean)^2 (biased, two passes),
//             rstd = 1/sqrt(var + eps),  y = (x - mean) * rstd * weight + bias
// (weight = 1, bias = 0 when null).
// requires: x, y [M, D], D > 0; weight, bias [D] or null; mean, rstd [M].
// ensures: writes y, mean, rstd.  in-place: y may equal x.
template <typename T>
void layer_norm_forward(const T* x, const T* weight, const T* bias, int64_t M, int64_t D, double eps, T* y,
                        T* mean, T* rstd, cudaStream_t stream);

// With xhat = (x - mean) * rstd and g = dy * weight:
//   dx      = rstd * (g - mean_d(g) - xhat * mean_d(g * xhat))
//   dweight = sum_m dy * xhat,   dbias = sum_m dy      (fixed summation order: deterministic)
// requires: dy, x [M, D]; mean, rstd [M] from layer_norm_forward; weight [D] or null;
//           dx [M, D], dweight, dbias [D], each null when not needed.
// ensures: writes (not accumulates) the non-null outputs.  in-place: dx may equal dy.
template <typename T>
void layer_norm_backward(const T* dy, const T* x, const T* mean, const T* rstd, const T* weight, int64_t M,
                         int64_t D, T* dx, T* dweight, T* dbias, cudaStream_t stream);

}  // namespace nd::kernels::cuda
