#include "engine/optim/grad_scaler.h"

#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/common.h"
#include "kernels/cpu/optim.h"
#include "kernels/common/optim_math.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/optim.h"

namespace nd::optim {

GradScaler::GradScaler(const GradScalerOptions& options) : options_(options), scale_(options.init_scale()) {
  check_options();
}

void GradScaler::check_options() const {
  const auto& o = options_;
  ND_CHECK(std::isfinite(o.init_scale()) && o.init_scale() > 0, "GradScaler: expected init_scale > 0 and finite, found ",
           o.init_scale());
  ND_CHECK(o.growth_factor() > 1 && std::isfinite(o.growth_factor()), "GradScaler: expected growth_factor > 1, found ",
           o.growth_factor());
  ND_CHECK(o.backoff_factor() > 0 && o.backoff_factor() < 1, "GradScaler: expected backoff_factor in (0, 1), found ",
           o.backoff_factor());
  ND_CHECK(o.growth_interval() >= 1, "GradScaler: expected growth_interval >= 1, found ", o.growth_interval());
}

bool GradScaler::capturing() { return kernels::cuda::capture_active(); }

void GradScaler::push() const {
  on_device_.scale.fill_(scale_);
  on_device_.growth_tracker.fill_(static_cast<double>(growth_tracker_));
  on_device_.found_any.fill_(skipped_ ? 1.0 : 0.0);
}

void GradScaler::pull() {
  if (!device_holds_truth()) return;
  scale_ = on_device_.scale.item();
  growth_tracker_ = static_cast<int64_t>(on_device_.growth_tracker.item());
  skipped_ = on_device_.found_any.item() != 0;
}

double GradScaler::get_scale() const {
  if (!is_enabled()) return 1.0;
  return device_holds_truth() ? on_device_.scale.item() : scale_;
}

int64_t GradScaler::growth_tracker() const {
  return device_holds_truth() ? static_cast<int64_t>(on_device_.growth_tracker.item()) : growth_tracker_;
}

bool GradScaler::skipped() const { return device_holds_truth() ? on_device_.found_any.item() != 0 : skipped_; }

Tensor GradScaler::scale(const Tensor& loss) const {
  ND_CHECK(loss.defined(), "GradScaler.scale: expected a loss tensor, found an undefined tensor");
  if (!is_enabled()) return loss;
  ND_CHECK(loss.is_floating_point(), "GradScaler.scale: expected a floating point loss, found ", loss.describe());
  if (capturing() && loss.is_cuda()) {
    // The replays scale by the device's scale as it is then (a power of two: the same bits).
    ND_CHECK(on_device_.scale.defined() && on_device_.scale.device() == loss.device(),
             "GradScaler.scale: the scale is not on ", loss.device().str(), " yet, so a CUDA graph cannot capture it "
             "(take an eager warm-up step with this scaler on that device before the capture)");
    return loss * on_device_.scale.to(loss.dtype());
  }
  if (loss.is_cuda() && !on_device_.scale.defined()) {
    const TensorOptions f64 = TensorOptions(kFloat64).device(loss.device());
    on_device_ = {empty({}, f64), empty({}, f64), empty({}, TensorOptions(kInt32).device(loss.device())), false};
    push();
  }
  return loss * get_scale();
}

namespace {
// p's gradient, checked for an in-place unscale (eagerly or in a capture): f32 or f64,
// contiguous and fit for an in-place write (ops::check_inplace).
Tensor unscalable_grad(const Tensor& p, const Optimizer& optimizer) {
  Tensor g = p.grad();
  ND_CHECK(g.dtype() == kFloat32 || g.dtype() == kFloat64, "GradScaler.unscale_: expected f32 or f64 gradients (",
           "master weights; f16 autocast keeps parameters and gradients f32), found ", g.describe(), " of parameter ",
           p.describe(), " in ", optimizer.name());
  ND_CHECK(g.is_contiguous(), "GradScaler.unscale_: expected a contiguous gradient, found ", g.describe(),
           " of parameter ", p.describe());
  ops::check_inplace("GradScaler.unscale_", g, false);
  return g;
}
}  // namespace

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!is_enabled()) return;
  OptimizerState& st = per_optimizer_[&optimizer];
  ND_CHECK(!st.unscaled, "GradScaler.unscale_: already called on ", optimizer.name(),
           " since the last update(); its gradients are unscaled once per iteration (call update() after step())");
  ND_CHECK(!st.stepped, "GradScaler.unscale_: called on ", optimizer.name(),
           " after its step(); unscale_ comes between backward and step");
  NoGradGuard no_grad;
  ops::InplaceOpLabel label("GradScaler.unscale_");
  if (capturing()) return unscale_on_device(optimizer, st);
  pull();
  // CPU gradients answer at once; CUDA gradients each get a flag in one int32 tensor per
  // device, set by one multi-tensor kernel per device and dtype, and read back together
  // (one synchronisation).
  struct Pending {
    std::map<ScalarType, std::vector<std::pair<Tensor, size_t>>> by_dtype;  // gradient, its flag
    std::vector<std::string> names;                                       // by flag
  };
  std::map<int, Pending> pending;  // by CUDA device index
  const double inv = 1.0 / scale_;
  for (const auto& group : optimizer.param_groups()) {
    for (const Tensor& p : group.params()) {
      if (!p.impl().grad) continue;
      Tensor g = unscalable_grad(p, optimizer);
      if (!g.is_cuda()) {
        const bool bad = ops::dispatch_floating("GradScaler.unscale_", g, [&]<class T>() {
          return kernels::cpu::unscale_grad<T>(g.numel(), g.data_ptr<T>(), static_cast<T>(inv));
        });
        if (bad && !st.found_nonfinite()) st.first_nonfinite = p.describe();
      } else {
        Pending& pd = pending[g.device().index];
        pd.by_dtype[g.dtype()].push_back({g, pd.names.size()});
        pd.names.push_back(p.describe());
      }
      ops::bump_version(g, "GradScaler.unscale_");
    }
  }
  for (auto& entry : pending) {  // (no structured binding: lambdas capture these; clang 14)
    const int device = entry.first;
    Pending& pd = entry.second;
    const Tensor flags =
        zeros({static_cast<int64_t>(pd.names.size())}, TensorOptions(kInt32).device(Device(kCUDA, device)));
    for (auto& dtype_grads : pd.by_dtype) {
      const std::vector<std::pair<Tensor, size_t>>& grads = dtype_grads.second;
      const Tensor& first = grads.front().first;
      ops::dispatch_floating("GradScaler.unscale_", first, [&]<class T>() {
        std::vector<kernels::cuda::UnscaleTensor<T>> tensors;
        for (const std::pair<Tensor, size_t>& gf : grads)
          tensors.push_back({gf.first.numel(), gf.first.data_ptr<T>(),
                             flags.data_ptr<int32_t>() + static_cast<int64_t>(gf.second)});
        ops::on_device(first, [] {}, [&](auto stream) {
          kernels::cuda::unscale_grad<T>(device, tensors, static_cast<T>(inv), stream);
        });
      });
    }
    const Tensor host_flags = flags.to(Device(kCPU));
    const int32_t* f = host_flags.data_ptr<int32_t>();
    for (size_t i = 0; i < pd.names.size(); ++i) {
      if (f[i] && !st.found_nonfinite()) st.first_nonfinite = pd.names[i];
    }
  }
  st.unscaled = true;
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!is_enabled()) {
    optimizer.step();
    return true;
  }
  {
    const auto it = per_optimizer_.find(&optimizer);
    ND_CHECK(it == per_optimizer_.end() || !it->second.stepped, "GradScaler.step: already called on ",
             optimizer.name(), " since the last update(); call update() once per iteration, after the step()s");
  }
  if (!per_optimizer_[&optimizer].unscaled) unscale_(optimizer);
  OptimizerState& st = per_optimizer_[&optimizer];
  st.stepped = true;
  if (st.found_on_device.defined()) {
    optimizer.step_unless(st.found_on_device);
    return true;
  }
  if (st.found_nonfinite()) {
    if (last_nonfinite_.empty()) last_nonfinite_ = st.first_nonfinite + " in " + optimizer.name();
    return false;
  }
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!is_enabled()) return;
  // Every inf check counts, also an unscale_ whose step() the caller left out (as in PyTorch).
  bool checked = false, found = false, on_device = false;
  for (const auto& [opt, st] : per_optimizer_) {
    checked = checked || st.unscaled;
    found = found || st.found_nonfinite();
    on_device = on_device || st.found_on_device.defined();
  }
  ND_CHECK(checked, "GradScaler.update: no step() or unscale_() since the last update(), so there is nothing to "
           "adjust the scale by (call scaler.step(optimizer) first)");
  if (on_device) return update_on_device();
  pull();
  kernels::optim_math::update_scale(scale_, growth_tracker_, found, options_.growth_factor(), options_.backoff_factor(),
                                    options_.growth_interval());
  skipped_ = found;
  if (on_device_.scale.defined()) push();
  if (found) {
    ++skipped_in_a_row_;
    if (skipped_in_a_row_ >= kWarnAfterSkips && !warned_) {
      warned_ = true;
      warn("GradScaler: the last " + std::to_string(skipped_in_a_row_) +
           " optimizer steps were all skipped for non-finite gradients (latest: " + last_nonfinite_ +
           "), and the scale fell to " + std::to_string(scale_) +
           ". An f16 overflow does not last this long: a NaN or inf in the model, its inputs or the loss keeps "
           "every step skipped, so the model no longer trains.");
    }
  } else {
    skipped_in_a_row_ = 0;
  }
  last_nonfinite_.clear();
  per_optimizer_.clear();
}

