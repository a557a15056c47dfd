#include "engine/nn/activation.h"

#include "engine/error.h"
#include "engine/ops/elementwise.h"

namespace nd::nn {

Tensor ReLUImpl::forward(const Tensor& input) { return relu(input); }
Tensor LeakyReLUImpl::forward(const Tensor& input) { return leaky_relu(input, options.negative_slope()); }
Tensor TanhImpl::forward(const Tensor& input) { return tanh(input); }
Tensor SigmoidImpl::forward(const Tensor& input) { return sigmoid(input); }

GELUImpl::GELUImpl(const GELUOptions& options_) : Module("GELU"), options(options_) {
  ND_CHECK(options.approximate() == "none" || options.approximate() == "tanh",
           "GELU: approximate must be \"none\" or \"tanh\", got \"", options.approximate(), "\"");
}
Tensor GELUImpl::forward(const Tensor& input) { return gelu(input, options.approximate()); }

Tensor FlattenImpl::forward(const Tensor& input) { return input.flatten(options.start_dim(), options.end_dim()); }

}  // namespace nd::nn
