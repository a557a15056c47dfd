// Batch normalisation over [N, C, S] on CUDA: the pieces of kernels/cpu/batch_norm.cpp.
//
// One launch each way where a block holds whole channels (N*S up to 4096, or N up to 128
// rows when S = 1: DCGAN's and MAE's batch norms at their batch sizes): the block reduces
// its channel, finishes it, then walks the values it has just read again (L1/L2 hits):
//   forward:  statistics -> mean, invstd, running statistics -> y = (x - mean) * a + b;
//   backward: sum dy, sum dy * (x - mean) -> weight and bias gradients -> dx.
// A channel spread over several blocks (up to 1024 chunks) takes two launches each way:
// the reduction, finished by its last block per channel (channel_reduce.cuh), then the
// elementwise pass (batch_norm_elementwise.cuh).
//
// Why not one launch for split channels too. Blocks would have to wait for each other
// inside the launch, safe only when every block is resident at once: a cooperative launch
// (cudaLaunchCooperativeKernel, a grid sized by the occupancy calculator, each block
// looping over (channel, chunk) tiles, grid.sync() between the passes); a spin on a flag
// without it deadlocks when the grid exceeds what fits.
//   - The emulator (tests/emu), where CI checks every kernel, runs a grid's blocks one
//     after another: the first block to wait would wait for blocks that start only after
//     it ends. Running a persistent grid concurrently there means an OS thread per CUDA
//     thread (132 SMs x 2048), not feasible on CI's two cores; we ship no unchecked kernel.
//   - On the GPU the gain is small: one launch (2-4 us, which a CUDA graph removes too);
//     the second read of x (or dy, x) is an L2 hit either way while the tensor fits L2
//     (60 MB on an H200), DRAM otherwise (a persistent block's tiles do not stay in its
//     registers across grid.sync()). And a cooperative launch needs every SM free: under
//     DDP the NCCL kernels of the communication stream hold SMs during backward, so it
//     would wait for them (or fail, cudaErrorCooperativeLaunchTooLarge) where two plain
//     launches overlap them.
// So split channels stay two launches. SyncBatchNorm's pieces (local sums, all-reduce, then
// mean/invstd and apply; gradient sums, all-reduce, then dx) are entry points of their own.
//
// Per value, no division: the statistics add x - K and (x - K)^2 in double, K the channel's
// first value (a shift that keeps the sum of squares from cancelling when |mean| >> std;
// each thread turns its sums into Welford's mean and M2 with one division, and threads,
// blocks and chunks merge with Chan's formula, kernels/common/welford.h); full-rate f64 on
// A100/H100/H200, not on consumer GPUs. The elementwise passes take per-channel
// coefficients (invstd * weight; for dx, input_grad_coefficients: the mean of dy and the
// projection on x - mean, times 1/count) and do two or three multiply-adds per value in T.
//
// Loads in flight: 4 loads per thread before their adds; a load is 4 values of a plane (one
// float4, two double2) when S % 4 == 0 and every pointer touched is 16-byte aligned, one
// value otherwise (S = 1's columns always: a warp reads 32 neighbouring channels already).
//
// Deterministic: every value goes to a fixed thread, combines in a fixed tree and chunk
// order (channel_reduce.cuh); no float atomics. The walk depends on the shape and the
// pointers' alignment only: a call adds in the same order on every run (the same values at
// another alignment, in another order: equal within rounding). Checked by
// tests/emu/batch_norm_emu_test.cpp (CPU twin, every layout, bit-equal reruns, launch
// counts, the sanitizer) and tests/cuda/cuda_batch_norm_test.cpp (on a GPU). Index math: kernels/common/batch_norm_index.h.
#include "kernels/cuda/batch_norm.h"

#include <string>

#include "kernels/common/batch_norm_index.h"
#include "kernels/common/welford.h"
#include "kernels/cuda/channel_reduce.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/cuda/batch_norm_elementwise.cuh"
#include "kernels/cuda/strided.cuh"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cuda {

