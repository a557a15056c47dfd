// FlashAttention-2 backward on CUDA in bf16 (and f16), on tensor cores: dq, dk, dv of
// attention_tc_forward.cu's forward (engine/ops/attention.cpp's autocast path). Templates on
// the 16-bit storage type S (BFloat16 or Half, Tc16 in attention_tc.cuh). The delta pass
// D_i = dout_i . out_i (f32 sums) is attention.cuh's, shared with the f32/f64 SIMT backward.
//
// The backward is still the WMMA kernels (dk/dv per key tile, dq per query tile, 64-row
// tiles of 4 warps); moving it to mma.sync (K/V fragments in registers) is issue 26's next
// step. Query and key tiles are both kTcTile = 64 rows and a block is 4 warps; warp w owns 16
// rows of its block's tile (queries in the dq kernel, keys in the dk/dv kernel), so the score
// rows a warp computes are exactly the rows it accumulates: inside a tile the warps need only
// __syncwarp; __syncthreads guards the tiles all warps read. Per tile, a warp
//   1. S = A B^T into its 16 x 64 f32 slice of a shared tile (wmma, f32 accumulation of
//      exact bf16 x bf16 products),
//   2. turns S into P = exp(s - lse) and dS with SIMT lanes (the mask, causality, dropout),
//      rounds them to bf16 into shared memory,
//   3. accumulates (P or dS) times the other operand tile into f32 accumulator fragments,
// read out once, at the end, through the same shared slice.
// Rounding points, all round-to-nearest-even: P = exp2(s2 - m) to bf16 before P V (the row
// sum l adds the f32 weights, as FlashAttention does; the exponent in log2 units moves P by a
// few f32 ulps from exp(s - m), far below the bf16 rounding that follows); in the backward
// Rounding points, all round-to-nearest-even: P and dS to bf16 before dV = P^T dO,
// dK = dS^T Q and dQ = dS K; dq, dk, dv once at the end. The scores, logsumexp, delta and
// every accumulator are f32. Bit-reproducible: each element is summed by one fixed sequence
// of WMMA and SIMT operations, no atomics.
// Checked so far only on a CPU emulation of the kernel bodies (a thread per CUDA thread; WMMA
// emulated; warp-collective calls and shared-memory races checked) against the f32 CPU kernel
// at tests/emu's and tests/cuda's shapes (tests/emu/attention_emu_test.cpp). ptxas compiles
// them for sm_90; no GPU has run them yet.
#include "kernels/cuda/attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/float16.h"
#include "kernels/common/online_softmax.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/scratch.cuh"

namespace nd::kernels::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTcWarps = kThreads / 32;  // 4
constexpr int kTcTile = 16 * kTcWarps;   // rows of a query tile and of a key tile: 64

template <class S>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, Dev<S>, wmma::row_major>;
template <class S>
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, Dev<S>, wmma::row_major>;
template <class S>
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, Dev<S>, wmma::col_major>;
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
  static constexpr size_t row_bytes = size_t(kTcTile) * 4;
  // backward dk/dv: Q, dO, K, V | S, dP | P, dS | lse, delta; dq: the same without P (so at
  // D = 128 two dq blocks fit on an SM, 111.5 KiB each; dk/dv takes 120.5 KiB)
  static constexpr size_t backward_dq = 4 * in_bytes + 2 * f_bytes + b_bytes + 2 * row_bytes;
  static constexpr size_t backward = backward_dq + b_bytes;
  static_assert(in_bytes % 128 == 0 && f_bytes % 128 == 0 && b_bytes % 128 == 0 && row_bytes % 128 == 0);
  static_assert(backward <= 227 * 1024, "sm_90 allows 227 KiB per block");
};

// dst[r * (D + 8) + e] = src[(row0 + r) * width + e] for r < rows, e < width, and 0 for the
// rest of the [64][D] tile (padding rows and columns must be 0, not stale: they enter the
// products). 16-byte loads when every row starts 16-byte aligned (the common case).
template <class S, int D>
__device__ void tc_load(Dev<S>* dst, const S* src, int64_t row0, int64_t rows, int64_t width) {
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
    tile_load_plain<S, D>(dst, src, row0, rows, width, kTcTile, kThreads);
  }
}

