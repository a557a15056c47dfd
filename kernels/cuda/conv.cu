// conv2d and conv_transpose2d on the GPU as implicit GEMMs (the index math, and what
// each pass's GEMM is, are in kernels/common/conv_index.h).
//
// Why one kernel serves every pass: each pass is C_g = A_g * B_g per channel group, with
// one operand gathered from an NCHW tensor (patches of x, or the dy pixels a dgrad tap
// reaches) and the other the weight. implicit_gemm_kernel is a plain 64x64x16
// shared-memory tile GEMM (256 threads, 4x4 results each) that gathers every tile element
// through the pass's walk (conv_walk.h) instead of reading a matrix, so zero padding,
// stride, dilation and groups live in the walks and accessors, which the CPU tests run,
// and not in the kernel. A gathering thread keeps one index of its cells fixed (a pixel row,
// a column) and steps the other by a constant: it splits both into digits ((n, h, w),
// (c, kh, kw)) once per tile and then advances them with carries, in 32-bit integers
// where fits_int32 allows (else the same kernels in 64-bit), with no division per element.
// The walk saves im2col's buffer (kH*kW times the input) and the traffic to fill it.
// Pipeline (f32, f64): the gather copies element by element with cp.async (4- or 8-byte
// .ca; the src-size-0 form writes the zeros of padding and overhang without reading) into
// two shared stages: depth step k + 1 is issued, then step k waited for (wait_group, a
// barrier) and multiplied, so the next tile's loads fly during the current tile's math
// where the old fill stored, waited at the barrier, then multiplied. Element copies, not
// 16-byte ones: a thread's cells are a walk's neighbours, contiguous only in some passes
// and rows, and 4 bytes keep every alignment. Shared memory: 16 / 32 KiB (f32 / f64). Its
// cost was registers: int32 f32 forward / dgrad / wgrad 128 / 128 / 64 -> 162 / 168 / 128
// (blocks per SM 2 / 2 / 4 -> 1 / 1 / 2; bench/RESULTS.md). Won back by the stores: they
// derived each stored element's pixel from m (two 64-bit divisions), which kept the slice's
// 64-bit geometry (dgrad: two DgradPhase) live across the depth loop; the OutputWalk
// (conv_walk.h) splits a thread's first row once per tile in I and steps it. With
// __launch_bounds__ asking 2 blocks per SM (simt_min_blocks) every int32 variant holds
// 124-128 registers, f32 and f64 (f32 162 / 168 / 128 -> 128 / 128 / 124, f64 178 / 208 /
// 162 -> 126 / 128 / 128: 2 blocks per SM each), and the int64 f32 forward and wgrad 127 /
// 128 (168 / 168: 1 -> 2 blocks); no spill. Not yet timed on a GPU. The walks, in registers
// (accessors -> int32 walks, before the pipeline; bench/kernel_resources.md then): SIMT
// dgrad 176 / 186 (f32 / f64) -> 128 / 174 (f32: 1 -> 2 blocks per SM), f32 wgrad 96 -> 64
// (2 -> 4 blocks); the former WMMA kernel's forward 254 / 255 (bf16 / f16) -> 238 / 174,
// dgrad 213 / 210 -> 190 / 198, but wgrad 190 / 183 -> 254 / 243: its unrolled 16-cell
// gathers issued all their loads first. No spill.
// Not for one input channel (a GEMM dimension of 1 or 16 against 64-wide tiles), nor one
// output channel (a forward GEMM of one column, a wgrad of one row, a dgrad of depth 1 at
// DCGAN's D.main.5): the launchers hand those to conv_narrow.cu (narrow::applies, the one
// hook in each pass).
//
// Strided dgrad (conv2d's input gradient, conv_transpose2d's forward) runs as stride_h *
// stride_w GEMMs, one per phase of the input pixels (ih mod stride_h, iw mod stride_w):
// only the taps t with stride | ih + pad - t*dil reach a pixel, and they depend on its phase
// alone (conv_index.h DgradPhase), so each phase is a dense GEMM over its own taps. One GEMM
// over all kH*kW taps would multiply (1 - 1/stride) of its A operand as structural zeros per
// dimension: 75% at stride 2, the DCGAN case, where the cost model's tensor-core flops drop
// from 117 to 34 MFLOP (bench/RESULTS.md "Cost model"). The phases are slices of one launch
// (grid z), so the blocks of all phases share the SMs: one launch per phase would run four
// quarter-size grids one after another. Its cost: a slice carries two DgradPhase (the
// 64-bit SIMT dgrad needs 238 / 242 registers, f32 / f64, one block per SM: capped at 128
// it spilled 300 / 344 bytes).
//
// Grid: x = row tiles, y = column tiles, z = (group, depth chunk, slice), each walked by a
// grid-stride loop, so no size runs into gridDim.y/z <= 65535. Both kernels spell that loop
// out: one device helper for it (per z a lambda, per tile one inside it) spilled 20 bytes in
// the f64 int32 dgrad at its 128-register cap ("tcstore"). A depth long against few
// output tiles (wgrad's N*OH*OW; forward's and dgrad's C*kH*kW on a small batch: DCGAN D's
// middle layer at batch 2 had 4 blocks for 132 SMs) is cut into chunks (split-K,
// launch_split) whose partial results go to a buffer that a second kernel sums in chunk
// order: no atomics, the same bits on every run; the bias goes into chunk 0. Cost model,
// that layer in bf16: forward 24.1 -> 10.7 us, dgrad 17.0 -> 12.7 us with 16 blocks each
// (bench/RESULTS.md); then, with chunks of 128 (kMinChunk, was 256) and the cut that
// minimises the busiest SM's share of the depth (conv_index.h split_depth: not the most
// chunks allowed, which can leave a part wave), 32 blocks: forward 10.66 -> 8.12 us, dgrad
// 12.59 -> 9.24 (f32: 18.59 -> 12.46, 17.43 -> 11.94); train_gan's D.main.2 (ndf 32) wgrad
// at batch 64 88 -> 112 blocks, 11.13 -> 10.05 us ("convfill"). Its forward at batch 64 (49
// row tiles, depth 512) stays at 98 blocks for 132 SMs: the busiest-SM measure ties it with
// 196 blocks of half the depth, and what more blocks buy (latency hidden) the cost model does
// not have. ConvSplit::kFillSms (conv.h, conv_index.h fill_sms: finer cuts until 132 SMs are
// covered) is an experiment: bench_kernels' model family times both
// rules on the batch-64 rows; the model has fill 8-32% slower there (more partial results
// and their sum; bench/RESULTS.md "fill-sms"). A smaller tile for such shapes is not done.
// The chunk's output offset and bias choice in the stores took the former WMMA forward from
// 166 to 254 registers (no spill; 3 -> 2 blocks per SM).
//
// Mixed precision (ConvOperands::kBf16 / kF16, float only): tensor_core_gemm_kernel
// (conv_tensor_core.cuh, whose opening comment has the layouts and their bank arithmetic)
// is the same 64 x 64 tiling on mma.sync m16n8k16 (bf16 or f16 in, f32 accumulation). Its
// gather copies f32 elements with cp.async through the same walks (zero-fill for padding
// and overhang) into two f32 staging stages, step k + 1 in flight while step k is
// multiplied; each lane builds its A and B fragments from the f32 tiles, rounding to
// bf16 / f16 (nearest even) as it packs them, and the result goes back through a shared f32
// tile to the slice's OutputWalk, as in the f32 kernel (a row split once per tile, no
// division per stored element). It replaced a WMMA kernel that rounded into 16-bit tiles with no pipeline:
// registers 174-255 -> 128-202 (2 -> 2-4 blocks per SM), the cost model's estimates
// unchanged (L2- or launch-bound rows; bench/RESULTS.md "tcconv").
//
// Checked: every pass against kernels/cpu in the emulator (tests/emu/conv_emu_test.cpp:
// partial tiles, groups, stride 2 and 3, dilation, padding, phases without taps,
// output_padding; the sanitizer on; a store walk stepped by 17 rows instead of 16 fails
// there as a global write conflict; the int64_t kernels too, forced by
// set_conv_index_width), the accessors, phases, walks and output walks (every
// cell, both index types) on the CPU (tests/kernels/conv_index_test.cpp),
// bit-reproducibility and autocast in tests/cuda/cuda_conv_test.cpp on the emulated
// library. The phase split's speed: the cost model's estimate (bench/RESULTS.md).
#include "kernels/cuda/conv.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "kernels/common/conv_index.h"
#include "kernels/common/conv_walk.h"
#include "kernels/cuda/chunk_sum.cuh"
#include "kernels/cuda/conv_gather.cuh"
#include "kernels/cuda/conv_narrow.cuh"
#include "kernels/cuda/conv_tensor_core.cuh"
#include "kernels/cuda/row_reduce.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/cuda/strided.cuh"
#include "kernels/cuda/warp_mma.cuh"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cuda {

