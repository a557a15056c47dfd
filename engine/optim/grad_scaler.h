#pragma once
// Loss scaling for f16 mixed precision: torch.amp.GradScaler, same options, same rules.
// Under f16 autocast (engine/autocast.h) the backward rounds every gradient that enters a
// product to f16, whose smallest value is 6e-8: the small gradients of a deep model vanish.
// Multiplying the loss by a large power of two (the scale) lifts them into f16's range;
// the gradients are divided by it again before the optimizer step:
//
//   GradScaler scaler;
//   scaler.scale(loss).backward();
//   scaler.step(optimizer);     // unscale_, then optimizer.step() unless a gradient is inf/NaN
//   scaler.update();            // halve the scale after a skipped step, double it after
//                               // growth_interval good steps
//
// The scale is a power of two, so scaling and unscaling f32 gradients is exact: in f32 a run
// with the scaler ends bit-identical to one without it, as long as nothing overflows.
// A gradient that is inf or NaN after backward means the scale was too large: that step is
// skipped (no parameter or optimizer state changes) and update() halves the scale.
// Several optimizers share one scaler (a GAN's G and D): unscale_ and step each of them,
// then one update(); a skip on either halves the scale for both.
// Under DDP every rank holds the same averaged gradients after backward (an inf on one rank
// is inf in the average), so every rank skips the same steps without an extra collective.
// Beyond PyTorch: a scaler that skips kWarnAfterSkips steps in a row warns once, naming the
// first non-finite gradient: a NaN in the model or the loss, not an f16 overflow, keeps every
// step skipped and the model silently stops training (docs/traps.md, trap 9).
// Under a CUDA graph capture (docs/cuda_graphs.md) the host cannot read the non-finite
// flags: the scale and the count of good steps then also live on the loss's device (made by
// the first eager scale() of a CUDA loss, kept equal to the host's by every eager update()),
// unscale_ reads the scale there and leaves its answer in a device flag, step() passes the flag
// to the optimizer's kernels (Optimizer::step_unless) and update() adjusts the scale in a
// kernel. After a replay get_scale(), growth_tracker(), skipped() and state_dict() read the
// device's values. The warning about skipped steps counts eager steps only.
// Tests: tests/optim/grad_scaler_test.cpp, tests/dist (2 ranks), tests/emu/optim_emu_test.cpp,
// tests/cuda/cuda_graph_step_test.cpp (captured).
#include <map>
#include <string>

#include "engine/nn/module.h"  // ND_ARG
#include "engine/optim/optimizer.h"

namespace nd::optim {

struct GradScalerOptions {
  GradScalerOptions() = default;
  ND_ARG(double, init_scale) = 65536.0;  // 2^16
  ND_ARG(double, growth_factor) = 2.0;
  ND_ARG(double, backoff_factor) = 0.5;
  ND_ARG(int64_t, growth_interval) = 2000;
  // Disabled, every call passes through: scale() returns the loss, step() is optimizer.step().
  ND_ARG(bool, enabled) = true;
};

class GradScaler {
 public:
  static constexpr int64_t kWarnAfterSkips = 20;

  // An nd::Error for init_scale <= 0 or not finite, growth_factor <= 1, backoff_factor
  // outside (0, 1), growth_interval < 1.
  explicit GradScaler(const GradScalerOptions& options = {});

  // loss * scale (recorded for backward), or `loss` when disabled.
  Tensor scale(const Tensor& loss) const;
  // Divides every gradient of `optimizer` by the scale, in place, and records whether one
  // of them was inf or NaN. Once per optimizer between update()s and before its step();
  // call it yourself to clip or inspect unscaled gradients, else step() calls it.
  void unscale_(Optimizer& optimizer);
  // optimizer.step() unless one of its gradients was non-finite; returns whether it stepped.
  // Once per optimizer between update()s. While a CUDA graph is captured: always true, the
  // skip is decided on the device as each replay runs (skipped() tells after it).
  bool step(Optimizer& optimizer);
  // After the step()s of an iteration: scale *= backoff_factor if any of them was skipped
  // (and the count of good steps restarts), else one more good step, and scale *=
  // growth_factor after growth_interval good steps in a row (unless that overflows).
  // Every unscale_ counts, with or without its step(). An nd::Error when neither ran since
  // the last update().
  void update();

  bool is_enabled() const { return options_.enabled(); }
  double get_scale() const;
  int64_t growth_tracker() const;
  // Whether the last update() saw a non-finite gradient (its iteration's steps were skipped).
  bool skipped() const;
  // Steps skipped in a row (update()s that saw a non-finite gradient since the last good one).
  int64_t skipped_in_a_row() const { return skipped_in_a_row_; }

  // "scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker" (f64
  // scalars, PyTorch's keys); empty when disabled.
  TensorDict state_dict() const;
  // Restores a state_dict(); a missing or non-scalar key is an nd::Error naming it.
  void load_state_dict(const TensorDict& state);

 private:
  struct OptimizerState {
    bool unscaled = false, stepped = false;
    Tensor found_on_device;  // int32, under capture: set by unscale_ when a gradient was not finite
    std::string first_nonfinite;  // the first parameter whose gradient was inf or NaN, if any
    bool found_nonfinite() const { return !first_nonfinite.empty(); }
  };
  void check_options() const;
  // The device's state, for a captured step: made by the first eager scale() of a CUDA loss.
  struct OnDevice {
    Tensor scale, growth_tracker;  // f64 scalars
    Tensor found_any;              // int32: the last update()'s answer
    bool replayed = false;         // a capture's update() was recorded: the device holds the truth
  };
  // Sets the device's values to the host's (eager: fill kernels, no wait), and the host's to
  // the device's after replays (a read).
  void push() const;
  void pull();
  bool device_holds_truth() const { return on_device_.scale.defined() && on_device_.replayed && !capturing(); }
  static bool capturing();
  void unscale_on_device(Optimizer& optimizer, OptimizerState& st);
  void update_on_device();

  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0, skipped_in_a_row_ = 0;
  bool warned_ = false, skipped_ = false;
  mutable OnDevice on_device_;
  std::string last_nonfinite_;
  std::map<const Optimizer*, OptimizerState> per_optimizer_;
};

}  // namespace nd::optim
