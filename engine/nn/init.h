#pragma once
// Parameter initialisation exactly as PyTorch's torch.nn.init (LibTorch:
// torch::nn::init), drawing from nd's seeded default generator. Every function fills
// its tensor in place under NoGradGuard (bumping its version) and returns it.
// Values differ from PyTorch's (another generator); distributions and bounds match.
// Tests: tests/nn/layers_test.cpp ("init").
#include <cstdint>
#include <utility>

#include "engine/nn/module.h"
#include "engine/tensor.h"

namespace nd::nn::init {

enum class FanMode { kFanIn, kFanOut };
enum class Nonlinearity { kLinear, kConv2D, kConvTranspose2D, kSigmoid, kTanh, kReLU, kLeakyReLU, kSELU };

// PyTorch's recommended gains: linear/conv/sigmoid 1, tanh 5/3, relu sqrt(2),
// leaky_relu sqrt(2 / (1 + param^2)) (param = negative slope, default 0.01), selu 3/4.
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);

// For a weight [out, in, k...]: fan_in = in * prod(k), fan_out = out * prod(k).
// (ConvTranspose2d's [in, out/groups, kH, kW] weight goes through the same formula, as
// in PyTorch.) requires: tensor.dim() >= 2.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor);

// U(a, b).
Tensor uniform_(const Tensor& tensor, double a = 0, double b = 1);
// N(mean, std^2).
Tensor normal_(const Tensor& tensor, double mean = 0, double std = 1);
Tensor constant_(const Tensor& tensor, double value);
Tensor zeros_(const Tensor& tensor);
Tensor ones_(const Tensor& tensor);
// U(-bound, bound), bound = gain * sqrt(3 / fan), gain = calculate_gain(nonlinearity, a).
Tensor kaiming_uniform_(const Tensor& tensor, double a = 0, FanMode mode = FanMode::kFanIn,
                        Nonlinearity nonlinearity = Nonlinearity::kLeakyReLU);
// N(0, std^2), std = gain / sqrt(fan).
Tensor kaiming_normal_(const Tensor& tensor, double a = 0, FanMode mode = FanMode::kFanIn,
                       Nonlinearity nonlinearity = Nonlinearity::kLeakyReLU);
// U(-bound, bound), bound = gain * sqrt(6 / (fan_in + fan_out)).
Tensor xavier_uniform_(const Tensor& tensor, double gain = 1);
// N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor xavier_normal_(const Tensor& tensor, double gain = 1);

}  // namespace nd::nn::init
