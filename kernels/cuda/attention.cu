// Flash-style attention on CUDA in f32 and f64: forward with an online softmax,
// FlashAttention-2 backward. The bf16 and f16 entry points (tensor cores) are attention_tc_forward.cu and
// attention_tc_backward.cu;
// what both files need (Problem, Head, the delta pass, the head-dim dispatch, the grid
// helpers) is attention.cuh.
//
// Why this shape: the scores of a query tile against a key tile are a TILE x TILE block that
// lives only in shared memory, so memory stays O(S) per head whatever the sequence length.
// The f32/f64 kernels are plain FMA arithmetic over shared-memory tiles: simple enough to
// check by reading, since no test of it runs on the machine that builds it.
//
// Layout of a block (kThreads threads): Q/K/V/dO tiles are [TILE][D + 1] in shared memory,
// zero-padded past the real head dim (E or Ev <= D) and past the last row; the extra
// column keeps threads that read a column of K (one key per lane) on distinct banks.
// Accumulators for a [TILE][D] output tile (out, dq, dk, dv) sit in registers: thread t owns
// elements t, t + kThreads, ... (row idx / D, column idx % D), so a warp covers one row's
// consecutive columns. Score tiles are [TILE][TILE + 1]; a thread owns elements the same way.
//
// Determinism: every output element is summed by one thread in a fixed order (keys within a
// tile, tiles in order), D_i by one warp's fixed shuffle tree; no atomics. dq therefore has
// its own pass over key tiles (FlashAttention-2's alternative to atomics), which recomputes
// the scores once more.
//
// Types: f32 and f64 compute in their own type. bf16 multiplies on tensor cores
// (attention_tc_*.cu) with f32 accumulation; only its delta pass (dout . out, f32 sums,
// attention.cuh) is SIMT code shared with these kernels.
//
// The online-softmax update and tile bounds are kernels/common/online_softmax.h (CPU-tested).
// Twin: kernels/cpu/attention.cpp. Test: tests/cuda/cuda_attention_test.cpp.
#include "kernels/cuda/attention.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/online_softmax.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cuda {

