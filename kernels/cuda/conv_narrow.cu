// conv2d's passes when the input has ONE channel (C_in == 1, so groups == 1) or the output
// has ONE channel (C_out == 1, groups == 1), instead of conv.cu's 64 x 64 tile implicit GEMM; conv.cu's launchers hand these shapes over
// (narrow::applies, conv_narrow.cuh). The index math is kernels/common/conv_index.h's.
//
// Why: with one input channel a GEMM dimension of every pass is tiny. DCGAN on Fashion-MNIST
// has it twice: D's first conv (1 -> 64 channels, 4x4, stride 2) and G's last conv_transpose2d
// (64 -> 1), which is the dgrad of a conv2d with C_in = 1. There the dgrad GEMM has ONE column
// (conv_index.h DgradGemm: cols = C_in): the tile kernel gathers, rounds and multiplies a 64-wide
// B tile of which 63 columns are padding. The forward's depth is kH*kW = 16 (half of the WMMA
// kernel's 32-deep step), and wgrad's output is C_out x 16 (16 of 64 tile columns). Here
// each pass is a direct loop nest with no tile padding:
//   forward  one thread per output pixel (n, oh, ow), kChannels output channels in registers
//            (grid y walks the channels); the filters [taps][channels] staged in shared memory
//            (every thread reads the same word: a broadcast); neighbouring threads read
//            neighbouring ow of x's rows (stride apart) and store neighbouring ow of y.
//   dgrad    one thread per input pixel of one stride phase (grid z, conv_index.h DgradPhase:
//            every pixel of a phase is reached by the same taps, so a block shares them); the
//            phase's weights [tap][channel] staged in shared memory; the thread loops over the
//            taps and, innermost, the channels, reading dy at neighbouring ow across threads.
//   wgrad    dw [C_out, taps] = sum over the pixels k = (n, oh, ow) of dy[n, c, k] x[patch of k]:
//            a [16 x 16] output tile per block (grid x: channels, y: taps), thread 2 x 2 results;
//            each stage of 32 pixels puts dy [pixel][channel] and x's patches [pixel][tap] in
//            shared memory. A depth long against few tiles is cut into chunks (grid z, split
//            like conv.cu's split-K) whose partial results chunk_sum.cuh adds in chunk order.
// All three: 64 threads (2 warps) a block, so a small batch still makes several blocks (D's
// first layer at batch 2: 392 output pixels, 7 x 4 forward blocks).
//
// One output channel: DCGAN's last discriminator layer, Conv2d(128 -> 1, kernel 7) on 7 x 7,
// has a forward GEMM of ONE column (cols = C_out) and depth C_in*kH*kW = 6272, and a wgrad
// of ONE row, against 64-wide tiles (63/64 of B padding), and a dgrad of depth 1 (one tap
// reaches each input pixel: an outer product of dy and w) against 16- or 32-deep tile steps.
// conv_transpose2d with one input channel reaches the same kernels through as_conv() (its
// forward is the dgrad, with a bias per output channel).
//   forward  one block per output pixel (rows::threads_for(depth) threads, up to 256): thread
//            t adds taps t, t + blockDim, ... in order (neighbouring threads, neighbouring taps
//            of x's rows), rows::block_sum adds the threads' sums in a fixed order.
//   wgrad    one thread per tap k = (c, kh, kw) of dw [1, depth], summing dy[m] * x[patch of m]
//            over its chunk's pixels m in order (a warp: one dy word, a broadcast, and
//            neighbouring x); pixels long against the taps' blocks are cut into chunks as
//            wgrad's. 64 threads a block: D.main.5's 6272 taps make 98 blocks (256: 25).
//   dgrad    dgrad's rows (one thread per input pixel of a stride phase, grid z) times
//            kChannels input channels in registers (grid y); the phase's weights [tap][channel]
//            staged in shared memory (a broadcast); per tap one dy read (neighbouring threads,
//            neighbouring ow) and kChannels FMAs; stores of neighbouring iw per channel row.
//            D.main.5 at batch 64: 49 x 8 = 392 blocks where the tiles launched 98, the
//            mma's 51 MFLOP of padding for 0.8 of work gone.
// The forward and wgrad step x's index digits with conv_walk.h's InputPatch (no division
// per element), in int64_t. Cost model, D.main.5 at batch 64, bf16 (bench/RESULTS.md "convfill"): forward
// 16.15 -> 3.45 us (the tiles' split-K of 22 blocks and its sum launch -> 64 blocks, one
// launch), wgrad 4.98 -> 4.03 us (25 blocks of 256) -> 2.89 us (98 of 64). Registers:
// forward 46 (f64 48), wgrad 96 (f64 94; 10 blocks of 64 per SM); no spill. dgrad at
// batch 64, bf16: 3.44 -> 3.11 us (launch-bound either way: the model's floor; L2 4.90 ->
// 4.20 MB, shared wavefronts 123k -> 69k; bench/RESULTS.md "one output channel's dgrad"),
// 118 registers (f64 128: 8 blocks of 64 per SM), no spill.
//
// Arithmetic: T (f32, f64) accumulation; each thread adds its products in a fixed order
// (forward: taps in order, then + bias; dgrad: channel chunks of 64, the phase's taps in
// order, channels in order, then + bias; wgrad: pixels in order within a chunk, chunks in
// order; one output channel's forward: a thread's taps in order, then the block's fixed
// reduction, then + bias; its dgrad: the phase's taps in order, then + bias), so every run gives the same bits. Not the CPU's order (Eigen
// GEMMs): the emulator tests hold the results to the bound of an n-term sum
// (tests/emu/conv_emu_test.cpp), as for conv.cu. Mixed precision (ConvOperands::kBf16 /
// kF16, float only): each operand is rounded to bf16 / f16 (nearest even) as it is loaded
// and widened back, so every product is the exact product of the 16-bit values (8 + 8 or 11
// + 11 significant bits fit f32) and the sums are f32: the WMMA path's numbers, with SIMT
// FMAs instead of tensor cores (at 1 input channel the FMAs are few; the loads are the
// cost). Bias, output and partial sums stay f32.
//
// Checked: every pass in the emulator against kernels/cpu with the sanitizer on
// (tests/emu/conv_emu_test.cpp, its "narrow kernels" cases: DCGAN's two layers at batch 2,
// odd sizes, padding, stride 1 / 2 / 3, dilation, bias, more channels and taps than one
// stage, chunked wgrad, f32 / f64 / bf16 / f16, bit-equal reruns; one output channel:
// D.main.5 at batch 2 and 64, odd sizes with stride, padding and dilation, depth 333 past
// one stride of 256, four wgrad chunks, conv_transpose2d with one input channel and its
// forward's phases of 1, 2 and no taps; which kernels each pass launched); the
// dispatch through the engine in tests/cuda/cuda_conv_test.cpp and cuda_models_test.cpp
// (DCGAN) on the emulated library. Speed: the cost model only (bench/RESULTS.md, DCGAN at
// batch 2 in bf16: dgrad 8.93 -> 3.92 us, forward 3.33 -> 2.80, wgrad 5.86 -> 4.42); not
// yet run on a GPU. The dgrad kernel holds 127 registers (two DgradPhase; 16 warps per SM;
// capping it at 64 spills). Not covered here: groups > 1 at one output channel (impossible:
// groups divides C_out). The
// one-output forward is a block per pixel whatever the depth: on 2 x 28 x 28 pixels of depth
// 288 / 72 the cost model has it at 3.64 / 2.79 us against the tiles' 6.07 / 3.10, but with
// about 3x their L2 traffic (x's patches read per pixel, w per block), so a large batch of
// many pixels and a short depth may favour the tiles: not measured.
#include "kernels/cuda/conv_narrow.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "kernels/common/conv_index.h"
#include "kernels/common/conv_walk.h"
#include "kernels/cuda/chunk_sum.cuh"
#include "kernels/cuda/row_reduce.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cuda::narrow {

