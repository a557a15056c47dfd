#pragma once
// conv.cu's tensor-core GEMM: what its six passes run with bf16 or f16 operands
// (ConvOperands::kBf16 / kF16 on f32 tensors, autocast's conv). Included by conv.cu alone;
// everything sits in its anonymous namespace. The problems, walks and split-K are conv.cu's
// (its opening comment); this file is the kernel.
//
// Tiling: a 64 x 64 block tile (kTcTileM x kTcTileN), depth steps of 32 (kTcTileK), 4
// warps in 2 x 2, each owning a 32 x 32 sub-tile as 2 x 4 accumulators of mma.sync m16n8k16
// (warp_mma.cuh: documented lane maps, so the kernel builds its fragments itself; lane
// (g, t) = (lane / 4, lane % 4) holds rows g, g + 8 and columns 2t, 2t + 1 of each 16 x 8
// accumulator: 32 f32 a thread).
//
// Pipeline: the operands are f32 tensors, and cp.async copies bytes, so the gather
// (conv_gather.cuh TensorCoreGather) copies f32 elements (4-byte .ca, the src-size-0 form
// writing the zeros of padding and overhang without a read) into f32 staging tiles, two
// stages: depth step k + 1 is issued, then step k waited for (wait_group, a barrier) and
// multiplied, as in conv.cu's f32 kernel. The fragments are built straight from the f32
// tiles: each lane reads the f32 values its lane map names, rounds them to bf16 / f16
// (round-to-nearest-even: to_operand, the one rounding point) and packs two into a .b32
// register (pack2): no rounding pass, no 16-bit tiles. Two stages, not three: two are 37 /
// 40 KiB of static shared memory (pixel-row passes / wgrad), three would be 55 / 60 KiB,
// past the 48 KiB of static shared memory (dynamic shared memory and an opt-in), and the
// copies of one step already fly for a whole step's 16 mma per warp.
//
// Staging layouts, in the gather's order (neighbouring threads copy neighbouring global
// elements into neighbouring shared words: a warp's copies are one wavefront), padded so
// that the fragment reads are conflict-free (the cost model's count: the most distinct
// 4-byte words in one bank):
//   pixel-row problems (forward, dgrad: row m is a pixel): A copied row-fastest into
//     As[k][m], stride 68: lane (g, t) reads A[g][2t] and A[g][2t + 1] as two scalars at
//     words 68 * 2t + g (+ 68), banks 8t + g (+ 4): 32 distinct banks, one wavefront each;
//   wgrad (its depth is the pixels): A copied depth-fastest into As[m][k], stride 40, and
//     read as B is;
//   B copied depth-fastest in every pass (Bs[j][k], stride 40: the weight rows of forward
//     and dgrad, the pixels of wgrad's X): a lane reads its two k-neighbours as one float2
//     at words 40 g + 2t (+ 1), banks 8 g + 2t (+ 1) mod 32: each half-warp (g < 4, g >= 4)
//     covers the 32 banks once, two wavefronts for 64 words (the least 256 bytes take).
// Per warp and 16-deep step: A 16 wavefronts, B 16, for 8 mma; per block and depth step
// 256 read + 128 written (the copies). The WMMA kernel this replaces read 16-bit tiles
// (128 read + 128 written): f32 staging doubles the fragment reads, the price of rounding
// in the fragments instead of in a pass of its own.
// Epilogue: the accumulators go through a shared f32 tile on the staging memory (free once
// the last step's barrier is passed): Cs[j][m] (stride 68, scalar writes at 68 * 2t + g:
// conflict-free) where neighbouring threads store neighbouring pixels, Cs[m][j] (stride 72,
// float2 writes at 72 g + 2t: two wavefronts) in wgrad, where they store neighbouring filter
// taps; then every thread stores its cells through the slice's OutputWalk (conv_walk.h;
// bias, groups and split-K are its business), with no division per element: a pixel-row
// thread keeps its pixel row (Cs's column m) fixed, splits it once per tile and steps the
// channels (an add of col_stride); a wgrad thread keeps its tap column fixed and steps its
// rows (output channels, linear). The accessors' store() it replaced split m with two 64-bit
// divisions per stored element.
//
// Registers (ptxas, bench/kernel_resources.md; bf16 and f16 alike), int32 / int64 walks:
// forward 127 / 168, dgrad 128 / 204, wgrad 128 / 168, so 4 / 3, 4 / 2 and 4 / 3 blocks per
// SM (the WMMA kernel: 174-255, 2 blocks). No spill. With sp.store they were 128 / 155,
// 155 / 202, 143 / 168; the OutputWalk, uncapped, took the int32 ones to 142 / 160 / 144
// (the forward 4 -> 3 blocks), so tc_min_blocks caps the int32 walks at 128 (4 blocks), which
// ptxas meets without a spill. What keeps them there: the loop over the two 16-deep halves
// of a step is not unrolled, and the gather's copy loops and the epilogue's stores are
// unrolled by 4, not fully (all three unrolled, eight of the twelve instantiations spilled
// 16 to 300 bytes at 255 registers; with the halves' loop alone unrolled, the int64 forward
// still spilled 52 bytes). The copies are asynchronous, so unrolling them buys no overlap.
//
// Checked in the emulator (tests/emu/conv_emu_test.cpp: every pass and shape class in bf16
// and f16 against the CPU on rounded operands, the sanitizer on), and checked to fail with
// the wait for step k dropped, the multiply reading the other stage (both the sanitizer's
// uninitialised read of 'smem'), A's a[1] taken from row g instead of g + 8 (every pass off
// by up to 4.8e5 x its tolerance), B's b[1] from k = 2t instead of 2t + 8 (5.3e5 x), C's
// rows g + 8 written to row g (9e5 x) and bf16 truncated instead of rounded to nearest even
// (up to 2756 x); the stores' walk checked to fail with a pixel row one too far (m0 + fixed
// + 1: the sanitizer's out-of-bounds write, 5 tests), wgrad's rows stepped by 3 instead of 2
// (a global write conflict between blocks, 4 tests) and the pixel-row columns stepped by 3
// (cells never stored: values outside tolerance, and split-K's uninitialised partial sums).
// Its estimated speed: bench/RESULTS.md "tcconv".
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/conv_index.h"
#include "kernels/common/conv_walk.h"
#include "kernels/cuda/conv_gather.cuh"
#include "kernels/cuda/warp_mma.cuh"

