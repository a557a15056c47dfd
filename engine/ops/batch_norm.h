#pragma once
// batch_norm (LibTorch: torch::batch_norm) over [N, C, *]: per-channel statistics over
// N and the spatial dims. Backward node: NativeBatchNormBackward. sync_batch_norm: the
// same with statistics over several processes, the op behind nn::SyncBatchNorm
// (collectives/sync_batch_norm.h, which passes its process group's all-reduce). Backward
// node: SyncBatchNormBackward.
#include <functional>

#include "engine/tensor.h"
#include "kernels/common/batch_norm_activation.h"

namespace nd {

// none, ReLU or LeakyReLU (negative_slope >= 0) applied to batch_norm's output in the same
// pass: batch_norm(..., {Kind::relu}) equals relu(batch_norm(...)) bit for bit, forward and
// backward, in one launch fewer each way on CUDA (kernels/common/batch_norm_activation.h).
using kernels::BatchNormActivation;

// training: y = (x - mean_B) / sqrt(var_B + eps) * weight + bias with the batch's biased
//   variance; running stats (when given) are updated in place, bumping their versions:
//   running_mean = (1 - momentum) running_mean + momentum mean_B,
//   running_var  = (1 - momentum) running_var  + momentum var_B * n / (n - 1).
// eval:     the same with running_mean / running_var in place of the batch statistics.
// activation: y = act(...) (the backward takes the activation's gradient from y).
// requires: input [N, C, *]; running_mean, running_var [C] (both or neither; required
//           in eval); weight, bias [C] or undefined; activation's negative_slope >= 0.
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                  double eps = 1e-5, BatchNormActivation activation = {});

// Sums the f64 tensor t over every process taking part, in place (on a GPU the kernels
// queued after it wait for it); `what` names the sums ("statistics", "gradient sums").
using AllReduceSum = std::function<void(const Tensor& t, const char* what)>;

// Forward: per channel (count, sum x, sum x^2) in f64 over this process's values, summed by
// `allreduce` (one call, 3*C values), then mean and biased variance of all processes' values,
// y = (x - mean) / sqrt(var + eps) * weight + bias, and running stats updated as batch_norm
// does. Backward: (sum dy, sum dy (x - mean)) summed the same way (one call, 2*C values).
// So N processes on N shards compute batch_norm on the concatenated batch, unequal shards
// included. `world_size` processes take part; allreduce null or world_size 1: this one alone.
// requires: input [N, C, *]; running_mean, running_var [C] (both or neither); weight, bias
//           [C] or undefined; more than one value per channel over all processes.
Tensor sync_batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, double momentum, double eps,
                       const AllReduceSum& allreduce, int world_size);

}  // namespace nd
