#include "engine/nn/linear.h"

#include <cmath>

#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/matmul.h"

namespace nd::nn {

Tensor functional::linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  ND_CHECK(weight.dim() == 2, "linear: expected weight [out_features, in_features], found ", weight.describe());
  ND_CHECK(input.dim() >= 1 && input.size(-1) == weight.size(1), "linear: input ", input.describe(),
           " does not end in in_features=", weight.size(1), " (weight ", weight.describe(), ")");
  // Fold the leading dims into one GEMM: [M, in] x [in, out], accumulated onto the bias.
  Shape out_shape = input.sizes();
  out_shape.back() = weight.size(0);
  const Tensor rows = input.reshape({-1, weight.size(1)});
  if (bias.defined()) {
    ND_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear: expected bias [out_features=",
             weight.size(0), "], found ", bias.describe());
    return addmm(bias, rows, weight.t()).reshape(out_shape);
  }
  return mm(rows, weight.t()).reshape(out_shape);
}

LinearImpl::LinearImpl(const LinearOptions& options_) : Module("Linear"), options(options_) {
  ND_CHECK(options.in_features() >= 0, "Linear: in_features must be non-negative, got ", options.in_features());
  ND_CHECK(options.out_features() >= 0, "Linear: out_features must be non-negative, got ", options.out_features());
  weight = register_parameter("weight", empty({options.out_features(), options.in_features()}));
  if (options.bias()) bias = register_parameter("bias", empty({options.out_features()}));
  reset_parameters();
}

void LinearImpl::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    auto [fan_in, fan_out] = init::calculate_fan_in_and_fan_out(weight);
    const double bound = fan_in > 0 ? 1 / std::sqrt(static_cast<double>(fan_in)) : 0;
    init::uniform_(bias, -bound, bound);
  }
}

Tensor LinearImpl::forward(const Tensor& input) { return functional::linear(input, weight, bias); }

}  // namespace nd::nn
