#pragma once
// The dropout mask, shared by kernels/cpu/dropout.cpp and kernels/cuda/dropout.cu: both
// index the counter-based stream the same way, so for one generator state (seed, offset)
// the CPU and the GPU drop exactly the same elements.
#include <cstdint>

#include "kernels/common/counter_rng.h"

namespace nd::kernels {

// Element i of a dropout call is dropped iff counter_uniform(seed, offset + i) < p.
ND_HOST_DEVICE bool dropout_dropped(uint64_t seed, uint64_t offset, int64_t i, double p) {
  return counter_uniform(seed, offset + static_cast<uint64_t>(i)) < p;
}

// The factor a kept element is multiplied by: 1 / (1 - p), and 0 for p == 1 (all dropped).
template <class T>
ND_HOST_DEVICE T dropout_scale(double p) {
  return p < 1.0 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
}

// y_i = dropped_i ? 0 : x_i * scale  (forward and backward are this same map).
template <class T>
ND_HOST_DEVICE T dropout_apply(T x, T scale, uint64_t seed, uint64_t offset, int64_t i, double p) {
  return dropout_dropped(seed, offset, i, p) ? T(0) : x * scale;
}

// Dropout on attention probabilities (scaled_dot_product_attention's dropout_p): element
// (b, h, i, j) of P [B, H, Sq, Sk], flat index n = ((b * H + h) * Sq + i) * Sk + j, is
// dropped iff dropout_dropped(seed, offset, n, p): the element nd::dropout would drop in
// the materialised P, so MultiheadAttention's need_weights path (softmax, then dropout)
// drops the same weights as the fused kernels. The forward and the backward pass the same
// (p, seed, offset), so the backward recomputes the forward's mask. p == 0: no dropout.
struct AttentionDropout {
  double p = 0;
  uint64_t seed = 0, offset = 0;

  // P_ij's factor: 0 where dropped, else 1 / (1 - p) (1 when p == 0). bh = b * H + h.
  template <class T>
  ND_HOST_DEVICE T factor(int64_t bh, int64_t Sq, int64_t Sk, int64_t i, int64_t j) const {
    if (p == 0.0) return T(1);
    return dropout_dropped(seed, offset, (bh * Sq + i) * Sk + j, p) ? T(0) : dropout_scale<T>(p);
  }
};

}  // namespace nd::kernels
