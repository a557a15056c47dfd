#pragma once
// Learning-rate schedulers as closed forms of the epoch (torch.optim.lr_scheduler):
// lr(epoch) = f(epoch, base_lr). Closed forms compose exactly (SequentialLR) and
// resume exactly (the state is one integer).
#include <memory>
#include <vector>

#include "engine/optim/optimizer.h"

namespace nd::optim {

class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& optimizer);
  virtual ~LRScheduler() = default;
  // Advances one epoch (or step) and writes the new lr into every param group.
  void step();
  std::vector<double> get_last_lr() const;
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  // The lr of a group with base lr `base_lr` at `epoch` (epoch 0 = construction).
  virtual double lr_at(int64_t epoch, double base_lr) const = 0;

  TensorDict state_dict() const;  // {"last_epoch"}
  void load_state_dict(const TensorDict& state);

 protected:
  void apply(int64_t epoch);
  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = 0;
};

// lr = base * gamma^floor(epoch / step_size)
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t epoch, double base_lr) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = eta_min + (base - eta_min) (1 + cos(pi epoch / T_max)) / 2
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0);
  double lr_at(int64_t epoch, double base_lr) const override;

 private:
  int64_t T_max_;
  double eta_min_;
};

// Linear warmup: lr = base * (start + (end - start) min(epoch, total_iters) / total_iters)
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5);
  double lr_at(int64_t epoch, double base_lr) const override;

 private:
  double start_, end_;
  int64_t total_;
};

// Runs schedulers one after another: scheduler i is used from milestone i-1 on, with
// its epoch counted from that milestone (e.g. LinearLR warmup, then CosineAnnealingLR).
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  double lr_at(int64_t epoch, double base_lr) const override;

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

}  // namespace nd::optim
