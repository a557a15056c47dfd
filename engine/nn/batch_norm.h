#pragma once
// nn::BatchNorm2d over nd::batch_norm. state_dict: weight, bias [C] (affine),
// running_mean, running_var [C] and num_batches_tracked (i64, 0-d) (track_running_stats).
// collectives/ swaps it for SyncBatchNorm. Tests: tests/nn/layers_test.cpp, golden_test.cpp.
#include <optional>

#include "engine/nn/init.h"
#include "engine/nn/module.h"

namespace nd::nn {

struct BatchNormOptions {
  BatchNormOptions(int64_t num_features) : num_features_(num_features) {}
  ND_ARG(int64_t, num_features);
  ND_ARG(double, eps) = 1e-5;
  // Running-stat update weight; nullopt = cumulative average (1 / num_batches_tracked).
  ND_ARG(std::optional<double>, momentum) = 0.1;
  ND_ARG(bool, affine) = true;
  ND_ARG(bool, track_running_stats) = true;
};
using BatchNorm2dOptions = BatchNormOptions;

// Init: weight ones, bias zeros, running_mean zeros, running_var ones, num_batches_tracked 0.
// training: batch statistics; with track_running_stats the running stats are updated
//   (bumping their versions) and num_batches_tracked is incremented.
// eval: running statistics (batch statistics when track_running_stats is false).
class BatchNorm2dImpl : public Module {
 public:
  explicit BatchNorm2dImpl(const BatchNormOptions& options);
  explicit BatchNorm2dImpl(int64_t num_features) : BatchNorm2dImpl(BatchNormOptions(num_features)) {}
  void reset_running_stats();
  void reset_parameters();
  // input [N, C, H, W].
  Tensor forward(const Tensor& input) override;

  BatchNormOptions options;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};
ND_MODULE(BatchNorm2d);

}  // namespace nd::nn
