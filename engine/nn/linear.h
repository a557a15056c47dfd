#pragma once
// nn::Linear (y = x W^T + b) and the functional linear it runs on.
// state_dict: weight [out_features, in_features], bias [out_features].
// Tests: tests/nn/layers_test.cpp, tests/nn/golden_test.cpp.
#include "engine/nn/init.h"
#include "engine/nn/module.h"

namespace nd::nn {

namespace functional {
// input [*, in], weight [out, in], bias [out] or undefined -> [*, out].
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = {});
}  // namespace functional

struct LinearOptions {
  LinearOptions(int64_t in_features, int64_t out_features) : in_features_(in_features), out_features_(out_features) {}
  ND_ARG(int64_t, in_features);
  ND_ARG(int64_t, out_features);
  ND_ARG(bool, bias) = true;
};

// Init (PyTorch): weight kaiming_uniform_(a = sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in));
// bias U(-1/sqrt(in), 1/sqrt(in)).
class LinearImpl : public Module {
 public:
  explicit LinearImpl(const LinearOptions& options);
  LinearImpl(int64_t in_features, int64_t out_features) : LinearImpl(LinearOptions(in_features, out_features)) {}
  void reset_parameters();
  Tensor forward(const Tensor& input) override;

  LinearOptions options;
  Tensor weight, bias;
};
ND_MODULE(Linear);

}  // namespace nd::nn
