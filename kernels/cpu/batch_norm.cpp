#include "kernels/cpu/batch_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/twin_types.h"

namespace nd::kernels::cpu {

template <typename T>
void batch_norm_channel_stats(const T* x, int64_t N, int64_t C, int64_t S, double* sum,
                              double* sumsq) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    double s = 0.0, ss = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const T* row = x + (n * C + c) * S;
      for (int64_t i = 0; i < S; ++i) {
        const double v = static_cast<double>(row[i]);
        s += v;
        ss += v * v;
      }
    }
    sum[c] = s;
    sumsq[c] = ss;
  }
}

template <typename T>
void batch_norm_stats_to_mean_invstd(const double* sum, const double* sumsq, double count,
                                     int64_t C, double eps, double momentum, T* mean,
                                     T* invstd, T* running_mean, T* running_var) {
  for (int64_t c = 0; c < C; ++c) {
    const double m = sum[c] / count;
    // Clamp: rounding can make E[x^2] - E[x]^2 slightly negative for constant channels.
    const double var = std::max(sumsq[c] / count - m * m, 0.0);
    mean[c] = static_cast<T>(m);
    invstd[c] = static_cast<T>(1.0 / std::sqrt(var + eps));
    if (running_mean != nullptr) {
      running_mean[c] = static_cast<T>((1.0 - momentum) * running_mean[c] + momentum * m);
    }
    if (running_var != nullptr) {
      const double unbiased = var * count / (count - 1.0);
      running_var[c] = static_cast<T>((1.0 - momentum) * running_var[c] + momentum * unbiased);
    }
  }
}

template <typename T>
void batch_norm_invstd(const T* var, int64_t C, double eps, T* invstd) {
  for (int64_t c = 0; c < C; ++c) {
    invstd[c] = static_cast<T>(1.0 / std::sqrt(static_cast<double>(var[c]) + eps));
  }
}

template <typename T>
void batch_norm_apply(const T* x, const T* mean, const T* invstd, const T* weight,
                      const T* bias, int64_t N, int64_t C, int64_t S, T* y,
                      BatchNormActivation act) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      // Subtract the mean first: folding it into the shift cancels badly when |mean| >> std.
      const T m = mean[c];
      const T a = invstd[c] * (weight ? weight[c] : T(1));
      const T b = bias ? bias[c] : T(0);
      const T* xr = x + (n * C + c) * S;
      T* yr = y + (n * C + c) * S;
      for (int64_t i = 0; i < S; ++i) yr[i] = act.forward((xr[i] - m) * a + b);
    }
  }
}

template <typename T>
void batch_norm_backward_reduce(const T* dy, const T* x, const T* mean, int64_t N, int64_t C,
                                int64_t S, double* sum_dy, double* sum_dy_xmu) {
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    const double m = static_cast<double>(mean[c]);
    double sd = 0.0, sdx = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + (n * C + c) * S;
      const T* dr = dy + (n * C + c) * S;
      for (int64_t i = 0; i < S; ++i) {
        const double g = static_cast<double>(dr[i]);
        sd += g;
        sdx += g * (static_cast<double>(xr[i]) - m);
      }
    }
    sum_dy[c] = sd;
    sum_dy_xmu[c] = sdx;
  }
}

template <typename T>
void batch_norm_backward_elemt(const T* dy, const T* x, const T* mean, const T* invstd,
                               const T* weight, const double* sum_dy, const double* sum_dy_xmu,
                               double count, int64_t N, int64_t C, int64_t S, T* dx) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const double is = static_cast<double>(invstd[c]);
      const double m = static_cast<double>(mean[c]);
      const double w = weight ? static_cast<double>(weight[c]) : 1.0;
      const double mean_dy = sum_dy[c] / count;
      const double proj = sum_dy_xmu[c] / count * is * is;  // coefficient of (x - mean)
      const double scale = w * is;
      const T* xr = x + (n * C + c) * S;
      const T* dr = dy + (n * C + c) * S;
      T* out = dx + (n * C + c) * S;
      for (int64_t i = 0; i < S; ++i) {
        const double xm = static_cast<double>(xr[i]) - m;
        out[i] = static_cast<T>(scale * (static_cast<double>(dr[i]) - mean_dy - xm * proj));
      }
    }
  }
}

