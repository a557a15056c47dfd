#include "engine/optim/sgd.h"

#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/common.h"
#include "kernels/cpu/optim.h"
#include "kernels/cuda/optim.h"

namespace nd::optim {

std::map<std::string, double> SGDOptions::to_map() const {
  return {{"lr", lr_}, {"momentum", momentum_}, {"dampening", dampening_}, {"weight_decay", weight_decay_},
          {"nesterov", nesterov_ ? 1.0 : 0.0}};
}

void SGDOptions::from_map(const std::map<std::string, double>& v) {
  if (v.count("lr")) lr_ = v.at("lr");
  if (v.count("momentum")) momentum_ = v.at("momentum");
  if (v.count("dampening")) dampening_ = v.at("dampening");
  if (v.count("weight_decay")) weight_decay_ = v.at("weight_decay");
  if (v.count("nesterov")) nesterov_ = v.at("nesterov") != 0;
}

namespace {
void check(const SGDOptions& o) {
  ND_CHECK(o.lr_ >= 0, "SGD: invalid learning rate ", o.lr_, " (expected >= 0)");
  ND_CHECK(o.momentum_ >= 0, "SGD: invalid momentum ", o.momentum_, " (expected >= 0)");
  ND_CHECK(o.weight_decay_ >= 0, "SGD: invalid weight_decay ", o.weight_decay_, " (expected >= 0)");
  ND_CHECK(!o.nesterov_ || (o.momentum_ > 0 && o.dampening_ == 0),
           "SGD: Nesterov momentum requires a momentum and zero dampening");
}
}  // namespace

SGD::SGD(std::vector<OptimizerParamGroup> groups, const SGDOptions& defaults)
    : Optimizer("SGD", std::move(groups), defaults) {
  check(defaults);
  for (auto& g : param_groups()) check(static_cast<const SGDOptions&>(g.options()));
}

void SGD::update(const OptimizerOptions& options, std::vector<ParamUpdate>& params) {
  const auto& o = static_cast<const SGDOptions&>(options);
  const kernels::cpu::SgdParams hp{o.lr_, o.momentum_, o.dampening_, o.weight_decay_, o.nesterov_};
  for (const std::vector<ParamUpdate*>& group : by_device(params)) {
    const Tensor& first = group.front()->param;
    const int32_t* skip = skip_flag(first);
    ops::dispatch_floating("SGD.step", first, [&]<class T>() {
      std::vector<kernels::cpu::SgdTensor<T>> tensors;
      for (ParamUpdate* u : group) {
        kernels::cpu::SgdTensor<T> t{u->param.numel(), u->param.data_ptr<T>(), u->grad.data_ptr<T>()};
        if (o.momentum_ != 0) {
          std::map<std::string, Tensor>& b = u->state->buffers;
          t.first_step = !b.count("momentum_buffer");
          // A first step skipped on the device would leave the buffer unwritten for the next.
          ND_CHECK(!(t.first_step && skip), "SGD.step_unless: parameter ", u->param.describe(),
                   " has no momentum buffer yet (take a first step without the flag)");
          if (t.first_step) b["momentum_buffer"] = empty_like(u->param);
          t.buf = b["momentum_buffer"].data_ptr<T>();
        }
        ++u->state->step;
        tensors.push_back(t);
      }
      ops::on_device(
          first, [&] { kernels::cpu::sgd_step<T>(tensors, hp); },
          [&](auto stream) { kernels::cuda::sgd_step<T>(first.device().index, tensors, hp, stream, skip); });
    });
  }
}

}  // namespace nd::optim
