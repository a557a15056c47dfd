// Gather (index_select) and its backward (index_add) along the middle dimension of a
// contiguous [outer, D, inner] array; one thread per element of the small side.
#include "kernels/cuda/index.h"

#include "kernels/common/float16.h"
#include "kernels/cuda/strided.cuh"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cuda {

namespace {

using detail::kThreads;

// U: the element's bit pattern (a gather converts nothing).
template <class U>
__global__ void index_select_kernel(int64_t outer, int64_t D, int64_t inner, const U* x, int64_t K,
                                    const int64_t* index, U* out) {
  const int64_t n = outer * K * inner;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t in = i % inner, k = (i / inner) % K, o = i / (inner * K);
    out[i] = x[(o * D + index[k]) * inner + in];
  }
}

template <class T>
__global__ void index_add_kernel(int64_t outer, int64_t D, int64_t inner, int64_t K, const int64_t* index,
                                 const T* dy, T* dx) {
  const int64_t n = outer * K * inner;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t in = i % inner, k = (i / inner) % K, o = i / (inner * K);
    atomicAdd(dx + (o * D + index[k]) * inner + in, dy[i]);
  }
}

}  // namespace

template <class T>
void index_select(int64_t outer, int64_t D, int64_t inner, const T* x, int64_t K, const int64_t* index, T* out,
                  cudaStream_t stream) {
  const int64_t n = outer * K * inner;
  if (n == 0) return;
  using U = typename detail::Bits<sizeof(T)>::type;
  index_select_kernel<U><<<detail::blocks_for(n), kThreads, 0, stream>>>(
      outer, D, inner, reinterpret_cast<const U*>(x), K, index, reinterpret_cast<U*>(out));
  check_launch("index_select");
}

template <class T>
void index_add(int64_t outer, int64_t D, int64_t inner, int64_t K, const int64_t* index, const T* dy, T* dx,
               cudaStream_t stream) {
  const int64_t n = outer * K * inner;
  if (n == 0) return;
  index_add_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(outer, D, inner, K, index, dy, dx);
  check_launch("index_add");
}

#define ND_SELECT(T) \
  template void index_select<T>(int64_t, int64_t, int64_t, const T*, int64_t, const int64_t*, T*, cudaStream_t);
ND_SELECT(float)
ND_SELECT(double)
ND_SELECT(BFloat16)
ND_SELECT(Half)
ND_SELECT(int64_t)
ND_SELECT(int32_t)
ND_SELECT(uint8_t)
ND_SELECT(bool)
#define ND_INSTANTIATE(T) \
  template void index_add<T>(int64_t, int64_t, int64_t, int64_t, const int64_t*, const T*, T*, cudaStream_t);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cuda
