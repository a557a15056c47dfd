#include "engine/nn/container.h"

#include "engine/error.h"

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

Tensor SequentialImpl::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& m : *this) x = m->forward(x);
  return x;
}

}  // namespace nd::nn
