// FlashAttention-2 backward on CUDA in bf16 (and f16), on tensor cores: dq, dk, dv of
// attention_tc_forward.cu's forward (engine/ops/attention.cpp's autocast path). Templates on
// the 16-bit storage type S (BFloat16 or Half, Tc16 in attention_tc.cuh). The delta pass
// D_i = dout_i . out_i (f32 sums) is attention.cuh's, shared with the f32/f64 SIMT backward.
//
// Register-resident like the forward: mma.sync m16n8k16, ldmatrix and cp.async
// through warp_mma.cuh, whose fragment layouts are documented. Two kernels, 4 warps a block,
// a block owning kBwdRows = 64 rows (warp w rows 16w..16w+15; lane (g, t) = (lane / 4,
// lane % 4) holds rows g and g + 8, columns 2t, 2t + 1 of each 8-wide n-tile) and streaming
// 64-row tiles of the other side through two cp.async buffers (tile t + 1 copies while t is
// read):
// - dk, dv (FA2's main loop): a block owns 64 keys; K and V are copied once and, for D <= 64,
//   held as A fragments in registers (at D = 128 re-read from shared memory per use: held,
//   they would push the kernel past 255 registers). Q, dO and the tile's lse and delta stream
//   in. Per query tile a warp computes the TRANSPOSED scores S^T = K Q^T and dP^T = V dO^T
//   (4 of FA2's 5 GEMMs here: S^T, dP^T, dV, dK; the dq kernel recomputes two), turns them in registers into P^T = exp2(s2 - lse log2 e) (s2 = log2 e (scale dot
//   + mask), the forward's units) and dS^T = P^T (Z dP^T - delta), and adds dV += (Z P)^T dO,
//   dK += dS^T Q. Computing S^T rather than S is what makes the transposed products free:
//   the accumulators of S^T's n-tiles 2k, 2k + 1 are exactly the A fragment of k-block k of
//   P^T (the forward's P-to-A identity), and dO, Q are B operands read by ldmatrix.trans. The
//   alternatives cost more: staging P and dS through shared memory in bf16 (FA2's sm80 code)
//   adds per query tile 2 x 64 x 64 x 2 bytes of stores and ldmatrix loads a block and a
//   barrier between the warps; an accumulator-to-A relayout of S (not S^T) needs a transpose
//   across lanes (8 shuffles per 16 x 16 block).
// - dq: a block owns 64 queries; Q and dO are copied once (held as A fragments for D <= 64),
//   K and V stream in; per key tile S = Q K^T and dP = dO V^T are recomputed, dS formed in
//   registers as above and reused as the A operand of dQ += dS K (ldmatrix.trans of K rows).
//   Why a second kernel (FA2's "dq per query tile") and not dq partials per key tile summed in
//   a fixed order (both deterministic; FA2's atomicAdd of dq is not): at BH = 64, S = 256,
//   D = 64 the partials would write and read back Sk / 64 f32 copies of dq (33.5 MB, twice
//   the bytes of every input and output together; about 13 us at the cost model's copy rate,
//   plus a launch to sum them) to save two of seven 64 x 64 x D GEMMs per tile pair, where the
//   whole recomputing dq kernel is estimated at 7.4 us (bench/RESULTS.md, "Cost model: the
//   attention backward on mma.sync").
// P uses the saved lse (natural log) as exp2(s2 - log2 e lse); a fully masked or padding
// element has s2 = -inf and P = 0 (never -inf - (-inf)). Padding: keys past Sk and queries
// past Sq are zero rows in shared memory (cp.async zero-fill) and valid == false in tc_score,
// so their P and dS are 0; padding queries' lse and delta are stored as -inf and 0 (not
// stale: 0 x NaN would poison dS); 16-row blocks past the tile's end and 16-wide blocks past E
// or Ev are skipped (block-uniform); a warp whose 16 rows are all padding only copies and
// waits. Dropout: Z from kernels/common/dropout_mask.h at (bh, i, j), the forward's bits.
// Per-element work as in the forward: causality and padding are one range per row
// and tile (dq: keys c < seen, attention_keys_seen; dk/dv: queries seen_from <= c < rows,
// attention_first_query_seeing), dq skips 16-key blocks past its warp's last row's range and
// dk/dv 16-query blocks before its warp's first key's range (causal: the diagonal tiles'
// masked halves), and the mask and dropout live in the kMaskDropout = true instantiation, run
// only by launches that have one of them (with_mask_dropout).
// Registers (ptxas, bench/kernel_resources.md), no spills: without mask and dropout dk/dv 165,
// 232, 227 and dq 153, 168, 209 at D = 32, 64, 128; with them dk/dv 226, 244, 250 and dq 159,
// 230, 231 (before the split, one kernel: dk/dv 230, 244, 246, dq 167, 228, 234). Blocks per
// SM: 3 (12 warps; 168 registers, asked of ptxas by bwd_min_blocks) for the copies without mask
// and dropout of dk/dv at D = 32 and dq at D <= 64 (and dq at D = 32 with them: 159), else 2.
// Not reached: dk/dv at D = 64 asked for 3 spills 1072 bytes (72 with its queries in 32-query
// chunks, free of extra loads there as K and V are held in registers) and at D = 128 1332
// bytes (dK and dV alone are 128 registers); dq at D = 128 spills 24 bytes. At D = 128 dk/dv
// takes a query tile in two 32-query halves: S^T, dP^T of 64 beside dK, dV's 128 spilled 20
// bytes.
// Rounding points, all round-to-nearest-even: Z P and dS to bf16 before dV = (Z P)^T dO,
// dK = dS^T Q and dQ = dS K; dq, dk, dv once at the end (dq and dk times the scale). The
// scores, P, dP, lse, delta and every accumulator are f32. Bit-reproducible: each element is
// summed by one fixed sequence of mma and SIMT operations, no atomics.
// Checked so far only on a CPU emulation of the kernel bodies (a thread per CUDA thread;
// mma.sync, ldmatrix and cp.async emulated with their lane maps; warp-collective calls and
// shared-memory races checked) against the f32 CPU kernel at tests/emu's and tests/cuda's
// shapes (tests/emu/attention_emu_test.cpp); the test fails with the P and dS A fragments
// built on a wrong lane map (rows g and g + 8 exchanged), with dS missing its delta term,
// with dk/dv's dropout factor left out or its bits one element off (also dq's), with dq's
// causal range one key too long or its block skip one row short, and with dk/dv's first
// query one late or its block skip one key late. ptxas compiles it for sm_90; no GPU has run
// it yet.
#include "kernels/cuda/attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/float16.h"
#include "kernels/common/online_softmax.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/cuda/warp_mma.cuh"

