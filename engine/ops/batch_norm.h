#pragma once
// batch_norm (LibTorch: torch::batch_norm) over [N, C, *]: per-channel statistics over
// N and the spatial dims. Backward node: NativeBatchNormBackward.
#include "engine/tensor.h"

namespace nd {

// training: y = (x - mean_B) / sqrt(var_B + eps) * weight + bias with the batch's biased
//   variance; running stats (when given) are updated in place, bumping their versions:
//   running_mean = (1 - momentum) running_mean + momentum mean_B,
//   running_var  = (1 - momentum) running_var  + momentum var_B * n / (n - 1).
// eval:     the same with running_mean / running_var in place of the batch statistics.
// requires: input [N, C, *]; running_mean, running_var [C] (both or neither; required
//           in eval); weight, bias [C] or undefined.
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                  double eps = 1e-5);

}  // namespace nd
