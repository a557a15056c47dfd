// Batch normalisation over [N, C, S] on CUDA: the pieces of kernels/cpu/batch_norm.cpp.
//
// The two per-channel reductions (statistics forward, sum dy and sum dy*(x - mean)
// backward) are Ops of the deterministic two-level reduction in channel_reduce.cuh.
// The elementwise kernels (apply, input gradients) walk the flat index with a grid-stride
// loop that tracks the channel by additions (kernels/common/batch_norm_index.h).
#include "kernels/cuda/batch_norm.h"

#include <string>

#include "kernels/common/batch_norm_index.h"
#include "kernels/common/welford.h"
#include "kernels/cuda/channel_reduce.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/cuda/strided.cuh"

namespace nd::kernels::cuda {

namespace {

using detail::kThreads;
using detail::Scratch;

// ---- reduction ops ----------------------------------------------------------------------

// Forward statistics: Welford over x, handed out as (sum, sum of squares).
template <class T>
struct StatsOp {
  using State = Welford;
  const T* x;
  double* sum;
  double* sumsq;
  __device__ void add(State& st, int64_t offset, int64_t) const { welford_add(st, static_cast<double>(x[offset])); }
  __device__ static State combine(const State& a, const State& b) { return welford_combine(a, b); }
  __device__ void finish(const State& st, int64_t c) const {
    sum[c] = welford_sum(st);
    sumsq[c] = welford_sumsq(st);
  }
};

struct DySums {
  double dy, dy_xmu;
};

// Backward: sum dy and sum dy * (x - mean[c]) in double.
template <class T>
struct BackwardReduceOp {
  using State = DySums;
  const T* dy;
  const T* x;
  const T* mean;
  double* sum_dy;
  double* sum_dy_xmu;
  __device__ void add(State& st, int64_t offset, int64_t c) const {
    const double g = static_cast<double>(dy[offset]);
    st.dy += g;
    st.dy_xmu += g * (static_cast<double>(x[offset]) - static_cast<double>(mean[c]));
  }
  __device__ static State combine(const State& a, const State& b) { return {a.dy + b.dy, a.dy_xmu + b.dy_xmu}; }
  __device__ void finish(const State& st, int64_t c) const {
    sum_dy[c] = st.dy;
    sum_dy_xmu[c] = st.dy_xmu;
  }
};

// ---- per-channel kernels -----------------------------------------------------------------

// f(c) for every channel, grid-stride.
template <class F>
__device__ void for_each_channel(int64_t C, F&& f) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) f(c);
}

template <class T>
__global__ void stats_to_mean_invstd_kernel(const double* sum, const double* sumsq, const double* device_count,
                                            double count, int64_t C, double eps, double momentum, T* mean,
                                            T* invstd, T* running_mean, T* running_var) {
  if (device_count) count = *device_count;
  for_each_channel(C, [&](int64_t c) {
    const double m = sum[c] / count;
    const double var = fmax(sumsq[c] / count - m * m, 0.0);  // rounding can go below 0
    mean[c] = static_cast<T>(m);
    invstd[c] = static_cast<T>(1.0 / sqrt(var + eps));
    if (running_mean) running_mean[c] = static_cast<T>((1.0 - momentum) * running_mean[c] + momentum * m);
    if (running_var)
      running_var[c] = static_cast<T>((1.0 - momentum) * running_var[c] + momentum * (var * count / (count - 1.0)));
  });
}

template <class T>
__global__ void invstd_kernel(const T* var, int64_t C, double eps, T* invstd) {
  for_each_channel(C, [&](int64_t c) { invstd[c] = static_cast<T>(1.0 / sqrt(static_cast<double>(var[c]) + eps)); });
}

// grad_weight = sum dy*(x - mean) * invstd, grad_bias = sum dy (either may be null).
template <class T>
__global__ void param_grads_kernel(const double* sum_dy, const double* sum_dy_xmu, const T* invstd, int64_t C,
                                   T* grad_weight, T* grad_bias) {
  for_each_channel(C, [&](int64_t c) {
    if (grad_weight) grad_weight[c] = static_cast<T>(sum_dy_xmu[c] * static_cast<double>(invstd[c]));
    if (grad_bias) grad_bias[c] = static_cast<T>(sum_dy[c]);
  });
}

