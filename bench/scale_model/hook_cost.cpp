#include "scale_model/hook_cost.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "collectives/local_process_group.h"

namespace nd::scale {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

HookCost time_hook(const DdpModel& model, const std::vector<size_t>& members, const Options& o, int reps) {
  ND_CHECK(o.hook == "bf16" || o.hook == "fp16" || o.hook == "powersgd", "time_hook: expected a hook (bf16, fp16 or ",
           "powersgd), found '", o.hook, "'");
  ND_CHECK(reps >= 1 && !members.empty(), "time_hook: expected reps >= 1 and a bucket of parameters, found reps ",
           reps, " and ", members.size(), " parameters");
  NoGradGuard no_grad;
  int64_t n = 0;
  for (size_t i : members) n += model.params.at(i).numel();
  Generator gen{3, 0};
  const Tensor buffer = randn({n}, o.grad_dtype, &gen);
  std::vector<Tensor> params, grads;
  int64_t offset = 0;
  for (size_t i : members) {
    const Tensor& p = model.params[i];
    grads.push_back(buffer.narrow(0, offset, p.numel()).view(p.sizes()));
    params.push_back(empty({0}).set_name(model.name + "." + std::to_string(i)));  // PowerSGD's key
    offset += p.numel();
  }
  auto group = std::make_shared<dist::LocalProcessGroup>();
  dist::GradBucket bucket(0, buffer, params, grads, true, group);
  auto state = std::make_shared<dist::PowerSGDState>(
      dist::PowerSGDOptions().matrix_approximation_rank(std::max(1, o.powersgd_rank)).start_powerSGD_iter(0));
  auto hook = [&] {
    if (o.hook == "powersgd") return dist::powerSGD_hook(state.get(), bucket);
    return o.hook == "bf16" ? dist::bf16_compress_hook(nullptr, bucket) : dist::fp16_compress_hook(nullptr, bucket);
  };
  std::vector<double> launch, wait;
  for (int i = 0; i < reps + 2; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::shared_ptr<dist::FutureWork> work = hook();
    const double l = seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    work->value();
    const double w = seconds_since(t1);
    if (i >= 2) launch.push_back(l), wait.push_back(w);
  }
  return {median(launch), median(wait)};
}

HookCost MeasuredHookCosts::operator()(const DdpModel& model, const std::vector<size_t>& members, const Options& o) {
  const auto key = std::make_tuple(model.name, members, o.hook, o.powersgd_rank);
  auto it = seen_.find(key);
  if (it == seen_.end()) it = seen_.emplace(key, time_hook(model, members, o)).first;
  return it->second;
}

}  // namespace nd::scale