// out[16][16 n] (f32, ld 64 + 4) = A B^T for n < n_frags, for the warp's 16 rows A [16][D]
// and a tile B [64][D] (both bf16, ld D + 8; B^T read as a col-major matrix_b), over the
// first k_frags 16-column blocks of the head dim.
template <class S, int D>
__device__ void warp_scores(float* out, const Dev<S>* a, const Dev<S>* b, int n_frags, int k_frags) {
  constexpr int ld = D + 8;
  FragA<S> fa[D / 16];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    if (kk < k_frags) wmma::load_matrix_sync(fa[kk], a + 16 * kk, ld);
#pragma unroll
  for (int n = 0; n < kTcTile / 16; ++n) {
    if (n >= n_frags) break;
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      if (kk >= k_frags) break;
      FragBCol<S> fb;
      wmma::load_matrix_sync(fb, b + 16 * n * ld + 16 * kk, ld);
      wmma::mma_sync(acc, fa[kk], fb, acc);
    }
    wmma::store_matrix_sync(out + 16 * n, acc, kTcTile + 4, wmma::mem_row_major);
  }
}

// acc[d] += A B[:, 16d .. 16d + 16) for d < d_frags, for the warp's A [16][64] (bf16,
// ld 64 + 8) and a tile B [64][D] (bf16, ld D + 8, row-major matrix_b), over the first
// k_frags 16-row blocks of B (A is 0 past them).
template <class S, int D>
__device__ void warp_accumulate(FragC (&acc)[D / 16], const Dev<S>* a, const Dev<S>* b, int k_frags, int d_frags) {
  constexpr int ld = D + 8;
  FragA<S> fa[kTcTile / 16];
#pragma unroll
  for (int kk = 0; kk < kTcTile / 16; ++kk)
    if (kk < k_frags) wmma::load_matrix_sync(fa[kk], a + 16 * kk, kTcTile + 8);
#pragma unroll
  for (int d = 0; d < D / 16; ++d) {
    if (d >= d_frags) break;
#pragma unroll
    for (int kk = 0; kk < kTcTile / 16; ++kk) {
      if (kk >= k_frags) break;
      FragBRow<S> fb;
      wmma::load_matrix_sync(fb, b + 16 * kk * ld + 16 * d, ld);
      wmma::mma_sync(acc[d], fa[kk], fb, acc[d]);
    }
  }
}

// Writes the warp's 16 x D accumulators times `factor` to dst[r * width + e] (bf16) for
// r < rows, e < width, through the warp's f32 staging slice [16][64 + 4] in blocks of at
// most 64 columns.
template <class S, int D>
__device__ void warp_store(FragC (&acc)[D / 16], float* stage, float factor, S* dst, int64_t rows, int64_t width) {
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
        store(dst + r * width + c0 + c, stage[r * ld + c] * factor);
    }
  }
}