// ---- elementwise kernels (grid-stride over N*C*S, channel tracked by ElementWalk) ---------

// f(i, c) for every element i < total of [N, C, S], c its channel; grid-stride.
template <class F>
__device__ void for_each_element(int64_t total, int64_t C, int64_t S, F&& f) {
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (first >= total) return;
  for (ElementWalk w = element_walk(first, int64_t(gridDim.x) * blockDim.x, C, S); w.i < total; w.next()) f(w.i, w.c);
}

template <class T>
__global__ void apply_kernel(const T* x, const T* mean, const T* invstd, const T* weight, const T* bias,
                             int64_t total, int64_t C, int64_t S, T* y) {
  for_each_element(total, C, S, [&](int64_t i, int64_t c) {
    // Subtract the mean first, as the CPU: folding it into the shift cancels when |mean| >> std.
    const T a = invstd[c] * (weight ? weight[c] : T(1));
    const T b = bias ? bias[c] : T(0);
    y[i] = (x[i] - mean[c]) * a + b;
  });
}

template <class T>
__global__ void backward_elemt_kernel(const T* dy, const T* x, const T* mean, const T* invstd, const T* weight,
                                      const double* sum_dy, const double* sum_dy_xmu, const double* device_count,
                                      double count, int64_t total, int64_t C, int64_t S, T* dx) {
  if (device_count) count = *device_count;
  for_each_element(total, C, S, [&](int64_t i, int64_t c) {
    const double is = static_cast<double>(invstd[c]);
    const double scale = (weight ? static_cast<double>(weight[c]) : 1.0) * is;
    const double proj = sum_dy_xmu[c] / count * is * is;  // coefficient of (x - mean)
    const double xm = static_cast<double>(x[i]) - static_cast<double>(mean[c]);
    dx[i] = static_cast<T>(scale * (static_cast<double>(dy[i]) - sum_dy[c] / count - xm * proj));
  });
}

// Eval: mean and invstd are constants, so dx = dy * weight * invstd.
template <class T>
__global__ void eval_input_grad_kernel(const T* dy, const T* invstd, const T* weight, int64_t total, int64_t C,
                                       int64_t S, T* dx) {
  for_each_element(total, C, S,
                   [&](int64_t i, int64_t c) { dx[i] = dy[i] * (invstd[c] * (weight ? weight[c] : T(1))); });
}

}  // namespace

template <typename T>
void batch_norm_channel_stats(const T* x, int64_t N, int64_t C, int64_t S, double* sum, double* sumsq,
                              cudaStream_t stream) {
  channels::reduce("batch_norm_channel_stats", StatsOp<T>{x, sum, sumsq}, N, C, S, C, stream);
}

template <typename T>
void batch_norm_stats_to_mean_invstd(const double* sum, const double* sumsq, double count, int64_t C, double eps,
                                     double momentum, T* mean, T* invstd, T* running_mean, T* running_var,
                                     cudaStream_t stream) {
  if (C == 0) return;
  require(count > 0, "batch_norm_stats_to_mean_invstd", "expected count > 0, found " + std::to_string(count));
  stats_to_mean_invstd_kernel<T><<<detail::blocks_for(C), kThreads, 0, stream>>>(
      sum, sumsq, nullptr, count, C, eps, momentum, mean, invstd, running_mean, running_var);
  check_launch("batch_norm_stats_to_mean_invstd");
}

template <typename T>
void batch_norm_stats_to_mean_invstd(const double* sum, const double* sumsq, const double* count, int64_t C,
                                     double eps, double momentum, T* mean, T* invstd, T* running_mean,
                                     T* running_var, cudaStream_t stream) {
  if (C == 0) return;
  stats_to_mean_invstd_kernel<T><<<detail::blocks_for(C), kThreads, 0, stream>>>(
      sum, sumsq, count, 0.0, C, eps, momentum, mean, invstd, running_mean, running_var);
  check_launch("batch_norm_stats_to_mean_invstd");
}

