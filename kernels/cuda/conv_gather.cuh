#pragma once
// How conv.cu's two GEMM kernels fill their shared A and B tiles, one depth step at a time,
// from a pass's walk (kernels/common/conv_walk.h, whose CPU test checks that a walk visits
// exactly the accessors' elements). Why a walk: conv_index.h's accessors split every index
// into digits with 64-bit divisions; here each thread splits the indices it keeps fixed
// once per tile and steps the other with carries, in 32-bit integers where the launcher's
// fits_int32 allowed (I = int32_t). A cell outside the problem (an edge tile's overhang)
// or in the padding is copied as zeros (cp.async's src-size 0); its address may be computed
// (I's unsigned wrap) but is never read.
// Both copy with cp.async (warp_mma.cuh) so that the next depth step's copies fly while
// the current one is multiplied: TileGather for the f32 / f64 kernel, TensorCoreGather into
// the f32 staging tiles of the tensor-core kernel (conv_tensor_core.cuh, which rounds).
#include <cstdint>

#include "kernels/common/conv_walk.h"
#include "kernels/cuda/warp_mma.cuh"

namespace nd::kernels::cuda::conv_gather {

namespace ci = kernels::conv_index;

// cp.async of one element *src into *dst, or of zeros for no element (src-size 0 reads
// nothing: src may be null there).
template <class T>
__device__ __forceinline__ void copy_or_zero(T* dst, const T* src) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "cp.async.ca copies 4- or 8-byte elements here (f32, f64)");
  cp_async_ca_zfill<int(sizeof(T))>(dst, src, src ? int(sizeof(T)) : 0);
}

// implicit_gemm_kernel's gather: Threads threads copy a Depth x Tile tile of A (As[k][m])
// and one of B (Bs[k][j]) per depth step. Thread tid fills cell lane = tid % Tile of rows
// first + Step*i (i < Depth / Step): neighbouring threads read neighbouring pixels (forward,
// dgrad) or weights. Its row m0 + lane and column n0 + lane are split into digits once per
// tile; its depth walks on by Step, from one depth step into the next without a restart.
template <class I, class Walk, int Threads, int Tile, int Depth>
struct TileGather {
  static constexpr int kStep = Threads / Tile;
  static_assert(Threads % Tile == 0 && Depth % kStep == 0, "the threads tile the tile exactly");
  const Walk& wk;
  I g;
  int lane, first;
  ci::Digits<I> by, row, col, depth;
  bool row_in, col_in;
  int64_t k_end;

  __device__ TileGather(const Walk& walk, int64_t group, int tid)
      : wk(walk), g(I(group)), lane(tid % Tile), first(tid / Tile), by(walk.depth.digits(kStep)) {}

  // The tile of rows m0.., columns n0.. and depths [k_begin, k_end) of an M x Ncols problem.
  __device__ void tile(int64_t m0, int64_t n0, int64_t k_begin, int64_t k_stop, int64_t M, int64_t Ncols) {
    row_in = m0 + lane < M, col_in = n0 + lane < Ncols, k_end = k_stop;
    row = wk.rows.digits(I(m0 + lane)), col = wk.cols.digits(I(n0 + lane));
    depth = wk.depth.digits(I(k_begin + first));
  }

  // Issues the cp.async copies As[kl][lane] = A[m0 + lane, k0 + kl] and Bs[kl][lane] =
  // B[k0 + kl, n0 + lane] (the caller commits and waits). A cell in the padding or outside
  // the problem is the src-size-0 form: no read, the destination filled with zeros.
  template <class T>
  __device__ void issue(int64_t k0, T (&As)[Depth][Tile], T (&Bs)[Depth][Tile]) {
#pragma unroll
    for (int i = 0; i < Depth / kStep; ++i) {
      const int kl = first + i * kStep;
      const bool k_in = k0 + kl < k_end;
      copy_or_zero(&As[kl][lane], row_in && k_in ? wk.a(g, row, depth) : nullptr);
      copy_or_zero(&Bs[kl][lane], col_in && k_in ? wk.b(g, depth, col) : nullptr);
      wk.depth.advance(depth, by);
    }
  }
};

