#pragma once
// SGD with momentum, dampening, Nesterov and weight decay (torch.optim.SGD).
#include "engine/optim/optimizer.h"

namespace nd::optim {

struct SGDOptions : OptimizerOptions {
  explicit SGDOptions(double lr) : lr_(lr) {}
  SGDOptions& lr(double v) { lr_ = v; return *this; }
  SGDOptions& momentum(double v) { momentum_ = v; return *this; }
  SGDOptions& dampening(double v) { dampening_ = v; return *this; }
  SGDOptions& weight_decay(double v) { weight_decay_ = v; return *this; }
  SGDOptions& nesterov(bool v) { nesterov_ = v; return *this; }
  double lr() const { return lr_; }

  std::unique_ptr<OptimizerOptions> clone() const override { return std::make_unique<SGDOptions>(*this); }
  std::map<std::string, double> to_map() const override;
  void from_map(const std::map<std::string, double>& values) override;
  double get_lr() const override { return lr_; }
  void set_lr(double lr) override { lr_ = lr; }

  double lr_, momentum_ = 0, dampening_ = 0, weight_decay_ = 0;
  bool nesterov_ = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<OptimizerParamGroup> groups, const SGDOptions& defaults);
  SGD(std::vector<Tensor> params, const SGDOptions& defaults)
      : SGD(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))}, defaults) {}

 protected:
  // One sgd_step per device and dtype (on a GPU: one kernel launch for them all).
  void update(const OptimizerOptions& options, std::vector<ParamUpdate>& params) override;
};

}  // namespace nd::optim