template <typename T>
void batch_norm_invstd(const T* var, int64_t C, double eps, T* invstd, cudaStream_t stream) {
  if (C == 0) return;
  invstd_kernel<T><<<detail::blocks_for(C), kThreads, 0, stream>>>(var, C, eps, invstd);
  check_launch("batch_norm_invstd");
}

template <typename T>
void batch_norm_apply(const T* x, const T* mean, const T* invstd, const T* weight, const T* bias, int64_t N,
                      int64_t C, int64_t S, T* y, cudaStream_t stream) {
  const int64_t total = N * C * S;
  if (total == 0) return;
  apply_kernel<T><<<detail::blocks_for(total), kThreads, 0, stream>>>(x, mean, invstd, weight, bias, total, C, S, y);
  check_launch("batch_norm_apply");
}

template <typename T>
void batch_norm_backward_reduce(const T* dy, const T* x, const T* mean, int64_t N, int64_t C, int64_t S,
                                double* sum_dy, double* sum_dy_xmu, cudaStream_t stream) {
  channels::reduce("batch_norm_backward_reduce", BackwardReduceOp<T>{dy, x, mean, sum_dy, sum_dy_xmu}, N, C, S, C,
                   stream);
}

template <typename T>
void batch_norm_backward_elemt(const T* dy, const T* x, const T* mean, const T* invstd, const T* weight,
                               const double* sum_dy, const double* sum_dy_xmu, double count, int64_t N, int64_t C,
                               int64_t S, T* dx, cudaStream_t stream) {
  const int64_t total = N * C * S;
  if (total == 0) return;
  require(count > 0, "batch_norm_backward_elemt", "expected count > 0, found " + std::to_string(count));
  backward_elemt_kernel<T><<<detail::blocks_for(total), kThreads, 0, stream>>>(
      dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, nullptr, count, total, C, S, dx);
  check_launch("batch_norm_backward_elemt");
}

template <typename T>
void batch_norm_backward_elemt(const T* dy, const T* x, const T* mean, const T* invstd, const T* weight,
                               const double* sum_dy, const double* sum_dy_xmu, const double* count, int64_t N,
                               int64_t C, int64_t S, T* dx, cudaStream_t stream) {
  const int64_t total = N * C * S;
  if (total == 0) return;
  backward_elemt_kernel<T><<<detail::blocks_for(total), kThreads, 0, stream>>>(
      dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count, 0.0, total, C, S, dx);
  check_launch("batch_norm_backward_elemt");
}

template <typename T>
void batch_norm_forward_training(const T* x, const T* weight, const T* bias, T* running_mean, T* running_var,
                                 int64_t N, int64_t C, int64_t S, double momentum, double eps, T* y, T* save_mean,
                                 T* save_invstd, cudaStream_t stream) {
  if (C == 0) return;
  require(N * S > 0, "batch_norm_forward_training",
          "expected values in every channel (N*S > 0), found N = " + std::to_string(N) + ", S = " + std::to_string(S));
  const Scratch scratch("batch_norm_forward_training", sizeof(double) * 2 * C, stream);
  double* sums = scratch.as<double>();  // [sum | sum of squares]
  batch_norm_channel_stats(x, N, C, S, sums, sums + C, stream);
  batch_norm_stats_to_mean_invstd(sums, sums + C, static_cast<double>(N * S), C, eps, momentum, save_mean,
                                  save_invstd, running_mean, running_var, stream);
  batch_norm_apply(x, save_mean, save_invstd, weight, bias, N, C, S, y, stream);
}