void GradScaler::unscale_on_device(Optimizer& optimizer, OptimizerState& st) {
  // One flag for the optimizer's gradients, zeroed by the captured step itself; the factor
  // read from the device's scale as each replay runs.
  std::map<ScalarType, std::vector<Tensor>> by_dtype;
  for (const auto& group : optimizer.param_groups())
    for (const Tensor& p : group.params()) {
      if (!p.impl().grad) continue;
      const Tensor g = unscalable_grad(p, optimizer);
      ND_CHECK(g.is_cuda() && on_device_.scale.defined() && g.device() == on_device_.scale.device(),
               "GradScaler.unscale_: cannot capture the unscale of ", g.describe(), " of parameter ", p.describe(),
               " (a CUDA graph captures gradients on the device of the scaler's eager warm-up step, ",
               on_device_.scale.defined() ? on_device_.scale.device().str() : std::string("none yet"), ")");
      by_dtype[g.dtype()].push_back(g);
      ops::bump_version(g, "GradScaler.unscale_");
    }
  st.found_on_device = zeros({}, TensorOptions(kInt32).device(on_device_.scale.device()));
  for (auto& entry : by_dtype) {
    const std::vector<Tensor>& grads = entry.second;
    ops::dispatch_floating("GradScaler.unscale_", grads.front(), [&]<class T>() {
      std::vector<kernels::cuda::UnscaleTensor<T>> tensors;
      for (const Tensor& g : grads) tensors.push_back({g.numel(), g.data_ptr<T>(), st.found_on_device.data_ptr<int32_t>()});
      ops::on_device(grads.front(), [] {}, [&](auto stream) {
        kernels::cuda::unscale_grad<T>(grads.front().device().index, tensors, T(0), stream,
                                       on_device_.scale.data_ptr<double>());
      });
    });
  }
  st.unscaled = true;
}

