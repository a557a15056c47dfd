#pragma once
// nn::Conv2d and nn::ConvTranspose2d over nd::conv2d / nd::conv_transpose2d.
// state_dict: weight [out, in/groups, kH, kW] (Conv2d) or [in, out/groups, kH, kW]
// (ConvTranspose2d), bias [out]. Tests: tests/nn/layers_test.cpp, golden_test.cpp.
#include <array>
#include <initializer_list>
#include <vector>

#include "engine/nn/init.h"
#include "engine/nn/module.h"

namespace nd::nn {

// One value for every spatial dim (4) or one per dim ({4, 3}), as LibTorch's
// ExpandingArray.
template <size_t D>
class ExpandingArray {
 public:
  ExpandingArray(int64_t value) { values_.fill(value); }
  ExpandingArray(std::initializer_list<int64_t> values) : ExpandingArray(std::vector<int64_t>(values)) {}
  ExpandingArray(const std::vector<int64_t>& values);
  int64_t operator[](size_t i) const { return values_[i]; }
  std::vector<int64_t> vec() const { return {values_.begin(), values_.end()}; }

 private:
  std::array<int64_t, D> values_{};
};

struct Conv2dOptions {
  Conv2dOptions(int64_t in_channels, int64_t out_channels, ExpandingArray<2> kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  ND_ARG(int64_t, in_channels);
  ND_ARG(int64_t, out_channels);
  ND_ARG(ExpandingArray<2>, kernel_size);
  ND_ARG(ExpandingArray<2>, stride) = 1;
  ND_ARG(ExpandingArray<2>, padding) = 0;
  ND_ARG(ExpandingArray<2>, dilation) = 1;
  ND_ARG(int64_t, groups) = 1;
  ND_ARG(bool, bias) = true;
};

struct ConvTranspose2dOptions {
  ConvTranspose2dOptions(int64_t in_channels, int64_t out_channels, ExpandingArray<2> kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  ND_ARG(int64_t, in_channels);
  ND_ARG(int64_t, out_channels);
  ND_ARG(ExpandingArray<2>, kernel_size);
  ND_ARG(ExpandingArray<2>, stride) = 1;
  ND_ARG(ExpandingArray<2>, padding) = 0;
  ND_ARG(ExpandingArray<2>, output_padding) = 0;
  ND_ARG(ExpandingArray<2>, dilation) = 1;
  ND_ARG(int64_t, groups) = 1;
  ND_ARG(bool, bias) = true;
};

// Init (PyTorch's _ConvNd.reset_parameters, for both layers): weight
// kaiming_uniform_(a = sqrt(5)) = U(-1/sqrt(fan_in), 1/sqrt(fan_in)) and bias
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), with fan_in = weight.size(1) * kH * kW
// (for ConvTranspose2d that is out/groups * kH * kW: PyTorch's formula on its layout).
class Conv2dImpl : public Module {
 public:
  explicit Conv2dImpl(const Conv2dOptions& options);
  Conv2dImpl(int64_t in_channels, int64_t out_channels, ExpandingArray<2> kernel_size)
      : Conv2dImpl(Conv2dOptions(in_channels, out_channels, kernel_size)) {}
  void reset_parameters();
  // input [N, C_in, H, W] or [C_in, H, W].
  Tensor forward(const Tensor& input) override;

  Conv2dOptions options;
  Tensor weight, bias;
};
ND_MODULE(Conv2d);

class ConvTranspose2dImpl : public Module {
 public:
  explicit ConvTranspose2dImpl(const ConvTranspose2dOptions& options);
  ConvTranspose2dImpl(int64_t in_channels, int64_t out_channels, ExpandingArray<2> kernel_size)
      : ConvTranspose2dImpl(ConvTranspose2dOptions(in_channels, out_channels, kernel_size)) {}
  void reset_parameters();
  Tensor forward(const Tensor& input) override;

  ConvTranspose2dOptions options;
  Tensor weight, bias;
};
ND_MODULE(ConvTranspose2d);

}  // namespace nd::nn
