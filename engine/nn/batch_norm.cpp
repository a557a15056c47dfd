#include "engine/nn/batch_norm.h"

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/batch_norm.h"

namespace nd::nn {

BatchNormBase::BatchNormBase(const std::string& type_name, const BatchNormOptions& options_)
    : Module(type_name), options(options_) {
  const auto& o = options;
  ND_CHECK(o.num_features() > 0, type_name, ": num_features must be positive, got ", o.num_features());
  ND_CHECK(o.eps() > 0, type_name, ": eps must be positive, got ", o.eps());
  ND_CHECK(!o.momentum() || (*o.momentum() >= 0 && *o.momentum() <= 1), type_name,
           ": momentum must be in [0, 1] (or nullopt for a cumulative average), got ", *o.momentum());
  if (o.affine()) {
    weight = register_parameter("weight", empty({o.num_features()}));
    bias = register_parameter("bias", empty({o.num_features()}));
  }
  if (o.track_running_stats()) {
    running_mean = register_buffer("running_mean", empty({o.num_features()}));
    running_var = register_buffer("running_var", empty({o.num_features()}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, kInt64));
  }
  reset_parameters();
}

BatchNormBase::BatchNormBase(const std::string& type_name, const BatchNormBase& other)
    : Module(type_name), options(other.options) {
  weight = register_parameter("weight", other.weight, other.weight.defined() && other.weight.requires_grad());
  bias = register_parameter("bias", other.bias, other.bias.defined() && other.bias.requires_grad());
  running_mean = register_buffer("running_mean", other.running_mean);
  running_var = register_buffer("running_var", other.running_var);
  num_batches_tracked = register_buffer("num_batches_tracked", other.num_batches_tracked);
  training_ = other.is_training();
}

void BatchNormBase::reset_running_stats() {
  if (!options.track_running_stats()) return;
  init::zeros_(running_mean);
  init::ones_(running_var);
  NoGradGuard no_grad;
  num_batches_tracked.zero_();
}

void BatchNormBase::reset_parameters() {
  reset_running_stats();
  if (options.affine()) {
    init::ones_(weight);
    init::zeros_(bias);
  }
}

double BatchNormBase::next_momentum() {
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats()) {
    NoGradGuard no_grad;
    if (options.momentum()) {
      // Counted where the buffer lives (one kernel, as PyTorch's add_(1)): a GPU's count is
      // not read back, which would make the host wait for the device at every BatchNorm.
      num_batches_tracked.add_(1);
    } else {
      // The cumulative average needs the count on the host (as in PyTorch).
      const int64_t batches = num_batches_tracked.item<int64_t>() + 1;
      num_batches_tracked.fill_(static_cast<double>(batches));
      factor = 1.0 / static_cast<double>(batches);
    }
  }
  return factor;
}

Tensor BatchNormBase::batch_norm_local(const Tensor& input, double momentum, BatchNormActivation activation) const {
  // Running stats go in whenever they exist: updated in training, used in eval.
  const bool track = options.track_running_stats();
  return batch_norm(input, track ? running_mean : Tensor(), track ? running_var : Tensor(), weight, bias,
                    /*training=*/is_training() || !track, momentum, options.eps(), activation);
}

Tensor BatchNorm2dImpl::forward(const Tensor& input) { return forward_activated(input, {}); }

Tensor BatchNorm2dImpl::forward_activated(const Tensor& input, BatchNormActivation activation) {
  ND_CHECK(input.dim() == 4, "BatchNorm2d: expected 4D input [N, C, H, W], got ", input.describe());
  ND_CHECK(input.size(1) == options.num_features(), "BatchNorm2d: expected ", options.num_features(),
           " channels (num_features), got input ", input.describe());
  return batch_norm_local(input, next_momentum(), activation);
}

}  // namespace nd::nn
