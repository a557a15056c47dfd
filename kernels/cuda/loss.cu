// Losses. The per-element math is kernels/common/loss_math.h (shared with the CPU twin).
// Reductions (Sum, Mean) go through sum_terms: each block adds a fixed grid-stride slice
// of (value, weight) pairs in double, then a single block adds the block partials in
// block order and writes value sum (Sum) or value sum / weight sum (Mean). The weight of a
// term is 1 for mse and bce (so Mean divides by n) and w_y for cross_entropy. The number
// of blocks depends only on n, so the result repeats bit for bit.
// cross_entropy works row by row: one block per sample computes lse_i and l_i.
#include "kernels/cuda/loss.h"

#include <cmath>

#include "kernels/common/loss_math.h"
#include "kernels/cuda/row_reduce.cuh"
#include "kernels/cuda/strided.cuh"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cuda {

namespace {

using detail::kThreads;
using loss_math::grad_of;

constexpr int64_t kMaxPartials = 512;  // blocks of the first summation stage

// ---- the reduction machinery: functors f(i) -> (value, weight) ----

template <class F>
__global__ void partial_sums_kernel(int64_t n, F f, double2* partials) {
  __shared__ double smem[rows::kWarp];
  double a = 0.0, b = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double2 v = f(i);
    a += v.x;
    b += v.y;
  }
  a = rows::block_sum(a, smem);
  b = rows::block_sum(b, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = make_double2(a, b);
}

// One block: total = sum of the partials; out[0] = total.x (Sum) or total.x / total.y (Mean).
template <class T>
__global__ void finish_sum_kernel(const double2* partials, int64_t count, LossReduction reduction, double2* total,
                                  T* out) {
  __shared__ double smem[rows::kWarp];
  double a = 0.0, b = 0.0;
  for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
    a += partials[k].x;
    b += partials[k].y;
  }
  a = rows::block_sum(a, smem);
  b = rows::block_sum(b, smem);
  if (threadIdx.x != 0) return;
  if (total) *total = make_double2(a, b);
  if (out) out[0] = static_cast<T>(reduction == LossReduction::Mean ? a / b : a);
}

template <class T, class F>
__global__ void map_terms_kernel(int64_t n, F f, T* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = static_cast<T>(f(i).x);
}

// Sums f over [0, n) into *total and/or out[0] (either may be null), as described above.
template <class T, class F>
void sum_terms(int64_t n, const F& f, LossReduction reduction, double2* total, T* out, cudaStream_t stream,
               const char* kernel) {
  const int64_t blocks = std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxPartials);
  detail::Scratch partials(kernel, sizeof(double2) * blocks, stream);
  partial_sums_kernel<F><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(n, f, partials.as<double2>());
  check_launch(kernel);
  finish_sum_kernel<T><<<1, kThreads, 0, stream>>>(partials.as<double2>(), blocks, reduction, total, out);
  check_launch(kernel);
}

// None: out[i] = f(i).value; Sum / Mean: out[0] as sum_terms.
template <class T, class F>
void reduce_loss(int64_t n, LossReduction reduction, const F& f, T* out, cudaStream_t stream, const char* kernel) {
  if (reduction != LossReduction::None) return sum_terms<T>(n, f, reduction, nullptr, out, stream, kernel);
  if (n == 0) return;
  map_terms_kernel<T, F><<<detail::blocks_for(n), kThreads, 0, stream>>>(n, f, out);
  check_launch(kernel);
}

template <class T>
struct MseTerm {
  const T* input;
  const T* target;
  __device__ double2 operator()(int64_t i) const {
    return make_double2(loss_math::mse_loss(static_cast<double>(input[i]), static_cast<double>(target[i])), 1.0);
  }
};

template <class T>
struct BceTerm {
  const T *input, *target, *weight, *pos_weight;
  int64_t C;
  __device__ double2 operator()(int64_t i) const {
    const double w = weight ? static_cast<double>(weight[i]) : 1.0;
    const double pw = pos_weight ? static_cast<double>(pos_weight[i % C]) : 1.0;
    return make_double2(loss_math::bce_with_logits_loss(input[i], target[i], w, pw), 1.0);
  }
};

// (l_i, w_y), both 0 for ignored samples; l_i = 0 when row_loss is null (backward's denominator).
template <class T>
struct CrossEntropyTerm {
  const double* row_loss;
  const int64_t* target;
  const T* weight;
  int64_t ignore_index;
  __device__ double2 operator()(int64_t i) const {
    const int64_t y = target[i];
    if (y == ignore_index) return make_double2(0.0, 0.0);
    return make_double2(row_loss ? row_loss[i] : 0.0, weight ? static_cast<double>(weight[y]) : 1.0);
  }
};

// ---- elementwise backward kernels ----

