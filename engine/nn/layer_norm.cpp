#include "engine/nn/layer_norm.h"

#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/layer_norm.h"

namespace nd::nn {

LayerNormImpl::LayerNormImpl(const LayerNormOptions& options_) : Module("LayerNorm"), options(options_) {
  const Shape& shape = options.normalized_shape();
  ND_CHECK(!shape.empty(), "LayerNorm: normalized_shape must have at least one dimension, got []");
  for (int64_t d : shape)
    ND_CHECK(d > 0, "LayerNorm: normalized_shape must be positive, got ", shape_str(shape));
  ND_CHECK(options.eps() > 0, "LayerNorm: eps must be positive, got ", options.eps());
  if (options.elementwise_affine()) {
    weight = register_parameter("weight", empty(shape));
    if (options.bias()) bias = register_parameter("bias", empty(shape));
  }
  reset_parameters();
}

void LayerNormImpl::reset_parameters() {
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

Tensor LayerNormImpl::forward(const Tensor& input) {
  return layer_norm(input, options.normalized_shape(), weight, bias, options.eps());
}

}  // namespace nd::nn
