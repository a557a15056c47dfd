#pragma once
// CUDA twins of kernels/cpu/conv.h: conv2d forward / dgrad / wgrad as implicit GEMMs (the
// input patches are gathered into shared-memory tiles on the fly, no im2col buffer), and
// conv_transpose2d through the same kernels with the roles of conv2d's input and output
// swapped, as on the CPU. Same shapes, contracts and argument lists plus the stream the
// kernels are queued on; the index math is kernels/common/conv_index.h.
// Tests: tests/kernels/conv_index_test.cpp (index math, CPU), tests/cuda/cuda_conv_test.cpp.
//
// Accumulation is in T (f32 in float, f64 in double). Every result is bit-reproducible
// run to run: no atomics; split-K partial sums (any pass) are added in a fixed order.
// The engine checks the shape requirements of kernels/cpu/conv.h first; sizes that do
// not fit a launch are an nd::Error.
//
// Mixed precision (engine/autocast.h): the six GEMM passes take a last argument
// ConvOperands::kBf16 or kF16 (float only; on double an nd::Error). Both operands are
// rounded to bf16 / f16 (nearest even) as the kernel gathers them, multiplied on tensor
// cores (mma.sync) with f32 accumulation; tensors, bias, split-K sums and the output stay f32. The CPU
// twin is the cpu:: function on operands rounded to bf16 / f16 and widened back to f32: the
// products are the same (bf16 x bf16 and f16 x f16 are exact in f32), only the order of the f32
// additions differs. The bias gradient is a sum, not a product: always f32.
#include <cstdint>

#include "kernels/common/conv_shape.h"
#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

using kernels::Conv2dShape;
using kernels::ConvTranspose2dShape;

// The precision of a pass's products: T x T, or bf16 x bf16 / f16 x f16 into f32 (float only).
enum class ConvOperands { kExact, kBf16, kF16 };

// The index type of the implicit-GEMM kernels' walks (conv.cu): kAuto (the default) takes
// int32_t where every index of the conv fits (conv_walk.h fits_int32), else int64_t; kInt64
// always int64_t. For tests: the 64-bit kernels otherwise run only on tensors past 2^31
// elements, which no test can allocate (tests/emu/conv_emu_test.cpp runs them forced).
// Process-wide, read at each launch; returns the previous setting.
enum class ConvIndexWidth { kAuto, kInt64 };
ConvIndexWidth set_conv_index_width(ConvIndexWidth width);

// How the tile kernels cut a long depth into chunks (split-K, conv.cu): kBusiestSm (the
// default) takes the cut with the least depth on the busiest SM (conv_index.h split_depth);
// kFillSms then cuts finer until the blocks cover 132 SMs or a chunk is one k-tile
// (conv_index.h fill_sms). An experiment (bench_kernels' model family times both on the
// batch-64 rows), not a tuning knob: both give the same results up to the
// order of the chunks' sums, each the same bits on every run. Process-wide, read at each
// launch; returns the previous setting.
enum class ConvSplit { kBusiestSm, kFillSms };
ConvSplit set_conv_split(ConvSplit split);

// y = conv2d(x, w) + bias. requires/ensures as cpu::conv2d_forward.  in-place: no.
template <class T>
void conv2d_forward(const Conv2dShape& s, const T* input, const T* weight, const T* bias, T* output,
                    cudaStream_t stream, ConvOperands operands = ConvOperands::kExact);

// dgrad, as cpu::conv2d_backward_input: grad_input written (pixels no window reads get 0).
template <class T>
void conv2d_backward_input(const Conv2dShape& s, const T* grad_output, const T* weight, T* grad_input,
                           cudaStream_t stream, ConvOperands operands = ConvOperands::kExact);

// wgrad, as cpu::conv2d_backward_weight: grad_weight written (0 when N == 0). Uses a
// split-K partial buffer from the caching allocator when the depth N*OH*OW is long.
template <class T>
void conv2d_backward_weight(const Conv2dShape& s, const T* input, const T* grad_output, T* grad_weight,
                            cudaStream_t stream, ConvOperands operands = ConvOperands::kExact);

// grad_bias[c] = sum_{n, p} dy[n, c, p], as cpu::conv2d_backward_bias (accumulated in double).
template <class T>
void conv2d_backward_bias(int64_t N, int64_t C, int64_t HW, const T* grad_output, T* grad_bias,
                          cudaStream_t stream);

// conv_transpose2d forward = conv2d dgrad of s.as_conv() with the bias added in the same pass.
template <class T>
void conv_transpose2d_forward(const ConvTranspose2dShape& s, const T* input, const T* weight, const T* bias,
                              T* output, cudaStream_t stream, ConvOperands operands = ConvOperands::kExact);

// dgrad of conv_transpose2d = conv2d forward of s.as_conv() applied to grad_output.
template <class T>
void conv_transpose2d_backward_input(const ConvTranspose2dShape& s, const T* grad_output, const T* weight,
                                     T* grad_input, cudaStream_t stream, ConvOperands operands = ConvOperands::kExact);

// wgrad of conv_transpose2d = conv2d wgrad of s.as_conv() with input and grad_output swapped.
template <class T>
void conv_transpose2d_backward_weight(const ConvTranspose2dShape& s, const T* input, const T* grad_output,
                                      T* grad_weight, cudaStream_t stream,
                                      ConvOperands operands = ConvOperands::kExact);

}  // namespace nd::kernels::cuda