namespace {

namespace ci = kernels::conv_index;

constexpr int kThreads = 64;                       // every kernel: 2 warps a block
constexpr int kChannels = 16, kTaps = 64;          // forward: channels per thread, taps per weight stage
constexpr int kDgradTaps = 16, kDgradChannels = 64;  // dgrad: the weight stage [taps][channels]
constexpr int kWgradRows = 16, kWgradCols = 16;    // wgrad: the output tile [channels][taps] of a block
constexpr int kWgradPixels = 32;                   // wgrad: pixels per shared stage
constexpr int kMicro = 2;                          // wgrad: results per thread, kMicro x kMicro
constexpr int kRowStep = kWgradRows / kMicro, kColStep = kWgradCols / kMicro;  // a thread's rows / columns apart
static_assert(kRowStep * kColStep == kThreads, "the threads cover the wgrad tile");
static_assert(kThreads % kWgradPixels == 0, "every thread stages one pixel");
// wgrad's chunks (as conv.cu's split-K, conv_index.h split_depth): none shorter than this
// many pixels, at most about this many blocks. 256 (was 512): a second launch (the chunk sum)
// costs more than a block's 8 stages, so D.main.0 at batch 2 (392 pixels) stays one chunk
// (3 chunks of 128+ were slower in the cost model than none; bench/RESULTS.md); at batch 64
// (12544 pixels) 33 chunks fill the 132 SMs where 512 allowed 24 (96 blocks): 8.01 -> 7.49 us.
constexpr int64_t kMinChunk = 256, kTargetBlocks = 512;
using detail::kMaxGridX;
using detail::kMaxGridYZ;

// v as a product sees it: itself when R is T; rounded to R = bf16 / f16 (nearest even) and
// widened back otherwise.
template <class R, class T>
__device__ __forceinline__ T operand(T v) {
  if constexpr (std::is_same_v<R, __nv_bfloat16>)
    return __bfloat162float(__float2bfloat16_rn(v));
  else if constexpr (std::is_same_v<R, __half>)
    return __half2float(__float2half_rn(v));
  else
    return v;
}

__device__ __forceinline__ int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }

// y[n, c, oh, ow] = bias[c] + sum_{t = (kh, kw)} w[c, t] * x[n, 0, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw].
// Block: kThreads output pixels (grid x) times kChannels channels (grid y).
template <class T, class R>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(ci::Geometry q, const T* x, const T* w, const T* bias, T* y) {
  __shared__ T ws[kTaps][kChannels + 1];  // +1: the stage writes walk taps, 17 words apart
  const int64_t taps = q.kH * q.kW, ohw = q.OH * q.OW, pixels = q.N * ohw;
  for (int64_t c0 = int64_t(blockIdx.y) * kChannels; c0 < q.C_out; c0 += int64_t(gridDim.y) * kChannels) {
    for (int64_t m0 = int64_t(blockIdx.x) * kThreads; m0 < pixels; m0 += int64_t(gridDim.x) * kThreads) {
      const int64_t m = m0 + threadIdx.x;  // past the end: computes pixel m0's sums, stores nothing
      const ci::Pixel p = ci::pixel_of(m < pixels ? m : m0, q.OH, q.OW);
      const T* xn = x + p.n * q.H * q.W;
      const int64_t ih0 = p.h * q.stride_h - q.pad_h, iw0 = p.w * q.stride_w - q.pad_w;
      T acc[kChannels] = {};
      for (int64_t t0 = 0; t0 < taps; t0 += kTaps) {
        for (int i = threadIdx.x; i < kTaps * kChannels; i += kThreads) {
          const int tl = i % kTaps, j = i / kTaps;  // neighbouring threads, neighbouring taps of a filter
          const int64_t t = t0 + tl, c = c0 + j;
          ws[tl][j] = t < taps && c < q.C_out ? operand<R>(w[c * taps + t]) : T(0);
        }
        __syncthreads();
        const int stage = static_cast<int>(smaller(taps - t0, kTaps));
        for (int tl = 0; tl < stage; ++tl) {
          const int64_t t = t0 + tl, ih = ih0 + t / q.kW * q.dil_h, iw = iw0 + t % q.kW * q.dil_w;
          const T v = ci::in_range(ih, q.H) && ci::in_range(iw, q.W) ? operand<R>(xn[ih * q.W + iw]) : T(0);
#pragma unroll
          for (int j = 0; j < kChannels; ++j) acc[j] += v * ws[tl][j];
        }
        __syncthreads();  // the next stage overwrites ws
      }
      if (m < pixels) {
        T* const yp = y + p.n * q.C_out * ohw + p.h * q.OW + p.w;
#pragma unroll
        for (int j = 0; j < kChannels; ++j) {
          const int64_t c = c0 + j;
          if (c < q.C_out) yp[c * ohw] = bias ? acc[j] + bias[c] : acc[j];
        }
      }
    }
  }
}

// Both dgrads' weight stage: ws[ul][j] = w[c, kh, kw] (rounded as R) for the phase's tap
// u = u0 + ul = (a, b), (kh, kw) = (ph.first_tap + a*ph.tap_step, pw.first_tap + b*pw.tap_step),
// and channel c = c0 + j of the weight's `channels` (C_out for one input channel, C_in for
// one output channel: w is [channels, kH, kW] either way); 0 past the taps or channels.
// Neighbouring threads write neighbouring taps, Pitch = Cols + 1 words apart (no bank conflict).
template <class R, class T, int Pitch>
__device__ __forceinline__ void stage_phase_weights(T (&ws)[kDgradTaps][Pitch], const ci::Geometry& q,
                                                    const ci::DgradPhase& ph, const ci::DgradPhase& pw, const T* w,
                                                    int64_t u0, int64_t taps, int64_t c0, int64_t channels) {
  constexpr int Cols = Pitch - 1;
  for (int i = threadIdx.x; i < kDgradTaps * Cols; i += kThreads) {
    const int ul = i % kDgradTaps, j = i / kDgradTaps;
    const int64_t u = u0 + ul, c = c0 + j;
    T v = T(0);
    if (u < taps && c < channels) {
      const int64_t kh = ph.first_tap + u / pw.taps * ph.tap_step, kw = pw.first_tap + u % pw.taps * pw.tap_step;
      v = operand<R>(w[(c * q.kH + kh) * q.kW + kw]);
    }
    ws[ul][j] = v;
  }
}