namespace nd::kernels::cuda {

namespace {

constexpr int kBwdWarps = kThreads / 32;  // 4
constexpr int kBwdRows = 16 * kBwdWarps;  // rows a block owns (keys or queries) and rows of a streamed tile: 64
constexpr int kBwdN = kBwdRows / 8;       // 8-wide n-tiles of a streamed tile

// Dynamic shared memory for head dim D: the block's own two tiles (K, V or Q, dO) [64][D + 8] |
// the streamed two, double-buffered, [2][64][D + 8] each | (dk/dv) lse and delta [2][64] f32.
// D + 8 values a row: an odd multiple of 16 bytes, so an ldmatrix phase's 8 rows fall on 8
// distinct 16-byte bank groups (the forward's argument).
template <int D>
struct BwdLayout {
  static constexpr int ld = D + 8;
  static constexpr size_t tile_bytes = size_t(kBwdRows) * ld * 2;
  static constexpr size_t stats_bytes = 2 * 2 * kBwdRows * sizeof(float);
  static constexpr size_t dq = 6 * tile_bytes, dk_dv = dq + stats_bytes;
  static_assert(tile_bytes % 128 == 0 && dk_dv <= 227 * 1024, "sm_90 allows 227 KiB per block");
};

// Operand fragments of the warp's own 16 rows: held in registers for the whole loop when
// D <= 64; at D = 128 re-read from shared memory per use (kk-th 16 columns), which keeps the
// dk/dv kernel (dK and dV accumulators: 128 registers) under 255.
template <class T16, int D>
struct OwnRows {
  static constexpr bool kHeld = D <= 64;
  const T16* rows;  // the warp's first row in shared memory, ld D + 8
  uint32_t held[kHeld ? D / 16 : 1][4];
  __device__ void hold(int k_frags) {
    if constexpr (kHeld)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        if (kk < k_frags) read(kk, held[kk]);
  }
  __device__ void read(int kk, uint32_t (&a)[4]) const {
    const int lane = threadIdx.x % 32;
    ldmatrix<4>(a, rows + (lane % 16) * (D + 8) + 16 * kk + 8 * (lane / 16));
  }
  __device__ void fragment(int kk, uint32_t (&a)[4]) const {
    if constexpr (kHeld) {
      for (int x = 0; x < 4; ++x) a[x] = held[kk][x];
    } else {
      read(kk, a);
    }
  }
};

// c = A B^T for the warp's 16 own rows A (k_frags 16-column blocks) and the streamed rows
// b + 16np.. as B^T (n-tiles 2np, 2np + 1 from one ldmatrix.x4), n_first <= np < n_frags (N
// n-tiles; those before n_first are 0).
template <class T16, int D, int N>
__device__ void mma_abt(float (&c)[N][4], const OwnRows<T16, D>& a, const T16* b, int n_first, int n_frags,
                        int k_frags) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nt = 0; nt < N; ++nt) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    if (kk >= k_frags) break;
    uint32_t af[4];
    a.fragment(kk, af);
#pragma unroll
    for (int np = 0; np < N / 2; ++np) {
      if (np >= n_frags) break;
      if (np < n_first) continue;
      uint32_t bf[4];
      ldmatrix<4>(bf, b + (16 * np + 8 * (lane / 16) + lane % 8) * (D + 8) + 16 * kk + 8 * (lane / 8 % 2));
      mma_m16n8k16<T16>(c[2 * np], af, {bf[0], bf[1]}, c[2 * np]);
      mma_m16n8k16<T16>(c[2 * np + 1], af, {bf[2], bf[3]}, c[2 * np + 1]);
    }
  }
}

