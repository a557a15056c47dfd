#pragma once
// The per-element math of the losses (kernels/cpu/loss.h), shared by the CPU kernels and
// their CUDA twins so the two cannot drift apart. Everything is in double, the precision
// both accumulate in; the callers convert to and from T.
#include <cmath>
#include <cstdint>

#include "kernels/common/host_device.h"

namespace nd::kernels {

enum class LossReduction { None, Mean, Sum };

namespace loss_math {

// Incoming gradient of sample i: dout[i] (None), dout[0] (Sum), dout[0] / denominator (Mean).
template <class T>
ND_HOST_DEVICE double grad_of(const T* dout, int64_t i, LossReduction reduction, double denominator) {
  switch (reduction) {
    case LossReduction::None: return static_cast<double>(dout[i]);
    case LossReduction::Sum: return static_cast<double>(dout[0]);
    case LossReduction::Mean: break;
  }
  return static_cast<double>(dout[0]) / denominator;
}

// log(1 + exp(z)) without overflow: max(z, 0) + log1p(exp(-|z|)).
ND_HOST_DEVICE double softplus(double z) {
  using std::exp, std::fabs, std::log1p;
  return (z < 0.0 ? 0.0 : z) + log1p(exp(-fabs(z)));
}

// 1 / (1 + exp(-z)) without overflow.
ND_HOST_DEVICE double sigmoid(double z) {
  using std::exp;
  if (z >= 0) return 1.0 / (1.0 + exp(-z));
  const double e = exp(z);
  return e / (1.0 + e);
}

// mse_loss: l = (x - t)^2, dl/dx = 2 (x - t) = -dl/dt.
ND_HOST_DEVICE double mse_loss(double x, double t) { return (x - t) * (x - t); }
ND_HOST_DEVICE double mse_dinput(double x, double t) { return 2.0 * (x - t); }

// binary_cross_entropy_with_logits with weight w and positive-class weight pw (both 1
// when absent), lw = 1 + (pw - 1) t:
//   l     = w [ (1 - t) x + lw sp(-x) ]
//   dl/dx = w [ (1 - t) - lw sigmoid(-x) ]
//   dl/dt = w [ -x + (pw - 1) sp(-x) ]
ND_HOST_DEVICE double bce_with_logits_loss(double x, double t, double w, double pw) {
  return w * ((1.0 - t) * x + (1.0 + (pw - 1.0) * t) * softplus(-x));
}
ND_HOST_DEVICE double bce_with_logits_dinput(double x, double t, double w, double pw) {
  return w * ((1.0 - t) - (1.0 + (pw - 1.0) * t) * sigmoid(-x));
}
ND_HOST_DEVICE double bce_with_logits_dtarget(double x, double w, double pw) {
  return w * (-x + (pw - 1.0) * softplus(-x));
}

// cross_entropy of one sample with target y, eps = label_smoothing, C classes:
//   l = (1 - eps) w_y (lse - x_y) + (eps / C) (lse sum_c w_c - sum_c w_c x_c)
// weight_total = sum_c w_c and wx = sum_c w_c x_c (both only read when eps > 0).
ND_HOST_DEVICE double cross_entropy_loss(double lse, double x_y, double w_y, double eps, int64_t C,
                                         double weight_total, double wx) {
  double loss = (1.0 - eps) * w_y * (lse - x_y);
  if (eps > 0.0) loss += eps / static_cast<double>(C) * (lse * weight_total - wx);
  return loss;
}

// dl/dx_c with p = exp(x_c - lse): (1 - eps) w_y (p - [c == y]) + (eps / C) (p sum_k w_k - w_c).
ND_HOST_DEVICE double cross_entropy_dlogit(double p, bool is_target, double w_y, double w_c, double eps, int64_t C,
                                           double weight_total) {
  double d = (1.0 - eps) * w_y * (p - (is_target ? 1.0 : 0.0));
  if (eps > 0.0) d += eps / static_cast<double>(C) * (p * weight_total - w_c);
  return d;
}

}  // namespace loss_math
}  // namespace nd::kernels