namespace {

namespace ci = kernels::conv_index;

constexpr int kTileM = 64, kTileN = 64, kTileK = 16;
constexpr int kMicro = 4;                                        // results per thread: kMicro x kMicro
constexpr int kGemmThreads = (kTileM / kMicro) * (kTileN / kMicro);  // 256
static_assert(kTileM / kMicro == 16 && kTileN / kMicro == 16, "the thread layout below is 16 x 16");
// split-K (every pass; conv_index.h split_depth picks the cut with the least busiest-SM
// share): no chunk shorter than this many depth elements (8 bf16 depth steps), at most
// about this many blocks. 128 (was 256) lets a small batch's layers fill the SMs: DCGAN
// D.main.2 at batch 2 16 -> 32 blocks (bench/RESULTS.md "convfill").
constexpr int64_t kMinChunk = 128, kTargetBlocks = 512;
using detail::kMaxGridX;
using detail::kMaxGridYZ;
static_assert(kTcTileM == kTileM && kTcTileN == kTileN, "one grid of output tiles serves both kernels");

// Blocks per SM that implicit_gemm_kernel is compiled for (__launch_bounds__' minimum: 2
// caps it at 128 registers). 2 wherever ptxas fits that without a spill: every int32 walk
// (f32 and f64), and f32's int64 forward and wgrad. 1 for the rest, which spilled at 128
// (int64 dgrad 300 / 344 bytes for f32 / f64, f64 int64 forward 72 and wgrad 40; ptxas of
// nvcc 13.0, bench/kernel_resources.md).
template <class T, class I, class Problem>
constexpr int simt_min_blocks() {
  if constexpr (std::is_same_v<I, int32_t>) return 2;
  if constexpr (std::is_same_v<Problem, ci::DgradGemm<T>>) return 1;
  return sizeof(T) == 4 ? 2 : 1;
}

// For every z = (group g, chunk s, slice), column tile and row tile of that slice sp:
//   C_g[m, j] = sum_{k in chunk s} sp.a(g, m, k) * sp.b(g, k, j),
// stored where sp.store(g, s, m, j, .) puts it.
// Thread (ty, tx) owns rows m0 + ty + 16*i and columns n0 + tx + 16*j (i, j < kMicro), so
// a warp reads consecutive shared-memory words of Bs and one or two broadcast words of As.
// The tiles are gathered by conv_gather.cuh's TileGather (I: the walk's index type).
// Out-of-range rows, columns and depths load as 0 and are never stored. The stores go
// through the slice's OutputWalk (conv_walk.h): the thread's four rows split once per tile.
template <class T, class I, class Problem>
__global__ void __launch_bounds__(kGemmThreads, simt_min_blocks<T, I, Problem>())
    implicit_gemm_kernel(Problem p, int64_t groups, int64_t splits, int64_t chunk) {
  __shared__ T As[2][kTileK][kTileM];  // two stages: one multiplied while the other fills
  __shared__ T Bs[2][kTileK][kTileN];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  for (int64_t z = blockIdx.z; z < groups * splits * p.slices(); z += gridDim.z) {
    const int64_t g = z % groups, split = z / groups % splits;
    const auto& sp = p.slice(z / (groups * splits));
    const auto wk = ci::walk<I>(sp);
    conv_gather::TileGather<I, decltype(wk), kGemmThreads, kTileM, kTileK> gather(wk, g, tid);
    const auto out = ci::output_walk<I>(sp, split);
    const ci::Digits<I> by_row = out.rows.digits(16);
    const int64_t M = sp.rows(), Ncols = sp.cols(), K = sp.depth();
    const int64_t m_tiles = (M + kTileM - 1) / kTileM, n_tiles = (Ncols + kTileN - 1) / kTileN;
    const int64_t k_begin = split * chunk, k_end = k_begin + chunk < K ? k_begin + chunk : K;
    for (int64_t nt = blockIdx.y; nt < n_tiles; nt += gridDim.y) {
      for (int64_t mt = blockIdx.x; mt < m_tiles; mt += gridDim.x) {
        const int64_t m0 = mt * kTileM, n0 = nt * kTileN;
        gather.tile(m0, n0, k_begin, k_end, M, Ncols);
        T acc[kMicro][kMicro] = {};
        // Depth step k0 lies in stage s; step k0 + kTileK is issued into 1 - s before the
        // wait for k0, so its copies fly while k0 is multiplied. No group is left in flight
        // after the last step (nor any empty one committed: a block walks many tiles).
        if (k_begin < k_end) {
          gather.issue(k_begin, As[0], Bs[0]);
          cp_async_commit_group();
        }
        int s = 0;
        for (int64_t k0 = k_begin; k0 < k_end; k0 += kTileK, s = 1 - s) {
          if (k0 + kTileK < k_end) {
            gather.issue(k0 + kTileK, As[1 - s], Bs[1 - s]);
            cp_async_commit_group();
            cp_async_wait_group<1>();  // this thread's copies of step k0 have landed
          } else {
            cp_async_wait_group<0>();
          }
          __syncthreads();  // and every thread's
#pragma unroll
          for (int kk = 0; kk < kTileK; ++kk) {
            T a[kMicro], b[kMicro];
#pragma unroll
            for (int i = 0; i < kMicro; ++i) {
              a[i] = As[s][kk][ty + 16 * i];
              b[i] = Bs[s][kk][tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < kMicro; ++i)
#pragma unroll
              for (int j = 0; j < kMicro; ++j) acc[i][j] += a[i] * b[j];
          }
          __syncthreads();  // the next iteration issues step k0 + 2 kTileK into stage s
        }
        // The thread's rows m0 + ty + 16 i: split once, stepped by 16 (no division per store).
        ci::Digits<I> row = out.rows.digits(I(m0 + ty));
#pragma unroll
        for (int i = 0; i < kMicro; ++i, out.rows.advance(row, by_row)) {
          const auto row_offset = out.row(row);
#pragma unroll
          for (int j = 0; j < kMicro; ++j) {
            const int64_t col = n0 + tx + 16 * j;
            if (m0 + ty + 16 * i < M && col < Ncols) out.store(row_offset, I(g), I(col), acc[i][j]);
          }
        }
      }
    }
  }
}

// One depth chunk covering all of K.
ci::SplitK whole_depth(int64_t K) { return {1, std::max<int64_t>(K, 1)}; }

// bf16 and f16 operands exist for float only (conv.h).
template <class T>
void require_operands(const char* kernel, ConvOperands operands) {
  require(std::is_same_v<T, float> || operands == ConvOperands::kExact, kernel,
          "expected f32 tensors for bf16 or f16 operands (mixed precision), found f64");
}

// The kernels for index type I (conv_walk.h): int32_t where fits_int32 says the conv allows.
template <class T, class I, class Problem>
void launch_gemm_as(const char* kernel, const Problem& p, int64_t groups, ci::SplitK split, ConvOperands operands,
                    cudaStream_t stream) {
  // Slice 0 has the most rows (conv_index.h); the blocks past a smaller slice's tiles idle there.
  const int64_t m_tiles = (p.rows() + kTileM - 1) / kTileM, n_tiles = (p.cols() + kTileN - 1) / kTileN;
  const dim3 grid(static_cast<unsigned>(std::min(m_tiles, kMaxGridX)),
                  static_cast<unsigned>(std::min(n_tiles, kMaxGridYZ)),
                  static_cast<unsigned>(std::min(groups * split.splits * p.slices(), kMaxGridYZ)));
  if constexpr (std::is_same_v<T, float>) {
    if (operands == ConvOperands::kBf16) {
      tensor_core_gemm_kernel<__nv_bfloat16, I, Problem>
          <<<grid, kTcThreads, 0, stream>>>(p, groups, split.splits, split.chunk);
      return check_launch(kernel);
    }
    if (operands == ConvOperands::kF16) {
      tensor_core_gemm_kernel<__half, I, Problem>
          <<<grid, kTcThreads, 0, stream>>>(p, groups, split.splits, split.chunk);
      return check_launch(kernel);
    }
  }
  implicit_gemm_kernel<T, I, Problem><<<grid, kGemmThreads, 0, stream>>>(p, groups, split.splits, split.chunk);
  check_launch(kernel);
}

// A walk's indices overhang the problem by less than a tile and a step (edge tiles).
constexpr int64_t kIndexMargin = 2 * kTileM;

std::atomic<ConvIndexWidth> index_width{ConvIndexWidth::kAuto};  // set_conv_index_width
std::atomic<ConvSplit> split_rule{ConvSplit::kBusiestSm};         // set_conv_split

template <class T, class Problem>
void launch_gemm(const char* kernel, const Problem& p, int64_t groups, ci::SplitK split, ConvOperands operands,
                 cudaStream_t stream) {
  if (index_width.load(std::memory_order_relaxed) == ConvIndexWidth::kAuto && ci::fits_int32(p.q, kIndexMargin))
    return launch_gemm_as<T, int32_t>(kernel, p, groups, split, operands, stream);
  launch_gemm_as<T, int64_t>(kernel, p, groups, split, operands, stream);
}

// grad_bias[c] = sum_{n, p} dy[n, c, p]: one block per channel (grid-stride), each thread
// a strided slice in double, then the block's fixed-order shuffle reduction.
template <class T>
__global__ void bias_grad_kernel(int64_t N, int64_t C, int64_t HW, const T* dy, T* db) {
  __shared__ double smem[rows::kWarp];
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    double acc = 0;
    for (int64_t i = threadIdx.x; i < N * HW; i += blockDim.x)
      acc += static_cast<double>(dy[(i / HW * C + c) * HW + i % HW]);
    const double total = rows::block_sum(acc, smem);
    if (threadIdx.x == 0) db[c] = static_cast<T>(total);
  }
}

// p over its `size` output elements at p.*out, its depth cut into chunks (split-K) when
// it is long against the output tiles (split_depth): the chunks' partial results go to a
// scratch buffer, chunk_stride = size apart, that chunk_sum.cuh adds in chunk order
// into the output. `depth`: the longest slice's. The chunking depends on the shape only,
// so the result has the same bits on every run.
template <class T, class Problem>
void launch_split(const char* kernel, Problem p, T* Problem::*out, int64_t size, int64_t depth,
                  ConvOperands operands, cudaStream_t stream) {
  const int64_t tiles =
      (p.rows() + kTileM - 1) / kTileM * ((p.cols() + kTileN - 1) / kTileN) * p.q.groups * p.slices();
  const int64_t tile_k = operands == ConvOperands::kExact ? kTileK : kTcTileK;  // chunks of whole depth steps
  ci::SplitK split = ci::split_depth(depth, tiles, tile_k, kMinChunk, kTargetBlocks);
  if (split_rule.load(std::memory_order_relaxed) == ConvSplit::kFillSms) split = ci::fill_sms(split, depth, tiles, tile_k);
  if (split.splits == 1) return launch_gemm<T>(kernel, p, p.q.groups, whole_depth(depth), operands, stream);
  const detail::Scratch partial(kernel, sizeof(T) * split.splits * size, stream);
  T* const result = p.*out;
  p.*out = partial.as<T>();
  p.chunk_stride = size;
  launch_gemm<T>(kernel, p, p.q.groups, split, operands, stream);
  detail::sum_chunks(kernel, split.splits, size, partial.as<T>(), result, stream);
}

// wgrad of the conv2d s: dw = DY^T X (conv_index.h's WgradGemm).
template <class T>
void wgrad(const char* kernel, const Conv2dShape& s, const T* x, const T* dy, T* dw, ConvOperands operands,
           cudaStream_t stream) {
  require_operands<T>(kernel, operands);
  const ci::WgradGemm<T> p{ci::geometry(s), x, dy, dw};
  const int64_t size = p.q.C_out * p.cols();
  if (p.depth() == 0) {  // N == 0: the sum over no samples
    check(cudaMemsetAsync(dw, 0, sizeof(T) * size, stream), "cudaMemsetAsync", kernel);
    return;
  }
  if (narrow::applies(s))  // conv_narrow.cu
    return narrow::wgrad(kernel, s, x, dy, dw, operands, stream);
  launch_split<T>(kernel, p, &ci::WgradGemm<T>::out, size, p.depth(), operands, stream);
}

// Forward (ForwardGemm: out = conv(in, w) + bias) of the conv2d s.
template <class T>
void forward_pass(const char* kernel, const Conv2dShape& s, const T* in, const T* w, const T* bias, T* out,
                  ConvOperands operands, cudaStream_t stream) {
  require_operands<T>(kernel, operands);
  const ci::ForwardGemm<T> p{ci::geometry(s), in, w, bias, out};
  if (p.rows() == 0) return;
  if (narrow::applies(s))  // conv_narrow.cu
    return narrow::forward(kernel, s, in, w, bias, out, operands, stream);
  launch_split<T>(kernel, p, &ci::ForwardGemm<T>::y, p.rows() * p.q.C_out, p.depth(), operands, stream);
}

// Dgrad (DgradGemm: out = the adjoint of the conv2d s applied to in, + bias[channel]): its
// stride_h * stride_w phases (conv_index.h's DgradPhase) as slices of one launch, each a
// dense GEMM over the taps that reach its pixels, so no structural zero is multiplied. A
// phase no tap reaches (stride > kernel) has depth 0: its tiles store the bias or 0.
template <class T>
void dgrad_pass(const char* kernel, const Conv2dShape& s, const T* in, const T* w, const T* bias, T* out,
                ConvOperands operands, cudaStream_t stream) {
  require_operands<T>(kernel, operands);
  const ci::DgradGemm<T> p = ci::dgrad_gemm(ci::geometry(s), in, w, bias, out);
  if (p.rows() == 0) return;
  if (narrow::applies(s))  // conv_narrow.cu
    return narrow::dgrad(kernel, s, in, w, bias, out, operands, stream);
  int64_t depth = 0;  // the phases' depths differ (1 or 2 taps of 3 at stride 2): the chunks cover the longest
  for (int64_t slice = 0; slice < p.slices(); ++slice) depth = std::max(depth, p.slice(slice).depth());
  launch_split<T>(kernel, p, &ci::DgradGemm<T>::dx, p.q.N * p.q.C_in * p.q.H * p.q.W, depth, operands, stream);
}

}  // namespace

