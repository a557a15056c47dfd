#pragma once
// nn::Sequential (children "0", "1", ...; forward chains each child's single-tensor
// forward, a BatchNorm2d and the ReLU / LeakyReLU after it as one op) and nn::ModuleList (children "0", "1", ...; no forward). Both accept any
// holder (nn::Linear) or shared_ptr to a Module. Tests: tests/nn/layers_test.cpp.
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/init.h"
#include "engine/nn/module.h"

namespace nd::nn {

// The shared part: an ordered list of children named by their position.
class ModuleListBase : public Module {
 public:
  using Module::Module;
  void push_back(std::shared_ptr<Module> module);
  template <class Holder>
    requires requires(Holder h) { h.ptr(); }
  void push_back(const Holder& holder) {
    push_back(std::shared_ptr<Module>(holder.ptr()));
  }
  // Keeps the positional list in step with the child (convert_sync_batchnorm uses this).
  void replace_module(const std::string& name, std::shared_ptr<Module> module) override;
  size_t size() const { return modules_.size(); }
  bool is_empty() const { return modules_.empty(); }
  // Throws when index >= size().
  const std::shared_ptr<Module>& operator[](size_t index) const;
  // The child at index as a T (LinearImpl); throws when it is another type.
  template <class T>
  std::shared_ptr<T> ptr(size_t index) const {
    auto typed = std::dynamic_pointer_cast<T>((*this)[index]);
    if (!typed) throw_wrong_type(index, typeid(T).name());
    return typed;
  }
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 private:
  [[noreturn]] void throw_wrong_type(size_t index, const char* type) const;
  std::vector<std::shared_ptr<Module>> modules_;
};

// Holders with operator[] forwarded to the container.
template <class Impl>
class ContainerHolder : public ModuleHolder<Impl> {
 public:
  using ModuleHolder<Impl>::ModuleHolder;
  const std::shared_ptr<Module>& operator[](size_t index) const { return (*this->get())[index]; }
};

class SequentialImpl : public ModuleListBase {
 public:
  SequentialImpl() : ModuleListBase("Sequential") {}
  template <class... Modules>
  explicit SequentialImpl(Modules&&... modules) : SequentialImpl() {
    (push_back(std::forward<Modules>(modules)), ...);
  }
  // Chains each child's forward(const Tensor&); an empty Sequential returns input. A
  // BatchNorm2d directly followed by ReLU or LeakyReLU (slope >= 0) runs as one op,
  // BatchNorm2dImpl::forward_activated: the same values and gradients, one pass.
  Tensor forward(const Tensor& input) override;
};
class Sequential : public ContainerHolder<SequentialImpl> {
 public:
  using ContainerHolder<SequentialImpl>::ContainerHolder;
};

class ModuleListImpl : public ModuleListBase {
 public:
  ModuleListImpl() : ModuleListBase("ModuleList") {}
  template <class... Modules>
  explicit ModuleListImpl(Modules&&... modules) : ModuleListImpl() {
    (push_back(std::forward<Modules>(modules)), ...);
  }
};
class ModuleList : public ContainerHolder<ModuleListImpl> {
 public:
  using ContainerHolder<ModuleListImpl>::ContainerHolder;
};

}  // namespace nd::nn
