#include "engine/optim/optimizer.h"

#include <map>
#include <set>
#include <tuple>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/common.h"
#include "engine/ops/copy.h"

namespace nd::optim {

Optimizer::Optimizer(std::string name, std::vector<OptimizerParamGroup> groups, const OptimizerOptions& defaults)
    : name_(std::move(name)), defaults_(defaults.clone()) {
  for (const auto& g : groups) add_param_group(g);
}

void Optimizer::add_param_group(const OptimizerParamGroup& group) {
  OptimizerParamGroup g(group);
  if (!g.has_options()) g.set_options(defaults_->clone());
  std::set<const TensorImpl*> seen;
  for (const auto& existing : groups_)
    for (const Tensor& p : existing.params()) seen.insert(p.impl_ptr().get());
  for (const Tensor& p : g.params()) {
    ND_CHECK(p.defined(), name_, ": a parameter group holds an undefined tensor");
    ND_CHECK(p.is_leaf() && p.is_floating_point(), name_, ": can only optimize floating point leaf tensors, found ",
             p.describe());
    ND_CHECK(seen.insert(p.impl_ptr().get()).second, name_, ": parameter ", p.describe(),
             " appears in more than one parameter group");
  }
  groups_.push_back(std::move(g));
}

int64_t Optimizer::num_parameters() const {
  int64_t n = 0;
  for (const auto& g : groups_) n += static_cast<int64_t>(g.params().size());
  return n;
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [param, state] : state_)
    for (const auto& [name, t] : state.buffers) bytes += t.numel() * static_cast<int64_t>(element_size(t.dtype()));
  return bytes;
}

namespace {

std::vector<std::function<void(const Optimizer&)>>& first_step_hooks() {
  static std::vector<std::function<void(const Optimizer&)>> hooks;
  return hooks;
}

}  // namespace

void register_first_step_hook(std::function<void(const Optimizer&)> hook) {
  first_step_hooks().push_back(std::move(hook));
}

void Optimizer::step() {
  if (!first_step_taken_) {
    for (const auto& hook : first_step_hooks()) hook(*this);
    first_step_taken_ = true;
  }
  NoGradGuard no_grad;
  ops::InplaceOpLabel label(name_ + ".step");
  int64_t updated = 0;
  for (auto& group : groups_) {
    std::vector<ParamUpdate> params;
    for (const Tensor& p : group.params()) {
      if (!p.impl().grad) continue;
      Tensor g = p.grad();
      ND_CHECK(g.sizes() == p.sizes() && g.dtype() == p.dtype() && g.device() == p.device(), name_,
               ".step: gradient ", g.describe(), " does not match parameter ", p.describe());
      ND_CHECK(p.is_contiguous(), name_, ".step: parameter ", p.describe(), " is not contiguous");
      params.push_back({p, g.contiguous(), &state_[p.impl_ptr().get()]});
    }
    update(group.options(), params);
    for (const ParamUpdate& u : params) u.param.storage()->bump_version(name_ + ".step");
    updated += static_cast<int64_t>(params.size());
  }
  if (updated == 0 && num_parameters() > 0 && !warned_no_grad_) {
    warned_no_grad_ = true;
    warn(name_ + ".step(): none of its " + std::to_string(num_parameters()) +
         " parameters has a gradient, so nothing was updated. Did backward reach this model? (A loss computed "
         "under NoGradGuard, from detach()ed outputs, or made a leaf with requires_grad_(true) trains nothing.)");
  }
}

void Optimizer::step_unless(const Tensor& found_inf) {
  ND_CHECK(found_inf.defined() && found_inf.is_cuda() && found_inf.dtype() == kInt32 && found_inf.numel() == 1, name_,
           ".step_unless: expected an int32 flag on a CUDA device, found ", found_inf.describe());
  bool any_grad = false;
  for (const auto& group : groups_)
    for (const Tensor& p : group.params()) {
      if (!p.impl().grad) continue;
      any_grad = true;
      ND_CHECK(p.device() == found_inf.device(), name_, ".step_unless: parameter ", p.describe(),
               " is not on the flag's device ", found_inf.device().str());
    }
  skip_if_ = found_inf;
  skip_taken_ = false;
  try {
    step();
  } catch (...) {
    skip_if_ = Tensor();
    throw;
  }
  skip_if_ = Tensor();
  ND_CHECK(skip_taken_ || !any_grad, name_, ".step_unless: this optimizer's step cannot skip its update on the device "
           "(step it on the host's answer instead, outside a CUDA graph)");
}

