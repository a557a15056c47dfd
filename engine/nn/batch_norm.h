#pragma once
// nn::BatchNorm2d over nd::batch_norm. state_dict: weight, bias [C] (affine),
// running_mean, running_var [C] and num_batches_tracked (i64, 0-d) (track_running_stats).
// collectives/ swaps it for SyncBatchNorm. Tests: tests/nn/layers_test.cpp, golden_test.cpp.
#include <optional>
#include <string>

#include "engine/nn/init.h"
#include "engine/nn/module.h"
#include "engine/ops/batch_norm.h"

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

// What BatchNorm2d and SyncBatchNorm share (PyTorch's _NormBase): the options, the
// parameters and buffers they ask for, resetting them, and a training step's running-stat
// bookkeeping. Init: weight ones, bias zeros, running_mean zeros, running_var ones,
// num_batches_tracked 0.
class BatchNormBase : public Module {
 public:
  void reset_running_stats();
  void reset_parameters();

  BatchNormOptions options;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 protected:
  // Checks the options (errors name `type_name`) and registers weight and bias (affine)
  // and the running statistics (track_running_stats), initialised.
  BatchNormBase(const std::string& type_name, const BatchNormOptions& options);
  // Registers `other`'s tensors themselves (the same handles, so optimizers and names stay
  // valid) and takes over its options and training flag.
  BatchNormBase(const std::string& type_name, const BatchNormBase& other);
  // In training with track_running_stats: num_batches_tracked += 1 (one version bump).
  // Returns the running-stat update weight: momentum, or 1 / num_batches_tracked when
  // momentum is nullopt (a cumulative average).
  double next_momentum();
  // nd::batch_norm on this rank's input: batch statistics in training (updating the
  // running ones when tracked) and in eval without running ones; else the running ones.
  Tensor batch_norm_local(const Tensor& input, double momentum, BatchNormActivation activation = {}) const;
};

// training: batch statistics; with track_running_stats the running stats are updated
//   (bumping their versions) and num_batches_tracked is incremented.
// eval: running statistics (batch statistics when track_running_stats is false).
class BatchNorm2dImpl : public BatchNormBase {
 public:
  explicit BatchNorm2dImpl(const BatchNormOptions& options) : BatchNormBase("BatchNorm2d", options) {}
  explicit BatchNorm2dImpl(int64_t num_features) : BatchNorm2dImpl(BatchNormOptions(num_features)) {}
  // input [N, C, H, W].
  Tensor forward(const Tensor& input) override;
  // forward, then `activation` (ReLU, LeakyReLU) in the same pass: equal bit for bit to the
  // activation module applied to forward's result, one launch fewer each way on CUDA.
  // Sequential runs a BatchNorm2d followed by ReLU or LeakyReLU (slope >= 0) so.
  Tensor forward_activated(const Tensor& input, BatchNormActivation activation);
};
ND_MODULE(BatchNorm2d);

}  // namespace nd::nn
