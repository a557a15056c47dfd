// Flash-style attention on CUDA in bf16 (and f16), on tensor cores: forward and
// FlashAttention-2 backward, what f32 attention under autocast runs
// (engine/ops/attention.cpp). Every kernel is a template on the 16-bit storage type S
// (BFloat16 or Half, Tc16 below); what this comment says of bf16 holds for f16 with f16's
// rounding. The f32/f64
// SIMT kernels are attention.cu; what both files need (Problem, Head, the delta pass, the
// head-dim dispatch, the grid helpers) is attention.cuh.
//
// Why a file of its own: these kernels have their own tiles, shared-memory layout and
// rounding points (below) and share no kernel body with the f32/f64 ones, only their
// delta pass and the problem description.
//
// The forward is register-resident, built as FlashAttention-2's (issue 26): the scores S and
// the probabilities P never leave registers. mma.sync m16n8k16 and ldmatrix through
// warp_mma.cuh, whose documented fragment layouts say which lane holds which element (WMMA's
// do not). A block owns kFwdRows = 128 query rows and has 8 warps; warp w owns rows
// 16w..16w+15, and inside them lane (g, t) = (lane / 4, lane % 4) holds rows g and g + 8 (the
// mma's C layout: columns 2t, 2t + 1 of every 8-wide n-tile). Q is copied to shared memory once
// and held as A fragments; K and V come in 64-key tiles through cp.async into two buffers, tile
// t + 1 copying while tile t is read. Per key tile a warp
//   1. S = Q K^T in f32 accumulators (ldmatrix.x4 of K rows is the B fragment of two n-tiles),
//   2. turns each score into log2 units, s2 = log2(e) (scale dot + mask), -inf where masked,
//      causal or padding; the row maximum over the tile is a max over the lane's 16 values
//      and two quad shuffles (xor 1, 2); m' = max(m, max), the factor exp2(m - m')
//      (OnlineSoftmax<float, true>, kernels/common/online_softmax.h, CPU-tested),
//   3. P = exp2(s2 - m') (exp2 with the scale folded in), rounded times the dropout factor
//      straight into A fragments: S's n-tiles 2k and 2k + 1 are exactly A's k-th 16-key
//      block (P reused as the next operand), l = l exp2(m - m') + the quad's sum of the f32
//      weights,
//   4. O = O exp2(m - m') + P V on its f32 accumulators (ldmatrix.x4.trans of V rows is the B
//      fragment of two 8-wide dim tiles): the rescale is per register, each lane knowing its
//      rows.
// At the end out = O / l and lse = ln 2 (m + log2 l) (natural log, as the backward and the
// CPU twin take it; -inf and out = 0 for a row with no allowed key). Padding: rows past Sq and
// head-dim columns past E, Ev are zero in shared memory (cp.async's zero-fill); 16-key blocks
// past the tile's last key and 16-wide blocks past E or Ev are skipped (block-uniform); a
// warp whose 16 rows are all padding only copies and waits at the barriers.
// Registers (ptxas, bench/kernel_resources.md): 178, 200, 220 a thread at D = 32, 64, 128,
// no spills, so one 8-warp block per SM (D = 128 needs O 64 + Q 32 + S 32 + P 16 before any
// index). Why 128 rows of 8 warps and not 64 of 4: at these registers two 64-row blocks would
// give an SM the same 8 warps while reading every K, V tile twice as often; asking ptxas for
// two 128-row blocks per SM (128 registers) spills 100 and 336 bytes at D = 32 and 64. What
// lifts D = 32 to 178 is the unrolled per-element SIMT work (mask, causality, dropout hash):
// the next thing to shrink.
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
// P and dS to bf16 before dV = P^T dO, dK = dS^T Q and dQ = dS K; out, dq, dk, dv once at the
// end. The scores, logsumexp, delta and every accumulator are f32. Bit-reproducible: each
// element is summed by one fixed sequence of mma and SIMT operations (the quad sums add
// a + b, b + a: the same in every lane), no atomics.
// Checked so far only on a CPU emulation of the kernel bodies (a thread per CUDA thread; WMMA,
// mma.sync, ldmatrix and cp.async emulated with their lane maps; warp-collective calls and
// shared-memory races checked) against the f32 CPU kernel at tests/emu's and tests/cuda's
// shapes: every output within 0.74 of its tolerance (tests/emu/attention_emu_test.cpp); the
// forward's test fails with P's fragment built on a wrong lane map or without O's rescale.
// ptxas compiles them for sm_90; no GPU has run them yet.
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
#include "kernels/cuda/scratch.cuh"
#include "kernels/cuda/warp_mma.cuh"

