#include "kernels/cpu/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/common/twin_types.h"

namespace nd::kernels::cpu {

using loss_math::grad_of;

namespace {

// Writes per-element losses l(i) for None, or their sum / mean into out[0]. The sum is
// in double with a fixed OpenMP reduction order per thread count.
template <typename T, typename F>
void reduce_loss(int64_t n, LossReduction reduction, double denominator, T* out, F l) {
  if (reduction == LossReduction::None) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(l(i));
    return;
  }
  double s = 0.0;
#pragma omp parallel for reduction(+ : s) schedule(static)
  for (int64_t i = 0; i < n; ++i) s += l(i);
  out[0] = static_cast<T>(reduction == LossReduction::Mean ? s / denominator : s);
}

}  // namespace

template <typename T>
void mse_loss_forward(const T* input, const T* target, int64_t n, LossReduction reduction,
                      T* out) {
  reduce_loss(n, reduction, static_cast<double>(n), out, [&](int64_t i) {
    return loss_math::mse_loss(static_cast<double>(input[i]), static_cast<double>(target[i]));
  });
}

template <typename T>
void mse_loss_backward(const T* dout, const T* input, const T* target, int64_t n,
                       LossReduction reduction, T* dinput, T* dtarget) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad_of(dout, i, reduction, static_cast<double>(n));
    const double d = loss_math::mse_dinput(static_cast<double>(input[i]), static_cast<double>(target[i])) * g;
    if (dinput) dinput[i] = static_cast<T>(d);
    if (dtarget) dtarget[i] = static_cast<T>(-d);
  }
}

template <typename T>
void binary_cross_entropy_with_logits_forward(const T* input, const T* target, const T* weight,
                                              const T* pos_weight, int64_t n, int64_t C,
                                              LossReduction reduction, T* out) {
  reduce_loss(n, reduction, static_cast<double>(n), out, [&](int64_t i) {
    const double pw = pos_weight ? static_cast<double>(pos_weight[i % C]) : 1.0;
    const double w = weight ? static_cast<double>(weight[i]) : 1.0;
    return loss_math::bce_with_logits_loss(input[i], target[i], w, pw);
  });
}

template <typename T>
void binary_cross_entropy_with_logits_backward(const T* dout, const T* input, const T* target,
                                               const T* weight, const T* pos_weight, int64_t n,
                                               int64_t C, LossReduction reduction, T* dinput,
                                               T* dtarget) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad_of(dout, i, reduction, static_cast<double>(n));
    const double w = weight ? static_cast<double>(weight[i]) : 1.0;
    const double pw = pos_weight ? static_cast<double>(pos_weight[i % C]) : 1.0;
    if (dinput) dinput[i] = static_cast<T>(g * loss_math::bce_with_logits_dinput(input[i], target[i], w, pw));
    if (dtarget) dtarget[i] = static_cast<T>(g * loss_math::bce_with_logits_dtarget(input[i], w, pw));
  }
}

namespace {
// Sum over non-ignored samples of weight[target] (their count without weight).
template <typename T>
double target_weight_sum(const int64_t* target, const T* weight, int64_t N,
                         int64_t ignore_index) {
  double s = 0.0;
  for (int64_t i = 0; i < N; ++i) {
    if (target[i] == ignore_index) continue;
    s += weight ? static_cast<double>(weight[target[i]]) : 1.0;
  }
  return s;
}
}  // namespace

template <typename T>
int64_t cross_entropy_forward(const T* logits, const int64_t* target, const T* weight, int64_t N,
                              int64_t C, int64_t ignore_index, double label_smoothing,
                              LossReduction reduction, T* out, T* lse) {
  for (int64_t i = 0; i < N; ++i) {
    if (target[i] != ignore_index && (target[i] < 0 || target[i] >= C)) return i;
  }
  double weight_total = 0.0;  // sum_c w_c, the smoothing term's weight
  for (int64_t c = 0; c < C; ++c) weight_total += weight ? static_cast<double>(weight[c]) : 1.0;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* x = logits + i * C;
    const double mx = static_cast<double>(*std::max_element(x, x + C));
    double s = 0.0;
    for (int64_t c = 0; c < C; ++c) s += std::exp(static_cast<double>(x[c]) - mx);
    lse[i] = static_cast<T>(mx + std::log(s));
  }
  const double eps = label_smoothing;
  reduce_loss(N, reduction, target_weight_sum(target, weight, N, ignore_index), out,
              [&](int64_t i) {
                const int64_t y = target[i];
                if (y == ignore_index) return 0.0;
                const T* x = logits + i * C;
                const double l = static_cast<double>(lse[i]);
                const double wy = weight ? static_cast<double>(weight[y]) : 1.0;
                double wx = 0.0;  // sum_c w_c x_c, the smoothing term's
                if (eps > 0.0) {
                  for (int64_t c = 0; c < C; ++c) {
                    wx += (weight ? static_cast<double>(weight[c]) : 1.0) * static_cast<double>(x[c]);
                  }
                }
                return loss_math::cross_entropy_loss(l, static_cast<double>(x[y]), wy, eps, C, weight_total, wx);
              });
  return -1;
}

template <typename T>
void cross_entropy_backward(const T* dout, const T* logits, const int64_t* target,
                            const T* weight, const T* lse, int64_t N, int64_t C,
                            int64_t ignore_index, double label_smoothing,
                            LossReduction reduction, T* dlogits) {
  const double denominator = target_weight_sum(target, weight, N, ignore_index);
  double weight_total = 0.0;
  for (int64_t c = 0; c < C; ++c) weight_total += weight ? static_cast<double>(weight[c]) : 1.0;
  const double eps = label_smoothing;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const int64_t y = target[i];
    const T* x = logits + i * C;
    T* dx = dlogits + i * C;
    if (y == ignore_index) {
      std::fill(dx, dx + C, T(0));
      continue;
    }
    const double g = grad_of(dout, i, reduction, denominator);
    const double wy = weight ? static_cast<double>(weight[y]) : 1.0;
    const double l = static_cast<double>(lse[i]);
    for (int64_t c = 0; c < C; ++c) {
      const double p = std::exp(static_cast<double>(x[c]) - l);
      const double wc = weight ? static_cast<double>(weight[c]) : 1.0;
      dx[c] = static_cast<T>(g * loss_math::cross_entropy_dlogit(p, c == y, wy, wc, eps, C, weight_total));
    }
  }
}

#define ND_INSTANTIATE(T)                                                                      \
  template void mse_loss_forward<T>(const T*, const T*, int64_t, LossReduction, T*);          \
  template void mse_loss_backward<T>(const T*, const T*, const T*, int64_t, LossReduction, T*, \
                                     T*);                                                      \
  template void binary_cross_entropy_with_logits_forward<T>(                                   \
      const T*, const T*, const T*, const T*, int64_t, int64_t, LossReduction, T*);            \
  template void binary_cross_entropy_with_logits_backward<T>(                                  \
      const T*, const T*, const T*, const T*, const T*, int64_t, int64_t, LossReduction, T*,   \
      T*);                                                                                     \
  template int64_t cross_entropy_forward<T>(const T*, const int64_t*, const T*, int64_t,       \
                                            int64_t, int64_t, double, LossReduction, T*, T*);  \
  template void cross_entropy_backward<T>(const T*, const T*, const int64_t*, const T*,        \
                                          const T*, int64_t, int64_t, int64_t, double,         \
                                          LossReduction, T*);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cpu
