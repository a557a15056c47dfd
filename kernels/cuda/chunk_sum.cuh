#pragma once
// The second half of a deterministic split-K (conv.cu, conv_narrow.cu): partial results of a
// reduction cut into chunks, each chunk's `size` values `size` apart in one buffer, added in
// chunk order. The cut depends on the shape only, so the result has the same bits on every run.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/stream.h"
#include "kernels/cuda/strided.cuh"

namespace nd::kernels::cuda::detail {

// out[i] = sum_{s < splits} partial[s*size + i], added in order s = 0, 1, ...
template <class T>
__global__ void sum_chunks_kernel(int64_t splits, int64_t size, const T* partial, T* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < size; i += int64_t(gridDim.x) * blockDim.x) {
    T acc = partial[i];
    for (int64_t s = 1; s < splits; ++s) acc += partial[s * size + i];
    out[i] = acc;
  }
}

template <class T>
void sum_chunks(const char* kernel, int64_t splits, int64_t size, const T* partial, T* out, cudaStream_t stream) {
  sum_chunks_kernel<T><<<blocks_for(size), kThreads, 0, stream>>>(splits, size, partial, out);
  check_launch(kernel);
}

}  // namespace nd::kernels::cuda::detail
