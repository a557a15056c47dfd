#include "engine/nn/conv.h"

#include <cmath>

#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/conv.h"

namespace nd::nn {

template <size_t D>
ExpandingArray<D>::ExpandingArray(const std::vector<int64_t>& values) {
  ND_CHECK(values.size() == 1 || values.size() == D, "expected 1 or ", D, " values (one per spatial dim), got ",
           values.size());
  for (size_t i = 0; i < D; ++i) values_[i] = values[values.size() == 1 ? 0 : i];
}
template class ExpandingArray<2>;

namespace {
// Checks shared by both layers; `layer` names the layer in messages.
void check_conv_options(const char* layer, int64_t in, int64_t out, const ExpandingArray<2>& kernel,
                        const ExpandingArray<2>& stride, const ExpandingArray<2>& padding,
                        const ExpandingArray<2>& dilation, int64_t groups) {
  ND_CHECK(in > 0, layer, ": in_channels must be positive, got ", in);
  ND_CHECK(out > 0, layer, ": out_channels must be positive, got ", out);
  ND_CHECK(groups > 0, layer, ": groups must be positive, got ", groups);
  ND_CHECK(in % groups == 0, layer, ": in_channels must be divisible by groups, got in_channels=", in,
           ", groups=", groups);
  ND_CHECK(out % groups == 0, layer, ": out_channels must be divisible by groups, got out_channels=", out,
           ", groups=", groups);
  for (size_t i = 0; i < 2; ++i) {
    ND_CHECK(kernel[i] > 0, layer, ": kernel_size must be positive, got ", shape_str(kernel.vec()));
    ND_CHECK(stride[i] > 0, layer, ": stride must be positive, got ", shape_str(stride.vec()));
    ND_CHECK(padding[i] >= 0, layer, ": padding must be non-negative, got ", shape_str(padding.vec()));
    ND_CHECK(dilation[i] > 0, layer, ": dilation must be positive, got ", shape_str(dilation.vec()));
  }
}

void reset_conv(const Tensor& weight, const Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const int64_t fan_in = init::calculate_fan_in_and_fan_out(weight).first;
    const double bound = fan_in > 0 ? 1 / std::sqrt(static_cast<double>(fan_in)) : 0;
    init::uniform_(bias, -bound, bound);
  }
}
}  // namespace

Conv2dImpl::Conv2dImpl(const Conv2dOptions& options_) : Module("Conv2d"), options(options_) {
  const auto& o = options;
  check_conv_options("Conv2d", o.in_channels(), o.out_channels(), o.kernel_size(), o.stride(), o.padding(),
                     o.dilation(), o.groups());
  weight = register_parameter(
      "weight", empty({o.out_channels(), o.in_channels() / o.groups(), o.kernel_size()[0], o.kernel_size()[1]}));
  if (o.bias()) bias = register_parameter("bias", empty({o.out_channels()}));
  reset_parameters();
}

void Conv2dImpl::reset_parameters() { reset_conv(weight, bias); }

Tensor Conv2dImpl::forward(const Tensor& input) {
  return conv2d(input, weight, bias, options.stride().vec(), options.padding().vec(), options.dilation().vec(),
                options.groups());
}

ConvTranspose2dImpl::ConvTranspose2dImpl(const ConvTranspose2dOptions& options_)
    : Module("ConvTranspose2d"), options(options_) {
  const auto& o = options;
  check_conv_options("ConvTranspose2d", o.in_channels(), o.out_channels(), o.kernel_size(), o.stride(), o.padding(),
                     o.dilation(), o.groups());
  for (size_t i = 0; i < 2; ++i)
    ND_CHECK(o.output_padding()[i] >= 0 &&
                 (o.output_padding()[i] < o.stride()[i] || o.output_padding()[i] < o.dilation()[i]),
             "ConvTranspose2d: output_padding must be non-negative and smaller than stride or dilation, got "
             "output_padding=", shape_str(o.output_padding().vec()), ", stride=", shape_str(o.stride().vec()),
             ", dilation=", shape_str(o.dilation().vec()));
  weight = register_parameter(
      "weight", empty({o.in_channels(), o.out_channels() / o.groups(), o.kernel_size()[0], o.kernel_size()[1]}));
  if (o.bias()) bias = register_parameter("bias", empty({o.out_channels()}));
  reset_parameters();
}

void ConvTranspose2dImpl::reset_parameters() { reset_conv(weight, bias); }

Tensor ConvTranspose2dImpl::forward(const Tensor& input) {
  return conv_transpose2d(input, weight, bias, options.stride().vec(), options.padding().vec(),
                          options.output_padding().vec(), options.groups(), options.dilation().vec());
}

}  // namespace nd::nn