namespace nd::kernels::cuda {

namespace {

constexpr int kTcTileM = 64, kTcTileN = 64, kTcTileK = 32;
constexpr int kTcWarps = 4, kTcThreads = 32 * kTcWarps;  // 128
constexpr int kTcStages = 2;
constexpr int kTcStoreStep = kTcThreads / kTcTileM;  // 2: the epilogue's stores, a 64-thread row at a time
static_assert(kTcThreads % kTcTileM == 0 && kTcTileM == kTcTileN, "the stores tile Cs exactly");

// Whether the rows of a problem are pixels (forward, dgrad) or its depth is (wgrad).
template <class Problem>
constexpr bool kPixelRows = true;
template <class T>
constexpr bool kPixelRows<kernels::conv_index::WgradGemm<T>> = false;

// A pass's shared layouts, in floats (the opening comment says why these strides).
template <bool PixelRows>
struct ConvTcLayout {
  static constexpr int kLdA = PixelRows ? kTcTileM + 4 : kTcTileK + 8;  // As[k][m] : As[m][k]
  static constexpr int kLdB = kTcTileK + 8;                              // Bs[j][k]
  static constexpr int kLdC = PixelRows ? kTcTileM + 4 : kTcTileN + 8;  // Cs[j][m] : Cs[m][j]
  static constexpr int kA = PixelRows ? kTcTileK * kLdA : kTcTileM * kLdA;
  static constexpr int kStage = kA + kTcTileN * kLdB;  // As, then Bs
  static constexpr int kC = kTcTileM * kLdC;           // kTcTileM == kTcTileN
  static constexpr int kFloats = kTcStages * kStage > kC ? kTcStages * kStage : kC;
  static_assert(kTcTileM == kTcTileN, "Cs's size holds for either orientation");
  static_assert(kLdA % 2 == 0 && kLdB % 2 == 0 && kLdC % 2 == 0 && kA % 4 == 0 && kStage % 4 == 0,
                "float2 accesses stay 8-byte aligned");
  // Offsets of element (m, k) of A, (k, j) of B and (m, j) of C.
  static __device__ int a_at(int m, int k) { return PixelRows ? k * kLdA + m : m * kLdA + k; }
  static __device__ int b_at(int k, int j) { return j * kLdB + k; }
  static __device__ int c_at(int m, int j) { return PixelRows ? j * kLdC + m : m * kLdC + j; }
};

// An f32 value as the 16-bit operand type E (__nv_bfloat16 or __half), nearest even: the
// kernel's one rounding point.
template <class E>
__device__ __forceinline__ E to_operand(float v) {
  if constexpr (std::is_same_v<E, __half>)
    return __float2half_rn(v);
  else
    return __float2bfloat16_rn(v);
}
template <class E>
__device__ __forceinline__ uint32_t rounded_pair(float lo, float hi) {
  return pack2(to_operand<E>(lo), to_operand<E>(hi));
}

// A[m][k], A[m][k + 1] of a stage, rounded into one register (two scalars from As[k][m],
// one float2 from As[m][k]); B[k][j], B[k + 1][j] likewise (one float2 from Bs[j][k]).
template <class E, bool PixelRows>
__device__ __forceinline__ uint32_t a_pair(const float* As, int m, int k) {
  using L = ConvTcLayout<PixelRows>;
  if constexpr (PixelRows) {
    return rounded_pair<E>(As[L::a_at(m, k)], As[L::a_at(m, k + 1)]);
  } else {
    const float2 v = *reinterpret_cast<const float2*>(As + L::a_at(m, k));
    return rounded_pair<E>(v.x, v.y);
  }
}
template <class E, bool PixelRows>
__device__ __forceinline__ uint32_t b_pair(const float* Bs, int k, int j) {
  const float2 v = *reinterpret_cast<const float2*>(Bs + ConvTcLayout<PixelRows>::b_at(k, j));
  return rounded_pair<E>(v.x, v.y);
}
// C[m][j] = lo, C[m][j + 1] = hi.
template <bool PixelRows>
__device__ __forceinline__ void c_pair(float* Cs, int m, int j, float lo, float hi) {
  using L = ConvTcLayout<PixelRows>;
  if constexpr (PixelRows) {
    Cs[L::c_at(m, j)] = lo;
    Cs[L::c_at(m, j + 1)] = hi;
  } else {
    *reinterpret_cast<float2*>(Cs + L::c_at(m, j)) = make_float2(lo, hi);
  }
}

// Blocks per SM that tensor_core_gemm_kernel is compiled for (__launch_bounds__' minimum):
// 4 for the int32 walks (caps them at 128 registers, no spill: 3 -> 4 blocks for dgrad and
// wgrad; the forward, at 142 uncapped since the stores' OutputWalk, keeps its 4), 1 for the
// int64 walks (ptxas's own 168 / 204: 3 / 2 blocks; 3 for dgrad spilled 44 bytes).
template <class I>
constexpr int tc_min_blocks() {
  return std::is_same_v<I, int32_t> ? 4 : 1;
}

// For every z = (group g, chunk s, slice), column tile and row tile of that slice sp:
//   C_g[m, j] = sum_{k in chunk s} round(sp.a(g, m, k)) * round(sp.b(g, k, j)) in f32,
// stored where sp.store(g, s, m, j, .) puts it, through the slice's OutputWalk (conv_walk.h);
// E: the 16-bit operand type, I: the walk's index type. Out-of-range rows, columns and
// depths copy as 0 and are never stored.
template <class E, class I, class Problem>
__global__ void __launch_bounds__(kTcThreads, tc_min_blocks<I>())
    tensor_core_gemm_kernel(Problem p, int64_t groups, int64_t splits, int64_t chunk) {
  constexpr bool pixel_rows = kPixelRows<Problem>;
  using L = ConvTcLayout<pixel_rows>;
  __shared__ __align__(16) float smem[L::kFloats];  // the stages; after the last step, Cs
  const int tid = threadIdx.x, warp = tid / 32, gq = tid % 32 / 4, tq = tid % 4;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32;  // the warp's sub-tile origin
  for (int64_t z = blockIdx.z; z < groups * splits * p.slices(); z += gridDim.z) {
    const int64_t g = z % groups, split = z / groups % splits;
    const auto& sp = p.slice(z / (groups * splits));
    const auto wk = kernels::conv_index::walk<I>(sp);
    conv_gather::TensorCoreGather<I, decltype(wk), pixel_rows, kTcThreads, kTcTileM, kTcTileK> gather(wk, g, tid);
    const int64_t M = sp.rows(), Ncols = sp.cols(), K = sp.depth();
    const int64_t m_tiles = (M + kTcTileM - 1) / kTcTileM, n_tiles = (Ncols + kTcTileN - 1) / kTcTileN;
    const int64_t k_begin = split * chunk, k_end = k_begin + chunk < K ? k_begin + chunk : K;
    for (int64_t nt = blockIdx.y; nt < n_tiles; nt += gridDim.y) {
      for (int64_t mt = blockIdx.x; mt < m_tiles; mt += gridDim.x) {
        const int64_t m0 = mt * kTcTileM, n0 = nt * kTcTileN;
        gather.tile(m0, n0, k_begin, k_end, M, Ncols);
        float acc[2][4][4] = {};
        // Depth step k0 lies in stage s; step k0 + kTcTileK is issued into 1 - s before the
        // wait for k0. No group is left in flight after the last step, and none committed
        // empty (a tile without depth: a stride phase without taps).
        const auto issue_step = [&](int64_t k0, int stage) {
          float* As = smem + stage * L::kStage;
          gather.issue(k0, As, As + L::kA, L{});
          cp_async_commit_group();
        };
        if (k_begin < k_end) issue_step(k_begin, 0);
        int s = 0;
        for (int64_t k0 = k_begin; k0 < k_end; k0 += kTcTileK, s = 1 - s) {
          if (k0 + kTcTileK < k_end) {
            issue_step(k0 + kTcTileK, 1 - s);
            cp_async_wait_group<1>();  // this thread's copies of step k0 have landed
          } else {
            cp_async_wait_group<0>();
          }
          __syncthreads();  // and every thread's
          const float* As = smem + s * L::kStage;
          const float* Bs = As + L::kA;
#pragma unroll 1
          for (int kk = 0; kk < kTcTileK; kk += 16) {
            // The lane maps of warp_mma.cuh: a[0..3] = A[g][2t..], A[g+8][2t..], A[g][2t+8..],
            // A[g+8][2t+8..]; b[0], b[1] = B[2t.., g], B[2t+8.., g].
            uint32_t a[2][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const int m = wm + 16 * i + gq;
              a[i][0] = a_pair<E, pixel_rows>(As, m, kk + 2 * tq);
              a[i][1] = a_pair<E, pixel_rows>(As, m + 8, kk + 2 * tq);
              a[i][2] = a_pair<E, pixel_rows>(As, m, kk + 2 * tq + 8);
              a[i][3] = a_pair<E, pixel_rows>(As, m + 8, kk + 2 * tq + 8);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              b[j][0] = b_pair<E, pixel_rows>(Bs, kk + 2 * tq, wn + 8 * j + gq);
              b[j][1] = b_pair<E, pixel_rows>(Bs, kk + 2 * tq + 8, wn + 8 * j + gq);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
              for (int j = 0; j < 4; ++j) mma_m16n8k16<E>(acc[i][j], a[i], b[j], acc[i][j]);
          }
          __syncthreads();  // the next iteration issues step k0 + 2 kTcTileK into stage s
        }
        // C's lane map: acc[.][.][0, 1] = C[g][2t, 2t+1], acc[.][.][2, 3] = C[g+8][2t, 2t+1].
        float* Cs = smem;
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int m = wm + 16 * i + gq, col = wn + 8 * j + 2 * tq;
            c_pair<pixel_rows>(Cs, m, col, acc[i][j][0], acc[i][j][1]);
            c_pair<pixel_rows>(Cs, m + 8, col, acc[i][j][2], acc[i][j][3]);
          }
        __syncthreads();
        // The stores, through the slice's OutputWalk (conv_walk.h: no division per element).
        // Each thread keeps one index of Cs fixed (neighbouring threads, neighbouring
        // addresses) and steps the other by kTcStoreStep.
        const auto out = kernels::conv_index::output_walk<I>(sp, split);
        const int fixed = tid % kTcTileM, first = tid / kTcTileM;
        if constexpr (pixel_rows) {
          // The thread's pixel row m0 + fixed: split once; its columns add col_stride each.
          if (m0 + fixed < M) {
            const auto row = out.row(out.rows.digits(I(m0 + fixed)));
#pragma unroll 4
            for (int jl = first; jl < kTcTileN; jl += kTcStoreStep)
              if (n0 + jl < Ncols) out.store(row, I(g), I(n0 + jl), Cs[L::c_at(fixed, jl)]);
          }
        } else {
          // wgrad: the thread's column n0 + fixed (a flat tap of dw's row); its rows (output
          // channels) split once and stepped by kTcStoreStep.
          if (n0 + fixed < Ncols) {
            auto row = out.rows.digits(I(m0 + first));
            const auto by_row = out.rows.digits(I(kTcStoreStep));
#pragma unroll 4
            for (int ml = first; ml < kTcTileM; ml += kTcStoreStep, out.rows.advance(row, by_row))
              if (m0 + ml < M) out.store(out.row(row), I(g), I(n0 + fixed), Cs[L::c_at(ml, fixed)]);
          }
        }
        __syncthreads();  // the next tile's copies overwrite Cs
      }
    }
  }
}

}  // namespace

}  // namespace nd::kernels::cuda