namespace {

using batch_norm_elementwise::ApplyMap;
using batch_norm_elementwise::EvalInputGradMap;
using batch_norm_elementwise::InputGradCoefficients;
using batch_norm_elementwise::InputGradMap;
using batch_norm_elementwise::input_grad_coefficients;
using batch_norm_elementwise::aligned;
using batch_norm_elementwise::launch_elementwise;
using channels::load_values;
using channels::store_values;
using detail::kThreads;
using detail::Scratch;

// mean, invstd and the running statistics of channel c from its mean and biased variance
// over `count` values (PyTorch: the running variance takes the unbiased one).
template <class T>
__device__ void write_channel_stats(double m, double var, double count, double eps, double momentum, int64_t c,
                                    T* mean, T* invstd, T* running_mean, T* running_var) {
  mean[c] = static_cast<T>(m);
  invstd[c] = static_cast<T>(1.0 / sqrt(var + eps));
  if (running_mean) running_mean[c] = static_cast<T>((1.0 - momentum) * running_mean[c] + momentum * m);
  if (running_var)
    running_var[c] = static_cast<T>((1.0 - momentum) * running_var[c] + momentum * (var * count / (count - 1.0)));
}

// ---- reduction ops (channel_reduce.cuh) ----------------------------------------------------

// Statistics: sums of x - K and (x - K)^2 per thread, K = x[value 0 of the channel].
template <class T>
struct StatsReduction {
  struct Acc {
    double shift, n, s, ss;
  };
  using Value = T;
  using State = Welford;
  static constexpr bool kRevisit = false;
  static constexpr bool kVectorLoads = true;
  const T* x;
  int64_t S;
  __device__ Acc start(int64_t c) const { return {static_cast<double>(x[c * S]), 0.0, 0.0, 0.0}; }
  template <int W>
  __device__ void load(int64_t offset, Value (&v)[W]) const {
    load_values<W>(x, offset, v);
  }
  __device__ static void add(Acc& a, Value v) {
    const double d = static_cast<double>(v) - a.shift;
    a.n += 1.0;
    a.s += d;
    a.ss += d * d;
  }
  // mean = K + s/n,  M2 = sum (x - mean)^2 = ss - s^2/n.
  __device__ static State summary(const Acc& a, int64_t) {
    if (a.n == 0.0) return State{};
    const double d = a.s / a.n;
    return State{a.n, a.shift + d, fmax(a.ss - a.s * d, 0.0)};
  }
  __device__ static State combine(const State& a, const State& b) { return welford_combine(a, b); }
};

// SyncBatchNorm's local statistics: (sum, sum of squares) for its all-reduce.
template <class T>
struct ChannelStatsOp : StatsReduction<T> {
  double* sum;
  double* sumsq;
  __device__ void finish(const Welford& w, int64_t c) const {
    sum[c] = welford_sum(w);
    sumsq[c] = welford_sumsq(w);
  }
};

// The training forward's statistics, finished into mean, invstd and the running stats;
// where a block holds whole channels, it then applies them (ApplyMap's arithmetic).
template <class T>
struct TrainingStatsOp : StatsReduction<T> {
  static constexpr bool kRevisit = true;
  struct Affine {
    T m, a, b;
  };
  double eps, momentum;
  T *mean, *invstd, *running_mean, *running_var;
  const T *weight, *bias;
  T* y;
  BatchNormActivation act;
  __device__ void finish(const Welford& w, int64_t c) const {
    write_channel_stats(w.mean, w.m2 / w.count, w.count, eps, momentum, c, mean, invstd, running_mean, running_var);
  }
  __device__ Affine revisit_constants(int64_t c) const {
    return {mean[c], invstd[c] * (weight ? weight[c] : T(1)), bias ? bias[c] : T(0)};
  }
  template <int W>
  __device__ void revisit(const Affine& k, int64_t offset, const T (&v)[W]) const {
    T out[W];
#pragma unroll
    for (int i = 0; i < W; ++i) out[i] = act.forward((v[i] - k.m) * k.a + k.b);
    store_values<W>(out, y, offset);
  }
};

struct DySums {
  double dy, dy_xmu;
};

// Backward: sum dy and sum dy * (x - mean[c]) in double; finished into the sums (when
// sum_dy is not null) and the parameter gradients (either may be null). With an activation,
// dy is taken back through it (the forward's output y) as it is loaded.
template <class T>
struct BackwardReduceOp {
  struct Acc {
    double mean, dy, dy_xmu;
  };
  struct Value {
    T dy, x;
  };
  using State = DySums;
  static constexpr bool kRevisit = false;
  static constexpr bool kVectorLoads = true;
  const T *dy, *x, *mean, *invstd;
  double *sum_dy, *sum_dy_xmu;
  T *grad_weight, *grad_bias;
  BatchNormActivation act;
  const T* y;  // the forward's output when act.on()
  __device__ Acc start(int64_t c) const { return {static_cast<double>(mean[c]), 0.0, 0.0}; }
  template <int W>
  __device__ void load(int64_t offset, Value (&v)[W]) const {
    T g[W], xv[W];
    load_values<W>(dy, offset, g);
    load_values<W>(x, offset, xv);
    if (act.on()) {
      T out[W];
      load_values<W>(y, offset, out);
#pragma unroll
      for (int i = 0; i < W; ++i) g[i] = act.backward(g[i], out[i]);
    }
#pragma unroll
    for (int i = 0; i < W; ++i) v[i] = {g[i], xv[i]};
  }
  __device__ static void add(Acc& a, const Value& v) {
    const double g = static_cast<double>(v.dy);
    a.dy += g;
    a.dy_xmu += g * (static_cast<double>(v.x) - a.mean);
  }
  __device__ static State summary(const Acc& a, int64_t) { return {a.dy, a.dy_xmu}; }
  __device__ static State combine(const State& a, const State& b) { return {a.dy + b.dy, a.dy_xmu + b.dy_xmu}; }
  __device__ void finish(const State& st, int64_t c) const {
    if (sum_dy) {
      sum_dy[c] = st.dy;
      sum_dy_xmu[c] = st.dy_xmu;
    }
    if (grad_weight) grad_weight[c] = static_cast<T>(st.dy_xmu * static_cast<double>(invstd[c]));
    if (grad_bias) grad_bias[c] = static_cast<T>(st.dy);
  }
};

// The training backward's sums, finished into sum_dy, sum_dy_xmu (needed) and the parameter
// gradients; where a block holds whole channels, it then computes dx from the values it has
// just read (InputGradMap's arithmetic, count = N*S).
template <class T>
struct TrainingBackwardOp : BackwardReduceOp<T> {
  static constexpr bool kRevisit = true;
  const T* weight;
  double inv_count;
  T* dx;
  __device__ InputGradCoefficients<T> revisit_constants(int64_t c) const {
    return input_grad_coefficients(this->mean, this->invstd, weight, this->sum_dy, this->sum_dy_xmu, inv_count, c);
  }
  template <int W>
  __device__ void revisit(const InputGradCoefficients<T>& k, int64_t offset,
                          const typename BackwardReduceOp<T>::Value (&v)[W]) const {
    T out[W];
#pragma unroll
    for (int i = 0; i < W; ++i) out[i] = k(v[i].dy, v[i].x);
    store_values<W>(out, dx, offset);
  }
};

// ---- per-channel kernels (SyncBatchNorm's and eval's) --------------------------------------

template <class F>
__device__ void for_each_channel(int64_t C, F&& f) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C; c += int64_t(gridDim.x) * blockDim.x) f(c);
}

