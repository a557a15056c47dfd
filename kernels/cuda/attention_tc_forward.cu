// Flash-style attention forward on CUDA in bf16 (and f16), on tensor cores: what f32
// attention under autocast runs (engine/ops/attention.cpp). The kernel is a template on the
// 16-bit storage type S (BFloat16 or Half, Tc16 in attention_tc.cuh); what this comment says
// of bf16 holds for f16 with f16's rounding. The backward is attention_tc_backward.cu, the
// f32/f64 SIMT kernels attention.cu; what all need (Problem, Head, the head-dim dispatch, the
// grid helpers) is attention.cuh, what the two 16-bit files share attention_tc.cuh.
//
// The forward is register-resident, built as FlashAttention-2's: the scores S and
// the probabilities P never leave registers. mma.sync m16n8k16 and ldmatrix through
// warp_mma.cuh, whose documented fragment layouts say which lane holds which element (WMMA's
// do not). A block owns kFwdRows = 128 query rows and has 8 warps; warp w owns rows
// 16w..16w+15, and inside them lane (g, t) = (lane / 4, lane % 4) holds rows g and g + 8 (the
// mma's C layout: columns 2t, 2t + 1 of every 8-wide n-tile). Q is copied to shared memory once
// and held as A fragments; K and V come in 64-key tiles through cp.async into two buffers, tile
// t + 1 copying while tile t is read. Per key tile a warp
//   1. S = Q K^T in f32 accumulators (ldmatrix.x4 of K rows is the B fragment of two n-tiles),
//   2. takes the row maximum over the tile (a max over the lane's 16 values and two quad
//      shuffles, xor 1, 2) in log2 units: without mask and dropout of the raw dot products
//      (-inf where causal or padding), times c = scale log2(e) after (rounding is monotone,
//      so for c > 0 that is the maximum of the products; the host runs any other scale on
//      the general copy), with them of s2 = log2(e) (scale dot + mask) (c = 1); m' = max(m,
//      max), the factor exp2(m - m') (OnlineSoftmax<float, true>, kernels/common/
//      online_softmax.h, CPU-tested),
//   3. P = 2^(s c - m') as one FFMA and one MUFU.EX2 (ex2.approx.ftz, warp_ptx.cuh: a weight
//      below 2^-126 is 0, then rounded to 16 bits anyway), rounded times the dropout factor
//      straight into A fragments (two roundings into one F2FP pack): S's n-tiles 2k and 2k + 1
//      are exactly A's k-th 16-key block (P reused as the next operand), l = l exp2(m - m') +
//      the quad's sum of the f32 weights,
//   4. O = O exp2(m - m') + P V on its f32 accumulators (ldmatrix.x4.trans of V rows is the B
//      fragment of two 8-wide dim tiles): the rescale is per register, each lane knowing its
//      rows.
// At the end out = O / l and lse = ln 2 (m + log2 l) (natural log, as the backward and the
// CPU twin take it; -inf and out = 0 for a row with no allowed key); out goes rounded through
// the warp's own rows of Q's shared buffer and leaves in 16-byte stores (Ev % 8 == 0 and out
// 16-byte aligned; else 2-byte stores per element). Padding: rows past Sq and
// head-dim columns past E, Ev are zero in shared memory (cp.async's zero-fill); 16-key blocks
// past the tile's last key and 16-wide blocks past E or Ev are skipped (block-uniform); a
// warp whose 16 rows are all padding only copies and waits at the barriers.
// Per-element work: the loop body is compiled twice. A full tile (every row of the warp real
// and seeing all 64 keys, E = Ev = D: warp-uniform) runs a copy with no compare per score and
// no skipped block; an edge tile (the last keys, the causal diagonal, padding rows or head
// dims) pays one compare per score, of its column c in the tile with the row's range (c <
// seen: attention_keys_seen, kernels/common/online_softmax.h, CPU-tested against
// attention_allowed), and skips the 16-key blocks past the range of the warp's last row
// (causal: a diagonal tile's upper blocks, and whole tiles for a block's first warps). The
// additive mask (a 64-bit address per score) and dropout (a splitmix64 hash per score) live in
// a second instantiation, kMaskDropout = true, which the host picks only for launches that have
// one of them, or a scale <= 0 (with_forward_variant; with_mask_dropout, attention_tc.cuh). Measured
// with ptxas before the split: compiling mask, causality and dropout out took D = 32 from 178 to
// 122 registers and D = 64 from 200 to 172 (D = 128: 220 to 228, ptxas using what it is given).
// Registers (ptxas, bench/kernel_resources.md), no spills: without mask and dropout 126, 128,
// 229 at D = 32, 64, 128, where D <= 64 asks ptxas for two blocks (16 warps) per SM
// (fwd_min_blocks); with them 176, 222, 246, one 8-warp block (before the full-tile copy of
// the loop body: 128, 128, 216 and 159, 184, 234; before the mask split: one kernel at 178,
// 200, 220). D = 128 stays at one block: two need 128
// registers and spill 808 bytes even with every per-element test compiled out (O 64 + Q 32 +
// S 32 + P 16 = 144 before any index). Why 128 rows of 8 warps and not 64 of 4: two 64-row
// blocks give an SM the warps of one 128-row block while reading every K, V tile twice as often.
// The second instantiation doubles the file's kernels (12) and its device compile time
// (bench/RESULTS.md, "attnregs").
// Rounding points, all round-to-nearest-even: P = 2^(s c - m) to bf16 before P V (the row
// sum l adds the f32 weights, as FlashAttention does; the exponent in log2 units, its FFMA
// and ex2.approx move P by a few f32 ulps from exp(s - m), far below the bf16 rounding that
// follows); out once at the end. The scores, logsumexp and every accumulator are f32. Bit-reproducible: each element is
// summed by one fixed sequence of mma and SIMT operations (the quad sums add a + b, b + a: the
// same in every lane), no atomics.
// Checked so far only on a CPU emulation of the kernel (a thread per CUDA thread; mma.sync,
// ldmatrix and cp.async emulated with their lane maps; warp-collective calls and
// shared-memory races checked) against the f32 CPU kernel at tests/emu's and tests/cuda's
// shapes (tests/emu/attention_emu_test.cpp); the test fails with P's fragment built on a
// wrong lane map or without O's rescale, with the 16-key block skip one row short, the causal
// range one key too long, the dropout bits one element off, and with the host running the
// copy without mask and dropout for a launch with dropout alone. ptxas compiles it for sm_90;
// no GPU has run it yet.
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