// acc += A B for A = a (k-block kk: the streamed rows b + 16kk.., k_first <= kk < k_frags;
// a's other blocks are not read) and B those rows [16 KB][D] read by ldmatrix.x4.trans (dims
// 16dp..16dp + 15, dp < d_frags).
template <class T16, int D, int KB>
__device__ void mma_ab(float (&acc)[D / 8][4], const uint32_t (&a)[KB][4], const T16* b, int k_first, int k_frags,
                       int d_frags) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < KB; ++kk) {
    if (kk >= k_frags) break;
    if (kk < k_first) continue;
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      if (dp >= d_frags) break;
      uint32_t bf[4];
      ldmatrix_trans<4>(bf, b + (16 * kk + lane % 16) * (D + 8) + 16 * dp + 8 * (lane / 16));
      mma_m16n8k16<T16>(acc[2 * dp], a[kk], {bf[0], bf[1]}, acc[2 * dp]);
      mma_m16n8k16<T16>(acc[2 * dp + 1], a[kk], {bf[2], bf[3]}, acc[2 * dp + 1]);
    }
  }
}

// Element x of n-tile nt rounded into the A fragment of k-block nt / 2 (the C-to-A identity).
template <class S, int KB>
__device__ void pack_a(uint32_t (&a)[KB][4], int nt, const float (&v)[4]) {
  a[nt / 2][2 * (nt % 2)] = pack2(Tc16<S>::round(v[0]), Tc16<S>::round(v[1]));
  a[nt / 2][2 * (nt % 2) + 1] = pack2(Tc16<S>::round(v[2]), Tc16<S>::round(v[3]));
}

// P (f32) from a score in log2 units and the row's lse (natural log): 0 where s2 = -inf.
__device__ float probability_log2(float s2, float lse) { return s2 == -INFINITY ? 0.0f : exp2f(s2 - kLog2e * lse); }

// dst[r * width + c] = acc * factor for the warp's rows r < rows, columns c < width.
template <class S, int D>
__device__ void store_rows(const float (&acc)[D / 8][4], float factor, S* dst, int64_t rows, int64_t width) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int x = 0; x < 4; ++x) {
    const int64_t r = g + 8 * (x / 2);
    if (r >= rows) continue;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      const int64_t c = 8 * dn + 2 * t + x % 2;
      if (c < width) store(dst + r * width + c, acc[dn][x] * factor);
    }
  }
}

