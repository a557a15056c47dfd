#include "models/recipes.h"

#include <cmath>
#include <numbers>

#include "engine/error.h"

namespace nd::models {

std::vector<optim::OptimizerParamGroup> mae_param_groups(const nn::Module& model, double lr, double weight_decay) {
  ND_CHECK(weight_decay >= 0, "mae_param_groups: weight_decay must be >= 0, found ", weight_decay);
  std::vector<Tensor> decay, no_decay;
  for (const auto& [name, p] : model.named_parameters()) {
    if (!p.requires_grad()) continue;
    const bool bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    (p.dim() == 1 || bias ? no_decay : decay).push_back(p);
  }
  std::vector<optim::OptimizerParamGroup> groups;
  groups.emplace_back(no_decay, mae_adamw_options(lr).weight_decay(0));
  groups.emplace_back(decay, mae_adamw_options(lr).weight_decay(weight_decay));
  return groups;
}

optim::AdamWOptions mae_adamw_options(double lr) { return optim::AdamWOptions(lr).betas({0.9, 0.95}).weight_decay(0.05); }

double mae_lr(int64_t effective_batch, double blr) {
  ND_CHECK(effective_batch > 0 && blr > 0, "mae_lr: expected a positive effective batch and blr, found ",
           effective_batch, " and ", blr);
  return blr * static_cast<double>(effective_batch) / 256.0;
}

MAEWarmupCosineLR::MAEWarmupCosineLR(optim::Optimizer& optimizer, int64_t warmup, int64_t total, double min_lr)
    : LRScheduler(optimizer), warmup_(warmup), total_(total), min_lr_(min_lr) {
  ND_CHECK(warmup >= 0 && warmup < total, "MAEWarmupCosineLR: expected 0 <= warmup < total, found warmup ", warmup,
           ", total ", total);
  ND_CHECK(min_lr >= 0, "MAEWarmupCosineLR: min_lr must be >= 0, found ", min_lr);
  apply(0);
}

double MAEWarmupCosineLR::lr_at(int64_t step, double base_lr) const {
  if (step < warmup_) return base_lr * static_cast<double>(step) / static_cast<double>(warmup_);
  const double t = static_cast<double>(std::min(step, total_) - warmup_) / static_cast<double>(total_ - warmup_);
  return min_lr_ + (base_lr - min_lr_) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
}

optim::AdamOptions dcgan_adam_options() { return optim::AdamOptions(2e-4).betas({0.5, 0.999}); }

}  // namespace nd::models
