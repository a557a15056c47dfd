// Flash-style attention on CUDA: forward with an online softmax, FlashAttention-2 backward.
//
// Why this shape: the scores of a query tile against a key tile are a TILE x TILE block that
// lives only in shared memory, so memory stays O(S) per head whatever the sequence length.
// The f32/f64 kernels are plain FMA arithmetic over shared-memory tiles: simple enough to
// check by reading, since no test of it runs on the machine that builds it.
//
// The layout and determinism notes below are the f32/f64 kernels'; bf16 runs on tensor
// cores (the section "bf16 on tensor cores" has its own layout and rounding points).
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
// Types: f32 and f64 compute in their own type. bf16 multiplies on tensor cores (WMMA) with
// f32 accumulation; only its delta pass (dout . out, f32 sums) shares the SIMT code.
//
// The online-softmax update and tile bounds are kernels/common/online_softmax.h (CPU-tested).
// Twin: kernels/cpu/attention.cpp. Test: tests/cuda/cuda_attention_test.cpp.
#include "kernels/cuda/attention.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include <string>

#include "kernels/common/float16.h"
#include "kernels/common/online_softmax.h"
#include "kernels/cuda/scratch.cuh"

namespace nd::kernels::cuda {

namespace {

constexpr int kThreads = 128;
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

// Storage type S (in global memory) and arithmetic type compute_t<S> (shared memory,
// registers, logsumexp and delta): the same for f32 and f64; f32 for bf16.
template <class S>
struct ComputeType {
  using type = S;
};
template <>
struct ComputeType<BFloat16> {
  using type = float;
};
template <class S>
using compute_t = typename ComputeType<S>::type;

template <class T>
__device__ T to_compute(T x) {
  return x;
}
__device__ float to_compute(BFloat16 x) { return __bfloat162float(__ushort_as_bfloat16(x.bits)); }
template <class T>
__device__ void store(T* p, T v) {
  *p = v;
}
__device__ void store(BFloat16* p, float v) { p->bits = __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

// Everything a kernel needs, by value.
template <class S>
struct Problem {
  using T = compute_t<S>;
  const S *q, *k, *v, *out, *dout;
  const T *lse, *delta;
  AttentionMask<S> mask;
  int64_t H, Sq, Sk, E, Ev;
  bool is_causal;
  T scale;
};

// One head's slice of the arrays and of the mask (base == nullptr: no mask).
template <class S>
struct Head {
  using T = compute_t<S>;
  const S *q, *k, *v, *out, *dout, *mask;
  const T *lse, *delta;
  __device__ Head(const Problem<S>& p, int64_t bh) {
    const int64_t b = bh / p.H, h = bh % p.H;
    q = p.q + bh * p.Sq * p.E;
    k = p.k + bh * p.Sk * p.E;
    v = p.v + bh * p.Sk * p.Ev;
    out = p.out ? p.out + bh * p.Sq * p.Ev : nullptr;
    lse = p.lse ? p.lse + bh * p.Sq : nullptr;
    dout = p.dout ? p.dout + bh * p.Sq * p.Ev : nullptr;
    delta = p.delta ? p.delta + bh * p.Sq : nullptr;
    mask = p.mask.data ? p.mask.data + b * p.mask.stride_b + h * p.mask.stride_h : nullptr;
  }
};

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
//   l = l exp(m - m') + rowsum P, acc = acc exp(m - m') + P V;   finally out = acc / l.
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
        ss[r][c] = w;
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

// delta_i = dout_i . out_i, one warp per row (a fixed shuffle tree: deterministic).
template <class S, class T = compute_t<S>>
__global__ void __launch_bounds__(kThreads) delta_kernel(int64_t rows, int64_t Ev, const S* dout, const S* out,
                                                         T* delta) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t row = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32; row < rows;
       row += int64_t(gridDim.x) * kWarps) {
    T sum = 0;
    for (int64_t e = lane; e < Ev; e += 32) sum += to_compute(dout[row * Ev + e]) * to_compute(out[row * Ev + e]);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) delta[row] = sum;
  }
}

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
    for (int r = threadIdx.x; r < TILE; r += kThreads) {
      lse[r] = r < rows ? hd.lse[i0 + r] : neg_inf<T>();
      delta[r] = r < rows ? hd.delta[i0 + r] : T(0);
    }
  }
  // Keys [j0, j0 + cols).
  __device__ void load_keys(const Problem<S>& p, const Head<S>& hd, int64_t j0, int64_t cols) {
    load_tile<TILE, D>(k, hd.k, j0, cols, p.E);
    load_tile<TILE, D>(v, hd.v, j0, cols, p.Ev);
  }
  // For the loaded pair: P_rc = exp(s_rc - lse_r) into p_out (when given) and
  //   dS_rc = P_rc (dout_r . v_c - delta_r) into ds.
  // A fully masked row (lse = -inf) and any disallowed key get P = dS = 0.
  __device__ void probabilities_and_ds(const Problem<S>& p, const Head<S>& hd, int64_t i0, int64_t j0,
                                       int64_t rows, T (*p_out)[TILE + 1]) {
    for (int idx = threadIdx.x; idx < TILE * TILE; idx += kThreads) {
      const int r = idx / TILE, c = idx % TILE;
      const T prob = probability_from_lse(score<D>(p, hd, q, k, r, c, i0, j0, rows), lse[r]);
      T dsv = 0;
      if (prob != T(0)) {
        T dp = 0;
#pragma unroll 16
        for (int e = 0; e < D; ++e) dp += dout[r][e] * v[c][e];
        dsv = prob * (dp - delta[r]);
      }
      if (p_out) p_out[r][c] = prob;
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
    t.probabilities_and_ds(p, hd, i0, j0, rows, sp);
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
    t.probabilities_and_ds(p, hd, i0, j0, rows, nullptr);
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

// ---- bf16 on tensor cores (WMMA) ---------------------------------------------------
//
// The bf16 entry points multiply on tensor cores through the documented WMMA API (bf16
// m16n16k16 fragments, f32 accumulators). Query and key tiles are both kTcTile = 64 rows and
// a block is 4 warps; warp w owns 16 rows of its block's tile (queries in the forward and dq
// kernels, keys in the dk/dv kernel), so the score rows a warp computes are exactly the rows
// whose softmax it updates and whose output it accumulates: inside a key (or query) tile the
// warps need only __syncwarp; __syncthreads guards the tiles all warps read. Per tile, a warp
//   1. S = A B^T into its 16 x 64 f32 slice of a shared tile (wmma, f32 accumulation of
//      exact bf16 x bf16 products),
//   2. turns S into probabilities with SIMT lanes (online_softmax.h, the mask, causality),
//      rounds them (and dS in the backward) to bf16 into shared memory,
//   3. accumulates (P or dS) times the other operand tile into f32 accumulator fragments.
// The output accumulators stay in fragments for the whole loop. The forward's per-row
// rescale exp(m - m') cannot be applied to a fragment directly (which element is which row
// is unspecified), so the warp writes the row factors into a 16 x 16 f32 tile (factor of row
// r in every column of row r), loads that as an accumulator fragment of the same type and
// multiplies element by element: two fragments of one type loaded or computed with one
// layout share their element mapping (the CUDA guide's alpha/beta epilogue relies on the
// same), so this scales each row by its factor without knowing the mapping. It moves 1 KiB
// of shared memory per warp and tile, where keeping O in shared memory would move the whole
// 16 x D f32 slice twice (store and load around every mma); results are read out once, at
// the end, through the same shared slice.
// Rounding points, all round-to-nearest-even: P = exp(s - m) to bf16 before P V (the row
// sum l adds the f32 weights, as FlashAttention does); in the backward P and dS to bf16
// before dV = P^T dO, dK = dS^T Q and dQ = dS K; out, dq, dk, dv once at the end. The scores,
// logsumexp, delta and every accumulator are f32. Bit-reproducible: each element is summed
// by one fixed sequence of mma and SIMT operations, no atomics.
// Checked so far only on a CPU emulation of the kernel bodies (a thread per CUDA thread,
// WMMA emulated, warp-collective calls checked) against the f32 CPU kernel: within 6.6e-3
// of the largest |value| of each output on tests/cuda's shapes. No GPU has run them yet.

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kTcWarps = kThreads / 32;  // 4
constexpr int kTcTile = 16 * kTcWarps;   // rows of a query tile and of a key tile: 64

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Dynamic shared memory of the kernels for head dim D (bytes; every region a multiple of
// 128 bytes, so each 16-row or 16-column fragment pointer is 32-byte aligned). Leading
// dimensions: bf16 operand tiles [64][D + 8], f32 score tiles [64][64 + 4], bf16 probability
// tiles [64][64 + 8] (multiples of 8 bf16 / 4 f32 as WMMA requires; the padding spreads rows
// over banks).
template <int D>
struct TcLayout {
  static constexpr int ld_in = D + 8, ld_f = kTcTile + 4, ld_b = kTcTile + 8;
  static constexpr size_t in_bytes = size_t(kTcTile) * ld_in * 2;
  static constexpr size_t f_bytes = size_t(kTcTile) * ld_f * 4;
  static constexpr size_t b_bytes = size_t(kTcTile) * ld_b * 2;
  static constexpr size_t corr_bytes = size_t(kTcWarps) * 16 * 16 * 4;
  static constexpr size_t row_bytes = size_t(kTcTile) * 4;
  // forward: Q, K, V | S | P | row-factor tiles | 1 / l
  static constexpr size_t forward = 3 * in_bytes + f_bytes + b_bytes + corr_bytes + row_bytes;
  // backward dk/dv: Q, dO, K, V | S, dP | P, dS | lse, delta; dq: the same without P (so at
  // D = 128 two dq blocks fit on an SM, 111.5 KiB each; dk/dv takes 120.5 KiB)
  static constexpr size_t backward_dq = 4 * in_bytes + 2 * f_bytes + b_bytes + 2 * row_bytes;
  static constexpr size_t backward = backward_dq + b_bytes;
  static_assert(in_bytes % 128 == 0 && f_bytes % 128 == 0 && b_bytes % 128 == 0 && corr_bytes % 128 == 0 &&
                row_bytes % 128 == 0);
  static_assert(backward <= 227 * 1024 && forward <= 227 * 1024, "sm_90 allows 227 KiB per block");
};

// Carves consecutive regions out of the dynamic shared memory.
struct SharedCarver {
  unsigned char* next;
  template <class T>
  __device__ T* take(size_t bytes) {
    T* p = reinterpret_cast<T*>(next);
    next += bytes;
    return p;
  }
};

// dst[r * (D + 8) + e] = src[(row0 + r) * width + e] for r < rows, e < width, and 0 for the
// rest of the [64][D] tile (padding rows and columns must be 0, not stale: they enter the
// products). 16-byte loads when every row starts 16-byte aligned (the common case).
template <int D>
__device__ void tc_load(bf16* dst, const BFloat16* src, int64_t row0, int64_t rows, int64_t width) {
  constexpr int ld = D + 8;
  if (width % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    constexpr int kChunks = D / 8;
    for (int idx = threadIdx.x; idx < kTcTile * kChunks; idx += kThreads) {
      const int r = idx / kChunks, e = idx % kChunks * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows && e < width) v = *reinterpret_cast<const uint4*>(src + (row0 + r) * width + e);
      *reinterpret_cast<uint4*>(dst + r * ld + e) = v;
    }
  } else {
    for (int idx = threadIdx.x; idx < kTcTile * D; idx += kThreads) {
      const int r = idx / D, e = idx % D;
      dst[r * ld + e] = __ushort_as_bfloat16(r < rows && e < width ? src[(row0 + r) * width + e].bits : 0);
    }
  }
}

// s_ij = scale * dot + mask_ij, or -inf where key j may not be seen by query i or the row
// is padding (valid == false).
__device__ float tc_score(const Problem<BFloat16>& p, const Head<BFloat16>& hd, float dot, int64_t i, int64_t j,
                          bool valid) {
  if (!valid || !attention_allowed(i, j, p.Sk, p.is_causal)) return -INFINITY;
  const float s = p.scale * dot;
  return hd.mask ? s + to_compute(hd.mask[i * p.mask.stride_q + j * p.mask.stride_k]) : s;
}

// Fragment counts skip work on padding (block-uniform, so every wmma call stays
// warp-uniform): a tile's rows past the sequence's end and head-dim columns past E or Ev are
// zero in shared memory, so their products add nothing; score columns past the tile's last
// key (or query) get P = dS = 0 from the SIMT passes, which skip whole 16-column blocks of them.
// The MAE's short sequences (13 and 50 rows in a 64-row tile) and small heads gain most.
__host__ __device__ constexpr int frags16(int64_t n) { return static_cast<int>((n + 15) / 16); }

// The warp's 16 rows A [16][D] (bf16, ld D + 8) as matrix_a fragments: the first k_frags
// of them (the others stay unused).
template <int D>
__device__ void warp_rows(FragA (&fa)[D / 16], const bf16* a, int k_frags) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    if (kk < k_frags) wmma::load_matrix_sync(fa[kk], a + 16 * kk, D + 8);
}

// out[16][16 n] (f32, ld 64 + 4) = A B^T for n < n_frags, for the warp's 16 rows A
// (fragments) and a tile B [64][D] (bf16, ld D + 8; B^T read as a col-major matrix_b),
// over the first k_frags 16-column blocks of the head dim.
template <int D>
__device__ void warp_scores(float* out, const FragA (&fa)[D / 16], const bf16* b, int n_frags, int k_frags) {
  constexpr int ld = D + 8;
#pragma unroll
  for (int n = 0; n < kTcTile / 16; ++n) {
    if (n >= n_frags) break;
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      if (kk >= k_frags) break;
      FragBCol fb;
      wmma::load_matrix_sync(fb, b + 16 * n * ld + 16 * kk, ld);
      wmma::mma_sync(acc, fa[kk], fb, acc);
    }
    wmma::store_matrix_sync(out + 16 * n, acc, kTcTile + 4, wmma::mem_row_major);
  }
}
template <int D>
__device__ void warp_scores(float* out, const bf16* a, const bf16* b, int n_frags, int k_frags) {
  FragA fa[D / 16];
  warp_rows<D>(fa, a, k_frags);
  warp_scores<D>(out, fa, b, n_frags, k_frags);
}