// lse and delta of query rows [i0, i0 + rows) into 64-entry buffers: cp.async for the rows,
// plain stores of -inf and 0 for the padding (visible after the next __syncthreads).
template <class S>
__device__ void stats_load(float* lse, float* delta, const Head<S>& hd, int64_t i0, int64_t rows) {
  const int r = threadIdx.x % kBwdRows;
  float* dst = threadIdx.x < kBwdRows ? lse : delta;
  const float* src = threadIdx.x < kBwdRows ? hd.lse : hd.delta;
  if (r < rows) cp_async_ca<4>(dst + r, src + i0 + r);
  else dst[r] = threadIdx.x < kBwdRows ? -INFINITY : 0.0f;
}

// Blocks per SM asked of ptxas (__launch_bounds__' second argument; 0: none asked): 3, at most
// 168 registers, where that does not spill (the file comment's numbers).
constexpr int bwd_min_blocks(bool dq, int D, bool mask_dropout) {
  return !mask_dropout && D <= (dq ? 64 : 32) ? 3 : 0;
}

// dk, dv: one block per (64-key tile, b*h); see the file comment.
template <class S, int D, bool kMaskDropout>
__global__ void __launch_bounds__(kThreads, bwd_min_blocks(false, D, kMaskDropout))
    tc_dk_dv_kernel(Problem<S> p, int64_t n_tiles, S* dk, S* dv) {
  using L = BwdLayout<D>;
  using T16 = Dev<S>;
  constexpr int ld = L::ld;
  extern __shared__ __align__(128) unsigned char tc_shared[];
  SharedCarver carve{tc_shared};
  T16* sk = carve.take<T16>(L::tile_bytes);
  T16* sv = carve.take<T16>(L::tile_bytes);
  T16* sq = carve.take<T16>(2 * L::tile_bytes);
  T16* sdo = carve.take<T16>(2 * L::tile_bytes);
  float* stats = carve.take<float>(L::stats_bytes);  // [buffer][lse, delta][64]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const TileOfBlock tb = tile_of_block(blockIdx.x, n_tiles);
  const Head<S> hd(p, tb.bh);
  const int64_t j0 = tb.tile * kBwdRows, cols = p.Sk - j0 < kBwdRows ? p.Sk - j0 : kBwdRows;
  const int64_t first = attention_first_query_tile(j0, kBwdRows, p.is_causal), q_tiles = (p.Sq + kBwdRows - 1) / kBwdRows;
  const bool warp_busy = 16 * warp < cols;
  const int e_frags = frags16(p.E), ev_frags = frags16(p.Ev);
  const float scale_log2 = p.scale * kLog2e;
  OwnRows<T16, D> kr{sk + 16 * warp * ld, {}}, vr{sv + 16 * warp * ld, {}};

  float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn)
    for (int x = 0; x < 4; ++x) dk_acc[dn][x] = dv_acc[dn][x] = 0.0f;
  auto load_queries = [&](int64_t qt, int buf) {
    const int64_t i0 = qt * kBwdRows, rows = p.Sq - i0 < kBwdRows ? p.Sq - i0 : kBwdRows;
    tile_load_async<S, D>(sq + buf * kBwdRows * ld, hd.q, i0, rows, p.E, kBwdRows, kThreads);
    tile_load_async<S, D>(sdo + buf * kBwdRows * ld, hd.dout, i0, rows, p.Ev, kBwdRows, kThreads);
    stats_load(stats + buf * 2 * kBwdRows, stats + (buf * 2 + 1) * kBwdRows, hd, i0, rows);
    cp_async_commit_group();
  };
  if (first < q_tiles) {  // group 0: K, V and the first query tile
    tile_load_async<S, D>(sk, hd.k, j0, cols, p.E, kBwdRows, kThreads);
    tile_load_async<S, D>(sv, hd.v, j0, cols, p.Ev, kBwdRows, kThreads);
    load_queries(first, 0);
  }
  for (int64_t qt = first; qt < q_tiles; ++qt) {
    const int buf = (qt - first) % 2;
    const int64_t i0 = qt * kBwdRows, rows = p.Sq - i0 < kBwdRows ? p.Sq - i0 : kBwdRows;
    if (qt + 1 < q_tiles) {  // into the other buffer, read by nobody since the last barrier
      load_queries(qt + 1, 1 - buf);
      cp_async_wait_group<1>();
    } else {
      cp_async_wait_group<0>();
    }
    __syncthreads();  // every thread's copies of tile qt (and K, V) are visible
    if (warp_busy) {
      const T16 *tq = sq + buf * kBwdRows * ld, *tdo = sdo + buf * kBwdRows * ld;
      const float *slse = stats + buf * 2 * kBwdRows, *sdelta = slse + kBwdRows;
      if (qt == first) {
        kr.hold(e_frags);
        vr.hold(ev_frags);
      }
      // The queries i0 + c that key row r is seen by: seen_from <= c < rows (causality and
      // padding queries in two compares; none for a padding key).
      int seen_from[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = 16 * warp + g + 8 * h;
        const int64_t from = r < cols ? attention_first_query_seeing(j0 + r, i0, i0 + rows, p.is_causal) : rows;
        seen_from[h] = static_cast<int>(from);
      }
      // 16-query blocks before the range of the warp's first key are skipped (causal: a
      // diagonal tile's lower blocks, none of which the warp's keys are seen by).
      const int warp_from = static_cast<int>(attention_first_query_seeing(j0 + 16 * warp, i0, i0 + rows, p.is_causal));
      // The tile's queries in chunks of kChunk (all 64 for D <= 64; 2 x 32 at D = 128, where
      // S^T and dP^T of 64 queries beside the dK, dV accumulators would spill).
      constexpr int kChunk = D <= 64 ? kBwdRows : kBwdRows / 2, kN = kChunk / 8;
#pragma unroll
      for (int c0 = 0; c0 < kBwdRows; c0 += kChunk) {
        const int query_frags = frags16(rows - c0 < kChunk ? rows - c0 : kChunk);
        if (query_frags <= 0) break;
        const int first_frag = warp_from > c0 ? (warp_from - c0) / 16 : 0;
        if (first_frag >= query_frags) continue;
        float s[kN][4], dp[kN][4];  // S^T, dP^T: rows = the warp's keys, columns = queries c0..
        mma_abt<T16, D>(s, kr, tq + c0 * ld, first_frag, query_frags, e_frags);
        mma_abt<T16, D>(dp, vr, tdo + c0 * ld, first_frag, query_frags, ev_frags);
        uint32_t pf[kN / 2][4], dsf[kN / 2][4];
#pragma unroll
        for (int nt = 0; nt < kN; ++nt) {
          if (nt >= 2 * query_frags) break;
          if (nt < 2 * first_frag) continue;
          float zp[4], ds[4];
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            const int r = 16 * warp + g + 8 * (x / 2), c = c0 + 8 * nt + 2 * t + x % 2;
            const float s2 = tc_score<kMaskDropout>(p, hd, scale_log2, kLog2e, s[nt][x],
                                                    c >= seen_from[x / 2] && c < rows, i0 + c, j0 + r);
            const float prob = probability_log2(s2, slse[c]);
            float z = 1.0f;
            if constexpr (kMaskDropout)
              if (prob != 0.0f && p.dropout.p != 0.0) z = p.dropout_factor(tb.bh, i0 + c, j0 + r);
            zp[x] = prob * z;
            ds[x] = prob != 0.0f ? prob * (z * dp[nt][x] - sdelta[c]) : 0.0f;
          }
          pack_a<S>(pf, nt, zp);
          pack_a<S>(dsf, nt, ds);
        }
        mma_ab<T16, D>(dv_acc, pf, tdo + c0 * ld, first_frag, query_frags, ev_frags);
        mma_ab<T16, D>(dk_acc, dsf, tq + c0 * ld, first_frag, query_frags, e_frags);
      }
    }
    __syncthreads();  // every warp is done with buffer buf before tile qt + 2 copies into it
  }
  if (!warp_busy) return;
  const int64_t key = j0 + 16 * warp;
  store_rows<S, D>(dk_acc, p.scale, dk + (tb.bh * p.Sk + key) * p.E, cols - 16 * warp, p.E);
  store_rows<S, D>(dv_acc, 1.0f, dv + (tb.bh * p.Sk + key) * p.Ev, cols - 16 * warp, p.Ev);
}

