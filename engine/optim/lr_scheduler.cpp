#include "engine/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"
#include "engine/factories.h"

namespace nd::optim {

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (const auto& g : optimizer.param_groups()) base_lrs_.push_back(g.options().get_lr());
}

void LRScheduler::apply(int64_t epoch) {
  auto& groups = optimizer_.param_groups();
  ND_CHECK(groups.size() == base_lrs_.size(), "LRScheduler: the optimizer has ", groups.size(),
           " param groups but the scheduler was built for ", base_lrs_.size());
  for (size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(lr_at(epoch, base_lrs_[i]));
}

void LRScheduler::step() { apply(++last_epoch_); }

std::vector<double> LRScheduler::get_last_lr() const {
  std::vector<double> out;
  for (const auto& g : optimizer_.param_groups()) out.push_back(g.options().get_lr());
  return out;
}

TensorDict LRScheduler::state_dict() const {
  return {{"last_epoch", scalar_tensor(static_cast<double>(last_epoch_), kFloat64)}};
}

void LRScheduler::load_state_dict(const TensorDict& state) {
  auto it = state.find("last_epoch");
  ND_CHECK(it != state.end(), "LRScheduler.load_state_dict: missing key 'last_epoch'");
  last_epoch_ = static_cast<int64_t>(it->second.item());
  apply(last_epoch_);
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  ND_CHECK(step_size > 0, "StepLR: step_size must be positive, found ", step_size);
}
double StepLR::lr_at(int64_t epoch, double base_lr) const {
  return base_lr * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min)
    : LRScheduler(optimizer), T_max_(T_max), eta_min_(eta_min) {
  ND_CHECK(T_max > 0, "CosineAnnealingLR: T_max must be positive, found ", T_max);
}
double CosineAnnealingLR::lr_at(int64_t epoch, double base_lr) const {
  return eta_min_ + (base_lr - eta_min_) * (1 + std::cos(M_PI * static_cast<double>(epoch) / T_max_)) / 2;
}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(optimizer), start_(start_factor), end_(end_factor), total_(total_iters) {
  ND_CHECK(start_factor > 0 && start_factor <= 1, "LinearLR: start_factor must be in (0, 1], found ", start_factor);
  ND_CHECK(end_factor >= 0 && end_factor <= 1, "LinearLR: end_factor must be in [0, 1], found ", end_factor);
  ND_CHECK(total_iters > 0, "LinearLR: total_iters must be positive, found ", total_iters);
  apply(0);
}
double LinearLR::lr_at(int64_t epoch, double base_lr) const {
  const double t = static_cast<double>(std::min(epoch, total_)) / static_cast<double>(total_);
  return base_lr * (start_ + (end_ - start_) * t);
}

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  ND_CHECK(!schedulers_.empty() && milestones_.size() + 1 == schedulers_.size(), "SequentialLR: expected ",
           schedulers_.size() ? schedulers_.size() - 1 : 0, " milestones for ", schedulers_.size(),
           " schedulers, found ", milestones_.size());
  ND_CHECK(std::is_sorted(milestones_.begin(), milestones_.end()), "SequentialLR: milestones must be increasing");
  base_lrs_ = schedulers_[0]->base_lrs();  // the sub-schedulers already moved the live lr
  apply(0);
}
double SequentialLR::lr_at(int64_t epoch, double base_lr) const {
  size_t i = 0;
  while (i < milestones_.size() && epoch >= milestones_[i]) ++i;
  const int64_t start = i == 0 ? 0 : milestones_[i - 1];
  return schedulers_[i]->lr_at(epoch - start, base_lr);
}

}  // namespace nd::optim
