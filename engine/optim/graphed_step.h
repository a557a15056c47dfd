#pragma once
// A user's training step captured once as a CUDA graph after eager warm-up calls, then
// replayed on every call (PyTorch's make_graphed_callables for a whole step, the pattern of
// docs/cuda_graphs.md in one object):
//
//   nd::cuda::GraphedStep step([&](const std::vector<nd::Tensor>& in) {
//     optimizer.zero_grad();
//     nd::Tensor loss = nd::mse_loss(model->forward(in[0]), in[1]);
//     loss.backward();
//     optimizer.step();
//     return std::vector<nd::Tensor>{loss};
//   }, {&optimizer});
//   for (auto& [x, y] : batches) nd::Tensor loss = step({x, y})[0];
//
// Each call copies its inputs into the step's static inputs (made on the first call, on the
// inputs' CUDA device), runs the step eagerly for the first `warmup` calls, captures it on the
// next (then replays it once, so that call also steps) and replays it from then on. The
// returned outputs of a replayed call are the captured step's own tensors, rewritten by every
// replay: copy them to keep a value.
//
// A replay repeats the captured kernels on the captured addresses with the captured values,
// so every call first checks what the capture fixed, and throws an nd::Error naming what
// changed, expected and found, before anything runs: an input's shape, dtype or device, the
// number of inputs, each optimizer's parameters (their number, shapes, dtypes, memory and
// requires_grad), its groups' hyperparameters (lr and the others travel by value with the
// launches) and its state (a load_state_dict after the capture).
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/optim/optimizer.h"
#include "engine/tensor.h"

namespace nd::cuda {

class GraphedStep {
 public:
  using Step = std::function<std::vector<Tensor>(const std::vector<Tensor>& static_inputs)>;

  // An nd::Error for warmup < 1 (the warm-up creates the optimizers' state and uploads their
  // chunk tables, which the capture reads) or a null optimizer.
  GraphedStep(Step step, std::vector<optim::Optimizer*> optimizers, int warmup = 2);

  // requires: CUDA tensors on one device; after the first call, inputs of the first call's
  // shapes, dtypes and device (else an nd::Error naming the input).
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs);

  bool captured() const { return graph_ != nullptr; }
  int64_t num_nodes() const;  // the captured kernels, copies and memsets; 0 before the capture

 private:
  // What a replay relies on in one optimizer.
  struct OptimizerRecord {
    std::vector<Tensor> params;  // every group's, in order
    std::vector<void*> data;     // each parameter's memory at the capture
    std::vector<bool> requires_grad;
    int64_t state_generation = 0;
    std::vector<std::map<std::string, double>> options;  // each group's
  };
  static OptimizerRecord record(const optim::Optimizer& optimizer);
  void check_inputs(const std::vector<Tensor>& inputs) const;
  void check_optimizers() const;

  Step step_;
  std::vector<optim::Optimizer*> optimizers_;
  int warmup_, calls_ = 0;
  std::vector<Tensor> static_inputs_, outputs_;
  std::vector<OptimizerRecord> records_;
  std::unique_ptr<Graph> graph_;
};

}  // namespace nd::cuda