// tensor_core_gemm_kernel's gather (conv_tensor_core.cuh): cp.async copies of f32 elements
// into a stage's tiles As and Bs, laid out by Layout::a_at(m, k) and Layout::b_at(k, j). B
// (and wgrad's A, whose depth is its pixels) is gathered depth-fastest: thread tid holds
// depth k0 + lane_k (lane_k = tid % Depth, on by Depth each step) and walks the columns
// (rows) n0 + first_j + StepJ*i from digits split once per tile. PixelRows (forward,
// dgrad): A row-fastest, thread tid holds row m0 + lane_m (lane_m = tid % Tile) and walks
// depths first_k + StepK*i on by StepK, like TileGather. Steps are issued in depth order.
template <class I, class Walk, bool PixelRows, int Threads, int Tile, int Depth>
struct TensorCoreGather {
  static constexpr int kStepK = Threads / Tile, kStepJ = Threads / Depth;
  static_assert(Threads % Tile == 0 && Threads % Depth == 0 && Depth % kStepK == 0 && Tile % kStepJ == 0,
                "the threads tile the tiles exactly");
  const Walk& wk;
  I g;
  int lane_m, first_k, lane_k, first_j;
  ci::Digits<I> by_k, by_depth, by_j_rows, by_j_cols;
  ci::Digits<I> row, depth_a, depth, rows_first, cols_first;
  int64_t m0, n0, k_end, M, Ncols;

  __device__ TensorCoreGather(const Walk& walk, int64_t group, int tid)
      : wk(walk), g(I(group)), lane_m(tid % Tile), first_k(tid / Tile), lane_k(tid % Depth), first_j(tid / Depth),
        by_k(walk.depth.digits(kStepK)), by_depth(walk.depth.digits(Depth)), by_j_rows(walk.rows.digits(kStepJ)),
        by_j_cols(walk.cols.digits(kStepJ)) {}

  __device__ void tile(int64_t tile_m0, int64_t tile_n0, int64_t k_begin, int64_t k_stop, int64_t rows,
                       int64_t cols) {
    m0 = tile_m0, n0 = tile_n0, k_end = k_stop, M = rows, Ncols = cols;
    if constexpr (PixelRows) {
      row = wk.rows.digits(I(m0 + lane_m));
      depth_a = wk.depth.digits(I(k_begin + first_k));
    } else {
      rows_first = wk.rows.digits(I(m0 + first_j));
    }
    cols_first = wk.cols.digits(I(n0 + first_j));
    depth = wk.depth.digits(I(k_begin + lane_k));
  }

  // Issues the copies of depth step k0 (the caller commits and waits); a cell in the padding
  // or outside the problem is the src-size-0 form: no read, zeros written.
  template <class Layout>
  __device__ void issue(int64_t k0, float* As, float* Bs, Layout) {
    const bool k_in = k0 + lane_k < k_end;
    if constexpr (PixelRows) {
#pragma unroll 4
      for (int i = 0; i < Depth / kStepK; ++i) {
        const int kl = first_k + i * kStepK;
        const bool in = m0 + lane_m < M && k0 + kl < k_end;
        copy_or_zero(&As[Layout::a_at(lane_m, kl)], in ? wk.a(g, row, depth_a) : nullptr);
        wk.depth.advance(depth_a, by_k);
      }
    } else {
      ci::Digits<I> m = rows_first;
#pragma unroll 4
      for (int i = 0; i < Tile / kStepJ; ++i) {
        const int ml = first_j + i * kStepJ;
        copy_or_zero(&As[Layout::a_at(ml, lane_k)], m0 + ml < M && k_in ? wk.a(g, m, depth) : nullptr);
        wk.rows.advance(m, by_j_rows);
      }
    }
    ci::Digits<I> j = cols_first;
#pragma unroll 4
    for (int i = 0; i < Tile / kStepJ; ++i) {
      const int jl = first_j + i * kStepJ;
      copy_or_zero(&Bs[Layout::b_at(lane_k, jl)], n0 + jl < Ncols && k_in ? wk.b(g, depth, j) : nullptr);
      wk.cols.advance(j, by_j_cols);
    }
    wk.depth.advance(depth, by_depth);
  }
};

}  // namespace nd::kernels::cuda::conv_gather
