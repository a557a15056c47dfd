// Dropout: one thread per element (grid-stride), the mask regenerated from the counter
// RNG (kernels/common/dropout_mask.h, shared with kernels/cpu/dropout.cpp).
#include "kernels/cuda/dropout.h"

#include "kernels/common/dropout_mask.h"
#include "kernels/cuda/strided.cuh"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cuda {

namespace {

using detail::kThreads;

// Forward and backward are the same map: y_i = dropped_i ? 0 : x_i * scale.
template <class T>
__global__ void dropout_kernel(const T* x, int64_t n, double p, T scale, uint64_t seed, uint64_t offset, T* y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = dropout_apply(x[i], scale, seed, offset, i, p);
}

template <class T>
void launch(const T* x, int64_t n, double p, uint64_t seed, uint64_t offset, T* y, cudaStream_t stream,
            const char* kernel) {
  if (n == 0) return;
  dropout_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(x, n, p, dropout_scale<T>(p), seed, offset, y);
  check_launch(kernel);
}

}  // namespace

template <typename T>
void dropout_forward(const T* x, int64_t n, double p, uint64_t seed, uint64_t offset, T* y, cudaStream_t stream) {
  launch(x, n, p, seed, offset, y, stream, "dropout_forward");
}

template <typename T>
void dropout_backward(const T* dy, int64_t n, double p, uint64_t seed, uint64_t offset, T* dx,
                      cudaStream_t stream) {
  launch(dy, n, p, seed, offset, dx, stream, "dropout_backward");
}

#define ND_INSTANTIATE(T) \
  template void dropout_forward<T>(const T*, int64_t, double, uint64_t, uint64_t, T*, cudaStream_t); \
  template void dropout_backward<T>(const T*, int64_t, double, uint64_t, uint64_t, T*, cudaStream_t);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cuda
