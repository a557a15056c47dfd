#include "engine/nn/module.h"

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/ops/copy.h"

namespace nd::nn {

void throw_empty_holder(const char* type) {
  throw Error(std::string("use of an empty module holder (") + type +
              "): construct it with options, e.g. nn::Linear(nn::LinearOptions(4, 3))");
}

Tensor Module::forward(const Tensor&) {
  throw Error(type_name_ + " has no single-tensor forward(input), so it cannot be chained in a Sequential; call "
              "its own forward");
}

void Module::check_new_name(const std::string& name, const char* what) const {
  ND_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_, ": invalid ", what, " name '", name,
           "' (must be non-empty and contain no '.')");
  auto taken = [&](const auto& list) {
    for (const auto& entry : list)
      if (entry.first == name) return true;
    return false;
  };
  ND_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_), type_name_, ": ", what, " name '", name,
           "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_new_name(name, "parameter");
  if (!tensor.defined()) return tensor;
  ND_CHECK(tensor.is_leaf(), type_name_, ": parameter '", name, "' must be a leaf tensor (detach() it first), found ",
           tensor.describe());
  if (requires_grad) tensor.requires_grad_(true);
  if (tensor.name().empty()) tensor.set_name(name);
  parameters_.emplace_back(name, tensor);
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor) {
  check_new_name(name, "buffer");
  if (!tensor.defined()) return tensor;
  if (tensor.name().empty()) tensor.set_name(name);
  buffers_.emplace_back(name, tensor);
  return tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> child) {
  check_new_name(name, "submodule");
  ND_CHECK(child != nullptr, type_name_, ": submodule '", name, "' is null");
  child->parent_ = this;
  children_.emplace_back(name, std::move(child));
  rename_from_root();
}

void Module::replace_module(const std::string& name, std::shared_ptr<Module> module) {
  ND_CHECK(module != nullptr, type_name_, ": replacement for submodule '", name, "' is null");
  for (auto& [child_name, child] : children_) {
    if (child_name != name) continue;
    if (child->parent_ == this) child->parent_ = nullptr;
    module->parent_ = this;
    child = std::move(module);
    rename_from_root();
    return;
  }
  throw Error(type_name_ + ": no submodule named '" + name + "' to replace");
}

Module::~Module() {
  for (auto& [name, child] : children_)
    if (child->parent_ == this) child->parent_ = nullptr;
}

void Module::rename_from_root() {
  Module* root = this;
  while (root->parent_) root = root->parent_;
  root->name_tensors(root->name_prefix_);
}

template <class Visit>
void Module::visit(const std::string& prefix, Visit&& visit_module) const {
  visit_module(prefix, *this);
  for (const auto& [name, child] : children_)
    static_cast<const Module&>(*child).visit(prefix.empty() ? name : prefix + "." + name, visit_module);
}

namespace {
std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const TensorImpl*> seen;  // a parameter shared by two modules is listed once
  auto add = [&](const std::string& prefix, const Module& m) {
    for (const auto& [name, t] : m.parameters_) {
      bool dup = false;
      for (auto* s : seen) dup |= s == t.impl_ptr().get();
      if (dup) continue;
      seen.push_back(t.impl_ptr().get());
      out.emplace_back(join(prefix, name), t);
    }
  };
  if (recurse)
    visit("", add);
  else
    add("", *this);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  auto add = [&](const std::string& prefix, const Module& m) {
    for (const auto& [name, t] : m.buffers_) out.emplace_back(join(prefix, name), t);
  };
  if (recurse)
    visit("", add);
  else
    add("", *this);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (auto& [name, c] : children_) out.push_back(c);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  out.emplace_back("", shared_from_this());
  for (auto& [name, child] : children_)
    for (auto& [sub, m] : child->named_modules()) out.emplace_back(join(name, sub), m);
  return out;
}

TensorDict Module::state_dict() const {
  TensorDict out;
  for (auto& [name, t] : named_parameters()) out[name] = t;
  for (auto& [name, t] : named_buffers()) out[name] = t;
  return out;
}

