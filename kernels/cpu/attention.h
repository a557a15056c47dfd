#pragma once
// Scaled dot-product attention, flash-style: the forward walks tiles of queries against
// tiles of keys (scores by a small GEMM), keeps an online softmax per query row and saves
// only logsumexp [B, H, Sq]; the backward recomputes the probabilities tile by tile from it.
// Neither ever holds an Sq x Sk matrix; each thread holds one query-tile x key-tile block
// of scores (and of dP in the backward), reused. Threads: OpenMP over (b, h, query tile) in
// the forward; over heads in the backward, and key tiles too when B*H < threads.
// Kernel: kernels/cpu/attention.cpp. Benchmark: bench_cpu_ops "attention".
#include <cstdint>

#include "kernels/common/attention_layout.h"
#include "kernels/common/dropout_mask.h"

namespace nd::kernels::cpu {

using kernels::AttentionDropout;

using kernels::AttentionLayout;
using kernels::AttentionMask;
using kernels::AttentionRows;

// For each (b, h) and query row i, over the allowed keys j (all j, or j <= i when
// is_causal: PyTorch's top-left aligned tril(ones(Sq, Sk))):
//   s_ij = scale * q_i . k_j + mask_ij
//   lse_i = log sum_j exp(s_ij),   P_ij = exp(s_ij - lse_i),   out_i = sum_j P_ij Z_ij v_j
// with Z_ij = dropout.factor(...) (kernels/common/dropout_mask.h: 0 for a dropped weight,
// 1 / (1 - p) for a kept one, 1 without dropout); lse is the undropped softmax's.
// A row with no allowed key (all masked) gets out_i = 0 and lse_i = -inf, and no gradient.
// requires: q [B, H, Sq, E], k [B, H, Sk, E], v [B, H, Sk, Ev], out [B, H, Sq, Ev], laid out
//           as `layout` says; logsumexp [B, H, Sq]; out does not overlap q, k, v.
// ensures: writes out and logsumexp (results do not depend on the layout).
template <typename T>
void scaled_dot_product_attention_forward(const T* q, const T* k, const T* v,
                                          AttentionMask<T> mask, const AttentionLayout& layout,
                                          int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t E,
                                          int64_t Ev, bool is_causal, double scale,
                                          const AttentionDropout& dropout, T* out, T* logsumexp);

// With P recomputed from logsumexp, Z from the forward's dropout and D_i = dout_i . out_i
// (= sum_j P_ij Z_ij dout_i . v_j, so D needs no mask):
//   dv_j = sum_i P_ij Z_ij dout_i
//   dS_ij = P_ij (Z_ij dout_i . v_j - D_i)
//   dq_i = scale sum_j dS_ij k_j,   dk_j = scale sum_i dS_ij q_i
// requires: the forward's inputs and its out, logsumexp; dout [B, H, Sq, Ev]; dq, dk, dv
//           shaped like q, k, v; all laid out as `layout` says; dq, dk, dv overlap no input
//           nor each other.
// ensures: writes (not accumulates) dq, dk, dv. (No gradient for the mask.)
template <typename T>
void scaled_dot_product_attention_backward(const T* dout, const T* q, const T* k, const T* v,
                                           AttentionMask<T> mask, const T* out,
                                           const T* logsumexp, const AttentionLayout& layout,
                                           int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t E,
                                           int64_t Ev, bool is_causal, double scale,
                                           const AttentionDropout& dropout, T* dq, T* dk, T* dv);

// The same on dense [B, H, S, X] operands: the CUDA kernels' signature.
template <typename T>
void scaled_dot_product_attention_forward(const T* q, const T* k, const T* v,
                                          AttentionMask<T> mask, int64_t B, int64_t H,
                                          int64_t Sq, int64_t Sk, int64_t E, int64_t Ev,
                                          bool is_causal, double scale, const AttentionDropout& dropout,
                                          T* out, T* logsumexp) {
  scaled_dot_product_attention_forward(q, k, v, mask, AttentionLayout::contiguous(H, Sq, Sk, E, Ev),
                                       B, H, Sq, Sk, E, Ev, is_causal, scale, dropout, out, logsumexp);
}

template <typename T>
void scaled_dot_product_attention_backward(const T* dout, const T* q, const T* k, const T* v,
                                           AttentionMask<T> mask, const T* out,
                                           const T* logsumexp, int64_t B, int64_t H, int64_t Sq,
                                           int64_t Sk, int64_t E, int64_t Ev, bool is_causal,
                                           double scale, const AttentionDropout& dropout, T* dq,
                                           T* dk, T* dv) {
  scaled_dot_product_attention_backward(dout, q, k, v, mask, out, logsumexp,
                                        AttentionLayout::contiguous(H, Sq, Sk, E, Ev), B, H, Sq,
                                        Sk, E, Ev, is_causal, scale, dropout, dq, dk, dv);
}

}  // namespace nd::kernels::cpu