// ---- Forward: register-resident (mma.sync m16n8k16, ldmatrix, cp.async; warp_mma.cuh)

constexpr int kFwdWarps = 8, kFwdThreads = 32 * kFwdWarps;
constexpr int kFwdRows = 16 * kFwdWarps;  // query rows of a block: 128, 16 per warp
constexpr int kFwdKeys = 64;              // keys of a K, V tile

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

// Blocks per SM asked of ptxas (__launch_bounds__' second argument; 0: none asked): 2, at most
// 128 registers, where that does not spill (the file comment's numbers).
constexpr int fwd_min_blocks(int D, bool mask_dropout) { return !mask_dropout && D <= 64 ? 2 : 0; }

// One block per (128-row query tile, b*h), 8 warps; see the file comment.
template <class S, int D, bool kMaskDropout>
__global__ void __launch_bounds__(kFwdThreads, fwd_min_blocks(D, kMaskDropout))
    tc_forward_kernel(Problem<S> p, int64_t n_tiles, S* out, float* lse) {
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
  const bool full_dims = p.E == D && p.Ev == D;
  const float scale_log2 = p.scale * kLog2e;

  OnlineSoftmax<float, true> row_state[2];  // of rows g and g + 8, scores in log2 units
  float acc[D / 8][4];                       // O, 16 x D: n-tile dn holds columns 8dn..8dn + 7
#pragma unroll
  for (int dn = 0; dn < D / 8; ++dn) acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;
  uint32_t qf[D / 16][4];  // the warp's Q as A fragments, held for the whole loop

  if (key_tiles > 0) {  // group 0: Q and the first K, V tile
    tile_load_async<S, D>(sq, hd.q, i0, rows, p.E, kFwdRows, kFwdThreads);
    tile_load_async<S, D>(sk, hd.k, 0, key_end < kFwdKeys ? key_end : kFwdKeys, p.E, kFwdKeys, kFwdThreads);
    tile_load_async<S, D>(sv, hd.v, 0, key_end < kFwdKeys ? key_end : kFwdKeys, p.Ev, kFwdKeys, kFwdThreads);
    cp_async_commit_group();
  }
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const int64_t j0 = kt * kFwdKeys, cols = key_end - j0 < kFwdKeys ? key_end - j0 : kFwdKeys;
    if (kt + 1 < key_tiles) {  // tile kt + 1 into the other buffer, read by nobody since the last barrier
      const int64_t j1 = j0 + kFwdKeys, next = key_end - j1 < kFwdKeys ? key_end - j1 : kFwdKeys;
      tile_load_async<S, D>(sk + (kt + 1) % 2 * kFwdKeys * ld, hd.k, j1, next, p.E, kFwdKeys, kFwdThreads);
      tile_load_async<S, D>(sv + (kt + 1) % 2 * kFwdKeys * ld, hd.v, j1, next, p.Ev, kFwdKeys, kFwdThreads);
      cp_async_commit_group();
      cp_async_wait_group<1>();  // everything but tile kt + 1 has landed
    } else {
      cp_async_wait_group<0>();
    }
    __syncthreads();  // every thread's copies of tile kt (and Q) are visible
    if (warp_busy && kt == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        if (kk < e_frags) ldmatrix<4>(qf[kk], sq + (16 * warp + lane % 16) * ld + 16 * kk + 8 * (lane / 16));
    }
    // The tile's keys j0 + c that row r sees: c < seen (causality and padding keys in one
    // compare; 0 for a padding row). 16-key blocks past the warp's last row's range are skipped
    // (causal: a diagonal tile's upper blocks, or the whole tile for the block's first warps).
    const int64_t warp_last = 16 * warp + 15 < rows ? 16 * warp + 15 : rows - 1;
    const int key_frags = warp_busy ? frags16(attention_keys_seen(i0 + warp_last, j0, j0 + cols, p.is_causal)) : 0;
    // A full tile (warp-uniform): every row of the warp real and seeing all 64 keys, E = Ev = D.
    // Its copy of the body below has no compare per score and no skipped block.
    const bool full = full_dims && 16 * warp + 15 < rows &&
                      attention_keys_seen(i0 + 16 * warp, j0, j0 + cols, p.is_causal) == kFwdKeys;
    const auto tile = [&](auto full_tile) {
      constexpr bool kFull = decltype(full_tile)::value;
      const T16* tk = sk + kt % 2 * kFwdKeys * ld;
      const T16* tv = sv + kt % 2 * kFwdKeys * ld;
      int seen[2] = {kFwdKeys, kFwdKeys};
      if constexpr (!kFull) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t r = 16 * warp + g + 8 * h;
          seen[h] = r < rows ? static_cast<int>(attention_keys_seen(i0 + r, j0, j0 + cols, p.is_causal)) : 0;
        }
      }
      // S = Q K^T: n-tiles 2np, 2np + 1 from one ldmatrix.x4 of K rows 16np..16np + 15.
      float s[kFwdKeys / 8][4];
