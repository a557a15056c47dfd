// Fused optimizer steps: one thread per parameter element reads p, g and the state
// once and writes them once, with the CPU's per-element update (kernels/common/optim_math.h);
// the coefficients and bias corrections are computed once on the host.
#include "kernels/cuda/optim.h"

#include "kernels/common/optim_math.h"
#include "kernels/cuda/strided.cuh"

namespace nd::kernels::cuda {

namespace {

using detail::kThreads;

template <class T>
__global__ void sgd_kernel(int64_t n, optim_math::Sgd<T> c, T* p, const T* g, T* buf) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    optim_math::sgd_update(c, i, p, g, buf);
}

template <class T>
__global__ void adam_kernel(int64_t n, optim_math::Adam<T> c, T* p, const T* g, T* m, T* v, T* vmax) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    optim_math::adam_update(c, i, p, g, m, v, vmax);
}

// Every thread that sees a non-finite value stores the same 1: the flag ends the same
// whichever thread wins, so no atomic is needed.
template <class T>
__global__ void unscale_kernel(int64_t n, T* g, T inv_scale, int32_t* found) {
  bool nonfinite = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const T x = g[i];
    nonfinite = nonfinite || !(x - x == T(0));
    g[i] = x * inv_scale;
  }
  if (nonfinite) *found = 1;
}

}  // namespace

template <class T>
void sgd_step(int64_t n, const SgdParams& hp, T* p, const T* g, T* buf, cudaStream_t stream) {
  if (n == 0) return;
  sgd_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(n, optim_math::sgd<T>(hp), p, g, buf);
  check_launch("sgd_step");
}

template <class T>
void adam_step(int64_t n, const AdamParams& hp, T* p, const T* g, T* m, T* v, T* vmax, cudaStream_t stream) {
  if (n == 0) return;
  adam_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(n, optim_math::adam<T>(hp), p, g, m, v, vmax);
  check_launch("adam_step");
}

template <class T>
void unscale_grad(int64_t n, T* g, T inv_scale, int32_t* found_nonfinite, cudaStream_t stream) {
  if (n == 0) return;
  unscale_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(n, g, inv_scale, found_nonfinite);
  check_launch("unscale_grad");
}

template void sgd_step<float>(int64_t, const SgdParams&, float*, const float*, float*, cudaStream_t);
template void sgd_step<double>(int64_t, const SgdParams&, double*, const double*, double*, cudaStream_t);
template void adam_step<float>(int64_t, const AdamParams&, float*, const float*, float*, float*, float*,
                               cudaStream_t);
template void adam_step<double>(int64_t, const AdamParams&, double*, const double*, double*, double*, double*,
                                cudaStream_t);
template void unscale_grad<float>(int64_t, float*, float, int32_t*, cudaStream_t);
template void unscale_grad<double>(int64_t, double*, double, int32_t*, cudaStream_t);

}  // namespace nd::kernels::cuda
