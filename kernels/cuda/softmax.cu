// Softmax / log-softmax: one block per row (rows::threads_for picks a warp for short
// rows). The forward reads the row twice and writes it once: each thread strides over the
// row keeping the online maximum and sum of exp(x - maximum) of its elements
// (kernels/common/online_softmax.h), the block merges them, then each thread writes its
// elements' outputs. A thread reads and writes the
// same elements in both passes, so y may alias x. Accumulation is in T, as in
// kernels/cpu/softmax.cpp, in another order (each thread's running sum is rescaled when its
// maximum moves): the same bits run to run, within the sum's rounding of the CPU's.
#include "kernels/cuda/softmax.h"

#include <cmath>

#include "kernels/common/online_softmax.h"
#include "kernels/common/twin_types.h"
#include "kernels/cuda/row_reduce.cuh"

namespace nd::kernels::cuda {

namespace {

// The merge of every thread's state, in every thread: a warp's xor butterfly (merge is
// commutative bit for bit, so every lane ends with the same bits), then the warps' states in
// warp order, as rows::block_reduce. Every thread of the block must call it (it synchronises).
template <class T>
__device__ OnlineSoftmax<T> block_online(OnlineSoftmax<T> s, T* smem_m, T* smem_l) {
  T scale_a, scale_b;
  for (int o = rows::kWarp / 2; o > 0; o /= 2) {
    OnlineSoftmax<T> other;
    other.m = __shfl_xor_sync(0xffffffffu, s.m, o);
    other.l = __shfl_xor_sync(0xffffffffu, s.l, o);
    s = merge(s, other, &scale_a, &scale_b);
  }
  const int warps = static_cast<int>(blockDim.x) / rows::kWarp;
  if (threadIdx.x % rows::kWarp == 0) {
    smem_m[threadIdx.x / rows::kWarp] = s.m;
    smem_l[threadIdx.x / rows::kWarp] = s.l;
  }
  __syncthreads();
  OnlineSoftmax<T> r;
  r.m = smem_m[0];
  r.l = smem_l[0];
  for (int w = 1; w < warps; ++w) {
    OnlineSoftmax<T> other;
    other.m = smem_m[w];
    other.l = smem_l[w];
    r = merge(r, other, &scale_a, &scale_b);
  }
  __syncthreads();  // the arrays are free for the next row
  return r;
}

template <class T, bool Log>
__global__ void softmax_forward_kernel(const T* x, int64_t M, int64_t D, T* y) {
  using std::exp, std::log;
  __shared__ T smem_m[rows::kWarp];
  __shared__ T smem_l[rows::kWarp];
  for (int64_t m = blockIdx.x; m < M; m += gridDim.x) {
    const T* xr = x + m * D;
    T* yr = y + m * D;
    OnlineSoftmax<T> s;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const T v = xr[d];
      if (v > s.m) s.begin_block(v);  // the maximum moves: the sum so far is rescaled
      s.add(s.weight(v));
    }
    s = block_online(s, smem_m, smem_l);
    // A row of only -inf keeps m = -inf and l = 0 and shifts by 0 (online_softmax.h): it
    // comes out as 0 * (1/0) or -inf - log(0) = NaN, as on the CPU and in PyTorch.
    const T shift = s.shift();
    if (Log) {
      const T total = shift + log(s.l);
      for (int64_t d = threadIdx.x; d < D; d += blockDim.x) yr[d] = xr[d] - total;
    } else {
      const T inv = T(1) / s.l;
      for (int64_t d = threadIdx.x; d < D; d += blockDim.x) yr[d] = exp(xr[d] - shift) * inv;
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