template <class T>
__global__ void stats_to_mean_invstd_kernel(const double* sum, const double* sumsq, const double* device_count,
                                            double count, int64_t C, double eps, double momentum, T* mean,
                                            T* invstd, T* running_mean, T* running_var) {
  if (device_count) count = *device_count;
  const double inv_count = 1.0 / count;
  for_each_channel(C, [&](int64_t c) {
    const double m = sum[c] * inv_count;
    const double var = fmax(sumsq[c] * inv_count - m * m, 0.0);  // rounding can go below 0
    write_channel_stats(m, var, count, eps, momentum, c, mean, invstd, running_mean, running_var);
  });
}

template <class T>
__global__ void invstd_kernel(const T* var, int64_t C, double eps, T* invstd) {
  for_each_channel(C, [&](int64_t c) { invstd[c] = static_cast<T>(1.0 / sqrt(static_cast<double>(var[c]) + eps)); });
}

template <class T>
void backward_elemt(const T* dy, const T* x, const T* mean, const T* invstd, const T* weight, const double* sum_dy,
                    const double* sum_dy_xmu, const double* device_count, double count, int64_t N, int64_t C,
                    int64_t S, T* dx, cudaStream_t stream, BatchNormActivation act = {}, const T* y = nullptr) {
  launch_elementwise(
      "batch_norm_backward_elemt",
      InputGradMap<T>{dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, device_count, count, 0.0, dx, act, y}, N, C,
      S, aligned({dy, x, dx, y}), stream);
}

}  // namespace

