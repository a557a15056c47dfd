#pragma once
// Shared by softmax.cu, layer_norm.cu, embedding.cu and loss.cu: the "one block per row"
// launch geometry, warp-shuffle block reductions and the device-side index range check.
//
// Why the reductions are deterministic: a warp reduces with an xor butterfly (every lane
// ends with the same bits, since a + b == b + a exactly), then each thread combines the
// per-warp results in warp order. The order depends only on blockDim, which depends only
// on the row length, so a run repeats bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/scratch.cuh"
#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda::rows {

constexpr int kWarp = 32;
constexpr int kMaxThreads = 256;

// Threads for one row of D elements: a single warp for short rows, up to 256 threads
// (each striding over the row) for long ones. Always a multiple of 32.
inline unsigned threads_for(int64_t D) {
  const int64_t warps = std::clamp<int64_t>((D + kWarp - 1) / kWarp, 1, kMaxThreads / kWarp);
  return static_cast<unsigned>(warps * kWarp);
}

// Blocks for M rows (at least one; capped, and the kernels stride over the rest).
inline unsigned blocks_for(int64_t M) {
  return static_cast<unsigned>(std::clamp<int64_t>(M, 1, int64_t(1) << 20));
}

struct Sum {
  template <class T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
// std::max's rule (a < b ? b : a), as the CPU reference's row maximum.
struct Max {
  template <class T>
  __device__ T operator()(T a, T b) const { return a < b ? b : a; }
};

// op over all threads of the block; every thread returns the result. Every thread of
// the block must call it (it synchronises). smem: kWarp elements of shared memory.
template <class T, class Op>
__device__ T block_reduce(T v, T* smem, Op op) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warps = static_cast<int>(blockDim.x) / kWarp;
  if (threadIdx.x % kWarp == 0) smem[threadIdx.x / kWarp] = v;
  __syncthreads();
  T r = smem[0];
  for (int w = 1; w < warps; ++w) r = op(r, smem[w]);
  __syncthreads();  // smem is free for the caller's next reduction
  return r;
}

template <class T>
__device__ T block_sum(T v, T* smem) { return block_reduce(v, smem, Sum{}); }
template <class T>
__device__ T block_max(T v, T* smem) { return block_reduce(v, smem, Max{}); }

// A template only so that several .cu files can include its definition.
template <class Int>
__global__ void first_invalid_kernel(const Int* indices, int64_t n, int64_t limit, bool has_ignore,
                                     int64_t ignore_index, unsigned long long* first) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = indices[i];
    if (!(has_ignore && v == ignore_index) && (v < 0 || v >= limit))
      atomicMin(first, static_cast<unsigned long long>(i));  // the minimum: the same whatever the order
  }
}

// The first position i < n whose index lies outside [0, limit) (and is not ignore_index
// when has_ignore), or -1 when every index is valid. Blocks the host until known (the
// caller reports the bad index to the user, so it must know now).
inline int64_t first_invalid_index(const int64_t* indices, int64_t n, int64_t limit, bool has_ignore,
                                   int64_t ignore_index, cudaStream_t stream, const char* kernel) {
  if (n == 0) return -1;
  detail::Scratch first(kernel, sizeof(unsigned long long), stream);
  auto* dev = first.as<unsigned long long>();
  check(cudaMemsetAsync(dev, 0xff, sizeof(unsigned long long), stream), "cudaMemsetAsync", kernel);  // ULLONG_MAX
  const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>((n + kMaxThreads - 1) / kMaxThreads, 1, 4096));
  first_invalid_kernel<int64_t><<<blocks, kMaxThreads, 0, stream>>>(indices, n, limit, has_ignore, ignore_index, dev);
  check_launch(kernel);
  unsigned long long host = 0;
  check(cudaMemcpyAsync(&host, dev, sizeof(host), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync", kernel);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", kernel);
  return host == ~0ull ? -1 : static_cast<int64_t>(host);
}

}  // namespace nd::kernels::cuda::rows