#pragma unroll
      for (int np = 0; np < kFwdKeys / 16; ++np) {
        if (!kFull && np >= key_frags) break;
        for (int x = 0; x < 4; ++x) s[2 * np][x] = s[2 * np + 1][x] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          if (!kFull && kk >= e_frags) break;
          uint32_t kf[4];
          ldmatrix<4>(kf, tk + (16 * np + 8 * (lane / 16) + lane % 8) * ld + 16 * kk + 8 * (lane / 8 % 2));
          mma_m16n8k16<T16>(s[2 * np], qf[kk], {kf[0], kf[1]}, s[2 * np]);
          mma_m16n8k16<T16>(s[2 * np + 1], qf[kk], {kf[2], kf[3]}, s[2 * np + 1]);
        }
      }
      // The scores (-inf where not seen): without mask and dropout the raw dot products, whose
      // maximum times scale log2(e) > 0 is the maximum in log2 units (rounding is monotone), so
      // each weight below is one FFMA and an exp2; with them s2 = log2(e) (scale dot + mask),
      // unit 1. The tile's row maxima over the quad (lanes 4g..4g + 3 hold a row).
      const float unit = kMaskDropout ? 1.0f : scale_log2;
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < kFwdKeys / 8; ++nt) {
        if (!kFull && nt >= 2 * key_frags) break;
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const int c = 8 * nt + 2 * t + x % 2;
          const bool allowed = kFull || c < seen[x / 2];
          float v;
          if constexpr (kMaskDropout)
            v = tc_score<true>(p, hd, scale_log2, kLog2e, s[nt][x], allowed, i0 + 16 * warp + g + 8 * (x / 2), j0 + c);
          else
            v = allowed ? s[nt][x] : -INFINITY;
          s[nt][x] = v;
          tile_max[x / 2] = fmaxf(tile_max[x / 2], v);
        }
      }
      float corr[2], neg_shift[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // the quad's four lanes agree on the maximum, hence on the state
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        corr[h] = row_state[h].begin_block(tile_max[h] * unit);
        neg_shift[h] = -row_state[h].shift();
      }
      // P = exp2(s unit - shift), rounded (times the dropout factor) into A fragments: A's k
      // block kk is S's n-tiles 2kk (a[0], a[1]) and 2kk + 1 (a[2], a[3]). l adds the f32 weights.
      uint32_t pf[kFwdKeys / 16][4];
      float sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int nt = 0; nt < kFwdKeys / 8; ++nt) {
        if (!kFull && nt >= 2 * key_frags) break;
        T16 w16[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const float w = ex2_approx_ftz(fmaf(s[nt][x], unit, neg_shift[x / 2]));
          sum[x / 2] += w;
          if constexpr (kMaskDropout) {
            const int64_t i = i0 + 16 * warp + g + 8 * (x / 2), j = j0 + 8 * nt + 2 * t + x % 2;
            w16[x] = Tc16<S>::round(w != 0.0f ? w * p.dropout_factor(tb.bh, i, j) : 0.0f);
          } else {
            w16[x] = Tc16<S>::round(w);
          }
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
        if (!kFull && dn >= 2 * v_pairs) break;
        acc[dn][0] *= corr[0];
        acc[dn][1] *= corr[0];
        acc[dn][2] *= corr[1];
        acc[dn][3] *= corr[1];
      }
#pragma unroll
      for (int kk = 0; kk < kFwdKeys / 16; ++kk) {
        if (!kFull && kk >= key_frags) break;
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          if (!kFull && dp >= v_pairs) break;
          uint32_t vf[4];
          ldmatrix_trans<4>(vf, tv + (16 * kk + lane % 16) * ld + 16 * dp + 8 * (lane / 16));
          mma_m16n8k16<T16>(acc[2 * dp], pf[kk], {vf[0], vf[1]}, acc[2 * dp]);
          mma_m16n8k16<T16>(acc[2 * dp + 1], pf[kk], {vf[2], vf[3]}, acc[2 * dp + 1]);
        }
      }
    };
    if (full) tile(std::true_type{});
    else if (key_frags > 0) tile(std::false_type{});
    __syncthreads();  // every warp is done with buffer kt % 2 before tile kt + 2 copies into it
  }
  if (!warp_busy) return;
  // out = O / l (0 for a row with no allowed key), lse = ln 2 (m + log2 l) (-inf for such a row).
  const float inv[2] = {row_state[0].inverse_sum(), row_state[1].inverse_sum()};
  S* out_rows = out + (tb.bh * p.Sq + i0) * p.Ev;
  if (p.Ev % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    // 16-byte stores: the warp's 16 x D tile of out, rounded, into its own 16 rows of Q's
    // buffer (only this warp read them, at tile 0), then read back as rows of 16-byte chunks.
    T16* so = sq + 16 * warp * ld;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<uint32_t*>(so + (g + 8 * h) * ld + 8 * dn + 2 * t) =
            pack2(Tc16<S>::round(acc[dn][2 * h] * inv[h]), Tc16<S>::round(acc[dn][2 * h + 1] * inv[h]));
    __syncwarp();
    constexpr int kChunks = D / 8;  // of a row
#pragma unroll
    for (int idx = lane; idx < 16 * kChunks; idx += 32) {
      const int r = idx / kChunks, c = idx % kChunks * 8;
      if (16 * warp + r < rows && c < p.Ev)
        *reinterpret_cast<uint4*>(out_rows + (16 * warp + r) * p.Ev + c) =
            *reinterpret_cast<const uint4*>(so + r * ld + c);
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = 16 * warp + g + 8 * h;
      if (r >= rows) continue;
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        for (int y = 0; y < 2; ++y) {
          const int64_t c = 8 * dn + 2 * t + y;
          if (c < p.Ev) store(out_rows + r * p.Ev + c, acc[dn][2 * h + y] * inv[h]);
        }
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = 16 * warp + g + 8 * h;
    if (t == 0 && r < rows) lse[tb.bh * p.Sq + i0 + r] = row_state[h].logsumexp();
  }
}