namespace {

constexpr size_t kSharedBytes = 48 * 1024;  // static shared memory, no opt-in needed

// Shared-memory elements of each kernel for a tile of t rows and head dim d: the forward's
// Q, K-or-V, S and row factors; the backward's Q, dO, K, V, P, dS, lse and delta.
__host__ __device__ constexpr size_t forward_shared(int t, int d) { return 2 * t * (d + 1) + t * (t + 1) + t; }
__host__ __device__ constexpr size_t backward_shared(int t, int d) {
  return 4 * t * (d + 1) + 2 * t * (t + 1) + 2 * t;
}

// The largest tile in {64, 32, 16, 8} whose shared memory fits: f32 forward 64/32/32 for
// D = 32/64/128, backward 32/32/16; f64 forward 32/32/16, backward 16/16/8.
template <class T, int D>
__host__ __device__ constexpr int forward_tile() {
  for (int t = 64; t > 8; t /= 2)
    if (forward_shared(t, D) * sizeof(T) <= kSharedBytes) return t;
  return 8;
}
template <class T, int D>
__host__ __device__ constexpr int backward_tile() {
  for (int t = 64; t > 8; t /= 2)
    if (backward_shared(t, D) * sizeof(T) <= kSharedBytes) return t;
  return 8;
}

template <class T>
__host__ __device__ constexpr T neg_inf() {
  return -static_cast<T>(INFINITY);
}


// tile[r][e] = src[(row0 + r) * width + e] for r < rows, e < width; 0 elsewhere.
template <int TILE, int D, class T, class S>
__device__ void load_tile(T (*tile)[D + 1], const S* src, int64_t row0, int64_t rows, int64_t width) {
  for (int idx = threadIdx.x; idx < TILE * D; idx += kThreads) {
    const int r = idx / D, e = idx % D;
    tile[r][e] = r < rows && e < width ? to_compute(src[(row0 + r) * width + e]) : T(0);
  }
}

// s_ij for tile row r (query i = i0 + r) and column c (key j = j0 + c), or -inf where the
// key may not be seen (causal, past Sk) or the row is padding (r >= rows).
template <int D, class S, class T = compute_t<S>>
__device__ T score(const Problem<S>& p, const Head<S>& hd, const T (*sq)[D + 1], const T (*sk)[D + 1], int r,
                   int c, int64_t i0, int64_t j0, int64_t rows) {
  const int64_t i = i0 + r, j = j0 + c;
  if (r >= rows || !attention_allowed(i, j, p.Sk, p.is_causal)) return neg_inf<T>();
  T dot = 0;
#pragma unroll 16
  for (int e = 0; e < D; ++e) dot += sq[r][e] * sk[c][e];
  const T s = p.scale * dot;
  return hd.mask ? s + to_compute(hd.mask[i * p.mask.stride_q + j * p.mask.stride_k]) : s;
}

// ---- forward: one block per (query tile, b*h) ----------------------------------------
//   for each key tile: S = scale Q K^T + mask; per row m' = max(m, rowmax S), P = exp(S - m'),
//   l = l exp(m - m') + rowsum P, acc = acc exp(m - m') + (P Z) V;   finally out = acc / l
//   (Z: the dropout factors, all 1 without dropout; l sums the undropped P).
template <class S, int D>
__global__ void __launch_bounds__(kThreads) forward_kernel(Problem<S> p, int64_t n_tiles, S* out,
                                                           compute_t<S>* lse) {
  using T = compute_t<S>;
  constexpr int TILE = forward_tile<T, D>(), kAcc = TILE * D / kThreads;
  __shared__ T sq[TILE][D + 1];
  __shared__ T skv[TILE][D + 1];  // K for the scores, then V for P V
  __shared__ T ss[TILE][TILE + 1];
  __shared__ T srow[TILE];  // per row: the correction exp(m - m'), at the end 1 / l

  const TileOfBlock tb = tile_of_block(blockIdx.x, n_tiles);
  const Head<S> hd(p, tb.bh);
  const int64_t i0 = tb.tile * TILE, rows = p.Sq - i0 < TILE ? p.Sq - i0 : TILE;
  load_tile<TILE, D>(sq, hd.q, i0, rows, p.E);

  T acc[kAcc] = {};
  OnlineSoftmax<T> row_state;  // of row threadIdx.x, in threads < TILE
  const int64_t key_end = attention_key_end(i0 + rows, p.Sk, p.is_causal);
  for (int64_t j0 = 0; j0 < key_end; j0 += TILE) {
    const int64_t cols = key_end - j0 < TILE ? key_end - j0 : TILE;
    __syncthreads();  // the previous tile's P V is done with skv
    load_tile<TILE, D>(skv, hd.k, j0, cols, p.E);
    __syncthreads();
    for (int idx = threadIdx.x; idx < TILE * TILE; idx += kThreads) {
      const int r = idx / TILE, c = idx % TILE;
      ss[r][c] = score<D>(p, hd, sq, skv, r, c, i0, j0, rows);
    }
    __syncthreads();
    load_tile<TILE, D>(skv, hd.v, j0, cols, p.Ev);  // scores are in ss now
    if (threadIdx.x < TILE) {
      const int r = threadIdx.x;
      T block_max = neg_inf<T>();
      for (int c = 0; c < TILE; ++c) block_max = ss[r][c] > block_max ? ss[r][c] : block_max;
      srow[r] = row_state.begin_block(block_max);
      for (int c = 0; c < TILE; ++c) {
        const T w = row_state.weight(ss[r][c]);
        row_state.add(w);
        ss[r][c] = w * p.dropout_factor(tb.bh, i0 + r, j0 + c);
      }
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      const int idx = threadIdx.x + a * kThreads, r = idx / D, e = idx % D;
      T sum = 0;
      for (int c = 0; c < TILE; ++c) sum += ss[r][c] * skv[c][e];
      acc[a] = acc[a] * srow[r] + sum;
    }
  }
  __syncthreads();  // every reader of srow's corrections is done
  if (threadIdx.x < TILE) {
    srow[threadIdx.x] = row_state.inverse_sum();  // 0 for a row with no allowed key: out = 0
    if (threadIdx.x < rows) lse[tb.bh * p.Sq + i0 + threadIdx.x] = row_state.logsumexp();
  }
  __syncthreads();
  S* out_head = out + tb.bh * p.Sq * p.Ev;
#pragma unroll
  for (int a = 0; a < kAcc; ++a) {
    const int idx = threadIdx.x + a * kThreads, r = idx / D, e = idx % D;
    if (r < rows && e < p.Ev) store(out_head + (i0 + r) * p.Ev + e, acc[a] * srow[r]);
  }
}

// ---- backward ----------------------------------------------------------------------

// The shared-memory tiles of both backward kernels: one query tile (Q, dO, lse, delta), one
// key tile (K, V) and the dS block between them.
template <class S, int TILE, int D>
struct BackwardTiles {
  using T = compute_t<S>;
  T q[TILE][D + 1], dout[TILE][D + 1], k[TILE][D + 1], v[TILE][D + 1];
  T ds[TILE][TILE + 1];
  T lse[TILE], delta[TILE];