// Both dgrads' dy pixel of tap u = (a, b) for row p = (n, i, j) of phase (ph, pw): the offset
// oh * OW + ow of (oh, ow) = (i + ph.base - a*ph.out_step, j + pw.base - b*pw.out_step) in
// one channel of dy, or -1 where that pixel is outside dy (padding, or rows OH's floor dropped).
__device__ __forceinline__ int64_t tap_pixel(const ci::Geometry& q, const ci::DgradPhase& ph, const ci::DgradPhase& pw,
                                             const ci::Pixel& p, int64_t u) {
  const int64_t oh = p.h + ph.base - u / pw.taps * ph.out_step, ow = p.w + pw.base - u % pw.taps * pw.out_step;
  return ci::in_range(oh, q.OH) && ci::in_range(ow, q.OW) ? oh * q.OW + ow : -1;
}

// dx[n, 0, ih, iw] = bias[0] + sum_{c, taps (kh, kw) reaching (ih, iw)} w[c, kh, kw] * dy[n, c, oh, ow],
// for the pixels of phase z = (ih mod sh, iw mod sw): row r = (n, i, j) of the phase is
// (ih, iw) = (ph.first + i*sh, pw.first + j*sw), its tap u = (a, b) is (kh, kw) =
// (ph.first_tap + a*ph.tap_step, ...), reading (oh, ow) = (i + ph.base - a*ph.out_step, ...).
// A phase no tap reaches stores the bias or 0. Block: kThreads rows of one phase.
template <class T, class R>
__global__ void __launch_bounds__(kThreads)
    dgrad_kernel(ci::Geometry q, const T* dy, const T* w, const T* bias, T* dx) {
  __shared__ T ws[kDgradTaps][kDgradChannels + 1];  // +1: the stage writes walk taps
  const int64_t ohw = q.OH * q.OW;
  for (int64_t z = blockIdx.z; z < q.stride_h * q.stride_w; z += gridDim.z) {
    const ci::DgradPhase ph = ci::dgrad_phase(z / q.stride_w, q.H, q.kH, q.stride_h, q.pad_h, q.dil_h);
    const ci::DgradPhase pw = ci::dgrad_phase(z % q.stride_w, q.W, q.kW, q.stride_w, q.pad_w, q.dil_w);
    const int64_t rows = q.N * ph.rows * pw.rows, taps = ph.taps * pw.taps;
    for (int64_t m0 = int64_t(blockIdx.x) * kThreads; m0 < rows; m0 += int64_t(gridDim.x) * kThreads) {
      const int64_t m = m0 + threadIdx.x;
      const ci::Pixel p = ci::pixel_of(m < rows ? m : m0, ph.rows, pw.rows);
      const T* const dyn = dy + p.n * q.C_out * ohw;
      T acc = T(0);
      for (int64_t c0 = 0; c0 < q.C_out; c0 += kDgradChannels) {
        for (int64_t u0 = 0; u0 < taps; u0 += kDgradTaps) {
          stage_phase_weights<R>(ws, q, ph, pw, w, u0, taps, c0, q.C_out);
          __syncthreads();
          const int stage = static_cast<int>(smaller(taps - u0, kDgradTaps));
          const int channels = static_cast<int>(smaller(q.C_out - c0, kDgradChannels));
          for (int ul = 0; ul < stage; ++ul) {
            const int64_t pixel = tap_pixel(q, ph, pw, p, u0 + ul);
            if (pixel < 0) continue;
            const T* const d = dyn + c0 * ohw + pixel;
            for (int cl = 0; cl < channels; ++cl) acc += operand<R>(d[cl * ohw]) * ws[ul][cl];
          }
          __syncthreads();  // the next stage overwrites ws
        }
      }
      if (m < rows) {
        const int64_t ih = ph.first + p.h * q.stride_h, iw = pw.first + p.w * q.stride_w;
        dx[(p.n * q.H + ih) * q.W + iw] = bias ? acc + bias[0] : acc;
      }
    }
  }
}

