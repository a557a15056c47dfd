#pragma once
// CUDA twins of kernels/cpu/dropout.h. The mask is kernels/common/dropout_mask.h, the same
// function of (seed, offset, i) the CPU uses, so for one generator state both devices
// drop exactly the same elements.
#include <cstdint>

#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

// keep_i = counter_uniform(seed, offset + i) >= p
// y_i = keep_i ? x_i / (1 - p) : 0      (p == 1 gives all zeros)
// requires: x, y [n] on the stream's device; 0 <= p <= 1.  ensures: writes y.  in-place: y may equal x.
template <typename T>
void dropout_forward(const T* x, int64_t n, double p, uint64_t seed, uint64_t offset, T* y, cudaStream_t stream);

// dx_i = keep_i ? dy_i / (1 - p) : 0, keep_i regenerated from the forward's seed and offset.
// requires: dy, dx [n]; the forward's p, seed, offset.  ensures: writes dx.  in-place: dx may equal dy.
template <typename T>
void dropout_backward(const T* dy, int64_t n, double p, uint64_t seed, uint64_t offset, T* dx,
                      cudaStream_t stream);

}  // namespace nd::kernels::cuda
