#pragma once
// Activations as modules, for Sequential: ReLU, LeakyReLU, Tanh, Sigmoid, GELU, Flatten.
// No parameters or buffers (so they leave gaps in a Sequential's state_dict numbering,
// as in PyTorch). Tests: tests/nn/layers_test.cpp.
#include <string>

#include "engine/nn/init.h"
#include "engine/nn/module.h"

namespace nd::nn {

class ReLUImpl : public Module {
 public:
  ReLUImpl() : Module("ReLU") {}
  Tensor forward(const Tensor& input) override;
};
ND_MODULE(ReLU);

struct LeakyReLUOptions {
  LeakyReLUOptions() = default;
  ND_ARG(double, negative_slope) = 0.01;
};
class LeakyReLUImpl : public Module {
 public:
  explicit LeakyReLUImpl(const LeakyReLUOptions& options = {}) : Module("LeakyReLU"), options(options) {}
  Tensor forward(const Tensor& input) override;
  LeakyReLUOptions options;
};
ND_MODULE(LeakyReLU);

class TanhImpl : public Module {
 public:
  TanhImpl() : Module("Tanh") {}
  Tensor forward(const Tensor& input) override;
};
ND_MODULE(Tanh);

class SigmoidImpl : public Module {
 public:
  SigmoidImpl() : Module("Sigmoid") {}
  Tensor forward(const Tensor& input) override;
};
ND_MODULE(Sigmoid);

struct GELUOptions {
  GELUOptions() = default;
  // "none" (exact, erf) or "tanh".
  ND_ARG(std::string, approximate) = "none";
};
class GELUImpl : public Module {
 public:
  explicit GELUImpl(const GELUOptions& options = {});
  Tensor forward(const Tensor& input) override;
  GELUOptions options;
};
ND_MODULE(GELU);

struct FlattenOptions {
  FlattenOptions() = default;
  ND_ARG(int64_t, start_dim) = 1;
  ND_ARG(int64_t, end_dim) = -1;
};
// input.flatten(start_dim, end_dim); the default keeps the batch dim: [N, C, H, W] -> [N, C*H*W].
class FlattenImpl : public Module {
 public:
  explicit FlattenImpl(const FlattenOptions& options = {}) : Module("Flatten"), options(options) {}
  Tensor forward(const Tensor& input) override;
  FlattenOptions options;
};
ND_MODULE(Flatten);

}  // namespace nd::nn