// dw[c, t] = sum_{k = (n, oh, ow)} dy[n, c, oh, ow] * x[n, 0, ih(oh, t), iw(ow, t)] over chunk
// z's pixels k in [z*chunk, (z+1)*chunk), stored at out + z*chunk_stride. Block: channels
// [c0, c0 + 16) x taps [t0, t0 + 16); thread (ty, tx) owns channels c0 + ty + 8 i and taps
// t0 + tx + 8 j (i, j < 2). Stage: thread tid gathers pixel k0 + tid % 32 (the division into
// (n, oh, ow) once per stage), its channels and taps tid / 32 + 2 i; a warp's 32 pixels are
// neighbouring addresses of dy's rows.
template <class T, class R>
__global__ void __launch_bounds__(kThreads)
    wgrad_kernel(ci::Geometry q, const T* x, const T* dy, T* out, int64_t splits, int64_t chunk, int64_t chunk_stride) {
  __shared__ T dys[kWgradPixels][kWgradRows + 1];  // +1: a warp's stage writes walk pixels
  __shared__ T xs[kWgradPixels][kWgradCols + 1];
  constexpr int kStageStep = kThreads / kWgradPixels;
  const int64_t taps = q.kH * q.kW, ohw = q.OH * q.OW, depth = q.N * ohw;
  const int tid = threadIdx.x, tx = tid % kColStep, ty = tid / kColStep;
  const int pixel = tid % kWgradPixels, first = tid / kWgradPixels;
  for (int64_t z = blockIdx.z; z < splits; z += gridDim.z) {
    const int64_t k_begin = z * chunk, k_end = smaller(k_begin + chunk, depth);
    for (int64_t t0 = int64_t(blockIdx.y) * kWgradCols; t0 < taps; t0 += int64_t(gridDim.y) * kWgradCols) {
      for (int64_t c0 = int64_t(blockIdx.x) * kWgradRows; c0 < q.C_out; c0 += int64_t(gridDim.x) * kWgradRows) {
        T acc[kMicro][kMicro] = {};
        for (int64_t k0 = k_begin; k0 < k_end; k0 += kWgradPixels) {
          const int64_t k = k0 + pixel;
          const bool in = k < k_end;
          const ci::Pixel p = ci::pixel_of(in ? k : k0, q.OH, q.OW);
          const T* const dyk = dy + p.n * q.C_out * ohw + p.h * q.OW + p.w;
          for (int i = first; i < kWgradRows; i += kStageStep) {
            const int64_t c = c0 + i;
            dys[pixel][i] = in && c < q.C_out ? operand<R>(dyk[c * ohw]) : T(0);
          }
          const T* const xn = x + p.n * q.H * q.W;
          for (int i = first; i < kWgradCols; i += kStageStep) {
            const int64_t t = t0 + i;
            const int64_t ih = ci::input_coord(p.h, t / q.kW, q.stride_h, q.pad_h, q.dil_h);
            const int64_t iw = ci::input_coord(p.w, t % q.kW, q.stride_w, q.pad_w, q.dil_w);
            const bool inside = in && t < taps && ci::in_range(ih, q.H) && ci::in_range(iw, q.W);
            xs[pixel][i] = inside ? operand<R>(xn[ih * q.W + iw]) : T(0);
          }
          __syncthreads();
          const int stage = static_cast<int>(smaller(k_end - k0, kWgradPixels));
          for (int kk = 0; kk < stage; ++kk) {
            T a[kMicro], b[kMicro];
#pragma unroll
            for (int i = 0; i < kMicro; ++i) {
              a[i] = dys[kk][ty + kRowStep * i];
              b[i] = xs[kk][tx + kColStep * i];
            }
#pragma unroll
            for (int i = 0; i < kMicro; ++i)
#pragma unroll
              for (int j = 0; j < kMicro; ++j) acc[i][j] += a[i] * b[j];
          }
          __syncthreads();  // the next stage overwrites dys and xs
        }
#pragma unroll
        for (int i = 0; i < kMicro; ++i)
#pragma unroll
          for (int j = 0; j < kMicro; ++j) {
            const int64_t c = c0 + ty + kRowStep * i, t = t0 + tx + kColStep * j;
            if (c < q.C_out && t < taps) out[z * chunk_stride + c * taps + t] = acc[i][j];
          }
      }
    }
  }
}

// One output channel (C_out == 1, groups == 1; C_in > 1): the forward GEMM has one column,
// wgrad one row, and dgrad the depth of a phase's taps. The forward and wgrad walk x through conv_walk.h's InputPatch: a thread keeps one index
// fixed and steps the other's digits with carries, with no division per element.