template <class T>
__global__ void mse_backward_kernel(const T* dout, const T* input, const T* target, int64_t n,
                                    LossReduction reduction, T* dinput, T* dtarget) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double g = grad_of(dout, i, reduction, static_cast<double>(n));
    const double d = loss_math::mse_dinput(static_cast<double>(input[i]), static_cast<double>(target[i])) * g;
    if (dinput) dinput[i] = static_cast<T>(d);
    if (dtarget) dtarget[i] = static_cast<T>(-d);
  }
}

template <class T>
__global__ void bce_backward_kernel(const T* dout, const T* input, const T* target, const T* weight,
                                    const T* pos_weight, int64_t n, int64_t C, LossReduction reduction, T* dinput,
                                    T* dtarget) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double g = grad_of(dout, i, reduction, static_cast<double>(n));
    const double w = weight ? static_cast<double>(weight[i]) : 1.0;
    const double pw = pos_weight ? static_cast<double>(pos_weight[i % C]) : 1.0;
    if (dinput) dinput[i] = static_cast<T>(g * loss_math::bce_with_logits_dinput(input[i], target[i], w, pw));
    if (dtarget) dtarget[i] = static_cast<T>(g * loss_math::bce_with_logits_dtarget(input[i], w, pw));
  }
}

// ---- cross_entropy: one block per row of C logits ----

// sum_c w_c (w = 1 without weight) over the block; every thread gets it.
template <class T>
__device__ double weight_total(const T* weight, int64_t C, double* smem) {
  double s = 0.0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += weight ? static_cast<double>(weight[c]) : 1.0;
  return rows::block_sum(s, smem);
}

// lse[i] = log sum_c exp(x_ic) (max subtracted, in double) and row_loss[i] = l_i.
template <class T>
__global__ void cross_entropy_rows_kernel(const T* logits, const int64_t* target, const T* weight, int64_t N,
                                          int64_t C, int64_t ignore_index, double eps, T* lse, double* row_loss) {
  using std::exp, std::log;
  __shared__ double smem[rows::kWarp];
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const T* x = logits + i * C;
    double mx = static_cast<double>(x[0]);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) mx = rows::Max{}(mx, static_cast<double>(x[c]));
    mx = rows::block_max(mx, smem);
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += exp(static_cast<double>(x[c]) - mx);
    // Rounded to T before the loss uses it, as on the CPU (which reads back lse[i]).
    const T l = static_cast<T>(mx + log(rows::block_sum(s, smem)));
    double total = 0.0, wx = 0.0;  // sum_c w_c and sum_c w_c x_c, for label smoothing
    if (eps > 0.0) {
      total = weight_total(weight, C, smem);
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        wx += (weight ? static_cast<double>(weight[c]) : 1.0) * static_cast<double>(x[c]);
      wx = rows::block_sum(wx, smem);
    }
    if (threadIdx.x != 0) continue;
    lse[i] = l;
    const int64_t y = target[i];
    const double wy = y == ignore_index ? 0.0 : (weight ? static_cast<double>(weight[y]) : 1.0);
    row_loss[i] = y == ignore_index ? 0.0
                                    : loss_math::cross_entropy_loss(static_cast<double>(l), static_cast<double>(x[y]),
                                                                    wy, eps, C, total, wx);
  }
}

// total: sum_{i not ignored} w_y in total->y (Mean only; null otherwise).
template <class T>
__global__ void cross_entropy_backward_kernel(const T* dout, const T* logits, const int64_t* target, const T* weight,
                                              const T* lse, int64_t N, int64_t C, int64_t ignore_index, double eps,
                                              LossReduction reduction, const double2* total, T* dlogits) {
  using std::exp;
  __shared__ double smem[rows::kWarp];
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const T* x = logits + i * C;
    T* dx = dlogits + i * C;
    const double wt = eps > 0.0 ? weight_total(weight, C, smem) : 0.0;
    const int64_t y = target[i];
    if (y == ignore_index) {
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dx[c] = T(0);
      continue;
    }
    const double g = grad_of(dout, i, reduction, total ? total->y : 0.0);
    const double wy = weight ? static_cast<double>(weight[y]) : 1.0;
    const double l = static_cast<double>(lse[i]);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const double p = exp(static_cast<double>(x[c]) - l);
      const double wc = weight ? static_cast<double>(weight[c]) : 1.0;
      dx[c] = static_cast<T>(g * loss_math::cross_entropy_dlogit(p, c == y, wy, wc, eps, C, wt));
    }
  }
}

}  // namespace

template <typename T>
void mse_loss_forward(const T* input, const T* target, int64_t n, LossReduction reduction, T* out,
                      cudaStream_t stream) {
  reduce_loss(n, reduction, MseTerm<T>{input, target}, out, stream, "mse_loss_forward");
}

