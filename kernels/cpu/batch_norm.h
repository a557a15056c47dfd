#pragma once
// Batch normalisation over [N, C, S] (S = H*W for NCHW, 1 for [N, C]), PyTorch semantics.
//
// Why pieces: SyncBatchNorm combines per-channel statistics across ranks, so each step
// that touches the data is its own function and the single-process entry points
// (batch_norm_forward_training / _eval / batch_norm_backward) are built from them:
//   forward:  channel_stats (count = N*S, sum x, sum x^2 in f64)  --all-reduce-->
//             stats_to_mean_invstd (+ running-stat update)  -->  apply
//   backward: backward_reduce (sum dy, sum dy*(x-mean) in f64)  --all-reduce-->
//             backward_elemt (dx given the global sums and the global count)
// Statistics travel in double so that sum-of-squares variance stays accurate for f32
// data and so that ranks with unequal batch sizes combine exactly.
#include <cstdint>

#include "kernels/common/batch_norm_activation.h"

namespace nd::kernels::cpu {

// sum[c] = sum_{n,s} x[n,c,s],  sumsq[c] = sum_{n,s} x[n,c,s]^2   (count is N*S).
// requires: x [N, C, S]; sum, sumsq [C].  ensures: writes sum, sumsq.
template <typename T>
void batch_norm_channel_stats(const T* x, int64_t N, int64_t C, int64_t S, double* sum,
                              double* sumsq);

// mean = sum/count, var = sumsq/count - mean^2 (biased), invstd = 1/sqrt(var + eps).
// Running stats (PyTorch momentum convention), when running_mean/running_var are not null:
//   running_mean = (1 - momentum) * running_mean + momentum * mean
//   running_var  = (1 - momentum) * running_var  + momentum * var * count / (count - 1)
// requires: sum, sumsq [C] totals over `count` elements per channel, count > 0
//           (count > 1 when running_var is given); mean, invstd [C]; running stats [C] or
//           both null.  ensures: writes mean, invstd; updates running stats in place.
template <typename T>
void batch_norm_stats_to_mean_invstd(const double* sum, const double* sumsq, double count,
                                     int64_t C, double eps, double momentum, T* mean,
                                     T* invstd, T* running_mean, T* running_var);

// invstd[c] = 1 / sqrt(var[c] + eps)   (eval mode: var = running_var).
// requires: var, invstd [C].  ensures: writes invstd.  in-place: invstd may equal var.
template <typename T>
void batch_norm_invstd(const T* var, int64_t C, double eps, T* invstd);

// y[n,c,s] = act((x[n,c,s] - mean[c]) * invstd[c] * weight[c] + bias[c])
// (weight = 1 and bias = 0 when null; act: kernels/common/batch_norm_activation.h).
// requires: x, y [N, C, S]; mean, invstd [C]; weight, bias [C] or null.
// ensures: writes y.  in-place: y may equal x.
template <typename T>
void batch_norm_apply(const T* x, const T* mean, const T* invstd, const T* weight,
                      const T* bias, int64_t N, int64_t C, int64_t S, T* y,
                      BatchNormActivation act = {});

// sum_dy[c] = sum_{n,s} dy,  sum_dy_xmu[c] = sum_{n,s} dy * (x - mean[c]).
// requires: dy, x [N, C, S]; mean [C]; sum_dy, sum_dy_xmu [C].  ensures: writes both sums.
template <typename T>
void batch_norm_backward_reduce(const T* dy, const T* x, const T* mean, int64_t N, int64_t C,
                                int64_t S, double* sum_dy, double* sum_dy_xmu);

// Training-mode input gradient given the (global) sums and total element count per channel:
//   dx = weight * invstd * (dy - sum_dy/count - (x - mean) * invstd^2 * sum_dy_xmu/count)
// requires: dy, x, dx [N, C, S]; mean, invstd, sum_dy, sum_dy_xmu [C]; weight [C] or null;
//           count > 0.  ensures: writes dx.  in-place: dx may equal dy (not x).
template <typename T>
void batch_norm_backward_elemt(const T* dy, const T* x, const T* mean, const T* invstd,
                               const T* weight, const double* sum_dy, const double* sum_dy_xmu,
                               double count, int64_t N, int64_t C, int64_t S, T* dx);

// Training forward with batch statistics: stats -> mean/invstd (+ running update) -> apply.
// requires: x, y [N, C, S], N*S > 0 (> 1 with running stats); weight, bias [C] or null;
//           running_mean, running_var [C] or both null (track_running_stats off);
//           save_mean, save_invstd [C].
// ensures: writes y, save_mean, save_invstd; updates running stats in place.
// in-place: y may equal x.
template <typename T>
void batch_norm_forward_training(const T* x, const T* weight, const T* bias, T* running_mean,
                                 T* running_var, int64_t N, int64_t C, int64_t S,
                                 double momentum, double eps, T* y, T* save_mean,
                                 T* save_invstd, BatchNormActivation act = {});

// Eval forward: y = (x - running_mean) / sqrt(running_var + eps) * weight + bias
// (batch_norm_invstd, then batch_norm_apply).
// requires: x, y [N, C, S]; running stats [C]; weight, bias [C] or null.
// ensures: writes y.  in-place: y may equal x.
template <typename T>
void batch_norm_forward_eval(const T* x, const T* running_mean, const T* running_var,
                             const T* weight, const T* bias, int64_t N, int64_t C, int64_t S,
                             double eps, T* y, BatchNormActivation act = {});

// Backward of either forward. mean/invstd are the saved batch statistics (training) or
// the running mean and 1/sqrt(running_var + eps) (eval, where they are constants):
//   grad_bias[c]   = sum dy
//   grad_weight[c] = sum dy * (x - mean) * invstd
//   grad_input     = training ? backward_elemt(...) with count = N*S
//                              : dy * weight * invstd
// With an activation (act.on()), dy is the gradient at the forward's output y = act(...)
// and is taken back through it first: dy := act.backward(dy, y) (the unfused pair's values).
// requires: dy, x [N, C, S]; mean, invstd [C]; weight [C] or null; each output may be
//           null (not needed); grad_weight, grad_bias [C]; y [N, C, S] when act.on().
// ensures: writes (not accumulates) the non-null outputs.  in-place: grad_input may equal dy.
template <typename T>
void batch_norm_backward(const T* dy, const T* x, const T* mean, const T* invstd,
                         const T* weight, int64_t N, int64_t C, int64_t S, bool training,
                         T* grad_input, T* grad_weight, T* grad_bias,
                         BatchNormActivation act = {}, const T* y = nullptr);

}  // namespace nd::kernels::cpu
