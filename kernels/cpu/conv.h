#pragma once
// 2-D convolution and transposed convolution on the CPU, NCHW, forward and backward.
// conv2d is im2col + gemm (kernels/cpu/matmul.h); conv_transpose2d is conv2d's dgrad with
// the roles of input and output swapped, so it is a thin layer over the conv2d kernels.
// Test: tests/kernels/conv_kernel_test.cpp. Benchmark: bench/bench_cpu_ops.cpp.
//
// Shapes (PyTorch's):
//   conv2d:           input [N, C_in, H, W], weight [C_out, C_in/groups, kH, kW],
//                     output [N, C_out, OH, OW],
//                     OH = floor((H + 2*pad_h - dil_h*(kH-1) - 1) / stride_h) + 1 (same for W).
//   conv_transpose2d: input [N, C_in, H, W], weight [C_in, C_out/groups, kH, kW],
//                     output [N, C_out, OH, OW],
//                     OH = (H-1)*stride_h - 2*pad_h + dil_h*(kH-1) + output_pad_h + 1.
// All arrays dense row-major. Backward kernels *write* their gradient (never accumulate).
#include <cstdint>

#include "kernels/common/conv_shape.h"

namespace nd::kernels::cpu {

using kernels::Conv2dShape;
using kernels::ConvTranspose2dShape;

// The requirements every conv2d kernel below shares (the engine checks them first):
//   all sizes >= 1 (N may be 0: nothing is done), C_in and C_out divisible by groups,
//   out_h() >= 1, out_w() >= 1; no output array overlaps an input array.

// output = conv2d(input, weight) + bias:
//   y[n, co, oh, ow] = b[co] + sum_{ci in group(co), kh, kw}
//       w[co, ci - g*C_in/groups, kh, kw] * x[n, ci, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw]
//   (x is zero outside the image).
// requires: bias is nullptr or [C_out]; output [N, C_out, OH, OW].
// ensures:  output written.  in-place: no.
template <class T>
void conv2d_forward(const Conv2dShape& s, const T* input, const T* weight, const T* bias, T* output);

// dgrad: grad_input = d(sum(y * grad_output)) / dx, i.e. the adjoint of conv2d_forward in x
// (col2im of W^T * dy). Pixels no window touches (stride > kernel, bottom/right rows the
// floor in OH drops) get 0.
// requires: grad_output [N, C_out, OH, OW]; grad_input [N, C_in, H, W].
// ensures:  grad_input written.  in-place: no.
template <class T>
void conv2d_backward_input(const Conv2dShape& s, const T* grad_output, const T* weight, T* grad_input);

// wgrad: grad_weight[co, c, kh, kw] = sum_{n, oh, ow} dy[n, co, oh, ow] * x[n, ci, ih, iw]
//   (ci = g*C_in/groups + c, ih/iw as in forward).
// requires: input [N, C_in, H, W]; grad_output [N, C_out, OH, OW];
//           grad_weight [C_out, C_in/groups, kH, kW].
// ensures:  grad_weight written (0 when N == 0).  in-place: no.
template <class T>
void conv2d_backward_weight(const Conv2dShape& s, const T* input, const T* grad_output, T* grad_weight);

// Bias gradient of conv2d and conv_transpose2d: grad_bias[c] = sum_{n, p} dy[n, c, p].
// requires: grad_output [N, C, HW]; grad_bias [C].
// ensures:  grad_bias written.  in-place: no.
template <class T>
void conv2d_backward_bias(int64_t N, int64_t C, int64_t HW, const T* grad_output, T* grad_bias);

// conv_transpose2d forward = conv2d dgrad of s.as_conv(), plus bias:
//   y[n, co, oh, ow] = b[co] + sum_{ci, kh, kw : oh = ih*sh - ph + kh*dh, ow = iw*sw - pw + kw*dw}
//       x[n, ci, ih, iw] * w[ci, co - g*C_out/groups, kh, kw].
// requires: input [N, C_in, H, W]; weight [C_in, C_out/groups, kH, kW]; bias nullptr or
//           [C_out]; output [N, C_out, OH, OW]; output_padding < stride or < dilation
//           (PyTorch's rule; the engine checks it).
// ensures:  output written.  in-place: no.
template <class T>
void conv_transpose2d_forward(const ConvTranspose2dShape& s, const T* input, const T* weight,
                              const T* bias, T* output);

// dgrad of conv_transpose2d = conv2d forward of s.as_conv() applied to grad_output.
// requires: grad_output [N, C_out, OH, OW]; grad_input [N, C_in, H, W].
// ensures:  grad_input written.  in-place: no.
template <class T>
void conv_transpose2d_backward_input(const ConvTranspose2dShape& s, const T* grad_output,
                                     const T* weight, T* grad_input);

// wgrad of conv_transpose2d = conv2d wgrad of s.as_conv() with input and grad swapped:
//   grad_weight[ci, c, kh, kw] = sum_{n, ih, iw} x[n, ci, ih, iw] * dy[n, co, oh, ow].
// requires: input [N, C_in, H, W]; grad_output [N, C_out, OH, OW];
//           grad_weight [C_in, C_out/groups, kH, kW].
// ensures:  grad_weight written.  in-place: no.
// (Bias gradient: conv2d_backward_bias(N, C_out, OH*OW, grad_output, grad_bias).)
template <class T>
void conv_transpose2d_backward_weight(const ConvTranspose2dShape& s, const T* input,
                                      const T* grad_output, T* grad_weight);

}  // namespace nd::kernels::cpu
