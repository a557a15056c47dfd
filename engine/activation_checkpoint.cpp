// Activation checkpointing; see activation_checkpoint.h for what is kept and recomputed.
#include "engine/activation_checkpoint.h"

#include <string>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"

namespace nd {

namespace {

struct AutocastState {
  bool cpu = false, cuda = false;
  ScalarType cpu_dtype = kBFloat16, cuda_dtype = kBFloat16;
  static AutocastState current() {
    return {is_autocast_enabled(kCPU), is_autocast_enabled(kCUDA), autocast_dtype(kCPU), autocast_dtype(kCUDA)};
  }
};

class GradEnabledGuard {
 public:
  GradEnabledGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(true); }
  ~GradEnabledGuard() { GradMode::set_enabled(prev_); }
  GradEnabledGuard(const GradEnabledGuard&) = delete;
  GradEnabledGuard& operator=(const GradEnabledGuard&) = delete;

 private:
  bool prev_;
};

void check_outputs(const std::vector<Tensor>& outputs) {
  ND_CHECK(!outputs.empty(), "checkpoint: the function returned no tensors; expected at least one");
  for (size_t i = 0; i < outputs.size(); ++i)
    ND_CHECK(outputs[i].defined(), "checkpoint: output ", i, " of the function is an undefined tensor; expected ",
             "every output to be a defined tensor");
}

class CheckpointBackward : public autograd::Node {
 public:
  std::string name() const override { return "CheckpointBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  void release_saved_tensors() override {
    for (auto& s : inputs) s.reset();
  }

  CheckpointFunction fn;
  std::vector<autograd::SavedTensor> inputs;
  std::vector<bool> input_requires_grad;
  Generator rng;
  AutocastState autocast;
};

std::vector<Tensor> CheckpointBackward::apply(std::vector<Tensor>&& grads) {
  std::vector<Tensor> detached;
  std::vector<autograd::Edge> targets;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor t = inputs[i].unpack(*this);
    if (t.defined()) t = t.detach();
    if (input_requires_grad[i]) {
      t.requires_grad_(true);
      t.impl().marked_after_untracked = false;  // a leaf on purpose: no warning when fn returns it
    }
    targets.push_back(input_requires_grad[i] ? autograd::gradient_edge(t) : autograd::Edge{});
    detached.push_back(t);
  }
  for (size_t i = inputs.size(); i < next_edges.size(); ++i) targets.push_back(next_edges[i]);

  std::vector<Tensor> outputs;
  uint64_t first_recomputed;
  {
    GradEnabledGuard grad_on;
    AutocastGuard cpu(kCPU, autocast.cpu, autocast.cpu_dtype), cuda(kCUDA, autocast.cuda, autocast.cuda_dtype);
    Generator& gen = default_generator();
    const Generator now = gen;
    gen = rng;
    first_recomputed = autograd::detail::next_sequence_nr();
    try {
      outputs = fn(detached);
    } catch (...) {
      gen = now;
      throw;
    }
    gen = now;
  }
  ND_CHECK(outputs.size() == input_meta.size(), "checkpoint: the recomputation returned ", outputs.size(),
           " tensors; the forward returned ", input_meta.size());
  std::vector<Tensor> roots, root_grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    ND_CHECK(outputs[i].defined() && outputs[i].sizes() == input_meta[i].shape, "checkpoint: output ", i,
             " of the recomputation is ", outputs[i].defined() ? outputs[i].describe() : std::string("undefined"),
             "; the forward returned shape ", shape_str(input_meta[i].shape));
    if (!outputs[i].requires_grad()) continue;  // depends on nothing that requires grad
    roots.push_back(outputs[i]);
    root_grads.push_back(grads[i]);
  }
  if (roots.empty()) return std::vector<Tensor>(next_edges.size());
  return autograd::detail::grad_at_edges(roots, root_grads, targets, first_recomputed);
}

}  // namespace

std::vector<Tensor> checkpoint(CheckpointFunction fn, const std::vector<Tensor>& inputs) {
  ND_CHECK(static_cast<bool>(fn), "checkpoint: expected a function, found an empty std::function");
  if (!GradMode::is_enabled()) {
    std::vector<Tensor> outputs = fn(inputs);
    check_outputs(outputs);
    return outputs;
  }
  const Generator rng = default_generator();
  std::vector<Tensor> outputs, read;
  {
    NoGradGuard no_grad;
    autograd::detail::ReadCapture capture;
    outputs = fn(inputs);
    read = capture.tensors();
  }
  check_outputs(outputs);
  std::vector<Tensor> outside;  // what fn read that requires grad, other than its inputs
  for (const Tensor& t : read) {
    bool is_input = false;
    for (const Tensor& in : inputs) is_input |= in.defined() && in.impl_ptr() == t.impl_ptr();
    if (!is_input) outside.push_back(t);
  }
  bool needs_grad = !outside.empty();
  for (const Tensor& in : inputs) needs_grad |= in.defined() && in.requires_grad();
  if (!needs_grad) return outputs;

  auto node = std::make_shared<CheckpointBackward>();
  node->sequence_nr = autograd::detail::next_sequence_nr();
  for (const Tensor& in : inputs) {
    autograd::detail::connect(*node, {in});
    node->inputs.emplace_back(in);
    node->input_requires_grad.push_back(in.defined() && in.requires_grad());
  }
  for (const Tensor& t : outside) autograd::detail::connect(*node, {t});
  node->fn = std::move(fn);
  node->rng = rng;
  node->autocast = AutocastState::current();
  for (Tensor& out : outputs) out = out.detach();  // own TensorImpls: an output may be an input
  autograd::detail::set_history(node, outputs);
  return outputs;
}

}  // namespace nd
