#pragma once
// The geometry of a 2-D convolution and of a transposed one, PyTorch's (kernels/cpu/conv.h
// gives the shapes' formulas): shared by the CPU kernels, the CUDA kernels and the index
// math both use (conv_index.h). Host only.
#include <array>
#include <cstdint>

namespace nd::kernels {

struct Conv2dShape {
  int64_t N = 0, C_in = 0, H = 0, W = 0;  // input
  int64_t C_out = 0, kH = 0, kW = 0;      // weight [C_out, C_in/groups, kH, kW]
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};  // {h, w}
  int64_t groups = 1;

  int64_t out_h() const { return (H + 2 * padding[0] - dilation[0] * (kH - 1) - 1) / stride[0] + 1; }
  int64_t out_w() const { return (W + 2 * padding[1] - dilation[1] * (kW - 1) - 1) / stride[1] + 1; }
};

struct ConvTranspose2dShape {
  int64_t N = 0, C_in = 0, H = 0, W = 0;  // input
  int64_t C_out = 0, kH = 0, kW = 0;      // weight [C_in, C_out/groups, kH, kW]
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, output_padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;

  int64_t out_h() const {
    return (H - 1) * stride[0] - 2 * padding[0] + dilation[0] * (kH - 1) + output_padding[0] + 1;
  }
  int64_t out_w() const {
    return (W - 1) * stride[1] - 2 * padding[1] + dilation[1] * (kW - 1) + output_padding[1] + 1;
  }
  // The conv2d whose dgrad this is: its input is our output, its output is our input,
  // and our weight [C_in, C_out/groups, kH, kW] is its weight [C_out', C_in'/groups, kH, kW].
  Conv2dShape as_conv() const {
    return {N, C_out, out_h(), out_w(), C_in, kH, kW, stride, padding, dilation, groups};
  }
};

}  // namespace nd::kernels
