#pragma once
// nn::Dropout over nd::dropout: zeroes elements with probability p in training and
// scales the rest by 1 / (1 - p); the identity in eval. No state. Tests: tests/nn/layers_test.cpp.
#include "engine/nn/init.h"
#include "engine/nn/module.h"

namespace nd::nn {

struct DropoutOptions {
  DropoutOptions(double p = 0.5) : p_(p) {}
  ND_ARG(double, p);
};

class DropoutImpl : public Module {
 public:
  explicit DropoutImpl(const DropoutOptions& options = {});
  explicit DropoutImpl(double p) : DropoutImpl(DropoutOptions(p)) {}
  Tensor forward(const Tensor& input) override;

  DropoutOptions options;
};
ND_MODULE(Dropout);

}  // namespace nd::nn
