// Batch normalisation over [N, C, S] on CUDA: the pieces of kernels/cpu/batch_norm.cpp.
//
// Why this shape: the two per-channel reductions (statistics forward, sum dy and
// sum dy*(x - mean) backward) must be bit-reproducible run to run, because SyncBatchNorm
// ranks and repeated runs must agree, so there are no atomics: every value goes to a fixed
// thread, threads combine in a fixed tree, blocks in a fixed order. One generic two-level
// reduction serves both, parameterised by an Op (its per-thread State, how to add a value,
// how to combine two States, how to write the channel's result):
//   level 1: block (channel or 32 channels, chunk k) -> State; with one chunk per channel
//            the block writes the result directly;
//   level 2: one block per channel folds its chunks' States in chunk order.
// The elementwise kernels (apply, input gradients) walk the flat index with a grid-stride
// loop that tracks the channel by additions (kernels/common/batch_norm_index.h).
#include "kernels/cuda/batch_norm.h"

#include <string>

#include "kernels/common/batch_norm_index.h"
#include "kernels/common/welford.h"
#include "kernels/cuda/scratch.cuh"
#include "kernels/cuda/strided.cuh"

namespace nd::kernels::cuda {

namespace {

using detail::kThreads;
using detail::Scratch;
constexpr int kColumns = 32;                // S = 1: channels side by side in a block (one warp row)
constexpr int kRows = kThreads / kColumns;  // S = 1: rows of the batch a block walks at once
constexpr int64_t kValuesPerThread = 16;    // chunk size target: enough work to hide latency
constexpr int64_t kMaxChunks = 1024;        // chunks per channel (gridDim.y <= 65535)

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

// ---- the two-level reduction -------------------------------------------------------------

// Combines the States of the threadIdx.y lanes of each block column in a fixed halving
// tree (blockDim.y a power of two); threads (x, 0) return their column's total.
template <class Op>
__device__ typename Op::State combine_lanes(typename Op::State st, typename Op::State* smem) {
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  smem[t] = st;
  __syncthreads();
  for (int h = blockDim.y / 2; h > 0; h /= 2) {
    if (threadIdx.y < h) smem[t] = Op::combine(smem[t], smem[t + h * blockDim.x]);
    __syncthreads();
  }
  return smem[threadIdx.x];
}

// Chunk k's State of channel c: the channel's result when it has one chunk.
template <class Op>
__device__ void store(const Op& op, const typename Op::State& st, int64_t c, int64_t k, typename Op::State* partial) {
  if (gridDim.y == 1) {
    op.finish(st, c);
  } else {
    partial[c * gridDim.y + k] = st;
  }
}

// S > 1. Grid (C, chunks), block (1, kThreads): lane t of block (c, k) adds values
// j = begin + t, begin + t + kThreads, ... < end of channel c.
template <class Op>
__global__ void channel_partials_kernel(Op op, int64_t C, int64_t S, int64_t values, int64_t chunk_length,
                                        typename Op::State* partial) {
  __shared__ typename Op::State smem[kThreads];
  const int64_t c = blockIdx.x, k = blockIdx.y;
  const int64_t begin = k * chunk_length;
  const int64_t end = begin + chunk_length < values ? begin + chunk_length : values;
  typename Op::State st{};
  const int64_t first = begin + threadIdx.y;
  if (first < end) {
    ChannelWalk w = channel_walk(first, blockDim.y, C, S, c);
    for (int64_t j = first; j < end; j += blockDim.y, w.next()) op.add(st, w.offset, c);
  }
  st = combine_lanes<Op>(st, smem);
  if (threadIdx.y == 0) store(op, st, c, k, partial);
}

// S = 1 ([N, C]). Grid (ceil(C / kColumns), chunks), block (kColumns, kRows): thread
// (tx, ty) of block (b, k) adds rows n = begin + ty, begin + ty + kRows, ... < end of
// channel b * kColumns + tx; a warp reads kColumns consecutive channels of one row.
template <class Op>
__global__ void column_partials_kernel(Op op, int64_t N, int64_t C, int64_t chunk_length,
                                       typename Op::State* partial) {
  __shared__ typename Op::State smem[kThreads];
  const int64_t c = int64_t(blockIdx.x) * kColumns + threadIdx.x, k = blockIdx.y;
  const int64_t begin = k * chunk_length;
  const int64_t end = begin + chunk_length < N ? begin + chunk_length : N;
  typename Op::State st{};
  if (c < C)
    for (int64_t n = begin + threadIdx.y; n < end; n += kRows) op.add(st, n * C + c, c);
  st = combine_lanes<Op>(st, smem);
  if (threadIdx.y == 0 && c < C) store(op, st, c, k, partial);
}

// Level 2. Grid (C), block (1, kThreads): lane t folds chunks t, t + kThreads, ... in
// order, then the lanes combine in the fixed tree.
template <class Op>
__global__ void combine_partials_kernel(Op op, int64_t chunks, const typename Op::State* partial) {
  __shared__ typename Op::State smem[kThreads];
  const int64_t c = blockIdx.x;
  typename Op::State st{};
  for (int64_t k = threadIdx.y; k < chunks; k += blockDim.y) st = Op::combine(st, partial[c * chunks + k]);
  st = combine_lanes<Op>(st, smem);
  if (threadIdx.y == 0) op.finish(st, c);
}

template <class Op>
void channel_reduce(const char* kernel, const Op& op, int64_t N, int64_t C, int64_t S, cudaStream_t stream) {
  if (C == 0) return;
  require(C <= int64_t(0x7fffffff), kernel, "at most 2^31 - 1 channels, found " + std::to_string(C));
  using State = typename Op::State;
  const bool columns = S == 1;
  const int64_t per_chunk = (columns ? kRows : kThreads) * kValuesPerThread;
  const ChannelChunks chunks = channel_chunks(N * S, per_chunk, kMaxChunks);
  const Scratch scratch(kernel, chunks.count > 1 ? sizeof(State) * C * chunks.count : 0, stream);
  State* partial = scratch.as<State>();
  const auto chunk_count = static_cast<unsigned>(chunks.count);
  if (columns) {
    const dim3 grid(static_cast<unsigned>((C + kColumns - 1) / kColumns), chunk_count);
    column_partials_kernel<Op><<<grid, dim3(kColumns, kRows), 0, stream>>>(op, N, C, chunks.length, partial);
  } else {
    const dim3 grid(static_cast<unsigned>(C), chunk_count);
    channel_partials_kernel<Op><<<grid, dim3(1, kThreads), 0, stream>>>(op, C, S, N * S, chunks.length, partial);
  }
  check_launch(kernel);
  if (chunks.count == 1) return;
  combine_partials_kernel<Op><<<static_cast<unsigned>(C), dim3(1, kThreads), 0, stream>>>(op, chunks.count, partial);
  check_launch(kernel);
}

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
  channel_reduce("batch_norm_channel_stats", StatsOp<T>{x, sum, sumsq}, N, C, S, stream);
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
  channel_reduce("batch_norm_backward_reduce", BackwardReduceOp<T>{dy, x, mean, sum_dy, sum_dy_xmu}, N, C, S,
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