// y[m] = bias[0] + sum_{k = (c, kh, kw)} w[0, k] * x[n, c, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw]
// for pixel m = (n, oh, ow). Block: one pixel (grid x, grid-stride); thread t adds the taps
// k = t + i*blockDim in order (neighbouring threads, neighbouring taps of x's rows), then
// rows::block_sum adds the threads' sums in a fixed order (it depends on blockDim only).
template <class T, class R>
__global__ void __launch_bounds__(rows::kMaxThreads)
    one_output_forward_kernel(ci::Geometry q, const T* x, const T* w, const T* bias, T* y) {
  __shared__ T smem[rows::kWarp];
  const int64_t pixels = q.N * q.OH * q.OW, depth = q.C_in * q.kH * q.kW;
  const ci::InputPatch<T, int64_t> patch = ci::input_patch<T, int64_t>(q, x);
  const ci::Radix<int64_t> pixel_radix = ci::radix_of<int64_t>(q.OH, q.OW);
  const ci::Radix<int64_t> tap_radix = ci::radix_of<int64_t>(q.kH, q.kW);
  const ci::Digits<int64_t> by = tap_radix.digits(blockDim.x);
  for (int64_t m = blockIdx.x; m < pixels; m += gridDim.x) {
    const ci::Digits<int64_t> pixel = pixel_radix.digits(m);
    ci::Digits<int64_t> tap = tap_radix.digits(threadIdx.x);
    T acc = T(0);
    for (int64_t k = threadIdx.x; k < depth; k += blockDim.x, tap_radix.advance(tap, by)) {
      const T* const src = patch.at(0, pixel, tap);
      if (src) acc += operand<R>(*src) * operand<R>(w[k]);
    }
    const T total = rows::block_sum(acc, smem);
    if (threadIdx.x == 0) y[m] = bias ? total + bias[0] : total;
  }
}

// dw[0, k] = sum_{m = (n, oh, ow)} dy[m] * x[n, c, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw] for
// tap k = (c, kh, kw), over chunk z's pixels [z*chunk, (z+1)*chunk) (grid y), stored at
// out + z*chunk_stride. Thread: one tap (grid x, grid-stride), the chunk's pixels in order,
// their digits stepped by one; a warp reads one dy value (a broadcast) and neighbouring taps.
template <class T, class R>
__global__ void __launch_bounds__(kThreads)
    one_output_wgrad_kernel(ci::Geometry q, const T* x, const T* dy, T* out, int64_t splits, int64_t chunk,
                            int64_t chunk_stride) {
  const int64_t pixels = q.N * q.OH * q.OW, depth = q.C_in * q.kH * q.kW;
  const ci::InputPatch<T, int64_t> patch = ci::input_patch<T, int64_t>(q, x);
  const ci::Radix<int64_t> pixel_radix = ci::radix_of<int64_t>(q.OH, q.OW);
  const ci::Radix<int64_t> tap_radix = ci::radix_of<int64_t>(q.kH, q.kW);
  const ci::Digits<int64_t> next = pixel_radix.digits(1);
  for (int64_t z = blockIdx.y; z < splits; z += gridDim.y) {
    const int64_t m_begin = z * chunk, m_end = smaller(m_begin + chunk, pixels);
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < depth; k += int64_t(gridDim.x) * blockDim.x) {
      const ci::Digits<int64_t> tap = tap_radix.digits(k);
      ci::Digits<int64_t> pixel = pixel_radix.digits(m_begin);
      T acc = T(0);
      for (int64_t m = m_begin; m < m_end; ++m, pixel_radix.advance(pixel, next)) {
        const T* const src = patch.at(0, pixel, tap);
        if (src) acc += operand<R>(dy[m]) * operand<R>(*src);
      }
      out[z * chunk_stride + k] = acc;
    }
  }
}

