#include "engine/nn/container.h"

#include <typeinfo>

#include "engine/error.h"
#include "engine/nn/activation.h"
#include "engine/nn/batch_norm.h"

namespace nd::nn {

void ModuleListBase::push_back(std::shared_ptr<Module> module) {
  ND_CHECK(module != nullptr, type_name(), ": cannot push_back an empty module (holder constructed without options?)");
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

void ModuleListBase::replace_module(const std::string& name, std::shared_ptr<Module> module) {
  Module::replace_module(name, module);
  for (size_t i = 0; i < modules_.size(); ++i)
    if (std::to_string(i) == name) modules_[i] = std::move(module);
}

const std::shared_ptr<Module>& ModuleListBase::operator[](size_t index) const {
  ND_CHECK(index < modules_.size(), type_name(), ": index ", index, " is out of range for ", modules_.size(),
           " modules");
  return modules_[index];
}

void ModuleListBase::throw_wrong_type(size_t index, const char* type) const {
  throw Error(type_name() + ": module " + std::to_string(index) + " is a " + modules_[index]->type_name() +
              ", not the requested " + type);
}

namespace {

// The activation `m` applies when BatchNorm2d can apply it in its own pass (ReLU,
// LeakyReLU with a slope >= 0), none otherwise. Exact types only: a subclass may have
// its own forward, which the fused op would skip.
BatchNormActivation fusable_activation(const Module& m) {
  using Kind = BatchNormActivation::Kind;
  if (typeid(m) == typeid(ReLUImpl)) return {Kind::relu, 0};
  if (typeid(m) != typeid(LeakyReLUImpl)) return {};
  const double slope = static_cast<const LeakyReLUImpl&>(m).options.negative_slope();
  return slope >= 0 ? BatchNormActivation{Kind::leaky_relu, slope} : BatchNormActivation{};
}

}  // namespace

Tensor SequentialImpl::forward(const Tensor& input) {
  Tensor x = input;
  const auto modules = begin();
  for (size_t i = 0; i < size(); ++i) {
    // BatchNorm2d then ReLU / LeakyReLU: one op (BatchNorm2dImpl::forward_activated), the
    // same values and gradients as the pair. SyncBatchNorm (or any other type, a subclass
    // of BatchNorm2d included) keeps its pair two ops.
    Module& m = *modules[i];
    auto* bn = typeid(m) == typeid(BatchNorm2dImpl) ? static_cast<BatchNorm2dImpl*>(&m) : nullptr;
    const BatchNormActivation act =
        bn && i + 1 < size() ? fusable_activation(*modules[i + 1]) : BatchNormActivation{};
    if (act.on()) {
      x = bn->forward_activated(x, act);
      ++i;
    } else {
      x = m.forward(x);
    }
  }
  return x;
}

}  // namespace nd::nn