// dq: one block per (64-query tile, b*h); see the file comment.
template <class S, int D, bool kMaskDropout>
__global__ void __launch_bounds__(kThreads, bwd_min_blocks(true, D, kMaskDropout))
    tc_dq_kernel(Problem<S> p, int64_t n_tiles, S* dq) {
  using L = BwdLayout<D>;
  using T16 = Dev<S>;
  constexpr int ld = L::ld;
  extern __shared__ __align__(128) unsigned char tc_shared[];
  SharedCarver carve{tc_shared};
  T16* sq = carve.take<T16>(L::tile_bytes);
  T16* sdo = carve.take<T16>(L::tile_bytes);
  T16* sk = carve.take<T16>(2 * L::tile_bytes);
  T16* sv = carve.take<T16>(2 * L::tile_bytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const TileOfBlock tb = tile_of_block(blockIdx.x, n_tiles);
  const Head<S> hd(p, tb.bh);
  const int64_t i0 = tb.tile * kBwdRows, rows = p.Sq - i0 < kBwdRows ? p.Sq - i0 : kBwdRows;
  const int64_t key_end = attention_key_end(i0 + rows, p.Sk, p.is_causal);
  const int64_t key_tiles = (key_end + kBwdRows - 1) / kBwdRows;
  const bool warp_busy = 16 * warp < rows;
  const int e_frags = frags16(p.E), ev_frags = frags16(p.Ev);
  const float scale_log2 = p.scale * kLog2e;
  OwnRows<T16, D> qr{sq + 16 * warp * ld, {}}, dor{sdo + 16 * warp * ld, {}};
  float lse[2], delta[2];  // of rows g and g + 8 (padding rows: s2 = -inf, never read)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = 16 * warp + g + 8 * h;
    lse[h] = r < rows ? hd.lse[i0 + r] : -INFINITY;
    delta[h] = r < rows ? hd.delta[i0 + r] : 0.0f;
  }

  float dq_acc[D / 8][4];
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) dq_acc[dn][0] = dq_acc[dn][1] = dq_acc[dn][2] = dq_acc[dn][3] = 0.0f;
  auto load_keys = [&](int64_t kt, int buf) {
    const int64_t j0 = kt * kBwdRows, cols = key_end - j0 < kBwdRows ? key_end - j0 : kBwdRows;
    tile_load_async<S, D>(sk + buf * kBwdRows * ld, hd.k, j0, cols, p.E, kBwdRows, kThreads);
    tile_load_async<S, D>(sv + buf * kBwdRows * ld, hd.v, j0, cols, p.Ev, kBwdRows, kThreads);
    cp_async_commit_group();
  };
  if (key_tiles > 0) {  // group 0: Q, dO and the first K, V tile
    tile_load_async<S, D>(sq, hd.q, i0, rows, p.E, kBwdRows, kThreads);
    tile_load_async<S, D>(sdo, hd.dout, i0, rows, p.Ev, kBwdRows, kThreads);
    load_keys(0, 0);
  }
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const int buf = kt % 2;
    const int64_t j0 = kt * kBwdRows, cols = key_end - j0 < kBwdRows ? key_end - j0 : kBwdRows;
    if (kt + 1 < key_tiles) {
      load_keys(kt + 1, 1 - buf);
      cp_async_wait_group<1>();
    } else {
      cp_async_wait_group<0>();
    }
    __syncthreads();
    if (warp_busy && kt == 0) {
      qr.hold(e_frags);
      dor.hold(ev_frags);
    }
    // The tile's keys j0 + c that row r sees: c < seen (the forward's ranges); 16-key blocks
    // past the warp's last row's range are skipped.
    const int64_t warp_last = 16 * warp + 15 < rows ? 16 * warp + 15 : rows - 1;
    const int key_frags = warp_busy ? frags16(attention_keys_seen(i0 + warp_last, j0, j0 + cols, p.is_causal)) : 0;
    if (key_frags > 0) {
      const T16 *tk = sk + buf * kBwdRows * ld, *tv = sv + buf * kBwdRows * ld;
      int seen[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = 16 * warp + g + 8 * h;
        seen[h] = r < rows ? static_cast<int>(attention_keys_seen(i0 + r, j0, j0 + cols, p.is_causal)) : 0;
      }
      float s[kBwdN][4], dp[kBwdN][4];  // S, dP: rows = the warp's queries, columns = keys
      mma_abt<T16, D>(s, qr, tk, 0, key_frags, e_frags);
      mma_abt<T16, D>(dp, dor, tv, 0, key_frags, ev_frags);
      uint32_t dsf[kBwdN / 2][4];
#pragma unroll
      for (int nt = 0; nt < kBwdN; ++nt) {
        if (nt >= 2 * key_frags) break;
        float ds[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int r = 16 * warp + g + 8 * (x / 2), c = 8 * nt + 2 * t + x % 2;
          const float s2 = tc_score<kMaskDropout>(p, hd, scale_log2, kLog2e, s[nt][x], c < seen[x / 2], i0 + r, j0 + c);
          const float prob = probability_log2(s2, lse[x / 2]);
          float z = 1.0f;
          if constexpr (kMaskDropout)
            if (prob != 0.0f && p.dropout.p != 0.0) z = p.dropout_factor(tb.bh, i0 + r, j0 + c);
          ds[x] = prob != 0.0f ? prob * (z * dp[nt][x] - delta[x / 2]) : 0.0f;
        }
        pack_a<S>(dsf, nt, ds);
      }
      mma_ab<T16, D>(dq_acc, dsf, tk, 0, key_frags, e_frags);
    }
    __syncthreads();
  }
  if (!warp_busy) return;
  store_rows<S, D>(dq_acc, p.scale, dq + (tb.bh * p.Sq + i0 + 16 * warp) * p.E, rows - 16 * warp, p.E);
}

