#pragma once
// Adam (L2 weight decay folded into the gradient) and AdamW (decoupled weight
// decay), with optional AMSGrad: torch.optim.Adam / torch.optim.AdamW.
#include <utility>

#include "engine/optim/optimizer.h"
#include "kernels/cpu/optim.h"

namespace nd::optim {

struct AdamOptions : OptimizerOptions {
  explicit AdamOptions(double lr = 1e-3) : lr_(lr) {}
  AdamOptions& lr(double v) { lr_ = v; return *this; }
  AdamOptions& betas(std::pair<double, double> v) { betas_ = v; return *this; }
  AdamOptions& eps(double v) { eps_ = v; return *this; }
  AdamOptions& weight_decay(double v) { weight_decay_ = v; return *this; }
  AdamOptions& amsgrad(bool v) { amsgrad_ = v; return *this; }

  std::unique_ptr<OptimizerOptions> clone() const override { return std::make_unique<AdamOptions>(*this); }
  std::map<std::string, double> to_map() const override;
  void from_map(const std::map<std::string, double>& values) override;
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }

  double lr_;
  std::pair<double, double> betas_{0.9, 0.999};
  double eps_ = 1e-8, weight_decay_ = 0;
  bool amsgrad_ = false;
};

// AdamW's only difference in options: weight decay defaults to 0.01. The setters are
// repeated so that a chain stays an AdamWOptions: AdamWOptions(1e-3).betas({0.9, 0.95}).
struct AdamWOptions : AdamOptions {
  explicit AdamWOptions(double lr = 1e-3) : AdamOptions(lr) { weight_decay_ = 1e-2; }
  AdamWOptions& lr(double v) { AdamOptions::lr(v); return *this; }
  AdamWOptions& betas(std::pair<double, double> v) { AdamOptions::betas(v); return *this; }
  AdamWOptions& eps(double v) { AdamOptions::eps(v); return *this; }
  AdamWOptions& weight_decay(double v) { AdamOptions::weight_decay(v); return *this; }
  AdamWOptions& amsgrad(bool v) { AdamOptions::amsgrad(v); return *this; }
  std::unique_ptr<OptimizerOptions> clone() const override { return std::make_unique<AdamWOptions>(*this); }
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<OptimizerParamGroup> groups, const AdamOptions& defaults);
  Adam(std::vector<Tensor> params, const AdamOptions& defaults)
      : Adam(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))}, defaults) {}

 protected:
  Adam(std::string name, std::vector<OptimizerParamGroup> groups, const AdamOptions& defaults, bool decoupled);
  // One adam_step per device and dtype (on a GPU: one kernel launch for them all).
  void update(const OptimizerOptions& options, std::vector<ParamUpdate>& params) override;

 private:
  // Creates the state buffers on first use and counts a CPU parameter's step; a CUDA
  // parameter's count is an f64 on its device (ParamState::step_on_device), created here and
  // counted by the step kernel, so a CUDA graph can capture the step (PyTorch's capturable).
  void begin_step(const OptimizerOptions& options, const Tensor& param, ParamState& state);
  bool decoupled_ = false;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<OptimizerParamGroup> groups, const AdamWOptions& defaults)
      : Adam("AdamW", std::move(groups), defaults, /*decoupled=*/true) {}
  AdamW(std::vector<Tensor> params, const AdamWOptions& defaults)
      : AdamW(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))}, defaults) {}
};

}  // namespace nd::optim
