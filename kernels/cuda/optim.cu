// Fused optimizer steps: one thread per parameter element reads p, g and the state
// once and writes them once. Formulas as kernels/cpu/optim.cpp (see kernels/cpu/optim.h);
// the bias corrections are computed once on the host.
#include "kernels/cuda/optim.h"

#include <cmath>

#include "kernels/cuda/strided.cuh"

namespace nd::kernels::cuda {

namespace {

using detail::kThreads;

template <class T>
__global__ void sgd_kernel(int64_t n, T lr, T mom, T damp, T wd, bool use_momentum, bool first_step, bool nesterov,
                           T* p, const T* g, T* buf) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    T d = g[i] + wd * p[i];
    if (use_momentum) {
      buf[i] = first_step ? d : mom * buf[i] + (T(1) - damp) * d;
      d = nesterov ? d + mom * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
}

template <class T>
__global__ void adam_kernel(int64_t n, T step_size, T sqrt_bc2, T b1, T b2, T eps, T wd, T decay, bool decoupled,
                            bool amsgrad, T* p, const T* g, T* m, T* v, T* vmax) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    T grad = g[i];
    if (decoupled)
      p[i] *= decay;
    else
      grad += wd * p[i];
    m[i] = b1 * m[i] + (T(1) - b1) * grad;
    v[i] = b2 * v[i] + (T(1) - b2) * grad * grad;
    T second = v[i];
    if (amsgrad) second = vmax[i] = vmax[i] > v[i] ? vmax[i] : v[i];
    p[i] -= step_size * m[i] / (sqrt(second) / sqrt_bc2 + eps);
  }
}

}  // namespace

template <class T>
void sgd_step(int64_t n, const SgdParams& hp, T* p, const T* g, T* buf, cudaStream_t stream) {
  if (n == 0) return;
  sgd_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(
      n, T(hp.lr), T(hp.momentum), T(hp.dampening), T(hp.weight_decay), hp.momentum != 0, hp.first_step,
      hp.nesterov, p, g, buf);
  check_launch("sgd_step");
}

template <class T>
void adam_step(int64_t n, const AdamParams& hp, T* p, const T* g, T* m, T* v, T* vmax, cudaStream_t stream) {
  if (n == 0) return;
  const double bc1 = 1 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1 - std::pow(hp.beta2, static_cast<double>(hp.step));
  adam_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(
      n, T(hp.lr / bc1), T(std::sqrt(bc2)), T(hp.beta1), T(hp.beta2), T(hp.eps), T(hp.weight_decay),
      T(1 - hp.lr * hp.weight_decay), hp.decoupled_weight_decay, hp.amsgrad, p, g, m, v, vmax);
  check_launch("adam_step");
}

template void sgd_step<float>(int64_t, const SgdParams&, float*, const float*, float*, cudaStream_t);
template void sgd_step<double>(int64_t, const SgdParams&, double*, const double*, double*, cudaStream_t);
template void adam_step<float>(int64_t, const AdamParams&, float*, const float*, float*, float*, float*,
                               cudaStream_t);
template void adam_step<double>(int64_t, const AdamParams&, double*, const double*, double*, double*, double*,
                                cudaStream_t);

}  // namespace nd::kernels::cuda
