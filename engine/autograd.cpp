#include "engine/autograd.h"

#include <limits>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "engine/error.h"
#include "engine/factories.h"

namespace nd {

namespace {
thread_local bool t_grad_enabled = true;
}
bool GradMode::is_enabled() { return t_grad_enabled; }
void GradMode::set_enabled(bool enabled) { t_grad_enabled = enabled; }

namespace autograd {

// ---- SavedTensor ----
SavedTensor::SavedTensor(const Tensor& t) : defined_(t.defined()) {
  if (!defined_) return;
  data_ = t.detach();
  saved_version_ = t._version();
  description_ = t.describe();
}

Tensor SavedTensor::unpack(const Node& owner) const {
  if (released_) {
    throw Error("Trying to backward through the graph a second time (or directly access saved tensors after "
                "they have already been freed). Saved intermediate values of the graph are freed when you "
                "call backward() or autograd::grad(). Specify retain_graph=true if you need to backward "
                "through the graph a second time or if you need to access saved tensors after calling "
                "backward. (Node " + owner.name() + " had its saved tensors freed by an earlier backward.)");
  }
  if (!defined_) return Tensor();
  const int64_t now = data_._version();
  if (now != saved_version_) {
    const std::string& by = data_.storage()->last_modified_by();
    throw Error("one of the variables needed for gradient computation has been modified by an inplace "
                "operation: " + description_ + ", saved by " + owner.name() + ", is at version " +
                std::to_string(now) + "; expected version " + std::to_string(saved_version_) +
                " instead. It was last modified by " + (by.empty() ? std::string("an in-place op") : by) +
                ". Hint: the tensor was changed in place after the forward pass that saved it (for example "
                "an optimizer step between that forward and this backward). Recompute the forward after "
                "the step, or run every backward before stepping any optimizer.");
  }
  return data_;
}

// ---- AccumulateGrad ----
AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> variable) : variable_(std::move(variable)) {
  sequence_nr = std::numeric_limits<uint64_t>::max();  // leaves accumulate as soon as they are ready
  input_meta.push_back({variable_->shape, variable_->dtype, variable_->storage->device()});
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor var(variable_);
  Tensor& g = grads[0];
  if (!variable_->grad) {
    // Steal the incoming buffer when nobody else can see it; otherwise copy.
    const bool sole_owner = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous();
    variable_->grad = (sole_owner ? g : g.clone()).impl_ptr();
  } else {
    Tensor(variable_->grad).add_(g);
  }
  for (auto& hook : variable_->post_accumulate_grad_hooks) hook(var);
  return {};
}

// ---- recording ----
bool any_requires_grad(std::initializer_list<Tensor> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  TensorImpl& im = t.impl();
  if (im.grad_fn) return {im.grad_fn, im.output_nr};
  if (!im.requires_grad) return {};
  std::shared_ptr<Node> acc = im.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    im.grad_accumulator = acc;
  }
  return {acc, 0};
}

