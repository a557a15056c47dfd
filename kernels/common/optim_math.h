#pragma once
// The per-element updates of the fused optimizer steps, shared by kernels/cpu/optim.cpp and
// kernels/cuda/optim.cu so both devices do the same arithmetic in the same order
// (formulas in kernels/cpu/optim.h). The coefficients are derived once per step on the
// host (bias corrections in double), then each element is updated in place.
#include <cmath>
#include <cstdint>

#include "kernels/common/counter_rng.h"  // ND_HOST_DEVICE
#include "kernels/cpu/optim.h"

namespace nd::kernels::optim_math {

template <class T>
struct Sgd {
  T lr, mom, damp, wd;
  bool use_momentum, first_step, nesterov;
};

template <class T>
inline Sgd<T> sgd(const cpu::SgdParams& hp) {
  return {T(hp.lr), T(hp.momentum), T(hp.dampening), T(hp.weight_decay), hp.momentum != 0, hp.first_step,
          hp.nesterov};
}

template <class T>
ND_HOST_DEVICE void sgd_update(const Sgd<T>& c, int64_t i, T* p, const T* g, T* buf) {
  T d = g[i] + c.wd * p[i];
  if (c.use_momentum) {
    buf[i] = c.first_step ? d : c.mom * buf[i] + (T(1) - c.damp) * d;
    d = c.nesterov ? d + c.mom * buf[i] : buf[i];
  }
  p[i] -= c.lr * d;
}

template <class T>
struct Adam {
  T step_size, sqrt_bc2, b1, b2, eps, wd, decay;
  bool decoupled, amsgrad;
};

template <class T>
inline Adam<T> adam(const cpu::AdamParams& hp) {
  const double bc1 = 1 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1 - std::pow(hp.beta2, static_cast<double>(hp.step));
  return {T(hp.lr / bc1), T(std::sqrt(bc2)), T(hp.beta1), T(hp.beta2), T(hp.eps), T(hp.weight_decay),
          T(1 - hp.lr * hp.weight_decay), hp.decoupled_weight_decay, hp.amsgrad};
}

// A multi-tensor Adam step (cpu/cuda adam_step_multi) works in chunks of this many
// elements of one tensor, each tensor at its own step.
constexpr int64_t kAdamChunk = 4096;
template <class T>
inline Adam<T> adam_at_step(cpu::AdamParams hp, int64_t step) {
  hp.step = step;
  return adam<T>(hp);
}

template <class T>
ND_HOST_DEVICE void adam_update(const Adam<T>& c, int64_t i, T* p, const T* g, T* m, T* v, T* vmax) {
  using std::sqrt;
  T grad = g[i];
  if (c.decoupled)
    p[i] *= c.decay;
  else
    grad += c.wd * p[i];
  m[i] = c.b1 * m[i] + (T(1) - c.b1) * grad;
  v[i] = c.b2 * v[i] + (T(1) - c.b2) * grad * grad;
  T second = v[i];
  if (c.amsgrad) second = vmax[i] = vmax[i] < v[i] ? v[i] : vmax[i];  // std::max(vmax, v)
  p[i] -= c.step_size * m[i] / (sqrt(second) / c.sqrt_bc2 + c.eps);
}

}  // namespace nd::kernels::optim_math