const int32_t* Optimizer::skip_flag(const Tensor& param) {
  if (!skip_if_.defined() || !param.is_cuda()) return nullptr;
  skip_taken_ = true;
  return skip_if_.data_ptr<int32_t>();
}

std::vector<std::vector<Optimizer::ParamUpdate*>> Optimizer::by_device(std::vector<ParamUpdate>& params) {
  std::map<std::tuple<DeviceType, int, ScalarType>, std::vector<ParamUpdate*>> groups;
  for (ParamUpdate& u : params) groups[{u.param.device().type, u.param.device().index, u.param.dtype()}].push_back(&u);
  std::vector<std::vector<ParamUpdate*>> lists;
  for (auto& entry : groups) lists.push_back(std::move(entry.second));
  return lists;
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (auto& group : groups_)
    for (const Tensor& p : group.params()) {
      if (!p.impl().grad) continue;
      if (set_to_none)
        p.set_grad(Tensor());
      else
        p.grad().zero_();
    }
}

int64_t Optimizer::ParamState::steps_taken() const {
  return step_on_device.defined() ? static_cast<int64_t>(step_on_device.item()) : step;
}

TensorDict Optimizer::state_dict() const {
  TensorDict out;
  int64_t k = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (const auto& [opt, value] : groups_[gi].options().to_map())
      out["param_groups." + std::to_string(gi) + "." + opt] = scalar_tensor(value, kFloat64);
    for (const Tensor& p : groups_[gi].params()) {
      auto it = state_.find(p.impl_ptr().get());
      if (it != state_.end()) {
        const std::string prefix = "state." + std::to_string(k) + ".";
        out[prefix + "step"] = scalar_tensor(static_cast<double>(it->second.steps_taken()), kFloat64);
        for (const auto& [buf, t] : it->second.buffers) out[prefix + buf] = t;
      }
      ++k;
    }
  }
  return out;
}

Optimizer::StateKey Optimizer::parse_state_key(const std::string& optimizer, const std::string& key, const Tensor& value,
                                               const std::vector<Tensor>& params, size_t num_groups) {
  const auto dot1 = key.find('.'), dot2 = key.find('.', dot1 + 1);
  StateKey out;
  if (dot1 != std::string::npos && dot2 != std::string::npos) {
    out.kind = key.substr(0, dot1);
    out.field = key.substr(dot2 + 1);
    try {
      out.index = std::stoll(key.substr(dot1 + 1, dot2 - dot1 - 1));
    } catch (const std::exception&) {
      out.kind.clear();
    }
  }
  ND_CHECK(out.kind == "state" || out.kind == "param_groups", optimizer, ".load_state_dict: unexpected key '", key,
           "'");
  if (out.kind == "param_groups") {
    ND_CHECK(out.index >= 0 && out.index < static_cast<int64_t>(num_groups), optimizer, ".load_state_dict: the state "
             "has parameter group ", out.index, " but this optimizer has ", num_groups, " group(s)");
    return out;
  }
  ND_CHECK(out.index >= 0 && out.index < static_cast<int64_t>(params.size()), optimizer, ".load_state_dict: the state "
           "has parameter ", out.index, " but this optimizer holds ", params.size(), " parameter(s)");
  const Tensor& p = params[out.index];
  ND_CHECK(out.field == "step" || value.sizes() == p.sizes(), optimizer, ".load_state_dict: '", key, "' has shape ",
           shape_str(value.sizes()), " but parameter ", out.index, " ", p.describe(), " has shape ",
           shape_str(p.sizes()));
  return out;
}

void Optimizer::load_state_dict(const TensorDict& state) {
  std::vector<Tensor> flat;
  for (const auto& g : groups_)
    for (const Tensor& p : g.params()) flat.push_back(p);
  std::map<int64_t, ParamState> loaded;
  std::vector<std::map<std::string, double>> group_options(groups_.size());
  for (const auto& [key, t] : state) {
    const auto [kind, index, field] = parse_state_key(name_, key, t, flat, groups_.size());
    if (kind == "param_groups") {
      group_options[index][field] = t.item();
    } else if (field == "step") {
      loaded[index].step = static_cast<int64_t>(t.item());
    } else {
      Tensor buf = empty(flat[index].sizes(), flat[index].options());
      copy_data(buf, t);
      loaded[index].buffers[field] = buf;
    }
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    if (!group_options[gi].empty()) groups_[gi].options().from_map(group_options[gi]);
  state_.clear();
  for (auto& [index, s] : loaded) state_[flat[index].impl_ptr().get()] = std::move(s);
  ++state_generation_;
}

}  // namespace nd::optim