namespace detail {
uint64_t next_sequence_nr() {
  static thread_local uint64_t counter = 0;
  return counter++;
}

void connect(Node& node, std::initializer_list<Tensor> inputs) {
  const bool anomaly = is_anomaly_enabled();
  if (anomaly && !node.anomaly) node.anomaly = std::make_unique<AnomalyMetadata>();
  for (const Tensor& t : inputs) {
    const bool tracked = t.defined() && t.requires_grad();
    if (tracked) t.impl().last_read_untracked = false;
    node.next_edges.push_back(tracked ? gradient_edge(t) : Edge{});
    if (anomaly) node.anomaly->inputs.push_back(t.defined() ? t.describe() : "(none)");
  }
}

namespace {
thread_local ReadCapture* t_read_capture = nullptr;

void set_history_of(const std::shared_ptr<Node>& node, std::span<const Tensor> outputs) {
  uint32_t i = 0;
  for (const Tensor& out : outputs) {
    TensorImpl& im = out.impl();
    im.grad_fn = node;
    im.output_nr = i++;
    im.requires_grad = true;
    node->input_meta.push_back({im.shape, im.dtype, im.storage->device()});
  }
  if (is_anomaly_enabled()) record_anomaly_metadata(*node, outputs);
}
}  // namespace

void set_history(const std::shared_ptr<Node>& node, std::initializer_list<Tensor> outputs) {
  set_history_of(node, std::span<const Tensor>(outputs.begin(), outputs.size()));
}
void set_history(const std::shared_ptr<Node>& node, const std::vector<Tensor>& outputs) {
  set_history_of(node, outputs);
}

ReadCapture::ReadCapture() : previous_(t_read_capture) { t_read_capture = this; }
ReadCapture::~ReadCapture() { t_read_capture = previous_; }
void ReadCapture::add(const Tensor& t) {
  if (seen_.insert(&t.impl()).second) tensors_.push_back(t);
}

void mark_untracked(std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs) {
  // A leaf that requires grad read under no-grad (a module's forward under NoGradGuard) gets
  // no gradient from that use: Tensor::grad() says so if its .grad is then missing. Being
  // written in place (an optimizer step, after its reads) is not such a read.
  if (!GradMode::is_enabled()) {
    if (t_read_capture)
      for (const Tensor& t : inputs)
        if (t.defined() && t.requires_grad()) t_read_capture->add(t);
    for (const Tensor& t : inputs) {
      if (!t.defined() || !t.requires_grad() || !t.is_leaf()) continue;
      bool written = false;
      for (const Tensor& out : outputs) written |= out.defined() && out.impl_ptr() == t.impl_ptr();
      t.impl().last_read_untracked = !written;
    }
  }
  bool from_graph = false;
  for (const Tensor& t : inputs)
    if (t.defined() && (t.requires_grad() || t.impl().produced_untracked)) from_graph = true;
  if (!from_graph) return;
  for (const Tensor& out : outputs) {
    bool is_input = false;
    for (const Tensor& t : inputs) is_input |= t.impl_ptr() == out.impl_ptr();
    if (!is_input && !out.requires_grad()) out.impl().produced_untracked = true;
  }
}
}  // namespace detail

