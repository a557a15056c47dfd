#pragma once
// nn::Module: a tree of named parameters, buffers and child modules, with the
// dotted names PyTorch gives the same tree ("main.0.weight"), so state dicts and
// checkpoints move both ways. Modules are held by shared_ptr; layer types come
// as LibTorch-style holders (nn::Linear wraps std::shared_ptr<nn::LinearImpl>).
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace nd::nn {

// What load_state_dict found; strict loading throws when any list is non-empty.
struct LoadStateDictResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
  std::vector<std::string> mismatched_keys;  // "name: checkpoint [2, 3] vs module [3, 2]"
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The layer type ("Linear"), used in messages.
  const std::string& type_name() const { return type_name_; }
  // Single-tensor forward, so containers (Sequential) can chain any layer. Layers
  // with other signatures keep their own forward and leave this one throwing.
  virtual Tensor forward(const Tensor& input);

  // Registers a parameter (a leaf that requires grad unless requires_grad is false)
  // or a buffer (state without gradient: running statistics). An undefined tensor
  // registers nothing (an optional bias) and is returned as is.
  Tensor register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor tensor);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }
  template <class Holder>
  Holder register_module(const std::string& name, Holder holder)
    requires requires { holder.ptr(); }
  {
    add_child(name, holder.ptr());
    return holder;
  }

  // Puts `module` in place of the child registered as `name`, keeping its position
  // (dist::convert_sync_batchnorm swaps BatchNorm2d layers this way). Throws when there
  // is no such child.
  virtual void replace_module(const std::string& name, std::shared_ptr<Module> module);

  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  std::vector<std::shared_ptr<Module>> children() const;
  // This module and all below it, depth first ("" for this one).
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules();

  // Parameters and (persistent) buffers by dotted name, sharing storage with the module.
  TensorDict state_dict() const;
  // Copies values in (onto each parameter's own device and dtype, so every rank
  // loads onto its own GPU). Keys may carry a "module." prefix (PyTorch DDP files);
  // it is stripped. strict: any missing, unexpected or wrong-shaped key throws one
  // nd::Error listing all of them; otherwise they are returned.
  LoadStateDictResult load_state_dict(const TensorDict& state, bool strict = true);

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves/casts every parameter and buffer in place: tensors keep their identity,
  // so optimizers built before the move still hold them.
  void to(Device device);
  void to(ScalarType dtype);
  void zero_grad(bool set_to_none = true);
  // Calls fn on this module and every descendant, depth first.
  void apply(const std::function<void(Module&)>& fn);
  // Sets every parameter's and buffer's tensor name to prefix + "." + dotted path
  // (or the bare path when prefix is empty): errors then say 'D.main.0.weight'. The
  // prefix is kept: modules registered later anywhere in the tree are named the same way.
  void name_tensors(const std::string& prefix);

 protected:
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> child);
  // Renames this tree's tensors from its root (the module with no parent).
  void rename_from_root();
  void check_new_name(const std::string& name, const char* what) const;
  template <class Visit>
  void visit(const std::string& prefix, Visit&& visit_module);
  template <class Visit>
  void visit(const std::string& prefix, Visit&& visit_module) const;
  std::string type_name_;
  Module* parent_ = nullptr;  // the module this one was last registered into (cleared when it dies)
  std::string name_prefix_;   // set on a root by name_tensors
};

// LibTorch-style holder: nn::Linear(nn::LinearOptions(4, 3)) owns a shared LinearImpl.
template <class Impl>
class ModuleHolder {
 public:
  using ImplType = Impl;
  // Like LibTorch: a default-constructible layer is built (nn::ReLU(), nn::Sequential());
  // otherwise the holder is empty until assigned. nullptr always gives an empty holder.
  ModuleHolder() {
    if constexpr (std::is_default_constructible_v<Impl>) impl_ = std::make_shared<Impl>();
  }
  ModuleHolder(std::nullptr_t) {}
  explicit ModuleHolder(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  template <class First, class... Rest>
    requires(!std::is_same_v<std::decay_t<First>, std::shared_ptr<Impl>> &&
             !std::is_same_v<std::decay_t<First>, std::nullptr_t> &&
             !std::is_same_v<std::decay_t<First>, ModuleHolder>)
  ModuleHolder(First&& first, Rest&&... rest)
      : impl_(std::make_shared<Impl>(std::forward<First>(first), std::forward<Rest>(rest)...)) {}

  Impl* operator->() const { return get(); }
  Impl& operator*() const { return *get(); }
  Impl* get() const;
  const std::shared_ptr<Impl>& ptr() const { return impl_; }
  bool is_empty() const { return impl_ == nullptr; }
  template <class... Args>
  decltype(auto) operator()(Args&&... args) const {
    return get()->forward(std::forward<Args>(args)...);
  }

 private:
  std::shared_ptr<Impl> impl_;
};

[[noreturn]] void throw_empty_holder(const char* type);
template <class Impl>
Impl* ModuleHolder<Impl>::get() const {
  if (!impl_) throw_empty_holder(typeid(Impl).name());
  return impl_.get();
}

}  // namespace nd::nn

// ND_MODULE(Linear) declares nn::Linear as the holder of nn::LinearImpl.
#define ND_MODULE(Name)                               \
  class Name : public ::nd::nn::ModuleHolder<Name##Impl> { \
   public:                                            \
    using ::nd::nn::ModuleHolder<Name##Impl>::ModuleHolder; \
  }

// ND_ARG(int64_t, stride) declares field stride_, getter stride() and chainable setter
// stride(value) (LibTorch's TORCH_ARG).
#define ND_ARG(T, name)                                                   \
 public:                                                                  \
  auto name(const T& new_##name)->decltype(*this) {                       \
    this->name##_ = new_##name;                                           \
    return *this;                                                         \
  }                                                                       \
  const T& name() const noexcept { return this->name##_; }                \
                                                                          \
 private:                                                                 \
  T name##_