LoadStateDictResult Module::load_state_dict(const TensorDict& state, bool strict) {
  TensorDict own = state_dict();
  LoadStateDictResult result;
  TensorDict incoming;
  for (const auto& [key, value] : state) {
    const std::string name = key.rfind("module.", 0) == 0 ? key.substr(7) : key;
    incoming[name] = value;
  }
  for (const auto& [name, value] : incoming) {
    auto it = own.find(name);
    if (it == own.end()) {
      result.unexpected_keys.push_back(name);
    } else if (it->second.sizes() != value.sizes()) {
      result.mismatched_keys.push_back(name + ": checkpoint " + shape_str(value.sizes()) + " vs module " +
                                       shape_str(it->second.sizes()));
    }
  }
  for (const auto& [name, t] : own)
    if (!incoming.count(name)) result.missing_keys.push_back(name);
  if (strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty() || !result.mismatched_keys.empty())) {
    std::string msg = "Error(s) in loading state_dict for " + type_name_ + ":";
    auto list = [&](const char* what, const std::vector<std::string>& keys) {
      if (keys.empty()) return;
      msg += std::string("\n  ") + what + ": ";
      for (size_t i = 0; i < keys.size(); ++i) msg += (i ? ", " : "") + std::string("\"") + keys[i] + "\"";
    };
    list("Missing key(s)", result.missing_keys);
    list("Unexpected key(s)", result.unexpected_keys);
    list("Size mismatch", result.mismatched_keys);
    msg += "\n  (pass strict=false to load the matching keys and get these lists back)";
    throw Error(msg);
  }
  NoGradGuard no_grad;
  for (const auto& [name, value] : incoming) {
    auto it = own.find(name);
    if (it == own.end() || it->second.sizes() != value.sizes()) continue;
    copy_data(it->second, value);  // onto the parameter's own device and dtype
    it->second.storage()->bump_version("load_state_dict");
  }
  return result;
}

void Module::train(bool on) {
  apply([on](Module& m) { m.training_ = on; });
}

namespace {
// Replaces t's data with `moved` while keeping the TensorImpl (and so every handle).
void rebind(const Tensor& t, const Tensor& moved) {
  TensorImpl& im = t.impl();
  const TensorImpl& src = moved.impl();
  im.storage = src.storage;
  im.shape = src.shape;
  im.strides = src.strides;
  im.offset = src.offset;
  im.dtype = src.dtype;
  if (im.grad) im.grad.reset();
}
}  // namespace

void Module::to(Device device) {
  NoGradGuard no_grad;
  for (auto& [name, t] : named_parameters())
    if (t.device() != device) rebind(t, t.to(device));
  for (auto& [name, t] : named_buffers())
    if (t.device() != device) rebind(t, t.to(device));
}

void Module::to(ScalarType dtype) {
  NoGradGuard no_grad;
  for (auto& [name, t] : named_parameters())
    if (t.dtype() != dtype) rebind(t, t.to(dtype));
  for (auto& [name, t] : named_buffers())
    if (t.dtype() != dtype && is_floating_point(t.dtype())) rebind(t, t.to(dtype));
}

void Module::zero_grad(bool set_to_none) {
  for (auto& t : parameters()) {
    if (!t.impl().grad) continue;
    if (set_to_none) {
      t.set_grad(Tensor());
    } else {
      NoGradGuard no_grad;
      t.grad().zero_();
    }
  }
}

void Module::apply(const std::function<void(Module&)>& fn) {
  fn(*this);
  for (auto& [name, child] : children_) child->apply(fn);
}

void Module::name_tensors(const std::string& prefix) {
  name_prefix_ = prefix;
  visit(prefix, [](const std::string& path, Module& m) {
    for (auto& [name, t] : m.parameters_) t.set_name(join(path, name));
    for (auto& [name, t] : m.buffers_) t.set_name(join(path, name));
  });
}

template <class Visit>
void Module::visit(const std::string& prefix, Visit&& visit_module) {
  visit_module(prefix, *this);
  for (auto& [name, child] : children_) child->visit(prefix.empty() ? name : prefix + "." + name, visit_module);
}

}  // namespace nd::nn