// dx[n, c, ih, iw] = bias[c] + sum_{taps (kh, kw) reaching (ih, iw)} w[0, c, kh, kw] * dy[n, 0, oh, ow]:
// an outer product of dy and w when one tap reaches each pixel (DCGAN D.main.5), so a GEMM
// of depth 1 (or ph.taps * pw.taps) on the tiles. The pixels of phase z (grid z) are the
// rows of dgrad_kernel; a block takes kThreads of them (grid x) times kChannels channels
// (grid y), the thread its pixel's channels in registers. Each weight stage holds the
// phase's taps [tap][channel] (every thread reads the same word: a broadcast); per tap a
// thread reads its one dy value (neighbouring threads, neighbouring ow) and adds it times
// the tap's kChannels weights; it stores neighbouring iw of each channel's row.
template <class T, class R>
__global__ void __launch_bounds__(kThreads)
    one_output_dgrad_kernel(ci::Geometry q, const T* dy, const T* w, const T* bias, T* dx) {
  __shared__ T ws[kDgradTaps][kChannels + 1];  // +1: the stage writes walk taps, 17 words apart
  const int64_t ohw = q.OH * q.OW, hw = q.H * q.W;
  for (int64_t z = blockIdx.z; z < q.stride_h * q.stride_w; z += gridDim.z) {
    const ci::DgradPhase ph = ci::dgrad_phase(z / q.stride_w, q.H, q.kH, q.stride_h, q.pad_h, q.dil_h);
    const ci::DgradPhase pw = ci::dgrad_phase(z % q.stride_w, q.W, q.kW, q.stride_w, q.pad_w, q.dil_w);
    const int64_t rows = q.N * ph.rows * pw.rows, taps = ph.taps * pw.taps;
    for (int64_t c0 = int64_t(blockIdx.y) * kChannels; c0 < q.C_in; c0 += int64_t(gridDim.y) * kChannels) {
      for (int64_t m0 = int64_t(blockIdx.x) * kThreads; m0 < rows; m0 += int64_t(gridDim.x) * kThreads) {
        const int64_t m = m0 + threadIdx.x;  // past the end: computes row m0's sums, stores nothing
        const ci::Pixel p = ci::pixel_of(m < rows ? m : m0, ph.rows, pw.rows);
        const T* const dyn = dy + p.n * ohw;
        T acc[kChannels] = {};
        for (int64_t u0 = 0; u0 < taps; u0 += kDgradTaps) {
          stage_phase_weights<R>(ws, q, ph, pw, w, u0, taps, c0, q.C_in);
          __syncthreads();
          const int stage = static_cast<int>(smaller(taps - u0, kDgradTaps));
          for (int ul = 0; ul < stage; ++ul) {
            const int64_t pixel = tap_pixel(q, ph, pw, p, u0 + ul);
            if (pixel < 0) continue;
            const T d = operand<R>(dyn[pixel]);
#pragma unroll
            for (int j = 0; j < kChannels; ++j) acc[j] += d * ws[ul][j];
          }
          __syncthreads();  // the next stage overwrites ws
        }
        if (m < rows) {
          const int64_t ih = ph.first + p.h * q.stride_h, iw = pw.first + p.w * q.stride_w;
          T* const dxp = dx + p.n * q.C_in * hw + ih * q.W + iw;
#pragma unroll
          for (int j = 0; j < kChannels; ++j) {
            const int64_t c = c0 + j;
            if (c < q.C_in) dxp[c * hw] = bias ? acc[j] + bias[c] : acc[j];
          }
        }
      }
    }
  }
}

unsigned grid_size(int64_t n, int64_t per_block, int64_t cap) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + per_block - 1) / per_block, 1, cap));
}

template <class R>
struct Rounding {
  using type = R;
};
// launch(Rounding<R>{}) with R the operand type `operands` asks for: T itself, bf16 or f16.
template <class T, class Launch>
void with_operands(ConvOperands operands, Launch&& launch) {
  if constexpr (std::is_same_v<T, float>) {
    if (operands == ConvOperands::kBf16) return launch(Rounding<__nv_bfloat16>{});
    if (operands == ConvOperands::kF16) return launch(Rounding<__half>{});
  }
  launch(Rounding<T>{});
}

// launch(out) writes dw's `size` values at out: dw itself, or with split-K (split.splits > 1)
// chunk s of a scratch buffer at out + s * size, which chunk_sum.cuh then adds in chunk order
// into dw.
template <class T, class Launch>
void into_chunks(const char* kernel, ci::SplitK split, int64_t size, T* dw, cudaStream_t stream, Launch&& launch) {
  const detail::Scratch partial(kernel, split.splits > 1 ? sizeof(T) * split.splits * size : 0, stream);
  launch(split.splits > 1 ? partial.as<T>() : dw);
  check_launch(kernel);
  if (split.splits > 1) detail::sum_chunks(kernel, split.splits, size, partial.as<T>(), dw, stream);
}

// dw [1, C_in*kH*kW] of one output channel: a thread per tap, the pixels cut into chunks
// (split-K, as wgrad's) when they are long against the taps' blocks.
template <class T>
void one_output_wgrad(const char* kernel, const ci::Geometry& q, const T* x, const T* dy, T* dw, ConvOperands operands,
                      cudaStream_t stream) {
  const int64_t size = q.C_in * q.kH * q.kW, pixels = q.N * q.OH * q.OW;
  const unsigned blocks = grid_size(size, kThreads, kMaxGridX);  // D.main.5: 98 blocks (256 threads: 25)
  const ci::SplitK split = ci::split_depth(pixels, blocks, 1, kMinChunk, kTargetBlocks);
  into_chunks(kernel, split, size, dw, stream, [&](T* out) {
    with_operands<T>(operands, [&](auto rounding) {
      using R = typename decltype(rounding)::type;
      one_output_wgrad_kernel<T, R><<<dim3(blocks, grid_size(split.splits, 1, kMaxGridYZ)), kThreads, 0, stream>>>(
          q, x, dy, out, split.splits, split.chunk, size);
    });
  });
}

}  // namespace