// ---- the engine ----
namespace {

thread_local std::vector<std::function<void()>>* t_callbacks = nullptr;

struct ReadyOrder {  // higher sequence_nr first: reverse creation order
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

void accumulate(std::vector<Tensor>& buffer, uint32_t slot, const Tensor& g) {
  if (!buffer[slot].defined())
    buffer[slot] = g;
  else
    buffer[slot] = buffer[slot] + g;  // out of place: g may be shared with another edge
}

struct Capture {
  Node* node;
  uint32_t input_nr;
  size_t result_index;
};

// Runs the graph below `root_edges`. With captures (autograd::grad), gradients
// arriving at the captured node inputs are returned and no .grad is touched.
// With min_sequence_nr (captures only), nodes recorded before it are captured, not run.
void run_backward(const std::vector<Edge>& root_edges, const std::vector<Tensor>& root_grads, bool retain_graph,
                  const std::vector<Capture>* captures, std::vector<Tensor>* captured,
                  uint64_t min_sequence_nr = 0) {
  NoGradGuard no_grad;
  std::vector<std::function<void()>> callbacks;
  auto* outer_callbacks = t_callbacks;  // a backward started from a hook has its own list
  t_callbacks = &callbacks;
  struct Restore {
    std::vector<std::function<void()>>* saved;
    ~Restore() { t_callbacks = saved; }
  } restore{outer_callbacks};
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;

  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const Edge& e : root_edges) {
    if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    keep_alive[e.fn.get()] = e.fn;
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (n->sequence_nr < min_sequence_nr) continue;  // outside the recomputed graph
    for (const Edge& e : n->next_edges) {
      if (!e.fn) continue;
      ++deps[e.fn.get()];
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }

  for (size_t i = 0; i < root_edges.size(); ++i) {
    Node* n = root_edges[i].fn.get();
    auto& buf = buffers[n];
    buf.resize(n->input_meta.size());
    accumulate(buf, root_edges[i].input_nr, root_grads[i]);
  }
  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready;
  const bool anomaly = is_anomaly_enabled();  // read once: the whole pass checks or none of it
  for (auto& [n, buf] : buffers)
    if (deps[n] == 0) ready.push(n);

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> inputs = std::move(buffers[node]);
    buffers.erase(node);
    inputs.resize(node->input_meta.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].defined()) {
        const InputMeta& m = node->input_meta[i];
        inputs[i] = zeros(m.shape, TensorOptions(m.dtype).device(m.device));
      }
    }
    bool is_accumulate = dynamic_cast<AccumulateGrad*>(node) != nullptr;
    if (captures) {
      bool target = false;
      for (const Capture& c : *captures) {
        if (c.node != node) continue;
        (*captured)[c.result_index] = inputs[c.input_nr];
        target = true;
      }
      const bool outside = min_sequence_nr > 0 && node->sequence_nr < min_sequence_nr;
      ND_CHECK(!(outside || (min_sequence_nr > 0 && is_accumulate)) || target, "checkpoint: the recomputation "
               "reached ", node->name(), ", a tensor that requires grad which the forward under checkpoint did not "
               "read: the checkpointed function must read the same tensors every time it runs");
      if (is_accumulate || outside) continue;  // autograd::grad never writes .grad
    }
    for (auto& [nr, weak] : node->retained_grads) {
      if (auto im = weak.lock()) {
        Tensor g = inputs[nr];
        im->grad = (im->grad ? Tensor(im->grad) + g : g.clone()).impl_ptr();
      }
    }
    // A gradient that would only be added to a buffer that the engine holds alone (a
    // slice's, after an earlier one of the same tensor) is added there in place.
    Tensor* into = nullptr;
    if (!is_accumulate && node->next_edges.size() == 1 && node->next_edges[0].fn) {
      auto it = buffers.find(node->next_edges[0].fn.get());
      if (it != buffers.end()) {
        Tensor& b = it->second[node->next_edges[0].input_nr];
        if (b.defined() && b.impl_ptr().use_count() == 1 && b.storage().use_count() == 1 &&
            b.dtype() == inputs[0].dtype() && b.device() == inputs[0].device())
          into = &b;
      }
    }
    std::vector<Tensor> outputs;
    bool added_into = false;
    auto run_node = [&] {
      added_into = into && node->apply_into(inputs, *into);
      if (!added_into) outputs = node->apply(std::move(inputs));
    };
    if (!anomaly) {
      run_node();
    } else {
      detail::run_with_call_site(*node, run_node);
      detail::check_gradients(*node, added_into ? std::vector<Tensor>{*into} : outputs, seen);
    }
    if (!retain_graph) {
      node->release_saved_tensors();
      node->released = true;
    }
    ND_CHECK(is_accumulate || added_into || outputs.size() == node->next_edges.size(), "internal error: ", node->name(),
             " returned ", outputs.size(), " gradients for ", node->next_edges.size(), " inputs");
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.fn) continue;
      Node* next = e.fn.get();
      if (i < outputs.size() && outputs[i].defined()) {
        const InputMeta& m = next->input_meta[e.input_nr];
        ND_CHECK(outputs[i].sizes() == m.shape, "internal error: ", node->name(), " produced a gradient of shape ",
                 shape_str(outputs[i].sizes()), " for input ", i, " but ", next->name(), " expects ",
                 shape_str(m.shape));
        auto& buf = buffers[next];
        buf.resize(next->input_meta.size());
        accumulate(buf, e.input_nr, outputs[i]);
      }
      keep_alive[next] = e.fn;
      if (--deps[next] == 0) ready.push(next);
    }
  }
  for (size_t i = 0; i < callbacks.size(); ++i) {
    auto callback = std::move(callbacks[i]);  // it may queue more, growing the vector
    callback();
  }
}

