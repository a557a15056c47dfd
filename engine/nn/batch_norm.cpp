#include "engine/nn/batch_norm.h"

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/batch_norm.h"

namespace nd::nn {

BatchNorm2dImpl::BatchNorm2dImpl(const BatchNormOptions& options_) : Module("BatchNorm2d"), options(options_) {
  const auto& o = options;
  ND_CHECK(o.num_features() > 0, "BatchNorm2d: num_features must be positive, got ", o.num_features());
  ND_CHECK(o.eps() > 0, "BatchNorm2d: eps must be positive, got ", o.eps());
  ND_CHECK(!o.momentum() || (*o.momentum() >= 0 && *o.momentum() <= 1),
           "BatchNorm2d: momentum must be in [0, 1] (or nullopt for a cumulative average), got ", *o.momentum());
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

void BatchNorm2dImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  init::zeros_(running_mean);
  init::ones_(running_var);
  NoGradGuard no_grad;
  num_batches_tracked.zero_();
}

void BatchNorm2dImpl::reset_parameters() {
  reset_running_stats();
  if (options.affine()) {
    init::ones_(weight);
    init::zeros_(bias);
  }
}

Tensor BatchNorm2dImpl::forward(const Tensor& input) {
  ND_CHECK(input.dim() == 4, "BatchNorm2d: expected 4D input [N, C, H, W], got ", input.describe());
  ND_CHECK(input.size(1) == options.num_features(), "BatchNorm2d: expected ", options.num_features(),
           " channels (num_features), got input ", input.describe());
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats()) {
    NoGradGuard no_grad;
    // i64 arithmetic is not an op here: read, bump, write back (one version bump).
    const int64_t batches = num_batches_tracked.item<int64_t>() + 1;
    num_batches_tracked.fill_(static_cast<double>(batches));
    if (!options.momentum()) factor = 1.0 / static_cast<double>(batches);
  }
  // Batch statistics in training, or in eval when there are no running ones.
  const bool use_batch_stats = is_training() || !options.track_running_stats();
  const bool update_running = is_training() && options.track_running_stats();
  const bool pass_running = update_running || !use_batch_stats;
  return batch_norm(input, pass_running ? running_mean : Tensor(), pass_running ? running_var : Tensor(), weight, bias,
                    use_batch_stats, factor, options.eps());
}

}  // namespace nd::nn
