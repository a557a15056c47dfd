#pragma once
// CUDA twin of kernels/cpu/attention.h: fused, flash-style scaled-dot-product attention.
// The forward runs one thread block per (query tile, b*h): K/V tiles pass through shared
// memory, each query row keeps an online softmax (kernels/common/online_softmax.h), and only
// out and logsumexp [B, H, Sq] reach global memory, never an Sq x Sk matrix. The backward is
// FlashAttention-2's: D_i = dout_i . out_i first, then one block per (key tile, b*h) that
// sums dk, dv over the query tiles, then one block per (query tile, b*h) that sums dq over
// the key tiles. No atomics: every element is summed by one thread in a fixed order, so the
// results are bit-reproducible run to run.
// Head dims E, Ev <= 128, compiled for 32, 64 and 128 (other sizes are zero-padded up to the
// next of these). f32 and f64 run SIMT FMA kernels (the engine's exact path); bf16 runs on
// tensor cores (mma.sync m16n8k16 bf16 or f16, f32 accumulation), forward and backward: the
// forward on 128-row query tiles, the backward on 64-row tiles, up to 103 KiB of dynamic
// shared memory per block (sm_90).
// Kernels: kernels/cuda/attention.cu (f32, f64), attention_tc_forward.cu and
// attention_tc_backward.cu (bf16 and f16). Tests:
// tests/cuda/cuda_attention_test.cpp (against the CPU), tests/kernels/online_softmax_test.cpp
// (the shared math).
#include <cstdint>

#include "kernels/common/float16.h"
#include "kernels/common/attention_layout.h"
#include "kernels/common/dropout_mask.h"
#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

using kernels::AttentionDropout;
using kernels::AttentionMask;

// The largest head dim (E and Ev) the kernels take.
constexpr int64_t kAttentionMaxHeadDim = 128;

// Same contract as cpu::scaled_dot_product_attention_forward, on device pointers, queued on
// `stream`: for each (b, h) and query row i, over the allowed keys j,
//   s_ij = scale * q_i . k_j + mask_ij,  lse_i = log sum_j exp(s_ij),
//   out_i = sum_j exp(s_ij - lse_i) Z_ij v_j  (Z_ij: `dropout`'s factor, the CPU's);
// a row with no allowed key gets out_i = 0 and lse_i = -inf.
// requires: q [B, H, Sq, E], k [B, H, Sk, E], v [B, H, Sk, Ev], out [B, H, Sq, Ev],
//           logsumexp [B, H, Sq], mask (if any) on the device; E, Ev <= 128 (else nd::Error);
//           out does not alias q, k, v. T = float (f32 accumulation) or double.
// ensures: writes out and logsumexp.
template <typename T>
void scaled_dot_product_attention_forward(const T* q, const T* k, const T* v, AttentionMask<T> mask, int64_t B,
                                          int64_t H, int64_t Sq, int64_t Sk, int64_t E, int64_t Ev,
                                          bool is_causal, double scale, const AttentionDropout& dropout,
                                          T* out, T* logsumexp, cudaStream_t stream);

// Same contract as cpu::scaled_dot_product_attention_backward: with P recomputed from
// logsumexp, Z from the forward's `dropout` and D_i = dout_i . out_i,
//   dv_j = sum_i P_ij Z_ij dout_i,  dS_ij = P_ij (Z_ij dout_i . v_j - D_i),
//   dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i.
// requires: the forward's inputs and its out, logsumexp; dout [B, H, Sq, Ev]; dq, dk, dv
//           shaped like q, k, v, aliasing no input; E, Ev <= 128.
// ensures: writes (not accumulates) dq, dk, dv, bit-identically on every run; a fully masked
//          row contributes nothing. Uses B*H*Sq elements of scratch from the caching allocator.
template <typename T>
void scaled_dot_product_attention_backward(const T* dout, const T* q, const T* k, const T* v,
                                           AttentionMask<T> mask, const T* out, const T* logsumexp, int64_t B,
                                           int64_t H, int64_t Sq, int64_t Sk, int64_t E, int64_t Ev,
                                           bool is_causal, double scale, const AttentionDropout& dropout,
                                           T* dq, T* dk, T* dv, cudaStream_t stream);

// bf16 on tensor cores, with an f32 logsumexp: what f32 attention under autocast runs
// (engine/ops/attention.cpp), and what bench/bench_kernels times. Same contracts as above,
// with bf16 rounding at fixed points: the probabilities P (forward and backward) and dS
// (backward) are rounded to bf16 before they multiply V, dO, Q or K (P after its dropout
// factor: round(P Z)); every product
// accumulates in f32 (scores, logsumexp, delta, accumulators); out, dq, dk, dv are rounded
// once, at the end. Also bit-reproducible, no atomics; a fully masked row gives out = 0,
// lse = -inf and no gradient. Needs sm_80 or newer with at least 103 KiB of shared memory
// per block (nd::Error from cudaFuncSetAttribute otherwise).
void scaled_dot_product_attention_forward(const BFloat16* q, const BFloat16* k, const BFloat16* v,
                                          AttentionMask<BFloat16> mask, int64_t B, int64_t H, int64_t Sq,
                                          int64_t Sk, int64_t E, int64_t Ev, bool is_causal, double scale,
                                          const AttentionDropout& dropout, BFloat16* out, float* logsumexp,
                                          cudaStream_t stream);
void scaled_dot_product_attention_backward(const BFloat16* dout, const BFloat16* q, const BFloat16* k,
                                           const BFloat16* v, AttentionMask<BFloat16> mask, const BFloat16* out,
                                           const float* logsumexp, int64_t B, int64_t H, int64_t Sq, int64_t Sk,
                                           int64_t E, int64_t Ev, bool is_causal, double scale,
                                           const AttentionDropout& dropout, BFloat16* dq, BFloat16* dk,
                                           BFloat16* dv, cudaStream_t stream);

// The same kernels with f16 operands (autocast to f16): the same tiles and rounding points,
// with f16 in place of bf16 (P and dS rounded to f16, f16 x f16 products on tensor cores).
void scaled_dot_product_attention_forward(const Half* q, const Half* k, const Half* v, AttentionMask<Half> mask,
                                          int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t E, int64_t Ev,
                                          bool is_causal, double scale, const AttentionDropout& dropout,
                                          Half* out, float* logsumexp, cudaStream_t stream);
void scaled_dot_product_attention_backward(const Half* dout, const Half* q, const Half* k, const Half* v,
                                           AttentionMask<Half> mask, const Half* out, const float* logsumexp,
                                           int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t E, int64_t Ev,
                                           bool is_causal, double scale, const AttentionDropout& dropout,
                                           Half* dq, Half* dk, Half* dv, cudaStream_t stream);

}  // namespace nd::kernels::cuda
