#include "engine/nn/init.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"

namespace nd::nn::init {

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::kLinear:
    case Nonlinearity::kConv2D:
    case Nonlinearity::kConvTranspose2D:
    case Nonlinearity::kSigmoid: return 1.0;
    case Nonlinearity::kTanh: return 5.0 / 3.0;
    case Nonlinearity::kReLU: return std::sqrt(2.0);
    case Nonlinearity::kLeakyReLU: return std::sqrt(2.0 / (1 + param * param));
    case Nonlinearity::kSELU: return 3.0 / 4.0;
  }
  throw Error("calculate_gain: unknown nonlinearity");
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor) {
  ND_CHECK(tensor.dim() >= 2, "calculate_fan_in_and_fan_out: fan in and fan out can not be computed for a tensor with "
           "fewer than 2 dimensions, found ", tensor.describe());
  int64_t receptive_field = 1;
  for (int64_t d = 2; d < tensor.dim(); ++d) receptive_field *= tensor.size(d);
  return {tensor.size(1) * receptive_field, tensor.size(0) * receptive_field};
}

namespace {
// Overwrites tensor with `values` (same shape, drawn in f32/f64) as one in-place update.
Tensor fill_from(const Tensor& tensor, const Tensor& values) {
  NoGradGuard no_grad;
  tensor.copy_(values);
  return tensor;
}

TensorOptions draw_options(const Tensor& tensor) {
  ND_CHECK(tensor.is_floating_point(), "nn::init: expected a floating point tensor, found ", tensor.describe());
  // Draw on the CPU in the tensor's precision (f64 stays f64), then copy onto its device.
  return TensorOptions(tensor.dtype() == kFloat64 ? kFloat64 : kFloat32);
}

double fan(const Tensor& tensor, FanMode mode) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  const int64_t f = mode == FanMode::kFanIn ? fan_in : fan_out;
  ND_CHECK(f > 0, "nn::init: the fan of ", tensor.describe(), " is 0; cannot scale its initialisation");
  return static_cast<double>(f);
}
}  // namespace

Tensor uniform_(const Tensor& tensor, double a, double b) {
  ND_CHECK(a <= b, "uniform_: expected a <= b, found a=", a, ", b=", b);
  if (tensor.numel() == 0) return tensor;
  return fill_from(tensor, rand(tensor.sizes(), draw_options(tensor)) * (b - a) + a);
}

Tensor normal_(const Tensor& tensor, double mean, double std) {
  ND_CHECK(std >= 0, "normal_: expected std >= 0, found ", std);
  if (tensor.numel() == 0) return tensor;
  return fill_from(tensor, randn(tensor.sizes(), draw_options(tensor)) * std + mean);
}

Tensor constant_(const Tensor& tensor, double value) {
  NoGradGuard no_grad;
  tensor.fill_(value);
  return tensor;
}
Tensor zeros_(const Tensor& tensor) { return constant_(tensor, 0); }
Tensor ones_(const Tensor& tensor) { return constant_(tensor, 1); }

Tensor kaiming_uniform_(const Tensor& tensor, double a, FanMode mode, Nonlinearity nonlinearity) {
  if (tensor.numel() == 0) return tensor;
  const double bound = calculate_gain(nonlinearity, a) * std::sqrt(3.0 / fan(tensor, mode));
  return uniform_(tensor, -bound, bound);
}

Tensor kaiming_normal_(const Tensor& tensor, double a, FanMode mode, Nonlinearity nonlinearity) {
  if (tensor.numel() == 0) return tensor;
  return normal_(tensor, 0, calculate_gain(nonlinearity, a) / std::sqrt(fan(tensor, mode)));
}

Tensor xavier_uniform_(const Tensor& tensor, double gain) {
  if (tensor.numel() == 0) return tensor;
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(tensor, -bound, bound);
}

Tensor xavier_normal_(const Tensor& tensor, double gain) {
  if (tensor.numel() == 0) return tensor;
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  return normal_(tensor, 0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)));
}

}  // namespace nd::nn::init