template <typename T>
void mse_loss_backward(const T* dout, const T* input, const T* target, int64_t n, LossReduction reduction,
                       T* dinput, T* dtarget, cudaStream_t stream) {
  if (n == 0 || (dinput == nullptr && dtarget == nullptr)) return;
  mse_backward_kernel<T>
      <<<detail::blocks_for(n), kThreads, 0, stream>>>(dout, input, target, n, reduction, dinput, dtarget);
  check_launch("mse_loss_backward");
}

template <typename T>
void binary_cross_entropy_with_logits_forward(const T* input, const T* target, const T* weight, const T* pos_weight,
                                              int64_t n, int64_t C, LossReduction reduction, T* out,
                                              cudaStream_t stream) {
  reduce_loss(n, reduction, BceTerm<T>{input, target, weight, pos_weight, C}, out, stream,
              "binary_cross_entropy_with_logits_forward");
}

template <typename T>
void binary_cross_entropy_with_logits_backward(const T* dout, const T* input, const T* target, const T* weight,
                                               const T* pos_weight, int64_t n, int64_t C, LossReduction reduction,
                                               T* dinput, T* dtarget, cudaStream_t stream) {
  if (n == 0 || (dinput == nullptr && dtarget == nullptr)) return;
  bce_backward_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(dout, input, target, weight, pos_weight, n,
                                                                         C, reduction, dinput, dtarget);
  check_launch("binary_cross_entropy_with_logits_backward");
}

template <typename T>
int64_t cross_entropy_forward(const T* logits, const int64_t* target, const T* weight, int64_t N, int64_t C,
                              int64_t ignore_index, double label_smoothing, LossReduction reduction, T* out, T* lse,
                              cudaStream_t stream) {
  const char* kernel = "cross_entropy_forward";
  require(N == 0 || C > 0, kernel, "expected at least one class, found C = " + std::to_string(C));
  const int64_t bad = rows::first_invalid_index(target, N, C, true, ignore_index, stream, kernel);
  if (bad >= 0) return bad;
  detail::Scratch row_loss(kernel, sizeof(double) * N, stream);
  if (N > 0) {
    cross_entropy_rows_kernel<T><<<rows::blocks_for(N), rows::threads_for(C), 0, stream>>>(
        logits, target, weight, N, C, ignore_index, label_smoothing, lse, row_loss.as<double>());
    check_launch(kernel);
  }
  reduce_loss(N, reduction, CrossEntropyTerm<T>{row_loss.as<double>(), target, weight, ignore_index}, out, stream,
              kernel);
  return -1;
}

template <typename T>
void cross_entropy_backward(const T* dout, const T* logits, const int64_t* target, const T* weight, const T* lse,
                            int64_t N, int64_t C, int64_t ignore_index, double label_smoothing,
                            LossReduction reduction, T* dlogits, cudaStream_t stream) {
  const char* kernel = "cross_entropy_backward";
  if (N == 0 || C == 0) return;
  detail::Scratch total(kernel, sizeof(double2), stream);
  const bool mean = reduction == LossReduction::Mean;
  if (mean)
    sum_terms<T>(N, CrossEntropyTerm<T>{nullptr, target, weight, ignore_index}, reduction, total.as<double2>(),
                 nullptr, stream, kernel);
  cross_entropy_backward_kernel<T><<<rows::blocks_for(N), rows::threads_for(C), 0, stream>>>(
      dout, logits, target, weight, lse, N, C, ignore_index, label_smoothing, reduction,
      mean ? total.as<double2>() : nullptr, dlogits);
  check_launch(kernel);
}

#define ND_INSTANTIATE(T)                                                                                           \
  template void mse_loss_forward<T>(const T*, const T*, int64_t, LossReduction, T*, cudaStream_t);                 \
  template void mse_loss_backward<T>(const T*, const T*, const T*, int64_t, LossReduction, T*, T*, cudaStream_t);   \
  template void binary_cross_entropy_with_logits_forward<T>(const T*, const T*, const T*, const T*, int64_t,       \
                                                            int64_t, LossReduction, T*, cudaStream_t);             \
  template void binary_cross_entropy_with_logits_backward<T>(const T*, const T*, const T*, const T*, const T*,     \
                                                             int64_t, int64_t, LossReduction, T*, T*,              \
                                                             cudaStream_t);                                        \
  template int64_t cross_entropy_forward<T>(const T*, const int64_t*, const T*, int64_t, int64_t, int64_t, double, \
                                            LossReduction, T*, T*, cudaStream_t);                                  \
  template void cross_entropy_backward<T>(const T*, const T*, const int64_t*, const T*, const T*, int64_t,         \
                                          int64_t, int64_t, double, LossReduction, T*, cudaStream_t);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cuda