namespace nd::kernels::cuda {

namespace {

namespace wmma = nvcuda::wmma;
// The device type of a 16-bit storage type S (BFloat16 or Half), and rounding to it: the
// kernels below are written once for both, bf16 and f16 fragments having the same shapes,
// layouts and ldm rules.
template <class S>
struct Tc16;
template <>
struct Tc16<BFloat16> {
  using dev = __nv_bfloat16;
  static __device__ dev round(float v) { return __float2bfloat16_rn(v); }
  static __device__ dev from_bits(uint16_t b) { return __ushort_as_bfloat16(b); }
};
template <>
struct Tc16<Half> {
  using dev = __half;
  static __device__ dev round(float v) { return __float2half_rn(v); }
  static __device__ dev from_bits(uint16_t b) { return __ushort_as_half(b); }
};
template <class S>
using Dev = typename Tc16<S>::dev;

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

// The loads' path for rows that are not all 16-byte aligned (width % 8 != 0 or a misaligned
// base): dst[r * (D + 8) + e] = src[(row0 + r) * width + e] for r < rows, e < width, 0 for the
// rest of the [tile_rows][D] tile, element by element over `threads` threads.
template <class S, int D>
__device__ void tile_load_plain(Dev<S>* dst, const S* src, int64_t row0, int64_t rows, int64_t width, int tile_rows,
                                int threads) {
  for (int idx = threadIdx.x; idx < tile_rows * D; idx += threads) {
    const int r = idx / D, e = idx % D;
    dst[r * (D + 8) + e] = Tc16<S>::from_bits(r < rows && e < width ? src[(row0 + r) * width + e].bits : 0);
  }
}

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

// unit (scale dot + mask_ij), or -inf where key j may not be seen by query i or the row is
// padding (valid == false). unit = 1 (the backward), or log2(e) (the forward's exp2): the
// caller passes scale_unit = unit * scale.
template <class S>
__device__ float tc_score(const Problem<S>& p, const Head<S>& hd, float scale_unit, float unit, float dot, int64_t i,
                          int64_t j, bool valid) {
  if (!valid || !attention_allowed(i, j, p.Sk, p.is_causal)) return -INFINITY;
  const float s = scale_unit * dot;
  return hd.mask ? s + unit * to_compute(hd.mask[i * p.mask.stride_q + j * p.mask.stride_k]) : s;
}

// Fragment counts skip work on padding (block-uniform, so every wmma call stays
// warp-uniform): a tile's rows past the sequence's end and head-dim columns past E or Ev are
// zero in shared memory, so their products add nothing; score columns past the tile's last
// key (or query) get P = dS = 0 from the SIMT passes, which skip whole 16-column blocks of them.
// The MAE's short sequences (13 and 50 rows in a 64-row tile) and small heads gain most.
__host__ __device__ constexpr int frags16(int64_t n) { return static_cast<int>((n + 15) / 16); }

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

// ---- Forward: register-resident (mma.sync m16n8k16, ldmatrix, cp.async; warp_mma.cuh)

constexpr int kFwdWarps = 8, kFwdThreads = 32 * kFwdWarps;
constexpr int kFwdRows = 16 * kFwdWarps;  // query rows of a block: 128, 16 per warp
constexpr int kFwdKeys = 64;              // keys of a K, V tile
constexpr float kLog2e = 1.4426950408889634f;

// Dynamic shared memory of the forward for head dim D: Q [128][D + 8] | K [2][64][D + 8] |
// V [2][64][D + 8] (bf16; two K, V buffers: tile t + 1 copies in while tile t is read). A row
// of D + 8 values is an odd multiple of 16 bytes (80, 144, 272), so the 8 rows of an ldmatrix
// phase fall on 8 distinct 16-byte bank groups (no conflicts); ldmatrix and cp.async need the
// 16-byte alignment every row start has.
template <int D>
struct FwdLayout {
  static constexpr int ld = D + 8;
  static constexpr size_t q_bytes = size_t(kFwdRows) * ld * 2;
  static constexpr size_t kv_bytes = size_t(kFwdKeys) * ld * 2;  // one K or V tile
  static constexpr size_t bytes = q_bytes + 4 * kv_bytes;
  static_assert(q_bytes % 128 == 0 && kv_bytes % 128 == 0);
  static_assert(bytes <= 227 * 1024, "sm_90 allows 227 KiB per block");
};

// dst[r * (D + 8) + e] = src[(row0 + r) * width + e] for r < rows, e < width, 0 for the rest of
// the [tile_rows][D] tile (padding enters the products: it must be 0, not stale). With every
// row 16-byte aligned through cp.async (16 bytes, zero-filled past the data; complete at this
// thread's cp_async_wait_group, visible to the block after the __syncthreads that follows),
// else plain stores (visible after that same __syncthreads).
template <class S, int D>
__device__ void fwd_load(Dev<S>* dst, const S* src, int64_t row0, int64_t rows, int64_t width, int tile_rows) {
  constexpr int ld = D + 8;
  if (width % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    constexpr int kChunks = D / 8;
    for (int idx = threadIdx.x; idx < tile_rows * kChunks; idx += kFwdThreads) {
      const int r = idx / kChunks, e = idx % kChunks * 8;
      const bool in = r < rows && e < width;
      cp_async_cg_16_zfill(dst + r * ld + e, in ? src + (row0 + r) * width + e : src, in ? 16 : 0);
    }
  } else {
    tile_load_plain<S, D>(dst, src, row0, rows, width, tile_rows, kFwdThreads);
  }
}

// One block per (128-row query tile, b*h), 8 warps; see the file comment.
template <class S, int D>
__global__ void __launch_bounds__(kFwdThreads) tc_forward_kernel(Problem<S> p, int64_t n_tiles, S* out,
                                                                 float* lse) {
  using L = FwdLayout<D>;
  using T16 = Dev<S>;
  constexpr int ld = L::ld;
  extern __shared__ __align__(128) unsigned char tc_shared[];
  SharedCarver carve{tc_shared};
  T16* sq = carve.take<T16>(L::q_bytes);
  T16* sk = carve.take<T16>(2 * L::kv_bytes);
  T16* sv = carve.take<T16>(2 * L::kv_bytes);

  // Lane (g, t) = (lane / 4, lane % 4) holds rows g and g + 8 of its warp's 16 (warp_mma.cuh's
  // C layout): x = 0, 1 row g, x = 2, 3 row g + 8, columns 2t + (x & 1) of each 8-wide n-tile.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const TileOfBlock tb = tile_of_block(blockIdx.x, n_tiles);
  const Head<S> hd(p, tb.bh);
  const int64_t i0 = tb.tile * kFwdRows, rows = p.Sq - i0 < kFwdRows ? p.Sq - i0 : kFwdRows;
  const int64_t key_end = attention_key_end(i0 + rows, p.Sk, p.is_causal);
  const int64_t key_tiles = (key_end + kFwdKeys - 1) / kFwdKeys;
  const bool warp_busy = 16 * warp < rows;  // else every row of the warp is padding
  const int e_frags = frags16(p.E), v_pairs = frags16(p.Ev);  // 16-wide blocks of E and Ev
  const float scale_log2 = p.scale * kLog2e;

  OnlineSoftmax<float, true> row_state[2];  // of rows g and g + 8, scores in log2 units
  float acc[D / 8][4];                       // O, 16 x D: n-tile dn holds columns 8dn..8dn + 7
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;
  uint32_t qf[D / 16][4];  // the warp's Q as A fragments, held for the whole loop

  if (key_tiles > 0) {  // group 0: Q and the first K, V tile
    fwd_load<S, D>(sq, hd.q, i0, rows, p.E, kFwdRows);
    fwd_load<S, D>(sk, hd.k, 0, key_end < kFwdKeys ? key_end : kFwdKeys, p.E, kFwdKeys);
    fwd_load<S, D>(sv, hd.v, 0, key_end < kFwdKeys ? key_end : kFwdKeys, p.Ev, kFwdKeys);
    cp_async_commit_group();
  }
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const int64_t j0 = kt * kFwdKeys, cols = key_end - j0 < kFwdKeys ? key_end - j0 : kFwdKeys;
    if (kt + 1 < key_tiles) {  // tile kt + 1 into the other buffer, read by nobody since the last barrier
      const int64_t j1 = j0 + kFwdKeys, next = key_end - j1 < kFwdKeys ? key_end - j1 : kFwdKeys;
      fwd_load<S, D>(sk + (kt + 1) % 2 * kFwdKeys * ld, hd.k, j1, next, p.E, kFwdKeys);
      fwd_load<S, D>(sv + (kt + 1) % 2 * kFwdKeys * ld, hd.v, j1, next, p.Ev, kFwdKeys);
      cp_async_commit_group();
      cp_async_wait_group<1>();  // everything but tile kt + 1 has landed
    } else {
      cp_async_wait_group<0>();
    }
    __syncthreads();  // every thread's copies of tile kt (and Q) are visible
    if (warp_busy) {
      const T16* tk = sk + kt % 2 * kFwdKeys * ld;
      const T16* tv = sv + kt % 2 * kFwdKeys * ld;
      if (kt == 0) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          if (kk < e_frags) ldmatrix<4>(qf[kk], sq + (16 * warp + lane % 16) * ld + 16 * kk + 8 * (lane / 16));
      }
      const int key_frags = frags16(cols);  // 16-key blocks with a real key; the rest is skipped
      // S = Q K^T: n-tiles 2np, 2np + 1 from one ldmatrix.x4 of K rows 16np..16np + 15.
      float s[kFwdKeys / 8][4];
#pragma unroll
      for (int np = 0; np < kFwdKeys / 16; ++np) {
        if (np >= key_frags) break;
        for (int x = 0; x < 4; ++x) s[2 * np][x] = s[2 * np + 1][x] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          if (kk >= e_frags) break;
          uint32_t kf[4];
          ldmatrix<4>(kf, tk + (16 * np + 8 * (lane / 16) + lane % 8) * ld + 16 * kk + 8 * (lane / 8 % 2));
          mma_m16n8k16<T16>(s[2 * np], qf[kk], {kf[0], kf[1]}, s[2 * np]);
          mma_m16n8k16<T16>(s[2 * np + 1], qf[kk], {kf[2], kf[3]}, s[2 * np + 1]);
        }
      }
      // Scores in log2 units, the tile's row maxima over the quad (lanes 4g..4g + 3 hold a row).
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < kFwdKeys / 8; ++nt) {
        if (nt >= 2 * key_frags) break;
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int r = 16 * warp + g + 8 * (x / 2);
          const float v = tc_score(p, hd, scale_log2, kLog2e, s[nt][x], i0 + r, j0 + 8 * nt + 2 * t + x % 2, r < rows);
          s[nt][x] = v;
          tile_max[x / 2] = v > tile_max[x / 2] ? v : tile_max[x / 2];
        }
      }
      float corr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // the quad's four lanes agree on the maximum, hence on the state
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        corr[h] = row_state[h].begin_block(tile_max[h]);
      }
      // P = exp2(s - shift), rounded (times the dropout factor) into A fragments: A's k block kk
      // is S's n-tiles 2kk (a[0], a[1]) and 2kk + 1 (a[2], a[3]). l adds the f32 weights.
      uint32_t pf[kFwdKeys / 16][4];
      float sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int nt = 0; nt < kFwdKeys / 8; ++nt) {
        if (nt >= 2 * key_frags) break;
        T16 w16[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const float w = row_state[x / 2].weight(s[nt][x]);
          sum[x / 2] += w;
          const int64_t i = i0 + 16 * warp + g + 8 * (x / 2), j = j0 + 8 * nt + 2 * t + x % 2;
          w16[x] = Tc16<S>::round(w != 0.0f ? w * p.dropout_factor(tb.bh, i, j) : 0.0f);
        }
        pf[nt / 2][2 * (nt % 2)] = pack2(w16[0], w16[1]);
        pf[nt / 2][2 * (nt % 2) + 1] = pack2(w16[2], w16[3]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // a + b == b + a: the quad's four lanes agree bit for bit
        sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
        sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
        row_state[h].add(sum[h]);  // l was rescaled by begin_block
      }
      // O = O exp2(m_old - m_new) + P V: V's dims 16dp..16dp + 15 from one ldmatrix.x4.trans.
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        if (dn >= 2 * v_pairs) break;
        acc[dn][0] *= corr[0];
        acc[dn][1] *= corr[0];
        acc[dn][2] *= corr[1];
        acc[dn][3] *= corr[1];
      }
