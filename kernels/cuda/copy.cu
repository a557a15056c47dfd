// Strided copy with dtype conversion, and fill. bf16 and f16 are moved as their 16-bit
// patterns and converted through float on the device (round to nearest even), as the
// CPU twin does with nd::BFloat16 / nd::Half.
#include "kernels/cuda/copy.h"

#include <cuda_fp16.h>

#include <cstring>
#include <type_traits>

#include "kernels/common/float16.h"
#include "kernels/cuda/strided.cuh"

namespace nd::kernels::cuda {

namespace {

using detail::Indexer;
using detail::kThreads;

__device__ float bf16_to_float(uint16_t bits) { return __uint_as_float(static_cast<uint32_t>(bits) << 16); }
__device__ uint16_t float_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// read(p): the value at p in arithmetic form; write(p, v): store v converted to *p's type.
template <class T>
__device__ T read(const T* p) {
  return *p;
}
__device__ float read(const BFloat16* p) { return bf16_to_float(*reinterpret_cast<const uint16_t*>(p)); }
__device__ float read(const Half* p) { return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p))); }

template <class D, class V>
__device__ void write(D* p, V v) {
  *p = static_cast<D>(v);
}
template <class V>
__device__ void write(BFloat16* p, V v) {
  *reinterpret_cast<uint16_t*>(p) = float_to_bf16(static_cast<float>(v));
}
template <class V>
__device__ void write(Half* p, V v) {
  *reinterpret_cast<uint16_t*>(p) = __half_as_ushort(__float2half_rn(static_cast<float>(v)));
}

template <class S, class D>
__global__ void copy_kernel(int64_t n, Indexer<2> ix, const S* src, D* dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    write(dst + off[1], read(src + off[0]));
  }
}

template <class U>
__global__ void fill_kernel(int64_t n, U value, U* dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

template <class T>
__global__ void add_constant_kernel(int64_t n, T value, T* dst) {
  using U = std::make_unsigned_t<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = static_cast<T>(static_cast<U>(dst[i]) + static_cast<U>(value));
}

}  // namespace

template <class S, class D>
void copy_strided(int64_t ndim, const int64_t* shape, const S* src, const int64_t* src_strides, D* dst,
                  const int64_t* dst_strides, cudaStream_t stream) {
  const int64_t n = detail::numel(ndim, shape);
  if (n == 0) return;
  const auto ix = detail::make_indexer<2>("copy_strided", ndim, shape, {src_strides, dst_strides});
  copy_kernel<S, D><<<detail::blocks_for(n), kThreads, 0, stream>>>(n, ix, src, dst);
  check_launch("copy_strided");
}

template <class T>
void fill(int64_t n, T value, T* dst, cudaStream_t stream) {
  if (n == 0) return;
  using U = typename detail::Bits<sizeof(T)>::type;
  U bits;
  std::memcpy(&bits, &value, sizeof(T));
  fill_kernel<U><<<detail::blocks_for(n), kThreads, 0, stream>>>(n, bits, reinterpret_cast<U*>(dst));
  check_launch("fill");
}

template <class T>
void add_constant(int64_t n, T value, T* dst, cudaStream_t stream) {
  if (n == 0) return;
  add_constant_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(n, value, dst);
  check_launch("add_constant");
}
template void add_constant<int64_t>(int64_t, int64_t, int64_t*, cudaStream_t);
template void add_constant<int32_t>(int64_t, int32_t, int32_t*, cudaStream_t);

#define ND_TYPES(X, S) \
  X(S, float) X(S, double) X(S, BFloat16) X(S, Half) X(S, int64_t) X(S, int32_t) X(S, uint8_t) X(S, bool)
#define ND_COPY(S, D) \
  template void copy_strided<S, D>(int64_t, const int64_t*, const S*, const int64_t*, D*, const int64_t*, cudaStream_t);
#define ND_ALL(S) ND_TYPES(ND_COPY, S) template void fill<S>(int64_t, S, S*, cudaStream_t);
ND_ALL(float)
ND_ALL(double)
ND_ALL(BFloat16)
ND_ALL(Half)
ND_ALL(int64_t)
ND_ALL(int32_t)
ND_ALL(uint8_t)
ND_ALL(bool)

}  // namespace nd::kernels::cuda
