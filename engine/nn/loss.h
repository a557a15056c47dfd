#pragma once
// Losses as modules: MSELoss, BCEWithLogitsLoss, CrossEntropyLoss, over the functional
// losses of engine/ops/loss.h; forward(input, target). Class weights are buffers named
// "weight" / "pos_weight" (absent when not given), as in PyTorch. Tests: tests/nn/layers_test.cpp.
#include "engine/nn/init.h"
#include "engine/nn/module.h"
#include "engine/ops/loss.h"

namespace nd::nn {

struct MSELossOptions {
  MSELossOptions(Reduction reduction = Reduction::Mean) : reduction_(reduction) {}
  ND_ARG(Reduction, reduction);
};
class MSELossImpl : public Module {
 public:
  explicit MSELossImpl(const MSELossOptions& options = {}) : Module("MSELoss"), options(options) {}
  using Module::forward;
  Tensor forward(const Tensor& input, const Tensor& target);
  MSELossOptions options;
};
ND_MODULE(MSELoss);

struct BCEWithLogitsLossOptions {
  BCEWithLogitsLossOptions() = default;
  ND_ARG(Tensor, weight);
  ND_ARG(Tensor, pos_weight);
  ND_ARG(Reduction, reduction) = Reduction::Mean;
};
class BCEWithLogitsLossImpl : public Module {
 public:
  explicit BCEWithLogitsLossImpl(const BCEWithLogitsLossOptions& options = {});
  using Module::forward;
  Tensor forward(const Tensor& input, const Tensor& target);
  BCEWithLogitsLossOptions options;
  Tensor weight, pos_weight;
};
ND_MODULE(BCEWithLogitsLoss);

struct CrossEntropyLossOptions {
  CrossEntropyLossOptions() = default;
  ND_ARG(Tensor, weight);
  ND_ARG(int64_t, ignore_index) = -100;
  ND_ARG(Reduction, reduction) = Reduction::Mean;
  ND_ARG(double, label_smoothing) = 0.0;
};
class CrossEntropyLossImpl : public Module {
 public:
  explicit CrossEntropyLossImpl(const CrossEntropyLossOptions& options = {});
  using Module::forward;
  // input [N, C] (or [C], [N, C, d...]) logits; target int64 class indices, or class
  // probabilities of input's shape and dtype (soft labels), as nd::cross_entropy.
  Tensor forward(const Tensor& input, const Tensor& target);
  CrossEntropyLossOptions options;
  Tensor weight;
};
ND_MODULE(CrossEntropyLoss);

}  // namespace nd::nn
