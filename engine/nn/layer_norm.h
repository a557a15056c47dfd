#pragma once
// nn::LayerNorm over nd::layer_norm. state_dict: weight, bias of shape normalized_shape
// (elementwise_affine; bias unless bias(false)). Tests: tests/nn/layers_test.cpp, golden_test.cpp.
#include "engine/nn/init.h"
#include "engine/nn/module.h"

namespace nd::nn {

struct LayerNormOptions {
  LayerNormOptions(Shape normalized_shape) : normalized_shape_(std::move(normalized_shape)) {}
  ND_ARG(Shape, normalized_shape);
  ND_ARG(double, eps) = 1e-5;
  ND_ARG(bool, elementwise_affine) = true;
  ND_ARG(bool, bias) = true;
};

// Init: weight ones, bias zeros.
class LayerNormImpl : public Module {
 public:
  explicit LayerNormImpl(const LayerNormOptions& options);
  void reset_parameters();
  // input [*, normalized_shape...].
  Tensor forward(const Tensor& input) override;

  LayerNormOptions options;
  Tensor weight, bias;
};
ND_MODULE(LayerNorm);

}  // namespace nd::nn