void GradScaler::update_on_device() {
  kernels::cuda::ScaleUpdate u;
  u.scale = on_device_.scale.data_ptr<double>();
  u.growth_tracker = on_device_.growth_tracker.data_ptr<double>();
  u.found_any = on_device_.found_any.data_ptr<int32_t>();
  for (const auto& [opt, st] : per_optimizer_) {
    ND_CHECK(st.found_on_device.defined(), "GradScaler.update: ", opt->name(), " was unscaled outside the CUDA graph "
             "being captured and the others inside it: capture every unscale_ and step() of the iteration");
    ND_CHECK(u.num_found < kernels::cuda::ScaleUpdate::kMaxFound, "GradScaler.update: a captured update takes at most ",
             kernels::cuda::ScaleUpdate::kMaxFound, " optimizers, found ", per_optimizer_.size());
    u.found[u.num_found++] = st.found_on_device.data_ptr<int32_t>();
  }
  u.growth_factor = options_.growth_factor();
  u.backoff_factor = options_.backoff_factor();
  u.growth_interval = options_.growth_interval();
  ops::on_device(on_device_.scale, [] {}, [&](auto stream) {
    kernels::cuda::update_scale(on_device_.scale.device().index, u, stream);
  });
  on_device_.replayed = true;
  last_nonfinite_.clear();
  per_optimizer_.clear();
}

TensorDict GradScaler::state_dict() const {
  if (!is_enabled()) return {};
  const TensorOptions f64(kFloat64);
  return {{"scale", scalar_tensor(get_scale(), f64)},
          {"growth_factor", scalar_tensor(options_.growth_factor(), f64)},
          {"backoff_factor", scalar_tensor(options_.backoff_factor(), f64)},
          {"growth_interval", scalar_tensor(static_cast<double>(options_.growth_interval()), f64)},
          {"_growth_tracker", scalar_tensor(static_cast<double>(growth_tracker()), f64)}};
}

void GradScaler::load_state_dict(const TensorDict& state) {
  if (!is_enabled()) return;
  auto get = [&](const char* key) {
    const auto it = state.find(key);
    ND_CHECK(it != state.end(), "GradScaler.load_state_dict: missing key '", key, "'");
    ND_CHECK(it->second.numel() == 1, "GradScaler.load_state_dict: expected one value for '", key, "', found ",
             it->second.describe());
    return it->second.to(Device(kCPU)).item();
  };
  GradScaler loaded(GradScalerOptions()
                        .init_scale(get("scale"))
                        .growth_factor(get("growth_factor"))
                        .backoff_factor(get("backoff_factor"))
                        .growth_interval(static_cast<int64_t>(get("growth_interval"))));
  const double tracker = get("_growth_tracker");
  ND_CHECK(tracker >= 0 && tracker < static_cast<double>(loaded.options_.growth_interval()),
           "GradScaler.load_state_dict: expected _growth_tracker in [0, growth_interval), found ", tracker);
  options_ = loaded.options_;
  scale_ = loaded.scale_;
  growth_tracker_ = static_cast<int64_t>(tracker);
  skipped_in_a_row_ = 0;
  skipped_ = false;
  per_optimizer_.clear();
  if (on_device_.scale.defined()) {
    on_device_.replayed = false;
    push();
  }
}

}  // namespace nd::optim
