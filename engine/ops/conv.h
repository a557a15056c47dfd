#pragma once
// 2-D convolution and transposed convolution (PyTorch semantics and argument order).
// Kernels: kernels/cpu/conv.h. Tests: tests/ops/conv_test.cpp. Backward node:
// ConvolutionBackward (for both, as in PyTorch).
#include <vector>

#include "engine/tensor.h"

namespace nd {

// input [N, C_in, H, W] (or unbatched [C_in, H, W]), weight [C_out, C_in/groups, kH, kW],
// bias [C_out] or undefined. stride, padding, dilation: one value for both dims or {h, w}.
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
              const std::vector<int64_t>& stride = {1}, const std::vector<int64_t>& padding = {0},
              const std::vector<int64_t>& dilation = {1}, int64_t groups = 1);

// input [N, C_in, H, W] (or [C_in, H, W]), weight [C_in, C_out/groups, kH, kW], bias [C_out].
// Output size: (H - 1)*stride - 2*padding + dilation*(kH - 1) + output_padding + 1.
// output_padding must be smaller than stride or dilation.
Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
                        const std::vector<int64_t>& stride = {1}, const std::vector<int64_t>& padding = {0},
                        const std::vector<int64_t>& output_padding = {0}, int64_t groups = 1,
                        const std::vector<int64_t>& dilation = {1});

}  // namespace nd
