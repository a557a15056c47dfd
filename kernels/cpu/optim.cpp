#include "kernels/cpu/optim.h"

#include <algorithm>
#include <cmath>

namespace nd::kernels::cpu {

template <class T>
void sgd_step(int64_t n, const SgdParams& hp, T* p, const T* g, T* buf) {
  const T lr = T(hp.lr), mom = T(hp.momentum), damp = T(hp.dampening), wd = T(hp.weight_decay);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    T d = g[i] + wd * p[i];
    if (hp.momentum != 0) {
      buf[i] = hp.first_step ? d : mom * buf[i] + (T(1) - damp) * d;
      d = hp.nesterov ? d + mom * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
}

template <class T>
void adam_step(int64_t n, const AdamParams& hp, T* p, const T* g, T* m, T* v, T* vmax) {
  const double bc1 = 1 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1 - std::pow(hp.beta2, static_cast<double>(hp.step));
  const T step_size = T(hp.lr / bc1), sqrt_bc2 = T(std::sqrt(bc2));
  const T b1 = T(hp.beta1), b2 = T(hp.beta2), eps = T(hp.eps), wd = T(hp.weight_decay);
  const T decay = T(1 - hp.lr * hp.weight_decay);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    T grad = g[i];
    if (hp.decoupled_weight_decay)
      p[i] *= decay;
    else
      grad += wd * p[i];
    m[i] = b1 * m[i] + (T(1) - b1) * grad;
    v[i] = b2 * v[i] + (T(1) - b2) * grad * grad;
    T second = v[i];
    if (hp.amsgrad) second = vmax[i] = std::max(vmax[i], v[i]);
    p[i] -= step_size * m[i] / (std::sqrt(second) / sqrt_bc2 + eps);
  }
}

template void sgd_step<float>(int64_t, const SgdParams&, float*, const float*, float*);
template void sgd_step<double>(int64_t, const SgdParams&, double*, const double*, double*);
template void adam_step<float>(int64_t, const AdamParams&, float*, const float*, float*, float*, float*);
template void adam_step<double>(int64_t, const AdamParams&, double*, const double*, double*, double*, double*);

}  // namespace nd::kernels::cpu