template <typename T>
void batch_norm_channel_stats(const T* x, int64_t N, int64_t C, int64_t S, double* sum, double* sumsq,
                              cudaStream_t stream) {
  channels::reduce("batch_norm_channel_stats", ChannelStatsOp<T>{{x, S}, sum, sumsq}, N, C, S, C, aligned({x}),
                   stream);
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
                      int64_t C, int64_t S, T* y, cudaStream_t stream, BatchNormActivation act) {
  launch_elementwise("batch_norm_apply", ApplyMap<T>{x, mean, invstd, weight, bias, y, act}, N, C, S,
                     aligned({x, y}), stream);
}

template <typename T>
void batch_norm_backward_reduce(const T* dy, const T* x, const T* mean, int64_t N, int64_t C, int64_t S,
                                double* sum_dy, double* sum_dy_xmu, cudaStream_t stream) {
  channels::reduce("batch_norm_backward_reduce",
                   BackwardReduceOp<T>{dy, x, mean, nullptr, sum_dy, sum_dy_xmu, nullptr, nullptr, {}, nullptr}, N, C, S, C,
                   aligned({dy, x}), stream);
}

template <typename T>
void batch_norm_backward_elemt(const T* dy, const T* x, const T* mean, const T* invstd, const T* weight,
                               const double* sum_dy, const double* sum_dy_xmu, double count, int64_t N, int64_t C,
                               int64_t S, T* dx, cudaStream_t stream) {
  if (N * C * S == 0) return;
  require(count > 0, "batch_norm_backward_elemt", "expected count > 0, found " + std::to_string(count));
  backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, nullptr, count, N, C, S, dx, stream);
}

template <typename T>
void batch_norm_backward_elemt(const T* dy, const T* x, const T* mean, const T* invstd, const T* weight,
                               const double* sum_dy, const double* sum_dy_xmu, const double* count, int64_t N,
                               int64_t C, int64_t S, T* dx, cudaStream_t stream) {
  backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count, 0.0, N, C, S, dx, stream);
}

template <typename T>
void batch_norm_forward_training(const T* x, const T* weight, const T* bias, T* running_mean, T* running_var,
                                 int64_t N, int64_t C, int64_t S, double momentum, double eps, T* y, T* save_mean,
                                 T* save_invstd, cudaStream_t stream, BatchNormActivation act) {
  if (C == 0) return;
  require(N * S > 0, "batch_norm_forward_training",
          "expected values in every channel (N*S > 0), found N = " + std::to_string(N) + ", S = " + std::to_string(S));
  const TrainingStatsOp<T> stats{
      {x, S}, eps, momentum, save_mean, save_invstd, running_mean, running_var, weight, bias, y, act};
  if (!channels::reduce("batch_norm_forward_training", stats, N, C, S, C, aligned({x, y}), stream))
    batch_norm_apply(x, save_mean, save_invstd, weight, bias, N, C, S, y, stream, act);
}

template <typename T>
void batch_norm_forward_eval(const T* x, const T* running_mean, const T* running_var, const T* weight,
                             const T* bias, int64_t N, int64_t C, int64_t S, double eps, T* y, cudaStream_t stream,
                             BatchNormActivation act) {
  if (C == 0) return;
  const Scratch scratch("batch_norm_forward_eval", sizeof(T) * C, stream);
  T* invstd = scratch.as<T>();
  batch_norm_invstd(running_var, C, eps, invstd, stream);
  batch_norm_apply(x, running_mean, invstd, weight, bias, N, C, S, y, stream, act);
}