  // Query rows [i0, i0 + rows); padding rows get lse = -inf, so their P is 0.
  __device__ void load_queries(const Problem<S>& p, const Head<S>& hd, int64_t i0, int64_t rows) {
    load_tile<TILE, D>(q, hd.q, i0, rows, p.E);
    load_tile<TILE, D>(dout, hd.dout, i0, rows, p.Ev);
    load_row_stats(lse, delta, TILE, hd, i0, rows);
  }
  // Keys [j0, j0 + cols).
  __device__ void load_keys(const Problem<S>& p, const Head<S>& hd, int64_t j0, int64_t cols) {
    load_tile<TILE, D>(k, hd.k, j0, cols, p.E);
    load_tile<TILE, D>(v, hd.v, j0, cols, p.Ev);
  }
  // For the loaded pair of head bh: P_rc Z_rc = exp(s_rc - lse_r) Z_rc into p_out (when given) and
  //   dS_rc = P_rc (Z_rc dout_r . v_c - delta_r) into ds (Z: the dropout factors, 1 without).
  // A fully masked row (lse = -inf) and any disallowed key get P = dS = 0.
  __device__ void probabilities_and_ds(const Problem<S>& p, const Head<S>& hd, int64_t bh, int64_t i0, int64_t j0,
                                       int64_t rows, T (*p_out)[TILE + 1]) {
    for (int idx = threadIdx.x; idx < TILE * TILE; idx += kThreads) {
      const int r = idx / TILE, c = idx % TILE;
      const T prob = probability_from_lse(score<D>(p, hd, q, k, r, c, i0, j0, rows), lse[r]);
      const T z = p.dropout_factor(bh, i0 + r, j0 + c);
      T dsv = 0;
      if (prob != T(0)) {
        T dp = 0;
#pragma unroll 16
        for (int e = 0; e < D; ++e) dp += dout[r][e] * v[c][e];
        dsv = prob * (z * dp - delta[r]);
      }
      if (p_out) p_out[r][c] = prob * z;
      ds[r][c] = dsv;
    }
  }
};

// One block per (key tile, b*h): over every query tile that sees the keys,
//   dV += P^T dO,   dK += dS^T Q;   then dk = scale dK.
template <class S, int D>
__global__ void __launch_bounds__(kThreads) dk_dv_kernel(Problem<S> p, int64_t n_tiles, S* dk, S* dv) {
  using T = compute_t<S>;
  constexpr int TILE = backward_tile<T, D>(), kAcc = TILE * D / kThreads;
  __shared__ BackwardTiles<S, TILE, D> t;
  __shared__ T sp[TILE][TILE + 1];

  const TileOfBlock tb = tile_of_block(blockIdx.x, n_tiles);
  const Head<S> hd(p, tb.bh);
  const int64_t j0 = tb.tile * TILE, cols = p.Sk - j0 < TILE ? p.Sk - j0 : TILE;
  t.load_keys(p, hd, j0, cols);

  T acc_dk[kAcc] = {}, acc_dv[kAcc] = {};  // element (c, e) = (idx / D, idx % D)
  for (int64_t i0 = attention_first_query_tile(j0, TILE, p.is_causal) * TILE; i0 < p.Sq; i0 += TILE) {
    const int64_t rows = p.Sq - i0 < TILE ? p.Sq - i0 : TILE;
    __syncthreads();  // the previous query tile's readers are done
    t.load_queries(p, hd, i0, rows);
    __syncthreads();
    t.probabilities_and_ds(p, hd, tb.bh, i0, j0, rows, sp);
    __syncthreads();
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      const int idx = threadIdx.x + a * kThreads, c = idx / D, e = idx % D;
      T sum_dv = 0, sum_dk = 0;
      for (int r = 0; r < TILE; ++r) {
        sum_dv += sp[r][c] * t.dout[r][e];
        sum_dk += t.ds[r][c] * t.q[r][e];
      }
      acc_dv[a] += sum_dv;
      acc_dk[a] += sum_dk;
    }
  }
  S* dk_head = dk + tb.bh * p.Sk * p.E;
  S* dv_head = dv + tb.bh * p.Sk * p.Ev;
#pragma unroll
  for (int a = 0; a < kAcc; ++a) {
    const int idx = threadIdx.x + a * kThreads, c = idx / D, e = idx % D;
    if (c < cols && e < p.E) store(dk_head + (j0 + c) * p.E + e, p.scale * acc_dk[a]);
    if (c < cols && e < p.Ev) store(dv_head + (j0 + c) * p.Ev + e, acc_dv[a]);
  }
}