template <class T>
void forward(const char* kernel, const Conv2dShape& s, const T* x, const T* w, const T* bias, T* y,
             ConvOperands operands, cudaStream_t stream) {
  const ci::Geometry q = ci::geometry(s);
  if (q.C_in != 1) {  // one output channel (applies)
    const int64_t pixels = q.N * q.OH * q.OW;
    with_operands<T>(operands, [&](auto rounding) {
      using R = typename decltype(rounding)::type;
      const unsigned threads = rows::threads_for(q.C_in * q.kH * q.kW);
      one_output_forward_kernel<T, R><<<grid_size(pixels, 1, kMaxGridX), threads, 0, stream>>>(q, x, w, bias, y);
    });
    return check_launch(kernel);
  }
  const dim3 grid(grid_size(q.N * q.OH * q.OW, kThreads, kMaxGridX), grid_size(q.C_out, kChannels, kMaxGridYZ));
  with_operands<T>(operands, [&](auto rounding) {
    using R = typename decltype(rounding)::type;
    forward_kernel<T, R><<<grid, kThreads, 0, stream>>>(q, x, w, bias, y);
  });
  check_launch(kernel);
}

template <class T>
void dgrad(const char* kernel, const Conv2dShape& s, const T* dy, const T* w, const T* bias, T* dx,
           ConvOperands operands, cudaStream_t stream) {
  const ci::Geometry q = ci::geometry(s);
  // Phase (0, 0) has the most rows; the blocks past a smaller phase's rows idle there.
  const int64_t rows = q.N * ci::dgrad_phase(0, q.H, q.kH, q.stride_h, q.pad_h, q.dil_h).rows *
                       ci::dgrad_phase(0, q.W, q.kW, q.stride_w, q.pad_w, q.dil_w).rows;
  const unsigned phases = grid_size(q.stride_h * q.stride_w, 1, kMaxGridYZ);
  if (q.C_in != 1) {  // one output channel (applies)
    const dim3 grid(grid_size(rows, kThreads, kMaxGridX), grid_size(q.C_in, kChannels, kMaxGridYZ), phases);
    with_operands<T>(operands, [&](auto rounding) {
      using R = typename decltype(rounding)::type;
      one_output_dgrad_kernel<T, R><<<grid, kThreads, 0, stream>>>(q, dy, w, bias, dx);
    });
    return check_launch(kernel);
  }
  const dim3 grid(grid_size(rows, kThreads, kMaxGridX), 1, phases);
  with_operands<T>(operands, [&](auto rounding) {
    using R = typename decltype(rounding)::type;
    dgrad_kernel<T, R><<<grid, kThreads, 0, stream>>>(q, dy, w, bias, dx);
  });
  check_launch(kernel);
}

template <class T>
void wgrad(const char* kernel, const Conv2dShape& s, const T* x, const T* dy, T* dw, ConvOperands operands,
           cudaStream_t stream) {
  const ci::Geometry q = ci::geometry(s);
  if (q.C_in != 1) return one_output_wgrad(kernel, q, x, dy, dw, operands, stream);  // one output channel (applies)
  const int64_t taps = q.kH * q.kW, size = q.C_out * taps, depth = q.N * q.OH * q.OW;
  const unsigned row_tiles = grid_size(q.C_out, kWgradRows, kMaxGridX), col_tiles = grid_size(taps, kWgradCols, kMaxGridYZ);
  const ci::SplitK split =
      ci::split_depth(depth, int64_t(row_tiles) * col_tiles, kWgradPixels, kMinChunk, kTargetBlocks);
  const dim3 grid(row_tiles, col_tiles, grid_size(split.splits, 1, kMaxGridYZ));
  into_chunks(kernel, split, size, dw, stream, [&](T* out) {
    with_operands<T>(operands, [&](auto rounding) {
      using R = typename decltype(rounding)::type;
      wgrad_kernel<T, R><<<grid, kThreads, 0, stream>>>(q, x, dy, out, split.splits, split.chunk, size);
    });
  });
}

#define ND_INSTANTIATE_CONV_NARROW(T)                                                                        \
  template void forward<T>(const char*, const Conv2dShape&, const T*, const T*, const T*, T*, ConvOperands, \
                           cudaStream_t);                                                                    \
  template void dgrad<T>(const char*, const Conv2dShape&, const T*, const T*, const T*, T*, ConvOperands,   \
                         cudaStream_t);                                                                      \
  template void wgrad<T>(const char*, const Conv2dShape&, const T*, const T*, T*, ConvOperands, cudaStream_t);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE_CONV_NARROW)
#undef ND_INSTANTIATE_CONV_NARROW

}  // namespace nd::kernels::cuda::narrow