template <class S, int D, bool kMaskDropout>
void tc_backward_for(const Problem<S>& p, int64_t BH, S* dq, S* dk, S* dv, cudaStream_t stream) {
  constexpr bool f16 = std::is_same_v<S, Half>;
  if (p.Sk > 0) {  // dk, dv: written even when Sq == 0 (then zero)
    const char* name = f16 ? "attention backward dk, dv (f16)" : "attention backward dk, dv (bf16)";
    constexpr size_t bytes = BwdLayout<D>::dk_dv;
    allow_shared<tc_dk_dv_kernel<S, D, kMaskDropout>>(bytes, name);
    const int64_t n_tiles = ceil_div(p.Sk, kBwdRows);
    tc_dk_dv_kernel<S, D, kMaskDropout><<<grid_for(name, BH, n_tiles), kThreads, bytes, stream>>>(p, n_tiles, dk, dv);
    check_launch(name);
  }
  if (p.Sq > 0) {
    const char* name = f16 ? "attention backward dq (f16)" : "attention backward dq (bf16)";
    constexpr size_t bytes = BwdLayout<D>::dq;
    allow_shared<tc_dq_kernel<S, D, kMaskDropout>>(bytes, name);
    const int64_t n_tiles = ceil_div(p.Sq, kBwdRows);
    tc_dq_kernel<S, D, kMaskDropout><<<grid_for(name, BH, n_tiles), kThreads, bytes, stream>>>(p, n_tiles, dq);
    check_launch(name);
  }
}
}  // namespace