// One block per (query tile, b*h): over every key tile the rows see, dQ += dS K; dq = scale dQ.
template <class S, int D>
__global__ void __launch_bounds__(kThreads) dq_kernel(Problem<S> p, int64_t n_tiles, S* dq) {
  using T = compute_t<S>;
  constexpr int TILE = backward_tile<T, D>(), kAcc = TILE * D / kThreads;
  __shared__ BackwardTiles<S, TILE, D> t;

  const TileOfBlock tb = tile_of_block(blockIdx.x, n_tiles);
  const Head<S> hd(p, tb.bh);
  const int64_t i0 = tb.tile * TILE, rows = p.Sq - i0 < TILE ? p.Sq - i0 : TILE;
  t.load_queries(p, hd, i0, rows);

  T acc[kAcc] = {};  // element (r, e) = (idx / D, idx % D)
  const int64_t key_end = attention_key_end(i0 + rows, p.Sk, p.is_causal);
  for (int64_t j0 = 0; j0 < key_end; j0 += TILE) {
    const int64_t cols = key_end - j0 < TILE ? key_end - j0 : TILE;
    __syncthreads();  // the previous key tile's readers are done
    t.load_keys(p, hd, j0, cols);
    __syncthreads();
    t.probabilities_and_ds(p, hd, tb.bh, i0, j0, rows, nullptr);
    __syncthreads();
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      const int idx = threadIdx.x + a * kThreads, r = idx / D, e = idx % D;
      T sum = 0;
      for (int c = 0; c < TILE; ++c) sum += t.ds[r][c] * t.k[c][e];
      acc[a] += sum;
    }
  }
  S* dq_head = dq + tb.bh * p.Sq * p.E;