ConvIndexWidth set_conv_index_width(ConvIndexWidth width) {
  return index_width.exchange(width, std::memory_order_relaxed);
}

ConvSplit set_conv_split(ConvSplit split) { return split_rule.exchange(split, std::memory_order_relaxed); }

template <class T>
void conv2d_forward(const Conv2dShape& s, const T* input, const T* weight, const T* bias, T* output,
                    cudaStream_t stream, ConvOperands operands) {
  forward_pass("conv2d_forward", s, input, weight, bias, output, operands, stream);
}

template <class T>
void conv2d_backward_input(const Conv2dShape& s, const T* grad_output, const T* weight, T* grad_input,
                           cudaStream_t stream, ConvOperands operands) {
  dgrad_pass("conv2d_backward_input", s, grad_output, weight, static_cast<const T*>(nullptr),
                          grad_input, operands, stream);
}

template <class T>
void conv2d_backward_weight(const Conv2dShape& s, const T* input, const T* grad_output, T* grad_weight,
                            cudaStream_t stream, ConvOperands operands) {
  wgrad("conv2d_backward_weight", s, input, grad_output, grad_weight, operands, stream);
}

template <class T>
void conv2d_backward_bias(int64_t N, int64_t C, int64_t HW, const T* grad_output, T* grad_bias,
                          cudaStream_t stream) {
  if (C == 0) return;
  bias_grad_kernel<T><<<rows::blocks_for(C), rows::threads_for(N * HW), 0, stream>>>(N, C, HW, grad_output, grad_bias);
  check_launch("conv2d_backward_bias");
}