#define ND_TC_ATTENTION_BACKWARD(S, label)                                                                          \
  void scaled_dot_product_attention_backward(const S* dout, const S* q, const S* k, const S* v, AttentionMask<S> mask, \
                                             const S* out, const float* logsumexp, int64_t B, int64_t H,            \
                                             int64_t Sq, int64_t Sk, int64_t E, int64_t Ev, bool is_causal,         \
                                             double scale, const AttentionDropout& dropout, S* dq, S* dk, S* dv,    \
                                             cudaStream_t stream) {                                                 \
    run_backward<S>("attention backward (" label ")", dout, q, k, v, mask, out, logsumexp, B, H, Sq, Sk, E, Ev,      \
                    is_causal, scale, dropout, stream, [&](auto D, const Problem<S>& p, int64_t BH) {               \
                      with_mask_dropout(p, [&](auto md) {                                                           \
                        tc_backward_for<S, decltype(D)::value, decltype(md)::value>(p, BH, dq, dk, dv, stream);     \
                      });                                                                                           \
                    });                                                                                             \
  }
ND_TC_ATTENTION_BACKWARD(BFloat16, "bf16")
ND_TC_ATTENTION_BACKWARD(Half, "f16")
#undef ND_TC_ATTENTION_BACKWARD

}  // namespace nd::kernels::cuda