std::vector<Edge> root_edges_of(const std::vector<Tensor>& roots, std::vector<Tensor>& grads) {
  std::vector<Edge> edges;
  grads.resize(roots.size());
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    if (!r.requires_grad()) {
      std::string why = r.impl().produced_untracked
                            ? " It was produced under NoGradGuard or by detach(), so no graph was recorded: "
                              "compute it with grad mode on."
                            : " Nothing it was computed from requires grad: call requires_grad_(true) on the "
                              "inputs or parameters you want gradients for.";
      throw Error("element " + std::to_string(i) + " of tensors does not require grad and does not have a "
                  "grad_fn (" + r.describe() + ")." + why);
    }
    if (r.is_leaf() && r.impl().marked_after_untracked) {
      warn("backward() from " + r.describe() + ", a tensor that was computed under NoGradGuard (or by detach()) "
           "and then given requires_grad_(true): it is a leaf, so backward reaches no parameter and no "
           "parameter will receive a gradient. Compute the loss with grad mode on instead.");
    }
    if (!grads[i].defined()) {
      ND_CHECK(r.numel() == 1, "grad can be implicitly created only for scalar outputs; ", r.describe(),
               " has ", r.numel(), " elements: pass a gradient of the same shape");
      grads[i] = ones(r.sizes(), r.options());
    } else {
      ND_CHECK(grads[i].sizes() == r.sizes(), "backward: gradient for ", r.describe(),
               " has shape ", shape_str(grads[i].sizes()), "; expected ", shape_str(r.sizes()));
    }
    edges.push_back(gradient_edge(r));
  }
  return edges;
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, bool retain_graph) {
  ND_CHECK(grad_roots.empty() || grad_roots.size() == roots.size(), "backward: got ", grad_roots.size(),
           " gradients for ", roots.size(), " tensors");
  std::vector<Tensor> grads = grad_roots;
  std::vector<Edge> edges = root_edges_of(roots, grads);
  run_backward(edges, grads, retain_graph, nullptr, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph, bool allow_unused) {
  ND_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), "autograd::grad: got ",
           grad_outputs.size(), " grad_outputs for ", outputs.size(), " outputs");
  std::vector<Tensor> grads = grad_outputs;
  std::vector<Edge> edges = root_edges_of(outputs, grads);
  std::vector<Capture> captures;
  std::vector<std::shared_ptr<Node>> keep;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ND_CHECK(inputs[i].requires_grad(), "autograd::grad: input ", i, " ", inputs[i].describe(),
             " does not require grad");
    Edge e = gradient_edge(inputs[i]);
    keep.push_back(e.fn);
    captures.push_back({e.fn.get(), e.input_nr, i});
  }
  std::vector<Tensor> result(inputs.size());
  run_backward(edges, grads, retain_graph, &captures, &result);
  for (size_t i = 0; i < result.size(); ++i) {
    if (!result[i].defined()) {
      ND_CHECK(allow_unused, "autograd::grad: input ", i, " ", inputs[i].describe(),
               " was not used to compute the outputs (pass allow_unused=true to get an undefined tensor)");
      result[i] = Tensor::undefined_because("autograd::grad: " + inputs[i].describe() +
                                            " was not used to compute the outputs");
    }
  }
  return result;
}

namespace detail {
std::vector<Tensor> grad_at_edges(const std::vector<Tensor>& roots, const std::vector<Tensor>& root_grads,
                                  const std::vector<Edge>& targets, uint64_t min_sequence_nr) {
  std::vector<Tensor> grads = root_grads;
  std::vector<Edge> edges = root_edges_of(roots, grads);
  std::vector<Capture> captures;
  for (size_t i = 0; i < targets.size(); ++i)
    if (targets[i].fn) captures.push_back({targets[i].fn.get(), targets[i].input_nr, i});
  std::vector<Tensor> result(targets.size());
  run_backward(edges, grads, /*retain_graph=*/false, &captures, &result, min_sequence_nr);
  return result;
}
}  // namespace detail

void queue_callback(std::function<void()> callback) {
  ND_CHECK(t_callbacks != nullptr, "autograd::queue_callback: called outside a backward pass (only hooks that "
           "run during backward may queue callbacks)");
  t_callbacks->push_back(std::move(callback));
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.sizes() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  Shape dims;
  for (int64_t d = 0; d < grad.dim(); ++d)
    if (d < lead || (shape[d - lead] == 1 && grad.size(d) != 1)) dims.push_back(d);
  Tensor r = dims.empty() ? grad : grad.sum(dims, /*keepdim=*/true);
  return r.reshape(shape);
}

}  // namespace autograd
}  // namespace nd