template <class T>
void conv_transpose2d_forward(const ConvTranspose2dShape& s, const T* input, const T* weight, const T* bias,
                              T* output, cudaStream_t stream, ConvOperands operands) {
  dgrad_pass("conv_transpose2d_forward", s.as_conv(), input, weight, bias, output, operands, stream);
}

template <class T>
void conv_transpose2d_backward_input(const ConvTranspose2dShape& s, const T* grad_output, const T* weight,
                                     T* grad_input, cudaStream_t stream, ConvOperands operands) {
  forward_pass("conv_transpose2d_backward_input", s.as_conv(), grad_output, weight,
                            static_cast<const T*>(nullptr), grad_input, operands, stream);
}

template <class T>
void conv_transpose2d_backward_weight(const ConvTranspose2dShape& s, const T* input, const T* grad_output,
                                      T* grad_weight, cudaStream_t stream, ConvOperands operands) {
  wgrad("conv_transpose2d_backward_weight", s.as_conv(), grad_output, input, grad_weight, operands, stream);
}

#define ND_INSTANTIATE_CONV(T)                                                                                  \
  template void conv2d_forward<T>(const Conv2dShape&, const T*, const T*, const T*, T*, cudaStream_t,           \
                                  ConvOperands);                                                                \
  template void conv2d_backward_input<T>(const Conv2dShape&, const T*, const T*, T*, cudaStream_t, ConvOperands); \
  template void conv2d_backward_weight<T>(const Conv2dShape&, const T*, const T*, T*, cudaStream_t,             \
                                          ConvOperands);                                                        \
  template void conv2d_backward_bias<T>(int64_t, int64_t, int64_t, const T*, T*, cudaStream_t);                 \
  template void conv_transpose2d_forward<T>(const ConvTranspose2dShape&, const T*, const T*, const T*, T*,      \
                                            cudaStream_t, ConvOperands);                                        \
  template void conv_transpose2d_backward_input<T>(const ConvTranspose2dShape&, const T*, const T*, T*,         \
                                                   cudaStream_t, ConvOperands);                                 \
  template void conv_transpose2d_backward_weight<T>(const ConvTranspose2dShape&, const T*, const T*, T*,        \
                                                    cudaStream_t, ConvOperands);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE_CONV)
#undef ND_INSTANTIATE_CONV

}  // namespace nd::kernels::cuda
