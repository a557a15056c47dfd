#pragma once
// Reverse-mode autograd over a dynamic graph.
//
// Why it looks like this: every differentiable op records one Node holding the
// tensors its backward formula needs (SavedTensor, which remembers the storage
// version at save time) and one Edge per input pointing at the input's own
// grad_fn (or, for a leaf, at its AccumulateGrad node). backward() walks the
// graph from the root in dependency order, so each node runs once with the sum
// of all gradients flowing into it. Saved tensors are released after a node
// runs unless retain_graph: that is what makes a second backward fail loudly
// instead of reading freed memory. SavedTensor holds a detached alias (same
// storage, same version counter, no grad_fn), so a node never owns its own
// output's history and the graph has no reference cycles.
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/anomaly_mode.h"
#include "engine/tensor.h"

namespace nd {

// Thread-local switch for graph recording (LibTorch: torch::NoGradGuard).
struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

namespace autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> fn;  // null: this input needs no gradient
  uint32_t input_nr = 0;     // which of fn's gradient inputs this edge feeds
};

// What a gradient arriving at a node input must look like.
struct InputMeta {
  Shape shape;
  ScalarType dtype = kFloat32;
  Device device;
};

class Node {
 public:
  virtual ~Node() = default;
  virtual std::string name() const = 0;
  // grads: one per forward output (input_meta), all defined (the engine fills
  // zeros where no gradient arrived). Returns one gradient per next_edge;
  // undefined where that input needs none.
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  // Optional, for a node with one next_edge whose gradient is mostly zeros (a slice's):
  // adds that gradient straight into `into` and returns true, where apply() would return
  // a new tensor that the engine then adds to `into`. `into` is the engine's accumulation
  // buffer for the edge: already holding a gradient, of the input's shape, seen by no one
  // else. false: the engine calls apply() as usual. grads as for apply().
  virtual bool apply_into(std::vector<Tensor>& grads, const Tensor& into) {
    (void)grads;
    (void)into;
    return false;
  }
  // Frees saved tensors (called after apply unless retain_graph).
  virtual void release_saved_tensors() {}

  std::vector<Edge> next_edges;
  std::vector<InputMeta> input_meta;
  uint64_t sequence_nr = 0;  // creation order; later nodes run first
  bool released = false;     // saved tensors were freed by an earlier backward
  // Non-leaf outputs that asked for retain_grad(): (output slot, tensor).
  std::vector<std::pair<uint32_t, std::weak_ptr<TensorImpl>>> retained_grads;
  // Set only when the node was recorded in anomaly mode (engine/anomaly_mode.h).
  std::unique_ptr<AnomalyMetadata> anomaly;
};

// A tensor saved for backward. Unpacking checks that it was not freed by an
// earlier backward and that no in-place op changed it since it was saved.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);  // t may be undefined (optional argument)
  Tensor unpack(const Node& owner) const;
  void reset() {
    data_ = Tensor();
    released_ = true;
  }

 private:
  Tensor data_;
  int64_t saved_version_ = 0;
  std::string description_;
  bool defined_ = false;
  bool released_ = false;
};

// Adds incoming gradients into a leaf's .grad, then runs its post-accumulate hooks.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> variable);
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  const std::shared_ptr<TensorImpl>& variable() const { return variable_; }

 private:
  std::shared_ptr<TensorImpl> variable_;
};

// True when grad mode is on and some defined input requires grad.
bool any_requires_grad(std::initializer_list<Tensor> inputs);
// The edge a gradient for `t` should flow along (its grad_fn or its AccumulateGrad).
Edge gradient_edge(const Tensor& t);

// How every op records itself. If grad mode is on and some input requires grad,
// creates NodeT, connects it to the inputs, lets `init` fill saved tensors and
// attributes, and makes `outputs` its results (requires_grad, grad_fn, output_nr).
// Otherwise marks outputs computed from grad-requiring inputs as untracked (for the
// story-3 warning). Returns the node or null.
template <class NodeT, class Init>
std::shared_ptr<NodeT> record(std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs,
                              Init&& init);
template <class NodeT>
std::shared_ptr<NodeT> record(std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs) {
  return record<NodeT>(inputs, outputs, [](NodeT&) {});
}

// Runs backward from `roots` (LibTorch: torch::autograd::backward).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots = {},
              bool retain_graph = false);
// Returns d(sum of outputs * grad_outputs)/d(inputs) without touching .grad
// (LibTorch: torch::autograd::grad). allow_unused=false throws for an input
// that the outputs do not depend on.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool allow_unused = false);

// Runs `callback` when the backward pass now running finishes, before backward()
// returns (DDP waits for its last all-reduces here). Only valid from inside a
// backward pass (a hook); throws nd::Error otherwise.
void queue_callback(std::function<void()> callback);

// Sums `grad` over broadcast dimensions so it has `shape` (backward of broadcasting).
Tensor sum_to(const Tensor& grad, const Shape& shape);

// ---- implementation of record() ----
namespace detail {
uint64_t next_sequence_nr();
void connect(Node& node, std::initializer_list<Tensor> inputs);
void set_history(const std::shared_ptr<Node>& node, std::initializer_list<Tensor> outputs);
void set_history(const std::shared_ptr<Node>& node, const std::vector<Tensor>& outputs);
void mark_untracked(std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs);
// Activation checkpointing's two hooks (engine/activation_checkpoint.cpp).
// While a ReadCapture lives on this thread, every tensor that requires grad and is read by
// an op that records nothing (grad mode off) is collected once, in first-read order:
// the tensors from outside a checkpointed function that its backward must reach.
class ReadCapture {
 public:
  ReadCapture();
  ~ReadCapture();
  ReadCapture(const ReadCapture&) = delete;
  ReadCapture& operator=(const ReadCapture&) = delete;
  const std::vector<Tensor>& tensors() const { return tensors_; }
  void add(const Tensor& t);

 private:
  ReadCapture* previous_;
  std::vector<Tensor> tensors_;
  std::unordered_set<const TensorImpl*> seen_;
};
// The gradients arriving at `targets` (undefined where none arrives or the edge is null)
// when root_grads flow back from roots, running only the nodes recorded at or after
// min_sequence_nr (a recomputation's graph): nodes of the graph before it and the leaves'
// AccumulateGrad are not run and no .grad is written. A node before min_sequence_nr that
// is not a target throws nd::Error naming it (the recomputation read a tensor that
// requires grad which the capture did not see). Frees the recomputed graph.
std::vector<Tensor> grad_at_edges(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads,
                                  const std::vector<Edge>& targets, uint64_t min_sequence_nr);
// Anomaly mode (engine/anomaly_mode.cpp): fills node.anomaly when an op is recorded; runs
// a node, adding its forward call site to an nd::Error it throws; throws when a gradient
// it returned holds NaN or inf, naming the first non-finite forward output in `graph`.
void record_anomaly_metadata(Node& node, std::span<const Tensor> outputs);
void run_with_call_site(const Node& node, const std::function<void()>& run);
void check_gradients(const Node& node, const std::vector<Tensor>& grads, const std::unordered_set<Node*>& graph);
}  // namespace detail

template <class NodeT, class Init>
std::shared_ptr<NodeT> record(std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs,
                              Init&& init) {
  if (!any_requires_grad(inputs)) {
    detail::mark_untracked(inputs, outputs);
    return nullptr;
  }
  auto node = std::make_shared<NodeT>();
  node->sequence_nr = detail::next_sequence_nr();
  detail::connect(*node, inputs);
  init(*node);
  detail::set_history(node, outputs);
  return node;
}

}  // namespace autograd
}  // namespace nd
