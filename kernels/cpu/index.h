#pragma once
// Gather/scatter along one dimension of a contiguous [outer, D, inner] array.
#include <cstdint>

namespace nd::kernels::cpu {

// out[o, k, i] = x[o, index[k], i] for k < K. requires: 0 <= index[k] < D (the
// engine validates), out contiguous [outer, K, inner], no aliasing.
template <class T>
void index_select(int64_t outer, int64_t D, int64_t inner, const T* x, int64_t K, const int64_t* index, T* out);

// dx[o, index[k], i] += dy[o, k, i]: the backward of index_select (repeated indices add).
// requires: dx is [outer, D, inner] and initialised by the caller.
template <class T>
void index_add(int64_t outer, int64_t D, int64_t inner, int64_t K, const int64_t* index, const T* dy, T* dx);

}  // namespace nd::kernels::cpu
