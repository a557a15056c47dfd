#include "engine/nn/loss.h"

#include "engine/error.h"

namespace nd::nn {

Tensor MSELossImpl::forward(const Tensor& input, const Tensor& target) {
  return mse_loss(input, target, options.reduction());
}

BCEWithLogitsLossImpl::BCEWithLogitsLossImpl(const BCEWithLogitsLossOptions& options_)
    : Module("BCEWithLogitsLoss"), options(options_) {
  weight = register_buffer("weight", options.weight());
  pos_weight = register_buffer("pos_weight", options.pos_weight());
}

Tensor BCEWithLogitsLossImpl::forward(const Tensor& input, const Tensor& target) {
  return binary_cross_entropy_with_logits(input, target, weight, pos_weight, options.reduction());
}

CrossEntropyLossImpl::CrossEntropyLossImpl(const CrossEntropyLossOptions& options_)
    : Module("CrossEntropyLoss"), options(options_) {
  ND_CHECK(options.label_smoothing() >= 0 && options.label_smoothing() <= 1,
           "CrossEntropyLoss: label_smoothing must be in [0, 1], got ", options.label_smoothing());
  if (options.weight().defined())
    ND_CHECK(options.weight().dim() == 1, "CrossEntropyLoss: weight must be 1-D [C], got ",
             options.weight().describe());
  weight = register_buffer("weight", options.weight());
}

Tensor CrossEntropyLossImpl::forward(const Tensor& input, const Tensor& target) {
  return cross_entropy(input, target, weight, options.reduction(), options.ignore_index(), options.label_smoothing());
}

}  // namespace nd::nn
