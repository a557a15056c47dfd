#pragma once
// CUDA twins of kernels/cpu/index.h: gather/scatter along one dimension of a contiguous
// [outer, D, inner] array. `index` is a device array.
#include <cstdint>

#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

// out[o, k, i] = x[o, index[k], i]. requires: 0 <= index[k] < D (the engine validates).
template <class T>
void index_select(int64_t outer, int64_t D, int64_t inner, const T* x, int64_t K, const int64_t* index, T* out,
                  cudaStream_t stream);

// dx[o, index[k], i] += dy[o, k, i] (atomic adds: repeated indices add, in any order).
template <class T>
void index_add(int64_t outer, int64_t D, int64_t inner, int64_t K, const int64_t* index, const T* dy, T* dx,
               cudaStream_t stream);

}  // namespace nd::kernels::cuda