// dq: one block per (query tile, b*h), warp w owning query rows 16w..16w+15; over the key
// tiles: S = Q K^T, dP = dO V^T, P = exp(S - lse), dS = P (dP - delta), dQ += dS K.
template <class S, int D>
__global__ void __launch_bounds__(kThreads) tc_dq_kernel(Problem<S> p, int64_t n_tiles, S* dq) {
  using L = TcLayout<D>;
  extern __shared__ __align__(128) unsigned char tc_shared[];
  SharedCarver carve{tc_shared};
  Dev<S>* sq = carve.take<Dev<S>>(L::in_bytes);
  Dev<S>* sdo = carve.take<Dev<S>>(L::in_bytes);
  Dev<S>* sk = carve.take<Dev<S>>(L::in_bytes);
  Dev<S>* sv = carve.take<Dev<S>>(L::in_bytes);
  float* ss = carve.take<float>(L::f_bytes);
  float* sdp = carve.take<float>(L::f_bytes);
  Dev<S>* sds = carve.take<Dev<S>>(L::b_bytes);
  float* slse = carve.take<float>(L::row_bytes);
  float* sdelta = carve.take<float>(L::row_bytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TileOfBlock tb = tile_of_block(blockIdx.x, n_tiles);
  const Head<S> hd(p, tb.bh);
  const int64_t i0 = tb.tile * kTcTile, rows = p.Sq - i0 < kTcTile ? p.Sq - i0 : kTcTile;
  tc_load<S, D>(sq, hd.q, i0, rows, p.E);
  tc_load<S, D>(sdo, hd.dout, i0, rows, p.Ev);
  load_row_stats(slse, sdelta, kTcTile, hd, i0, rows);
  const Dev<S> *wq = sq + 16 * warp * L::ld_in, *wdo = sdo + 16 * warp * L::ld_in;
  const int e_frags = frags16(p.E), ev_frags = frags16(p.Ev);
  const bool warp_busy = 16 * warp < rows;  // else every query row of the warp is padding
  float *ws = ss + 16 * warp * L::ld_f, *wdp = sdp + 16 * warp * L::ld_f;
  Dev<S>* wds = sds + 16 * warp * L::ld_b;

  FragC acc[D / 16];
#pragma unroll
  for (int d = 0; d < D / 16; ++d) wmma::fill_fragment(acc[d], 0.0f);
  const int64_t key_end = attention_key_end(i0 + rows, p.Sk, p.is_causal);
  for (int64_t j0 = 0; j0 < key_end; j0 += kTcTile) {
    const int64_t cols = key_end - j0 < kTcTile ? key_end - j0 : kTcTile;
    __syncthreads();  // every warp is done with the previous K, V (and the first Q, dO, lse are in)
    tc_load<S, D>(sk, hd.k, j0, cols, p.E);
    tc_load<S, D>(sv, hd.v, j0, cols, p.Ev);
    __syncthreads();
    if (!warp_busy) continue;  // it still loads its share of every tile (above)
    const int key_frags = frags16(cols);
    warp_scores<S, D>(ws, wq, sk, key_frags, e_frags);
    warp_scores<S, D>(wdp, wdo, sv, key_frags, ev_frags);
    __syncwarp();
    const int width = 16 * key_frags;  // columns past it are never read
    const bool dropout = p.dropout.p != 0.0;
    for (int idx = lane; idx < 16 * width; idx += 32) {
      const int r = idx / width, c = idx % width, row = 16 * warp + r;
      const float s = tc_score(p, hd, p.scale, 1.0f, ws[r * L::ld_f + c], i0 + row, j0 + c, row < rows);
      const float prob = probability_from_lse(s, slse[row]);
      float ds = 0.0f;
      if (prob != 0.0f) {  // dS = P (Z dP - D), Z only computed with dropout on
        const float dp = wdp[r * L::ld_f + c];
        ds = prob * ((dropout ? dp * p.dropout_factor(tb.bh, i0 + row, j0 + c) : dp) - sdelta[row]);
      }
      wds[r * L::ld_b + c] = Tc16<S>::round(ds);
    }
    __syncwarp();
    warp_accumulate<S, D>(acc, wds, sk, key_frags, e_frags);
  }
  warp_store<S, D>(acc, ws, p.scale, dq + tb.bh * p.Sq * p.E + (i0 + 16 * warp) * p.E, rows - 16 * warp,
                p.E);
}

// dk, dv: one block per (key tile, b*h), warp w owning keys 16w..16w+15; over the query
// tiles that see them: S^T = K Q^T, dP^T = V dO^T, P^T, dS^T as in dq, dV += P^T dO,
// dK += dS^T Q.
template <class S, int D>
__global__ void __launch_bounds__(kThreads) tc_dk_dv_kernel(Problem<S> p, int64_t n_tiles, S* dk,
                                                            S* dv) {
  using L = TcLayout<D>;
  extern __shared__ __align__(128) unsigned char tc_shared[];
  SharedCarver carve{tc_shared};
  Dev<S>* sq = carve.take<Dev<S>>(L::in_bytes);
  Dev<S>* sdo = carve.take<Dev<S>>(L::in_bytes);
  Dev<S>* sk = carve.take<Dev<S>>(L::in_bytes);
  Dev<S>* sv = carve.take<Dev<S>>(L::in_bytes);
  float* ss = carve.take<float>(L::f_bytes);
  float* sdp = carve.take<float>(L::f_bytes);
  Dev<S>* sp = carve.take<Dev<S>>(L::b_bytes);
  Dev<S>* sds = carve.take<Dev<S>>(L::b_bytes);
  float* slse = carve.take<float>(L::row_bytes);
  float* sdelta = carve.take<float>(L::row_bytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const TileOfBlock tb = tile_of_block(blockIdx.x, n_tiles);
  const Head<S> hd(p, tb.bh);
  const int64_t j0 = tb.tile * kTcTile, cols = p.Sk - j0 < kTcTile ? p.Sk - j0 : kTcTile;
  tc_load<S, D>(sk, hd.k, j0, cols, p.E);
  tc_load<S, D>(sv, hd.v, j0, cols, p.Ev);
  const Dev<S> *wk = sk + 16 * warp * L::ld_in, *wv = sv + 16 * warp * L::ld_in;
  const int e_frags = frags16(p.E), ev_frags = frags16(p.Ev);
  const bool warp_busy = 16 * warp < cols;  // else every key of the warp is padding
  float *ws = ss + 16 * warp * L::ld_f, *wdp = sdp + 16 * warp * L::ld_f;
  Dev<S> *wp = sp + 16 * warp * L::ld_b, *wds = sds + 16 * warp * L::ld_b;

  FragC acc_dk[D / 16], acc_dv[D / 16];
#pragma unroll
  for (int d = 0; d < D / 16; ++d) {
    wmma::fill_fragment(acc_dk[d], 0.0f);
    wmma::fill_fragment(acc_dv[d], 0.0f);
  }
  for (int64_t i0 = attention_first_query_tile(j0, kTcTile, p.is_causal) * kTcTile; i0 < p.Sq; i0 += kTcTile) {
    const int64_t rows = p.Sq - i0 < kTcTile ? p.Sq - i0 : kTcTile;
    __syncthreads();  // every warp is done with the previous Q, dO (and K, V are in)
    tc_load<S, D>(sq, hd.q, i0, rows, p.E);
    tc_load<S, D>(sdo, hd.dout, i0, rows, p.Ev);
    load_row_stats(slse, sdelta, kTcTile, hd, i0, rows);
    __syncthreads();
    if (!warp_busy) continue;  // it still loads its share of every tile (above)
    const int query_frags = frags16(rows);
    warp_scores<S, D>(ws, wk, sq, query_frags, e_frags);
    warp_scores<S, D>(wdp, wv, sdo, query_frags, ev_frags);
    __syncwarp();
    const int width = 16 * query_frags;  // columns past it are never read
    for (int idx = lane; idx < 16 * width; idx += 32) {  // element (key r, query c)
      const int r = idx / width, c = idx % width;
      const float s = tc_score(p, hd, p.scale, 1.0f, ws[r * L::ld_f + c], i0 + c, j0 + 16 * warp + r, c < rows);
      const float prob = probability_from_lse(s, slse[c]);
      const float z = p.dropout_factor(tb.bh, i0 + c, j0 + 16 * warp + r);
      const float ds = prob != 0.0f ? prob * (z * wdp[r * L::ld_f + c] - sdelta[c]) : 0.0f;
      wp[r * L::ld_b + c] = Tc16<S>::round(prob * z);
      wds[r * L::ld_b + c] = Tc16<S>::round(ds);
    }
    __syncwarp();
    warp_accumulate<S, D>(acc_dv, wp, sdo, query_frags, ev_frags);
    warp_accumulate<S, D>(acc_dk, wds, sq, query_frags, e_frags);
  }
  const int64_t key = j0 + 16 * warp;
  warp_store<S, D>(acc_dk, ws, p.scale, dk + tb.bh * p.Sk * p.E + key * p.E, cols - 16 * warp, p.E);
  warp_store<S, D>(acc_dv, ws, 1.0f, dv + tb.bh * p.Sk * p.Ev + key * p.Ev, cols - 16 * warp, p.Ev);
}
template <class S, int D>
void tc_backward_for(const Problem<S>& p, int64_t BH, S* dq, S* dk, S* dv,
                     cudaStream_t stream) {
  if (p.Sk > 0) {  // dk, dv: written even when Sq == 0 (then zero)
    const char* name =
        std::is_same_v<S, Half> ? "attention backward dk, dv (f16)" : "attention backward dk, dv (bf16)";
    constexpr size_t bytes = TcLayout<D>::backward;
    allow_shared(tc_dk_dv_kernel<S, D>, bytes, name);
    const int64_t n_tiles = ceil_div(p.Sk, kTcTile);
    tc_dk_dv_kernel<S, D><<<grid_for(name, BH, n_tiles), kThreads, bytes, stream>>>(p, n_tiles, dk, dv);
    check_launch(name);
  }
  if (p.Sq > 0) {
    const char* name =
        std::is_same_v<S, Half> ? "attention backward dq (f16)" : "attention backward dq (bf16)";
    constexpr size_t bytes = TcLayout<D>::backward_dq;
    allow_shared(tc_dq_kernel<S, D>, bytes, name);
    const int64_t n_tiles = ceil_div(p.Sq, kTcTile);
    tc_dq_kernel<S, D><<<grid_for(name, BH, n_tiles), kThreads, bytes, stream>>>(p, n_tiles, dq);
    check_launch(name);
  }
}}  // namespace

#define ND_TC_ATTENTION_BACKWARD(S, label)                                                                          \
  void scaled_dot_product_attention_backward(const S* dout, const S* q, const S* k, const S* v, AttentionMask<S> mask, \
                                             const S* out, const float* logsumexp, int64_t B, int64_t H,            \
                                             int64_t Sq, int64_t Sk, int64_t E, int64_t Ev, bool is_causal,         \
                                             double scale, const AttentionDropout& dropout, S* dq, S* dk, S* dv,    \
                                             cudaStream_t stream) {                                                 \
    run_backward<S>("attention backward (" label ")", dout, q, k, v, mask, out, logsumexp, B, H, Sq, Sk, E, Ev,      \
                    is_causal, scale, dropout, stream, [&](auto D, const Problem<S>& p, int64_t BH) {               \
                      tc_backward_for<S, decltype(D)::value>(p, BH, dq, dk, dv, stream);                            \
                    });                                                                                             \
  }
ND_TC_ATTENTION_BACKWARD(BFloat16, "bf16")
ND_TC_ATTENTION_BACKWARD(Half, "f16")
#undef ND_TC_ATTENTION_BACKWARD

}  // namespace nd::kernels::cuda