#pragma unroll
      for (int kk = 0; kk < kFwdKeys / 16; ++kk) {
        if (kk >= key_frags) break;
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          if (dp >= v_pairs) break;
          uint32_t vf[4];
          ldmatrix_trans<4>(vf, tv + (16 * kk + lane % 16) * ld + 16 * dp + 8 * (lane / 16));
          mma_m16n8k16<T16>(acc[2 * dp], pf[kk], {vf[0], vf[1]}, acc[2 * dp]);
          mma_m16n8k16<T16>(acc[2 * dp + 1], pf[kk], {vf[2], vf[3]}, acc[2 * dp + 1]);
        }
      }
    }
    __syncthreads();  // every warp is done with buffer kt % 2 before tile kt + 2 copies into it
  }
  if (!warp_busy) return;
  // out = O / l (0 for a row with no allowed key), lse = ln 2 (m + log2 l) (-inf for such a row).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = 16 * warp + g + 8 * h;
    if (r >= rows) continue;
    const float inv = row_state[h].inverse_sum();
    const int64_t row = tb.bh * p.Sq + i0 + r;
    if (t == 0) lse[row] = row_state[h].logsumexp();
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      for (int y = 0; y < 2; ++y) {
        const int64_t c = 8 * dn + 2 * t + y;
        if (c < p.Ev) store(out + row * p.Ev + c, acc[dn][2 * h + y] * inv);
      }
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
// The tensor-core kernels take more than the default 48 KiB of dynamic shared memory
// (TcLayout: 46-100 KiB forward, 61-121 KiB backward), which sm_90 grants on request.
template <class Kernel>
void allow_shared(Kernel kernel, size_t bytes, const char* name) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)", name);
}

