#pragma once
// Optimizer base: parameter groups with per-group options, per-parameter state,
// a step that runs under NoGradGuard and bumps each parameter's version under the
// label "<Name>.step" (so a stale graph reports "last modified by Adam.step"),
// and a state_dict of plain tensors that checkpoints can store.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace nd::optim {

// Options every optimizer has; each optimizer extends it. Numeric options are
// exposed by name so param groups can be saved, loaded and scheduled uniformly.
struct OptimizerOptions {
  virtual ~OptimizerOptions() = default;
  virtual std::unique_ptr<OptimizerOptions> clone() const = 0;
  virtual std::map<std::string, double> to_map() const = 0;
  virtual void from_map(const std::map<std::string, double>& values) = 0;
  virtual double get_lr() const = 0;
  virtual void set_lr(double lr) = 0;
};

struct OptimizerParamGroup {
  OptimizerParamGroup(std::vector<Tensor> params) : params_(std::move(params)) {}
  OptimizerParamGroup(std::vector<Tensor> params, const OptimizerOptions& options)
      : params_(std::move(params)), options_(options.clone()) {}
  OptimizerParamGroup(const OptimizerParamGroup& o)
      : params_(o.params_), options_(o.options_ ? o.options_->clone() : nullptr) {}
  std::vector<Tensor>& params() { return params_; }
  const std::vector<Tensor>& params() const { return params_; }
  OptimizerOptions& options() const { return *options_; }
  bool has_options() const { return options_ != nullptr; }
  void set_options(std::unique_ptr<OptimizerOptions> o) { options_ = std::move(o); }

 private:
  std::vector<Tensor> params_;
  std::unique_ptr<OptimizerOptions> options_;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient. When none has one, warns once
  // (naming the optimizer and its parameter count): a model that never trains.
  // Virtual, as state_dict and load_state_dict, for dist::ZeroRedundancyOptimizer, which
  // steps only its rank's shard and gathers the rest.
  virtual void step();
  // step(), with every CUDA kernel of it skipping its update (parameters, state, step counts)
  // when `found_inf`, an int32 scalar on the parameters' device, holds a nonzero value as the
  // kernel runs: GradScaler's skip decided on the device, which a CUDA graph can capture
  // (docs/cuda_graphs.md). An nd::Error when a parameter is not on found_inf's device, or
  // when this optimizer's step did not take the flag (dist::ZeroRedundancyOptimizer's).
  void step_unless(const Tensor& found_inf);
  void zero_grad(bool set_to_none = true);
  void add_param_group(const OptimizerParamGroup& group);
  std::vector<OptimizerParamGroup>& param_groups() { return groups_; }
  const std::vector<OptimizerParamGroup>& param_groups() const { return groups_; }
  int64_t num_parameters() const;
  // Bytes of the state buffers this process holds ("exp_avg", "momentum_buffer", ...; not the
  // step counts): what the optimizer adds to memory. dist::ZeroRedundancyOptimizer's is its
  // rank's shard.
  virtual int64_t state_bytes() const;
  const std::string& name() const { return name_; }
  // Counts the load_state_dict calls: each replaces the state tensors (so a CUDA graph captured
  // before it would update the old ones; nd::cuda::GraphedStep refuses that).
  int64_t state_generation() const { return state_generation_; }
  // The first-step hooks (register_first_step_hook) will not run for this optimizer: for
  // one that steps a part of another's parameters (dist::ZeroRedundancyOptimizer's shard),
  // which the hooks see as the other.
  void skip_first_step_hooks() { first_step_taken_ = true; }

  // "state.<k>.step", "state.<k>.<buffer>" (k = parameter index across groups, as
  // PyTorch numbers them) and "param_groups.<g>.<option>", all tensors.
  virtual TensorDict state_dict() const;
  // Restores state saved by state_dict(); the groups must hold the same number of
  // parameters of the same shapes, else an nd::Error says which differs.
  virtual void load_state_dict(const TensorDict& state);
  // One entry of such a state, checked against `params` (every group's, in order) and
  // `num_groups`: "state.3.exp_avg" -> {"state", 3, "exp_avg"}. A malformed key, an index
  // out of range or a buffer not of its parameter's shape is an nd::Error naming `optimizer`.
  struct StateKey {
    std::string kind;  // "state" or "param_groups"
    int64_t index = -1;
    std::string field;
  };
  static StateKey parse_state_key(const std::string& optimizer, const std::string& key, const Tensor& value,
                                  const std::vector<Tensor>& params, size_t num_groups);

 protected:
  struct ParamState {
    int64_t step = 0;
    // Adam on a CUDA parameter: the count of steps taken, an f64 scalar on its device that the
    // step kernel increments (so a CUDA graph's replay counts on); it then holds the count and
    // `step` only the one it was created from (0, or a loaded state's).
    Tensor step_on_device;
    std::map<std::string, Tensor> buffers;  // "momentum_buffer", "exp_avg", ...
    int64_t steps_taken() const;
  };
  Optimizer(std::string name, std::vector<OptimizerParamGroup> groups, const OptimizerOptions& defaults);
  struct ParamUpdate {
    Tensor param, grad;  // contiguous, same dtype, shape and device
    ParamState* state;
  };
  // Updates every parameter of one group that has a gradient, given in the group's order.
  // Our optimizers update many at once: one multi-tensor kernel per device and dtype.
  virtual void update(const OptimizerOptions& options, std::vector<ParamUpdate>& params) = 0;
  // `params` split by (device, dtype), each list in the group's order.
  static std::vector<std::vector<ParamUpdate*>> by_device(std::vector<ParamUpdate>& params);
  // The flag of step_unless for the kernels updating `param` (null outside step_unless);
  // taking it marks the flag used.
  const int32_t* skip_flag(const Tensor& param);

 private:
  std::string name_;
  std::unique_ptr<OptimizerOptions> defaults_;
  std::vector<OptimizerParamGroup> groups_;
  std::map<const TensorImpl*, ParamState> state_;
  Tensor skip_if_;  // step_unless's flag while it runs
  bool skip_taken_ = false;
  bool warned_no_grad_ = false;
  int64_t state_generation_ = 0;
  bool first_step_taken_ = false;
};

// Called with every optimizer at the start of its first step() (PyTorch's global
// register_optimizer_step_pre_hook, first step only), in registration order; an nd::Error
// it throws leaves the step undone. Process-wide and never removed: what
// NANODDP_DISTRIBUTED_DEBUG=DETAIL registers to compare the ranks' optimizer options.
void register_first_step_hook(std::function<void(const Optimizer&)> hook);

}  // namespace nd::optim