#pragma unroll
  for (int a = 0; a < kAcc; ++a) {
    const int idx = threadIdx.x + a * kThreads, r = idx / D, e = idx % D;
    if (r < rows && e < p.E) store(dq_head + (i0 + r) * p.E + e, p.scale * acc[a]);
  }
}
// ---- launchers ---------------------------------------------------------------------
template <class S, int D>
void forward_for(const Problem<S>& p, int64_t BH, S* out, compute_t<S>* lse, cudaStream_t stream) {
  using T = compute_t<S>;
  constexpr int TILE = forward_tile<T, D>();
  static_assert(forward_shared(TILE, D) * sizeof(T) <= kSharedBytes && TILE * D % kThreads == 0);
  const int64_t n_tiles = ceil_div(p.Sq, TILE);
  forward_kernel<S, D><<<grid_for("attention forward", BH, n_tiles), kThreads, 0, stream>>>(p, n_tiles, out, lse);
  check_launch("attention forward");
}

template <class S, int D>
void backward_for(const Problem<S>& p, int64_t BH, S* dq, S* dk, S* dv, cudaStream_t stream) {
  using T = compute_t<S>;
  constexpr int TILE = backward_tile<T, D>();
  static_assert(backward_shared(TILE, D) * sizeof(T) <= kSharedBytes && TILE * D % kThreads == 0);
  static_assert(sizeof(BackwardTiles<S, TILE, D>) + TILE * (TILE + 1) * sizeof(T) ==
                backward_shared(TILE, D) * sizeof(T));
  if (p.Sk > 0) {  // dk, dv: written even when Sq == 0 (then zero)
    const int64_t n_tiles = ceil_div(p.Sk, TILE);
    dk_dv_kernel<S, D><<<grid_for("attention backward dk, dv", BH, n_tiles), kThreads, 0, stream>>>(p, n_tiles,
                                                                                                     dk, dv);
    check_launch("attention backward dk, dv");
  }
  if (p.Sq > 0) {
    const int64_t n_tiles = ceil_div(p.Sq, TILE);
    dq_kernel<S, D><<<grid_for("attention backward dq", BH, n_tiles), kThreads, 0, stream>>>(p, n_tiles, dq);
    check_launch("attention backward dq");
  }
}
}  // namespace
template <typename T>
void scaled_dot_product_attention_forward(const T* q, const T* k, const T* v, AttentionMask<T> mask, int64_t B,
                                          int64_t H, int64_t Sq, int64_t Sk, int64_t E, int64_t Ev,
                                          bool is_causal, double scale, const AttentionDropout& dropout,
                                          T* out, T* logsumexp, cudaStream_t stream) {
  run_forward<T>("attention forward", q, k, v, mask, B, H, Sq, Sk, E, Ev, is_causal, scale, dropout,
                 [&](auto D, const Problem<T>& p, int64_t BH) {
                   forward_for<T, decltype(D)::value>(p, BH, out, logsumexp, stream);
                 });
}

template <typename T>
void scaled_dot_product_attention_backward(const T* dout, const T* q, const T* k, const T* v,
                                           AttentionMask<T> mask, const T* out, const T* logsumexp, int64_t B,
                                           int64_t H, int64_t Sq, int64_t Sk, int64_t E, int64_t Ev,
                                           bool is_causal, double scale, const AttentionDropout& dropout,
                                           T* dq, T* dk, T* dv, cudaStream_t stream) {
  run_backward<T>("attention backward", dout, q, k, v, mask, out, logsumexp, B, H, Sq, Sk, E, Ev, is_causal, scale,
                  dropout, stream, [&](auto D, const Problem<T>& p, int64_t BH) {
                    backward_for<T, decltype(D)::value>(p, BH, dq, dk, dv, stream);
                  });
}
#define ND_INSTANTIATE(T)                                                                                      \
  template void scaled_dot_product_attention_forward<T>(const T*, const T*, const T*, AttentionMask<T>,       \
                                                        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, \
                                                        bool, double, const AttentionDropout&, T*, T*,        \
                                                        cudaStream_t);                                        \
  template void scaled_dot_product_attention_backward<T>(                                                      \
      const T*, const T*, const T*, const T*, AttentionMask<T>, const T*, const T*, int64_t, int64_t, int64_t, \
      int64_t, int64_t, int64_t, bool, double, const AttentionDropout&, T*, T*, T*, cudaStream_t);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cuda
