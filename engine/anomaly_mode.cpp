#include "engine/anomaly_mode.h"

#include <cmath>
#include <string_view>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/tensor.h"

namespace nd::autograd {

namespace detail {
std::atomic<bool> g_anomaly_enabled{false};
}

void set_detect_anomaly(bool enabled) { detail::g_anomaly_enabled.store(enabled, std::memory_order_relaxed); }

namespace {
thread_local const SourceLocation* t_call_site = nullptr;

// This file's folder as the compiler spelled it ("<root>/engine/"): the library's ops are
// compiled with the same spelling, so a call site under it is the library calling itself.
std::string_view engine_dir() {
  static const std::string_view dir = [] {
    const std::string_view self = SourceLocation::current().file_name();
    return self.substr(0, self.rfind('/') + 1);
  }();
  return dir;
}
}  // namespace

void CallSite::enter() {
  if (t_call_site) return;  // an outer user call site is open: ops inherit it
  const std::string_view file = where_.file_name();
  if (!engine_dir().empty() && file.substr(0, engine_dir().size()) == engine_dir()) return;
  t_call_site = &where_;
  owner_ = true;
}

void CallSite::leave() { t_call_site = nullptr; }

const SourceLocation* CallSite::current() { return t_call_site; }

namespace {
// "file:line in function" of a node's call site, or why there is none.
std::string call_site_str(const AnomalyMetadata& meta) {
  if (!meta.has_call_site)
    return "not recorded (an operator or module call outside any nd:: function call; see docs/anomaly.md)";
  return std::string(meta.call_site.file_name()) + ":" + std::to_string(meta.call_site.line()) + " in " +
         meta.call_site.function_name();
}

// Empty when every element of `t` (any dtype, any device) is finite; otherwise what was
// found: "nan", "inf", "-inf", joined with " and ".
std::string nonfinite_kinds(const Tensor& t) {
  if (!t.defined() || !t.is_floating_point() || t.numel() == 0) return "";
  NoGradGuard no_grad;
  const Tensor host = t.detach().to(Device(kCPU)).to(kFloat64).contiguous();
  const double* p = host.data_ptr<double>();
  bool nan = false, pos_inf = false, neg_inf = false;
  for (int64_t i = 0; i < host.numel(); ++i) {
    nan |= std::isnan(p[i]);
    pos_inf |= p[i] == INFINITY;
    neg_inf |= p[i] == -INFINITY;
  }
  std::string kinds;
  for (auto [found, name] : {std::pair{nan, "nan"}, {pos_inf, "inf"}, {neg_inf, "-inf"}})
    if (found) kinds += (kinds.empty() ? "" : " and ") + std::string(name);
  return kinds;
}
}  // namespace

namespace detail {

// Anomaly mode: where the user called the op, and whether its forward made a NaN or inf.
void record_anomaly_metadata(Node& node, std::span<const Tensor> outputs) {
  if (!node.anomaly) node.anomaly = std::make_unique<AnomalyMetadata>();
  AnomalyMetadata& meta = *node.anomaly;
  if (const SourceLocation* site = CallSite::current()) {
    meta.call_site = *site;
    meta.has_call_site = true;
  }
  uint32_t i = 0;
  for (const Tensor& out : outputs) {
    const std::string kinds = meta.nonfinite_output.empty() ? nonfinite_kinds(out) : "";
    if (!kinds.empty()) meta.nonfinite_output = kinds + " in output " + std::to_string(i) + " " + out.describe();
    ++i;
  }
}

void run_with_call_site(const Node& node, const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& e) {
    if (!node.anomaly) throw;
    throw Error(std::string(e.what()) + "\nForward call that created " + node.name() + ": " +
                call_site_str(*node.anomaly) + " (anomaly mode).");
  }
}

// Anomaly mode: a gradient holding NaN or inf stops backward at the node that made it,
// with PyTorch's sentence first, then the user's line that ran the node's forward and the
// first forward op in `graph` (by creation order) whose output was not finite.
void check_gradients(const Node& node, const std::vector<Tensor>& grads, const std::unordered_set<Node*>& graph) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const std::string kinds = nonfinite_kinds(grads[i]);
    if (kinds.empty()) continue;
    const AnomalyMetadata* meta = node.anomaly.get();
    std::string msg = "Function '" + node.name() + "' returned " + kinds + " values in its " + std::to_string(i) +
                      "th output";
    if (meta && i < meta->inputs.size()) msg += " (the gradient for its input " + meta->inputs[i] + ")";
    msg += ".\nForward call that created it: " +
           (meta ? call_site_str(*meta) : std::string("not recorded (created while anomaly mode was off)")) + ".";
    const Node* first = nullptr;
    for (const Node* n : graph)
      if (n->anomaly && !n->anomaly->nonfinite_output.empty() && (!first || n->sequence_nr < first->sequence_nr))
        first = n;
    if (first)
      msg += "\nFirst forward op of this graph with a non-finite output: the forward of " + first->name() + " at " +
             call_site_str(*first->anomaly) + " made " + first->anomaly->nonfinite_output + ".";
    else
      msg += "\nEvery forward output of this graph recorded in anomaly mode was finite.";
    throw Error(msg);
  }
}

}  // namespace detail
}  // namespace nd::autograd
