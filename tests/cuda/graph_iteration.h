#pragma once
// What a mixed-precision training iteration leaves, for the CUDA graph tests
// (cuda_graph_step_test.cpp, cuda_graph_gan_test.cpp), which compare each replay with the
// eager step bit for bit: its loss(es), the GradScaler's scale after it and whether its step
// was skipped (read after the replay: the scaler decided on the device).
#include "harness.h"

namespace nd::testing {

struct ScaledIteration {
  Tensor loss;  // on the CPU
  double scale;
  bool skipped;
};

inline ScaledIteration iteration_of(const Tensor& loss, const optim::GradScaler& scaler) {
  return {loss.cpu(), scaler.get_scale(), scaler.skipped()};
}

inline void check_same_iteration(const ScaledIteration& got, const ScaledIteration& want) {
  CHECK(bitwise_equal(got.loss, want.loss));
  CHECK(got.scale == want.scale);
  CHECK(got.skipped == want.skipped);
}

// Iteration i's input holds an inf, or its loss is multiplied by one: its gradients are not
// finite, so its steps are skipped and the scale backed off.
inline constexpr int kNonFiniteIteration = 4;

}  // namespace nd::testing