// acc[d] += A B[:, 16d .. 16d + 16) for d < d_frags, for the warp's A [16][64] (bf16,
// ld 64 + 8) and a tile B [64][D] (bf16, ld D + 8, row-major matrix_b), over the first
// k_frags 16-row blocks of B (A is 0 past them).
template <int D>
__device__ void warp_accumulate(FragC (&acc)[D / 16], const bf16* a, const bf16* b, int k_frags, int d_frags) {
  constexpr int ld = D + 8;
  FragA fa[kTcTile / 16];
#pragma unroll
  for (int kk = 0; kk < kTcTile / 16; ++kk)
    if (kk < k_frags) wmma::load_matrix_sync(fa[kk], a + 16 * kk, kTcTile + 8);
#pragma unroll
  for (int d = 0; d < D / 16; ++d) {
    if (d >= d_frags) break;
#pragma unroll
    for (int kk = 0; kk < kTcTile / 16; ++kk) {
      if (kk >= k_frags) break;
      FragBRow fb;
      wmma::load_matrix_sync(fb, b + 16 * kk * ld + 16 * d, ld);
      wmma::mma_sync(acc[d], fa[kk], fb, acc[d]);
    }
  }
}

// Writes the warp's 16 x D accumulators to dst[r * width + e] (bf16) for r < rows,
// e < width, times row_factor[r] (or `factor` when row_factor is null), through the warp's
// f32 staging slice [16][64 + 4] in blocks of at most 64 columns.
template <int D>
__device__ void warp_store(FragC (&acc)[D / 16], float* stage, const float* row_factor, float factor,
                           BFloat16* dst, int64_t rows, int64_t width) {
  constexpr int kChunk = D < kTcTile ? D : kTcTile, ld = kTcTile + 4;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int c0 = 0; c0 < D; c0 += kChunk) {
    __syncwarp();  // earlier readers of the staging slice are done
#pragma unroll
    for (int d = 0; d < kChunk / 16; ++d)
      wmma::store_matrix_sync(stage + 16 * d, acc[c0 / 16 + d], ld, wmma::mem_row_major);
    __syncwarp();
    for (int idx = lane; idx < 16 * kChunk; idx += 32) {
      const int r = idx / kChunk, c = idx % kChunk;
      if (r < rows && c0 + c < width)
        store(dst + r * width + c0 + c, stage[r * ld + c] * (row_factor ? row_factor[r] : factor));
    }
  }
}