template <typename T>
void batch_norm_forward_training(const T* x, const T* weight, const T* bias, T* running_mean,
                                 T* running_var, int64_t N, int64_t C, int64_t S,
                                 double momentum, double eps, T* y, T* save_mean,
                                 T* save_invstd, BatchNormActivation act) {
  std::vector<double> sum(C), sumsq(C);
  batch_norm_channel_stats(x, N, C, S, sum.data(), sumsq.data());
  batch_norm_stats_to_mean_invstd(sum.data(), sumsq.data(), static_cast<double>(N * S), C, eps,
                                  momentum, save_mean, save_invstd, running_mean, running_var);
  batch_norm_apply(x, save_mean, save_invstd, weight, bias, N, C, S, y, act);
}

template <typename T>
void batch_norm_forward_eval(const T* x, const T* running_mean, const T* running_var,
                             const T* weight, const T* bias, int64_t N, int64_t C, int64_t S,
                             double eps, T* y, BatchNormActivation act) {
  std::vector<T> invstd(C);
  batch_norm_invstd(running_var, C, eps, invstd.data());
  batch_norm_apply(x, running_mean, invstd.data(), weight, bias, N, C, S, y, act);
}

template <typename T>
void batch_norm_backward(const T* dy, const T* x, const T* mean, const T* invstd,
                         const T* weight, int64_t N, int64_t C, int64_t S, bool training,
                         T* grad_input, T* grad_weight, T* grad_bias, BatchNormActivation act,
                         const T* y) {
  std::vector<T> through;  // dy taken back through the activation (the unfused pair's dx)
  if (act.on()) {
    const int64_t total = N * C * S;
    through.resize(total);
#pragma omp parallel for schedule(static) if (total > 65536)
    for (int64_t i = 0; i < total; ++i) through[i] = act.backward(dy[i], y[i]);
    dy = through.data();
  }
  std::vector<double> sum_dy(C), sum_dy_xmu(C);
  batch_norm_backward_reduce(dy, x, mean, N, C, S, sum_dy.data(), sum_dy_xmu.data());
  for (int64_t c = 0; c < C; ++c) {
    if (grad_weight) grad_weight[c] = static_cast<T>(sum_dy_xmu[c] * invstd[c]);
    if (grad_bias) grad_bias[c] = static_cast<T>(sum_dy[c]);
  }
  if (grad_input == nullptr) return;
  if (training) {
    batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy.data(), sum_dy_xmu.data(),
                              static_cast<double>(N * S), N, C, S, grad_input);
    return;
  }
  // Eval: mean and invstd are constants, so the map is affine: dx = dy * weight * invstd.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const T a = invstd[c] * (weight ? weight[c] : T(1));
      const T* dr = dy + (n * C + c) * S;
      T* out = grad_input + (n * C + c) * S;
      for (int64_t i = 0; i < S; ++i) out[i] = dr[i] * a;
    }
  }
}

#define ND_INSTANTIATE(T)                                                                      \
  template void batch_norm_channel_stats<T>(const T*, int64_t, int64_t, int64_t, double*,     \
                                            double*);                                          \
  template void batch_norm_stats_to_mean_invstd<T>(const double*, const double*, double,      \
                                                   int64_t, double, double, T*, T*, T*, T*);   \
  template void batch_norm_invstd<T>(const T*, int64_t, double, T*);                          \
  template void batch_norm_apply<T>(const T*, const T*, const T*, const T*, const T*, int64_t, \
                                    int64_t, int64_t, T*, BatchNormActivation);                \
  template void batch_norm_backward_reduce<T>(const T*, const T*, const T*, int64_t, int64_t,  \
                                              int64_t, double*, double*);                      \
  template void batch_norm_backward_elemt<T>(const T*, const T*, const T*, const T*, const T*, \
                                             const double*, const double*, double, int64_t,    \
                                             int64_t, int64_t, T*);                            \
  template void batch_norm_forward_training<T>(const T*, const T*, const T*, T*, T*, int64_t,  \
                                               int64_t, int64_t, double, double, T*, T*, T*,   \
                                               BatchNormActivation);                           \
  template void batch_norm_forward_eval<T>(const T*, const T*, const T*, const T*, const T*,   \
                                           int64_t, int64_t, int64_t, double, T*,              \
                                           BatchNormActivation);                               \
  template void batch_norm_backward<T>(const T*, const T*, const T*, const T*, const T*,       \
                                       int64_t, int64_t, int64_t, bool, T*, T*, T*,            \
                                       BatchNormActivation, const T*);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cpu