template <typename T>
void batch_norm_backward(const T* dy, const T* x, const T* mean, const T* invstd, const T* weight, int64_t N,
                         int64_t C, int64_t S, bool training, T* grad_input, T* grad_weight, T* grad_bias,
                         cudaStream_t stream, BatchNormActivation act, const T* y) {
  if (C == 0) return;
  const bool input_grad = grad_input != nullptr && N * C * S > 0;
  const bool need_sums = training && input_grad;
  // The sums read dy, so they come first: grad_input may be dy (a thread of the fused launch
  // writes dx only where it has read dy, after the sums).
  const Scratch scratch("batch_norm_backward", need_sums ? sizeof(double) * 2 * C : 0, stream);
  double* sums = scratch.as<double>();  // [sum dy | sum dy*(x - mean)]
  if (need_sums) {
    const double count = static_cast<double>(N * S);
    const TrainingBackwardOp<T> op{
        {dy, x, mean, invstd, sums, sums + C, grad_weight, grad_bias, act, y}, weight, 1.0 / count, grad_input};
    if (!channels::reduce("batch_norm_backward", op, N, C, S, C, aligned({dy, x, grad_input, y}), stream))
      backward_elemt(dy, x, mean, invstd, weight, sums, sums + C, nullptr, count, N, C, S, grad_input, stream, act, y);
    return;
  }
  if (grad_weight != nullptr || grad_bias != nullptr) {
    const BackwardReduceOp<T> op{dy, x, mean, invstd, nullptr, nullptr, grad_weight, grad_bias, act, y};
    channels::reduce("batch_norm_backward", op, N, C, S, C, aligned({dy, x, y}), stream);
  }
  if (!input_grad) return;
  launch_elementwise("batch_norm_backward (eval input gradient)", EvalInputGradMap<T>{dy, invstd, weight, grad_input, act, y},
                     N, C, S, aligned({dy, grad_input, y}), stream);
}

#define ND_INSTANTIATE(T)                                                                                            \
  template void batch_norm_channel_stats<T>(const T*, int64_t, int64_t, int64_t, double*, double*, cudaStream_t);   \
  template void batch_norm_stats_to_mean_invstd<T>(const double*, const double*, double, int64_t, double, double, \
                                                   T*, T*, T*, T*, cudaStream_t);                                  \
  template void batch_norm_stats_to_mean_invstd<T>(const double*, const double*, const double*, int64_t, double,   \
                                                   double, T*, T*, T*, T*, cudaStream_t);                          \
  template void batch_norm_invstd<T>(const T*, int64_t, double, T*, cudaStream_t);                                  \
  template void batch_norm_apply<T>(const T*, const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t,    \
                                    T*, cudaStream_t, BatchNormActivation);                                         \
  template void batch_norm_backward_reduce<T>(const T*, const T*, const T*, int64_t, int64_t, int64_t, double*,     \
                                              double*, cudaStream_t);                                               \
  template void batch_norm_backward_elemt<T>(const T*, const T*, const T*, const T*, const T*, const double*,       \
                                             const double*, double, int64_t, int64_t, int64_t, T*, cudaStream_t);   \
  template void batch_norm_backward_elemt<T>(const T*, const T*, const T*, const T*, const T*, const double*,       \
                                             const double*, const double*, int64_t, int64_t, int64_t, T*,          \
                                             cudaStream_t);                                                        \
  template void batch_norm_forward_training<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, int64_t,     \
                                               double, double, T*, T*, T*, cudaStream_t, BatchNormActivation);      \
  template void batch_norm_forward_eval<T>(const T*, const T*, const T*, const T*, const T*, int64_t, int64_t,      \
                                           int64_t, double, T*, cudaStream_t, BatchNormActivation);                 \
  template void batch_norm_backward<T>(const T*, const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, \
                                       bool, T*, T*, T*, cudaStream_t, BatchNormActivation, const T*);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cuda
