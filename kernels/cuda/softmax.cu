// Softmax / log-softmax: one block per row (rows::threads_for picks a warp for short
// rows). Each thread strides over the row: pass 1 the maximum, pass 2 the sum of
// exp(x - max), pass 3 the output. A thread reads and writes the same elements in every
// pass, so y may alias x. Accumulation is in T, as in kernels/cpu/softmax.cpp.
#include "kernels/cuda/softmax.h"

#include <cmath>

#include "kernels/cuda/row_reduce.cuh"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cuda {

namespace {

template <class T, bool Log>
__global__ void softmax_forward_kernel(const T* x, int64_t M, int64_t D, T* y) {
  using std::exp, std::isinf, std::log;
  __shared__ T smem[rows::kWarp];
  for (int64_t m = blockIdx.x; m < M; m += gridDim.x) {
    const T* xr = x + m * D;
    T* yr = y + m * D;
    T mx = xr[0];
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) mx = rows::Max{}(mx, xr[d]);
    mx = rows::block_max(mx, smem);
    // A row of all -inf: subtract 0 instead (x - max would be NaN); the row comes out
    // as 0/0 = NaN, as on the CPU and in PyTorch.
    if (isinf(mx) && mx < T(0)) mx = T(0);
    T sum = 0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const T e = exp(xr[d] - mx);
      if (!Log) yr[d] = e;
      sum += e;
    }
    sum = rows::block_sum(sum, smem);
    if (Log) {
      const T shift = mx + log(sum);
      for (int64_t d = threadIdx.x; d < D; d += blockDim.x) yr[d] = xr[d] - shift;
    } else {
      const T inv = T(1) / sum;
      for (int64_t d = threadIdx.x; d < D; d += blockDim.x) yr[d] *= inv;
    }
  }
}

// softmax: dx = y (dy - sum dy y);  log_softmax: dx = dy - exp(y) sum dy.
template <class T, bool Log>
__global__ void softmax_backward_kernel(const T* dy, const T* y, int64_t M, int64_t D, T* dx) {
  using std::exp;
  __shared__ T smem[rows::kWarp];
  for (int64_t m = blockIdx.x; m < M; m += gridDim.x) {
    const T* g = dy + m * D;
    const T* yr = y + m * D;
    T* out = dx + m * D;
    T acc = 0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) acc += Log ? g[d] : g[d] * yr[d];
    acc = rows::block_sum(acc, smem);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
      out[d] = Log ? g[d] - exp(yr[d]) * acc : yr[d] * (g[d] - acc);
  }
}

template <class T, bool Log>
void launch_forward(const T* x, int64_t M, int64_t D, T* y, cudaStream_t stream, const char* kernel) {
  if (M == 0) return;
  require(D > 0, kernel, "expected rows of at least one element, found D = " + std::to_string(D));
  softmax_forward_kernel<T, Log><<<rows::blocks_for(M), rows::threads_for(D), 0, stream>>>(x, M, D, y);
  check_launch(kernel);
}

template <class T, bool Log>
void launch_backward(const T* dy, const T* y, int64_t M, int64_t D, T* dx, cudaStream_t stream, const char* kernel) {
  if (M == 0 || D == 0) return;
  softmax_backward_kernel<T, Log><<<rows::blocks_for(M), rows::threads_for(D), 0, stream>>>(dy, y, M, D, dx);
  check_launch(kernel);
}

}  // namespace

template <typename T>
void softmax_forward(const T* x, int64_t M, int64_t D, T* y, cudaStream_t stream) {
  launch_forward<T, false>(x, M, D, y, stream, "softmax_forward");
}

template <typename T>
void log_softmax_forward(const T* x, int64_t M, int64_t D, T* y, cudaStream_t stream) {
  launch_forward<T, true>(x, M, D, y, stream, "log_softmax_forward");
}

template <typename T>
void softmax_backward(const T* dy, const T* y, int64_t M, int64_t D, T* dx, cudaStream_t stream) {
  launch_backward<T, false>(dy, y, M, D, dx, stream, "softmax_backward");
}

template <typename T>
void log_softmax_backward(const T* dy, const T* y, int64_t M, int64_t D, T* dx, cudaStream_t stream) {
  launch_backward<T, true>(dy, y, M, D, dx, stream, "log_softmax_backward");
}

#define ND_INSTANTIATE(T)                                                                            \
  template void softmax_forward<T>(const T*, int64_t, int64_t, T*, cudaStream_t);                    \
  template void log_softmax_forward<T>(const T*, int64_t, int64_t, T*, cudaStream_t);                \
  template void softmax_backward<T>(const T*, const T*, int64_t, int64_t, T*, cudaStream_t);         \
  template void log_softmax_backward<T>(const T*, const T*, int64_t, int64_t, T*, cudaStream_t);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cuda