// Forward: one block per (query tile, b*h); see the section comment.
template <int D>
__global__ void __launch_bounds__(kThreads) tc_forward_kernel(Problem<BFloat16> p, int64_t n_tiles, BFloat16* out,
                                                              float* lse) {
  using L = TcLayout<D>;
  extern __shared__ __align__(128) unsigned char tc_shared[];
  SharedCarver carve{tc_shared};
  bf16* sq = carve.take<bf16>(L::in_bytes);
  bf16* sk = carve.take<bf16>(L::in_bytes);
  bf16* sv = carve.take<bf16>(L::in_bytes);
  float* ss = carve.take<float>(L::f_bytes);
  bf16* sp = carve.take<bf16>(L::b_bytes);
  float* scorr = carve.take<float>(L::corr_bytes);
  float* sinv = carve.take<float>(L::row_bytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TileOfBlock tb = tile_of_block(blockIdx.x, n_tiles);
  const Head<BFloat16> hd(p, tb.bh);
  const int64_t i0 = tb.tile * kTcTile, rows = p.Sq - i0 < kTcTile ? p.Sq - i0 : kTcTile;
  tc_load<D>(sq, hd.q, i0, rows, p.E);

  // The warp's slices; in the softmax, lane (r, half) takes row r's columns 2t + half.
  const bf16* wq = sq + 16 * warp * L::ld_in;
  float* ws = ss + 16 * warp * L::ld_f;
  bf16* wp = sp + 16 * warp * L::ld_b;
  float* wcorr = scorr + 16 * 16 * warp;
  const int r = lane % 16, half = lane / 16;
  const int64_t i = i0 + 16 * warp + r;
  const bool row_valid = 16 * warp + r < rows;

  FragC acc[D / 16];
#pragma unroll
  for (int d = 0; d < D / 16; ++d) wmma::fill_fragment(acc[d], 0.0f);
  OnlineSoftmax<float> row_state;  // of row r (both halves keep identical copies)
  FragA q_rows[D / 16];            // the warp's queries, held for the whole loop
  const int e_frags = frags16(p.E), ev_frags = frags16(p.Ev);
  const bool warp_busy = 16 * warp < rows;  // else every row of the warp is padding
  __syncthreads();                          // the Q tile is in
  if (warp_busy) warp_rows<D>(q_rows, wq, e_frags);
  const int64_t key_end = attention_key_end(i0 + rows, p.Sk, p.is_causal);
  for (int64_t j0 = 0; j0 < key_end; j0 += kTcTile) {
    const int64_t cols = key_end - j0 < kTcTile ? key_end - j0 : kTcTile;
    __syncthreads();  // every warp is done with the previous K, V
    tc_load<D>(sk, hd.k, j0, cols, p.E);
    tc_load<D>(sv, hd.v, j0, cols, p.Ev);
    __syncthreads();
    if (!warp_busy) continue;  // it still loads its share of every tile (above)
    const int key_frags = frags16(cols);
    warp_scores<D>(ws, q_rows, sk, key_frags, e_frags);
    __syncwarp();
    float block_max = -INFINITY;
    for (int t = 0; t < 8 * key_frags; ++t) {  // columns past 16 * key_frags are never read
      const int c = 2 * t + half;
      const float s = tc_score(p, hd, ws[r * L::ld_f + c], i, j0 + c, row_valid);
      ws[r * L::ld_f + c] = s;
      block_max = s > block_max ? s : block_max;
    }
    const float other_max = __shfl_xor_sync(0xffffffffu, block_max, 16);
    const float correction = row_state.begin_block(other_max > block_max ? other_max : block_max);
    float sum = 0;
    for (int t = 0; t < 8 * key_frags; ++t) {
      const int c = 2 * t + half;
      const float w = row_state.weight(ws[r * L::ld_f + c]);
      wp[r * L::ld_b + c] = __float2bfloat16_rn(w);
      sum += w;
    }
    row_state.add(sum + __shfl_xor_sync(0xffffffffu, sum, 16));  // a + b == b + a: both halves agree
    for (int t = 0; t < 8; ++t) wcorr[16 * r + 8 * half + t] = correction;
    __syncwarp();
    FragC corr;
    wmma::load_matrix_sync(corr, wcorr, 16, wmma::mem_row_major);
#pragma unroll
    for (int d = 0; d < D / 16; ++d) {
#pragma unroll
      for (int x = 0; x < corr.num_elements; ++x) acc[d].x[x] *= corr.x[x];
    }
    warp_accumulate<D>(acc, wp, sv, key_frags, ev_frags);
  }
  if (half == 0) {
    sinv[16 * warp + r] = row_state.inverse_sum();  // 0 for a row with no allowed key: out = 0
    if (row_valid) lse[tb.bh * p.Sq + i] = row_state.logsumexp();
  }
  warp_store<D>(acc, ws, sinv + 16 * warp, 1.0f, out + tb.bh * p.Sq * p.Ev + (i0 + 16 * warp) * p.Ev,
                rows - 16 * warp, p.Ev);
}

// dq: one block per (query tile, b*h), warp w owning query rows 16w..16w+15; over the key
// tiles: S = Q K^T, dP = dO V^T, P = exp(S - lse), dS = P (dP - delta), dQ += dS K.
template <int D>
__global__ void __launch_bounds__(kThreads) tc_dq_kernel(Problem<BFloat16> p, int64_t n_tiles, BFloat16* dq) {
  using L = TcLayout<D>;
  extern __shared__ __align__(128) unsigned char tc_shared[];
  SharedCarver carve{tc_shared};
  bf16* sq = carve.take<bf16>(L::in_bytes);
  bf16* sdo = carve.take<bf16>(L::in_bytes);
  bf16* sk = carve.take<bf16>(L::in_bytes);
  bf16* sv = carve.take<bf16>(L::in_bytes);
  float* ss = carve.take<float>(L::f_bytes);
  float* sdp = carve.take<float>(L::f_bytes);
  bf16* sds = carve.take<bf16>(L::b_bytes);
  float* slse = carve.take<float>(L::row_bytes);
  float* sdelta = carve.take<float>(L::row_bytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TileOfBlock tb = tile_of_block(blockIdx.x, n_tiles);
  const Head<BFloat16> hd(p, tb.bh);
  const int64_t i0 = tb.tile * kTcTile, rows = p.Sq - i0 < kTcTile ? p.Sq - i0 : kTcTile;
  tc_load<D>(sq, hd.q, i0, rows, p.E);
  tc_load<D>(sdo, hd.dout, i0, rows, p.Ev);
  for (int x = threadIdx.x; x < kTcTile; x += kThreads) {  // padding rows: lse = -inf, so P = 0
    slse[x] = x < rows ? hd.lse[i0 + x] : -INFINITY;
    sdelta[x] = x < rows ? hd.delta[i0 + x] : 0.0f;
  }
  const bf16 *wq = sq + 16 * warp * L::ld_in, *wdo = sdo + 16 * warp * L::ld_in;
  const int e_frags = frags16(p.E), ev_frags = frags16(p.Ev);
  const bool warp_busy = 16 * warp < rows;  // else every query row of the warp is padding
  float *ws = ss + 16 * warp * L::ld_f, *wdp = sdp + 16 * warp * L::ld_f;
  bf16* wds = sds + 16 * warp * L::ld_b;

  FragC acc[D / 16];
#pragma unroll
  for (int d = 0; d < D / 16; ++d) wmma::fill_fragment(acc[d], 0.0f);
  const int64_t key_end = attention_key_end(i0 + rows, p.Sk, p.is_causal);
  for (int64_t j0 = 0; j0 < key_end; j0 += kTcTile) {
    const int64_t cols = key_end - j0 < kTcTile ? key_end - j0 : kTcTile;
    __syncthreads();  // every warp is done with the previous K, V (and the first Q, dO, lse are in)
    tc_load<D>(sk, hd.k, j0, cols, p.E);
    tc_load<D>(sv, hd.v, j0, cols, p.Ev);
    __syncthreads();
    if (!warp_busy) continue;  // it still loads its share of every tile (above)
    const int key_frags = frags16(cols);
    warp_scores<D>(ws, wq, sk, key_frags, e_frags);
    warp_scores<D>(wdp, wdo, sv, key_frags, ev_frags);
    __syncwarp();
    const int width = 16 * key_frags;  // columns past it are never read
    for (int idx = lane; idx < 16 * width; idx += 32) {
      const int r = idx / width, c = idx % width, row = 16 * warp + r;
      const float prob =
          probability_from_lse(tc_score(p, hd, ws[r * L::ld_f + c], i0 + row, j0 + c, row < rows), slse[row]);
      const float ds = prob != 0.0f ? prob * (wdp[r * L::ld_f + c] - sdelta[row]) : 0.0f;
      wds[r * L::ld_b + c] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    warp_accumulate<D>(acc, wds, sk, key_frags, e_frags);
  }
  warp_store<D>(acc, ws, nullptr, p.scale, dq + tb.bh * p.Sq * p.E + (i0 + 16 * warp) * p.E, rows - 16 * warp,
                p.E);
}

// dk, dv: one block per (key tile, b*h), warp w owning keys 16w..16w+15; over the query
// tiles that see them: S^T = K Q^T, dP^T = V dO^T, P^T, dS^T as in dq, dV += P^T dO,
// dK += dS^T Q.
template <int D>
__global__ void __launch_bounds__(kThreads) tc_dk_dv_kernel(Problem<BFloat16> p, int64_t n_tiles, BFloat16* dk,
                                                            BFloat16* dv) {
  using L = TcLayout<D>;
  extern __shared__ __align__(128) unsigned char tc_shared[];
  SharedCarver carve{tc_shared};
  bf16* sq = carve.take<bf16>(L::in_bytes);
  bf16* sdo = carve.take<bf16>(L::in_bytes);
  bf16* sk = carve.take<bf16>(L::in_bytes);
  bf16* sv = carve.take<bf16>(L::in_bytes);
  float* ss = carve.take<float>(L::f_bytes);
  float* sdp = carve.take<float>(L::f_bytes);
  bf16* sp = carve.take<bf16>(L::b_bytes);
  bf16* sds = carve.take<bf16>(L::b_bytes);
  float* slse = carve.take<float>(L::row_bytes);
  float* sdelta = carve.take<float>(L::row_bytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TileOfBlock tb = tile_of_block(blockIdx.x, n_tiles);
  const Head<BFloat16> hd(p, tb.bh);
  const int64_t j0 = tb.tile * kTcTile, cols = p.Sk - j0 < kTcTile ? p.Sk - j0 : kTcTile;
  tc_load<D>(sk, hd.k, j0, cols, p.E);
  tc_load<D>(sv, hd.v, j0, cols, p.Ev);
  const bf16 *wk = sk + 16 * warp * L::ld_in, *wv = sv + 16 * warp * L::ld_in;
  const int e_frags = frags16(p.E), ev_frags = frags16(p.Ev);
  const bool warp_busy = 16 * warp < cols;  // else every key of the warp is padding
  float *ws = ss + 16 * warp * L::ld_f, *wdp = sdp + 16 * warp * L::ld_f;
  bf16 *wp = sp + 16 * warp * L::ld_b, *wds = sds + 16 * warp * L::ld_b;

  FragC acc_dk[D / 16], acc_dv[D / 16];
#pragma unroll
  for (int d = 0; d < D / 16; ++d) {
    wmma::fill_fragment(acc_dk[d], 0.0f);
    wmma::fill_fragment(acc_dv[d], 0.0f);
  }
  for (int64_t i0 = attention_first_query_tile(j0, kTcTile, p.is_causal) * kTcTile; i0 < p.Sq; i0 += kTcTile) {
    const int64_t rows = p.Sq - i0 < kTcTile ? p.Sq - i0 : kTcTile;
    __syncthreads();  // every warp is done with the previous Q, dO (and K, V are in)
    tc_load<D>(sq, hd.q, i0, rows, p.E);
    tc_load<D>(sdo, hd.dout, i0, rows, p.Ev);
    for (int x = threadIdx.x; x < kTcTile; x += kThreads) {
      slse[x] = x < rows ? hd.lse[i0 + x] : -INFINITY;
      sdelta[x] = x < rows ? hd.delta[i0 + x] : 0.0f;
    }
    __syncthreads();
    if (!warp_busy) continue;  // it still loads its share of every tile (above)
    const int query_frags = frags16(rows);
    warp_scores<D>(ws, wk, sq, query_frags, e_frags);
    warp_scores<D>(wdp, wv, sdo, query_frags, ev_frags);
    __syncwarp();
    const int width = 16 * query_frags;  // columns past it are never read
    for (int idx = lane; idx < 16 * width; idx += 32) {  // element (key r, query c)
      const int r = idx / width, c = idx % width;
      const float prob =
          probability_from_lse(tc_score(p, hd, ws[r * L::ld_f + c], i0 + c, j0 + 16 * warp + r, c < rows), slse[c]);
      const float ds = prob != 0.0f ? prob * (wdp[r * L::ld_f + c] - sdelta[c]) : 0.0f;
      wp[r * L::ld_b + c] = __float2bfloat16_rn(prob);
      wds[r * L::ld_b + c] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    warp_accumulate<D>(acc_dv, wp, sdo, query_frags, ev_frags);
    warp_accumulate<D>(acc_dk, wds, sq, query_frags, e_frags);
  }
  const int64_t key = j0 + 16 * warp;
  warp_store<D>(acc_dk, ws, nullptr, p.scale, dk + tb.bh * p.Sk * p.E + key * p.E, cols - 16 * warp, p.E);
  warp_store<D>(acc_dv, ws, nullptr, 1.0f, dv + tb.bh * p.Sk * p.Ev + key * p.Ev, cols - 16 * warp, p.Ev);
}

// ---- launchers ---------------------------------------------------------------------

// The compiled head dim for E and Ev: 32, 64 or 128 (nd::Error above 128).
int head_dim_for(const char* kernel, int64_t E, int64_t Ev) {
  const int64_t d = E > Ev ? E : Ev;
  require(E >= 0 && Ev >= 0 && d <= kAttentionMaxHeadDim, kernel,
          "expected head dims E and Ev of at most " + std::to_string(kAttentionMaxHeadDim) + ", found E = " +
              std::to_string(E) + ", Ev = " + std::to_string(Ev));
  return d <= 32 ? 32 : d <= 64 ? 64 : 128;
}

// Blocks of a 1-D grid over n_tiles tiles of each of BH heads (gridDim.x <= 2^31 - 1).
unsigned grid_for(const char* kernel, int64_t BH, int64_t n_tiles) {
  const int64_t blocks = BH * n_tiles;
  require(blocks <= int64_t(0x7fffffff), kernel,
          "at most 2^31 - 1 (head, tile) blocks per launch, found " + std::to_string(blocks));
  return static_cast<unsigned>(blocks);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

// delta_i = dout_i . out_i for each of `rows` query rows (none when rows == 0).
template <class S>
void launch_delta(int64_t rows, int64_t Ev, const S* dout, const S* out, compute_t<S>* delta, cudaStream_t stream) {
  if (rows == 0) return;
  const int64_t warps = kThreads / 32, blocks = ceil_div(rows, warps);
  delta_kernel<S><<<static_cast<unsigned>(blocks < (1 << 20) ? blocks : (1 << 20)), kThreads, 0, stream>>>(
      rows, Ev, dout, out, delta);
  check_launch("attention backward delta");
}

// The tensor-core kernels take more than the default 48 KiB of dynamic shared memory
// (TcLayout: 46-100 KiB forward, 61-121 KiB backward), which sm_90 grants on request.
template <class Kernel>
void allow_shared(Kernel kernel, size_t bytes, const char* name) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)", name);
}

template <int D>
void tc_forward_for(const Problem<BFloat16>& p, int64_t BH, BFloat16* out, float* lse, cudaStream_t stream) {
  constexpr size_t bytes = TcLayout<D>::forward;
  const char* name = "attention forward (bf16)";
  allow_shared(tc_forward_kernel<D>, bytes, name);
  const int64_t n_tiles = ceil_div(p.Sq, kTcTile);
  tc_forward_kernel<D><<<grid_for(name, BH, n_tiles), kThreads, bytes, stream>>>(p, n_tiles, out, lse);
  check_launch(name);
}

template <int D>
void tc_backward_for(const Problem<BFloat16>& p, int64_t BH, BFloat16* dq, BFloat16* dk, BFloat16* dv,
                     cudaStream_t stream) {
  if (p.Sk > 0) {  // dk, dv: written even when Sq == 0 (then zero)
    const char* name = "attention backward dk, dv (bf16)";
    constexpr size_t bytes = TcLayout<D>::backward;
    allow_shared(tc_dk_dv_kernel<D>, bytes, name);
    const int64_t n_tiles = ceil_div(p.Sk, kTcTile);
    tc_dk_dv_kernel<D><<<grid_for(name, BH, n_tiles), kThreads, bytes, stream>>>(p, n_tiles, dk, dv);
    check_launch(name);
  }
  if (p.Sq > 0) {
    const char* name = "attention backward dq (bf16)";
    constexpr size_t bytes = TcLayout<D>::backward_dq;
    allow_shared(tc_dq_kernel<D>, bytes, name);
    const int64_t n_tiles = ceil_div(p.Sq, kTcTile);
    tc_dq_kernel<D><<<grid_for(name, BH, n_tiles), kThreads, bytes, stream>>>(p, n_tiles, dq);
    check_launch(name);
  }
}

// The entry points for f32 and f64 (SIMT): checks, the head-dim dispatch, the scratch.
template <class S>
void run_forward(const S* q, const S* k, const S* v, AttentionMask<S> mask, int64_t B, int64_t H, int64_t Sq,
                 int64_t Sk, int64_t E, int64_t Ev, bool is_causal, double scale, S* out, compute_t<S>* lse,
                 cudaStream_t stream) {
  const int d = head_dim_for("attention forward", E, Ev);
  const int64_t BH = B * H;
  if (BH == 0 || Sq == 0) return;
  const Problem<S> p{q, k, v, nullptr, nullptr, nullptr, nullptr, mask, H, Sq, Sk, E, Ev, is_causal,
                     static_cast<compute_t<S>>(scale)};
  if (d == 32) forward_for<S, 32>(p, BH, out, lse, stream);
  else if (d == 64) forward_for<S, 64>(p, BH, out, lse, stream);
  else forward_for<S, 128>(p, BH, out, lse, stream);
}

template <class S>
void run_backward(const S* dout, const S* q, const S* k, const S* v, AttentionMask<S> mask, const S* out,
                  const compute_t<S>* lse, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t E, int64_t Ev,
                  bool is_causal, double scale, S* dq, S* dk, S* dv, cudaStream_t stream) {
  using T = compute_t<S>;
  const int d = head_dim_for("attention backward", E, Ev);
  const int64_t BH = B * H;
  if (BH == 0 || (Sq == 0 && Sk == 0)) return;
  // delta_i = dout_i . out_i for every query row, computed once (FlashAttention-2).
  const detail::Scratch delta("attention backward", static_cast<size_t>(BH * Sq) * sizeof(T), stream);
  launch_delta<S>(BH * Sq, Ev, dout, out, delta.as<T>(), stream);
  const Problem<S> p{q, k, v, out, dout, lse, delta.as<T>(), mask, H, Sq, Sk, E, Ev, is_causal,
                     static_cast<T>(scale)};
  if (d == 32) backward_for<S, 32>(p, BH, dq, dk, dv, stream);
  else if (d == 64) backward_for<S, 64>(p, BH, dq, dk, dv, stream);
  else backward_for<S, 128>(p, BH, dq, dk, dv, stream);
}

}  // namespace

template <typename T>
void scaled_dot_product_attention_forward(const T* q, const T* k, const T* v, AttentionMask<T> mask, int64_t B,
                                          int64_t H, int64_t Sq, int64_t Sk, int64_t E, int64_t Ev,
                                          bool is_causal, double scale, T* out, T* logsumexp,
                                          cudaStream_t stream) {
  run_forward<T>(q, k, v, mask, B, H, Sq, Sk, E, Ev, is_causal, scale, out, logsumexp, stream);
}

template <typename T>
void scaled_dot_product_attention_backward(const T* dout, const T* q, const T* k, const T* v,
                                           AttentionMask<T> mask, const T* out, const T* logsumexp, int64_t B,
                                           int64_t H, int64_t Sq, int64_t Sk, int64_t E, int64_t Ev,
                                           bool is_causal, double scale, T* dq, T* dk, T* dv,
                                           cudaStream_t stream) {
  run_backward<T>(dout, q, k, v, mask, out, logsumexp, B, H, Sq, Sk, E, Ev, is_causal, scale, dq, dk, dv, stream);
}

void scaled_dot_product_attention_forward(const BFloat16* q, const BFloat16* k, const BFloat16* v,
                                          AttentionMask<BFloat16> mask, int64_t B, int64_t H, int64_t Sq,
                                          int64_t Sk, int64_t E, int64_t Ev, bool is_causal, double scale,
                                          BFloat16* out, float* logsumexp, cudaStream_t stream) {
  const int d = head_dim_for("attention forward (bf16)", E, Ev);
  const int64_t BH = B * H;
  if (BH == 0 || Sq == 0) return;
  const Problem<BFloat16> p{q, k, v, nullptr, nullptr, nullptr, nullptr, mask, H, Sq, Sk, E, Ev, is_causal,
                            static_cast<float>(scale)};
  if (d == 32) tc_forward_for<32>(p, BH, out, logsumexp, stream);
  else if (d == 64) tc_forward_for<64>(p, BH, out, logsumexp, stream);
  else tc_forward_for<128>(p, BH, out, logsumexp, stream);
}

void scaled_dot_product_attention_backward(const BFloat16* dout, const BFloat16* q, const BFloat16* k,
                                           const BFloat16* v, AttentionMask<BFloat16> mask, const BFloat16* out,
                                           const float* logsumexp, int64_t B, int64_t H, int64_t Sq, int64_t Sk,
                                           int64_t E, int64_t Ev, bool is_causal, double scale, BFloat16* dq,
                                           BFloat16* dk, BFloat16* dv, cudaStream_t stream) {
  const int d = head_dim_for("attention backward (bf16)", E, Ev);
  const int64_t BH = B * H;
  if (BH == 0 || (Sq == 0 && Sk == 0)) return;
  const detail::Scratch delta("attention backward (bf16)", static_cast<size_t>(BH * Sq) * sizeof(float), stream);
  launch_delta<BFloat16>(BH * Sq, Ev, dout, out, delta.as<float>(), stream);
  const Problem<BFloat16> p{q, k, v, out, dout, logsumexp, delta.as<float>(), mask, H, Sq, Sk, E, Ev, is_causal,
                            static_cast<float>(scale)};
  if (d == 32) tc_backward_for<32>(p, BH, dq, dk, dv, stream);
  else if (d == 64) tc_backward_for<64>(p, BH, dq, dk, dv, stream);
  else tc_backward_for<128>(p, BH, dq, dk, dv, stream);
}

#define ND_INSTANTIATE(T)                                                                                      \
  template void scaled_dot_product_attention_forward<T>(const T*, const T*, const T*, AttentionMask<T>,       \
                                                        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, \
                                                        bool, double, T*, T*, cudaStream_t);                  \
  template void scaled_dot_product_attention_backward<T>(                                                      \
      const T*, const T*, const T*, const T*, AttentionMask<T>, const T*, const T*, int64_t, int64_t, int64_t, \
      int64_t, int64_t, int64_t, bool, double, T*, T*, T*, cudaStream_t);
ND_INSTANTIATE(float)
ND_INSTANTIATE(double)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cuda
