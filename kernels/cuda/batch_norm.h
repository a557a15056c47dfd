#pragma once
// CUDA twins of kernels/cpu/batch_norm.h: the same pieces over [N, C, S] (S = H*W, or 1
// for [N, C]) with the same contracts, plus the stream they are queued on. Pointers are
// device memory; `count` and the scalars are host values (SyncBatchNorm's count may be a
// device pointer: the overloads below).
//
// Statistics (channel_stats, backward_reduce) are deterministic: each thread reduces a
// fixed set of a channel's values (shifted sums, no division per value), each block
// combines its threads in a fixed tree (Welford/Chan, kernels/common/welford.h), and when a
// channel is split over several blocks the last block to finish folds the blocks' partials
// in chunk order, in the same launch (kernels/cuda/channel_reduce.cuh). No float atomics:
// the same input gives bitwise the same sums on every run. [N, C, S] with S > 1 puts one
// or more blocks on each channel; S = 1 puts 32 channels side by side in a block, so that
// neighbouring threads read neighbouring addresses; S % 4 == 0 with 16-byte aligned
// pointers loads 4 values at once. The fused forward and backward are one launch each when
// a block holds whole channels, two otherwise (kernels/cuda/batch_norm.cu says why). Index math:
// kernels/common/batch_norm_index.h. Tests: tests/emu/batch_norm_emu_test.cpp and
// tests/cuda/cuda_batch_norm_test.cpp (against the CPU), tests/kernels/welford_test.cpp
// (the shared math).
#include <cstdint>

#include "kernels/common/batch_norm_activation.h"
#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

// sum[c] = sum_{n,s} x[n,c,s],  sumsq[c] = sum_{n,s} x[n,c,s]^2, from per-channel Welford
// summaries (sum = n * mean, sumsq = M2 + n * mean^2).
// requires: x [N, C, S]; sum, sumsq [C] (double).  ensures: writes sum, sumsq (0 when N*S = 0).
template <typename T>
void batch_norm_channel_stats(const T* x, int64_t N, int64_t C, int64_t S, double* sum, double* sumsq,
                              cudaStream_t stream);

// mean, invstd and the running-stat update from (sum, sumsq, count): kernels/cpu/batch_norm.h.
// requires: sum, sumsq [C] (device), count > 0 (> 1 with running_var); mean, invstd [C];
//           running stats [C] or both null.  ensures: writes mean, invstd; updates running stats.
template <typename T>
void batch_norm_stats_to_mean_invstd(const double* sum, const double* sumsq, double count, int64_t C, double eps,
                                     double momentum, T* mean, T* invstd, T* running_mean, T* running_var,
                                     cudaStream_t stream);
// The same with `count` read on the device (SyncBatchNorm's all-reduced count, which the
// host then need not wait for). requires: *count > 0 (> 1 with running_var), unchecked.
template <typename T>
void batch_norm_stats_to_mean_invstd(const double* sum, const double* sumsq, const double* count, int64_t C,
                                     double eps, double momentum, T* mean, T* invstd, T* running_mean,
                                     T* running_var, cudaStream_t stream);

// invstd[c] = 1 / sqrt(var[c] + eps).  in-place: invstd may equal var.
template <typename T>
void batch_norm_invstd(const T* var, int64_t C, double eps, T* invstd, cudaStream_t stream);

// y = act((x - mean[c]) * invstd[c] * weight[c] + bias[c]) (weight 1, bias 0 when null).
// requires: x, y [N, C, S]; mean, invstd [C]; weight, bias [C] or null.  in-place: y may equal x.
template <typename T>
void batch_norm_apply(const T* x, const T* mean, const T* invstd, const T* weight, const T* bias, int64_t N,
                      int64_t C, int64_t S, T* y, cudaStream_t stream, BatchNormActivation act = {});

// sum_dy[c] = sum dy,  sum_dy_xmu[c] = sum dy * (x - mean[c])  (double).
// requires: dy, x [N, C, S]; mean [C]; sum_dy, sum_dy_xmu [C].  ensures: writes both (0 when N*S = 0).
template <typename T>
void batch_norm_backward_reduce(const T* dy, const T* x, const T* mean, int64_t N, int64_t C, int64_t S,
                                double* sum_dy, double* sum_dy_xmu, cudaStream_t stream);

// dx = weight * invstd * (dy - sum_dy/count - (x - mean) * invstd^2 * sum_dy_xmu/count).
// requires: as the CPU twin; sum_dy, sum_dy_xmu device [C].  in-place: dx may equal dy (not x).
template <typename T>
void batch_norm_backward_elemt(const T* dy, const T* x, const T* mean, const T* invstd, const T* weight,
                               const double* sum_dy, const double* sum_dy_xmu, double count, int64_t N, int64_t C,
                               int64_t S, T* dx, cudaStream_t stream);
// The same with `count` read on the device. requires: *count > 0, unchecked.
template <typename T>
void batch_norm_backward_elemt(const T* dy, const T* x, const T* mean, const T* invstd, const T* weight,
                               const double* sum_dy, const double* sum_dy_xmu, const double* count, int64_t N,
                               int64_t C, int64_t S, T* dx, cudaStream_t stream);

// The statistics (finished into mean, invstd and the running stats by their last block)
// -> apply: two launches; one where a block holds whole channels (N*S <= 4096, or N <= 128
// when S = 1): the statistics kernel applies them.
// requires: N*S > 0 (> 1 with running stats); otherwise as the CPU twin.  in-place: y may equal x.
template <typename T>
void batch_norm_forward_training(const T* x, const T* weight, const T* bias, T* running_mean, T* running_var,
                                 int64_t N, int64_t C, int64_t S, double momentum, double eps, T* y, T* save_mean,
                                 T* save_invstd, cudaStream_t stream, BatchNormActivation act = {});

// invstd from running_var, then apply with running_mean.  in-place: y may equal x.
template <typename T>
void batch_norm_forward_eval(const T* x, const T* running_mean, const T* running_var, const T* weight,
                             const T* bias, int64_t N, int64_t C, int64_t S, double eps, T* y, cudaStream_t stream,
                             BatchNormActivation act = {});

// grad_bias = sum dy, grad_weight = sum dy * (x - mean) * invstd, grad_input as the CPU twin
// (training: backward_elemt with count = N*S; eval: dy * weight * invstd). Null outputs
// are skipped; outputs are written, not accumulated.  in-place: grad_input may equal dy.
// Training: one launch where a block holds whole channels (N*S <= 4096, or N <= 128 when
// S = 1): the sums, grad_weight and grad_bias, then grad_input from the values just read;
// two otherwise (the sums, then grad_input). Eval: the sums when asked for, then grad_input.
// With an activation (act.on()), dy is the gradient at the forward's output y and every
// pass takes it back through the activation as it loads it (no launch of its own).
template <typename T>
void batch_norm_backward(const T* dy, const T* x, const T* mean, const T* invstd, const T* weight, int64_t N,
                         int64_t C, int64_t S, bool training, T* grad_input, T* grad_weight, T* grad_bias,
                         cudaStream_t stream, BatchNormActivation act = {}, const T* y = nullptr);

}  // namespace nd::kernels::cuda
