#pragma once
// Dropout with a counter-based mask (kernels/common/counter_rng.h).
//
// Why no stored mask: element i is dropped iff counter_uniform(seed, offset + i) < p, a
// pure function of (seed, offset, i). The backward regenerates the mask instead of
// saving an N-byte tensor: no activation memory, one hash per element (cheap next to
// the memory traffic), and the CUDA twin draws bit-identical masks.
#include <cstdint>

namespace nd::kernels::cpu {

// keep_i = counter_uniform(seed, offset + i) >= p
// y_i = keep_i ? x_i / (1 - p) : 0      (p == 1 gives all zeros)
// requires: x, y [n]; 0 <= p <= 1.  ensures: writes y.  in-place: y may equal x.
template <typename T>
void dropout_forward(const T* x, int64_t n, double p, uint64_t seed, uint64_t offset, T* y);

// dx_i = keep_i ? dy_i / (1 - p) : 0, keep_i regenerated from the forward's seed and offset.
// requires: dy, dx [n]; the forward's p, seed, offset.  ensures: writes dx.
// in-place: dx may equal dy.
template <typename T>
void dropout_backward(const T* dy, int64_t n, double p, uint64_t seed, uint64_t offset, T* dx);

}  // namespace nd::kernels::cpu