template <class S, int D>
void tc_forward_for(const Problem<S>& p, int64_t BH, S* out, float* lse, cudaStream_t stream) {
  constexpr size_t bytes = FwdLayout<D>::bytes;
  const char* name = std::is_same_v<S, Half> ? "attention forward (f16)" : "attention forward (bf16)";
  allow_shared(tc_forward_kernel<S, D>, bytes, name);
  const int64_t n_tiles = ceil_div(p.Sq, kFwdRows);
  tc_forward_kernel<S, D><<<grid_for(name, BH, n_tiles), kFwdThreads, bytes, stream>>>(p, n_tiles, out, lse);
  check_launch(name);
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
}
}  // namespace

#define ND_TC_ATTENTION(S, label)                                                                                   \
  void scaled_dot_product_attention_forward(const S* q, const S* k, const S* v, AttentionMask<S> mask, int64_t B,    \
                                            int64_t H, int64_t Sq, int64_t Sk, int64_t E, int64_t Ev,               \
                                            bool is_causal, double scale, const AttentionDropout& dropout,         \
                                            S* out, float* logsumexp, cudaStream_t stream) {                       \
    run_forward<S>("attention forward (" label ")", q, k, v, mask, B, H, Sq, Sk, E, Ev, is_causal, scale, dropout, \
                   [&](auto D, const Problem<S>& p, int64_t BH) {                                                   \
                     tc_forward_for<S, decltype(D)::value>(p, BH, out, logsumexp, stream);                          \
                   });                                                                                              \
  }                                                                                                                 \
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
ND_TC_ATTENTION(BFloat16, "bf16")
ND_TC_ATTENTION(Half, "f16")
#undef ND_TC_ATTENTION

}  // namespace nd::kernels::cuda