template <class S, int D, bool kMaskDropout>
void tc_forward_for(const Problem<S>& p, int64_t BH, S* out, float* lse, cudaStream_t stream) {
  constexpr size_t bytes = FwdLayout<D>::bytes;
  const char* name = std::is_same_v<S, Half> ? "attention forward (f16)" : "attention forward (bf16)";
  allow_shared<tc_forward_kernel<S, D, kMaskDropout>>(bytes, name);
  const int64_t n_tiles = ceil_div(p.Sq, kFwdRows);
  tc_forward_kernel<S, D, kMaskDropout><<<grid_for(name, BH, n_tiles), kFwdThreads, bytes, stream>>>(p, n_tiles, out,
                                                                                                   lse);
  check_launch(name);
}

// The forward's copy without mask and dropout takes each row's maximum over the raw dot
// products and multiplies it by scale log2(e) afterwards, which only a scale > 0 allows (the
// maximum of s x c is c x max s for c > 0): any other scale runs the general copy.
template <class S, class Launch>
void with_forward_variant(const Problem<S>& p, Launch launch) {
  if (!(p.scale > 0)) launch(std::true_type{});
  else with_mask_dropout(p, launch);
}

}  // namespace

#define ND_TC_ATTENTION_FORWARD(S, label)                                                                           \
  void scaled_dot_product_attention_forward(const S* q, const S* k, const S* v, AttentionMask<S> mask, int64_t B,    \
                                            int64_t H, int64_t Sq, int64_t Sk, int64_t E, int64_t Ev,               \
                                            bool is_causal, double scale, const AttentionDropout& dropout,         \
                                            S* out, float* logsumexp, cudaStream_t stream) {                       \
    run_forward<S>("attention forward (" label ")", q, k, v, mask, B, H, Sq, Sk, E, Ev, is_causal, scale, dropout, \
                   [&](auto D, const Problem<S>& p, int64_t BH) {                                                   \
                     with_forward_variant(p, [&](auto md) {                                                         \
                       tc_forward_for<S, decltype(D)::value, decltype(md)::value>(p, BH, out, logsumexp, stream);   \
                     });                                                                                            \
                   });                                                                                              \
  }
ND_TC_ATTENTION_FORWARD(BFloat16, "bf16")
ND_TC_ATTENTION_FORWARD(Half, "f16")
#undef ND_TC_ATTENTION_FORWARD

}  // namespace nd::kernels::cuda