template <typename T>
void batch_norm_forward_eval(const T* x, const T* running_mean, const T* running_var, const T* weight,
                             const T* bias, int64_t N, int64_t C, int64_t S, double eps, T* y, cudaStream_t stream) {
  if (C == 0) return;
  const Scratch scratch("batch_norm_forward_eval", sizeof(T) * C, stream);
  T* invstd = scratch.as<T>();
  batch_norm_invstd(running_var, C, eps, invstd, stream);
  batch_norm_apply(x, running_mean, invstd, weight, bias, N, C, S, y, stream);
}

template <typename T>
void batch_norm_backward(const T* dy, const T* x, const T* mean, const T* invstd, const T* weight, int64_t N,
                         int64_t C, int64_t S, bool training, T* grad_input, T* grad_weight, T* grad_bias,
                         cudaStream_t stream) {
  if (C == 0) return;
  const int64_t total = N * C * S;
  const bool param_grads = grad_weight != nullptr || grad_bias != nullptr;
  const bool need_sums = param_grads || (training && grad_input != nullptr);
  // The sums read dy, so they come first: grad_input may be dy.
  const Scratch scratch("batch_norm_backward", need_sums ? sizeof(double) * 2 * C : 0, stream);
  double* sums = scratch.as<double>();  // [sum dy | sum dy*(x - mean)]
  if (need_sums) batch_norm_backward_reduce(dy, x, mean, N, C, S, sums, sums + C, stream);
  if (param_grads) {
    param_grads_kernel<T><<<detail::blocks_for(C), kThreads, 0, stream>>>(sums, sums + C, invstd, C, grad_weight,
                                                                          grad_bias);
    check_launch("batch_norm_backward (weight and bias gradients)");
  }
  if (grad_input == nullptr || total == 0) return;
  if (training) {
    batch_norm_backward_elemt(dy, x, mean, invstd, weight, sums, sums + C, static_cast<double>(N * S), N, C, S,
                              grad_input, stream);
    return;
  }
  // Eval: mean and invstd are constants, so the map is affine.
  eval_input_grad_kernel<T><<<detail::blocks_for(total), kThreads, 0, stream>>>(dy, invstd, weight, total, C, S,
                                                                                grad_input);
  check_launch("batch_norm_backward (eval input gradient)");
}

#define ND_INSTANTIATE(T)                                                                                            \
  template void batch_norm_channel_stats<T>(const T*, int64_t, int64_t, int64_t, double*, double*, cudaStream_t);   \
  template void batch_norm_stats_to_mean_invstd<T>(const double*, const double*, double, int64_t, double, double, \
                                                   T*, T*, T*, T*, cudaStream_t);                                  \
  template void batch_norm_stats_to_mean_invstd<T>(const double*, const double*, const double*, int64_t, double,   \
                                                   double, T*, T*, T*, T*, cudaStream_t);                          \
  template void batch_norm_invstd<T>(const T*, int64_t, double, T*, cudaStream_t);                                  \
  template void batch_norm_apply<T>(const T*, const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t,    \
                                    T*, cudaStream_t);                                                              \
  template void batch_norm_backward_reduce<T>(const T*, const T*, const T*, int64_t, int64_t, int64_t, double*,     \
                                              double*, cudaStream_t);                                               \
  template void batch_norm_backward_elemt<T>(const T*, const T*, const T*, const T*, const T*, const double*,       \
                                             const double*, double, int64_t, int64_t, int64_t, T*, cudaStream_t);   \
  template void batch_norm_backward_elemt<T>(const T*, const T*, const T*, const T*, const T*, const double*,       \
                                             const double*, const double*, int64_t, int64_t, int64_t, T*,          \
                                             cudaStream_t);                                                        \
  template void batch_norm_forward_training<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, int64_t,     \
                                               double, double, T*, T*, T*, cudaStream_t);                           \
  template void batch_norm_forward_eval<T>(const T*, const T*, const T*, const T*, const T*, int64_t, int64_t,      \
                                           int64_t, double, T*, cudaStream_t);                                      \
  template void batch_norm_backward<T>(const T*, const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, \
                                       bool, T*, T*, T*, cudaStream_t);
ND_INSTANTIATE(float)
ND_INSTANTIATE(double)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cuda
