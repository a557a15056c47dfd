#include "engine/optim/adam.h"

#include <map>

#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/common.h"
#include "kernels/cpu/optim.h"
#include "kernels/cuda/optim.h"

namespace nd::optim {

std::map<std::string, double> AdamOptions::to_map() const {
  return {{"lr", lr_}, {"beta1", betas_.first}, {"beta2", betas_.second}, {"eps", eps_},
          {"weight_decay", weight_decay_}, {"amsgrad", amsgrad_ ? 1.0 : 0.0}};
}

void AdamOptions::from_map(const std::map<std::string, double>& v) {
  if (v.count("lr")) lr_ = v.at("lr");
  if (v.count("beta1")) betas_.first = v.at("beta1");
  if (v.count("beta2")) betas_.second = v.at("beta2");
  if (v.count("eps")) eps_ = v.at("eps");
  if (v.count("weight_decay")) weight_decay_ = v.at("weight_decay");
  if (v.count("amsgrad")) amsgrad_ = v.at("amsgrad") != 0;
}

namespace {
void check(const std::string& name, const AdamOptions& o) {
  ND_CHECK(o.lr_ >= 0, name, ": invalid learning rate ", o.lr_, " (expected >= 0)");
  ND_CHECK(o.eps_ >= 0, name, ": invalid epsilon ", o.eps_, " (expected >= 0)");
  ND_CHECK(o.betas_.first >= 0 && o.betas_.first < 1, name, ": invalid beta1 ", o.betas_.first,
           " (expected in [0, 1))");
  ND_CHECK(o.betas_.second >= 0 && o.betas_.second < 1, name, ": invalid beta2 ", o.betas_.second,
           " (expected in [0, 1))");
  ND_CHECK(o.weight_decay_ >= 0, name, ": invalid weight_decay ", o.weight_decay_, " (expected >= 0)");
}
}  // namespace

Adam::Adam(std::vector<OptimizerParamGroup> groups, const AdamOptions& defaults)
    : Adam("Adam", std::move(groups), defaults, false) {}

Adam::Adam(std::string name, std::vector<OptimizerParamGroup> groups, const AdamOptions& defaults, bool decoupled)
    : Optimizer(name, std::move(groups), defaults), decoupled_(decoupled) {
  check(name, defaults);
  for (auto& g : param_groups()) check(name, static_cast<const AdamOptions&>(g.options()));
}

void Adam::begin_step(const OptimizerOptions& options, const Tensor& p, ParamState& state) {
  const auto& o = static_cast<const AdamOptions&>(options);
  if (state.buffers.empty()) {
    state.buffers["exp_avg"] = zeros_like(p);
    state.buffers["exp_avg_sq"] = zeros_like(p);
  }
  if (o.amsgrad_ && !state.buffers.count("max_exp_avg_sq")) state.buffers["max_exp_avg_sq"] = zeros_like(p);
  if (!p.is_cuda())
    ++state.step;
  else if (!state.step_on_device.defined())  // the kernel counts from here
    state.step_on_device = full({}, static_cast<double>(state.step), TensorOptions(kFloat64).device(p.device()));
}

void Adam::update(const OptimizerOptions& options, std::vector<ParamUpdate>& params) {
  const auto& o = static_cast<const AdamOptions&>(options);
  const kernels::cpu::AdamParams hp{o.lr_, o.betas_.first, o.betas_.second, o.eps_, o.weight_decay_, decoupled_,
                                    o.amsgrad_};
  for (const std::vector<ParamUpdate*>& group : by_device(params)) {
    const Tensor& first = group.front()->param;
    ops::dispatch_floating("Adam.step", first, [&]<class T>() {
      std::vector<kernels::cpu::AdamTensor<T>> tensors;
      for (ParamUpdate* u : group) {
        begin_step(options, u->param, *u->state);
        std::map<std::string, Tensor>& b = u->state->buffers;
        T* vmax = hp.amsgrad ? b["max_exp_avg_sq"].data_ptr<T>() : nullptr;
        const Tensor& counted = u->state->step_on_device;
        tensors.push_back({u->param.numel(), u->param.data_ptr<T>(), u->grad.data_ptr<T>(),
                           b["exp_avg"].data_ptr<T>(), b["exp_avg_sq"].data_ptr<T>(), vmax, u->state->step,
                           counted.defined() ? counted.data_ptr<double>() : nullptr});
      }
      ops::on_device(
          first, [&] { kernels::cpu::adam_step<T>(tensors, hp); },
          [&](auto stream) {
            kernels::cuda::adam_step<T>(first.device().index, tensors, hp, stream, skip_flag(first));
          });
    });
  }
}

}  // namespace nd::optim
