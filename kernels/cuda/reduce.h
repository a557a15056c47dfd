#pragma once
// CUDA twins of kernels/cpu/reduce.h: row reductions over a contiguous [M, R] array,
// one thread block per row, accumulating in double like the CPU reference.
#include <cstdint>

#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

// out[m] = sum_r x[m, r]. R >= 0 (an empty row sums to 0).
template <class T>
void sum_rows(int64_t M, int64_t R, const T* x, T* out, cudaStream_t stream);

// out[m] = sum_r (x[m, r] - mean_m)^2 / (R - correction), two passes. requires R - correction > 0.
template <class T>
void var_rows(int64_t M, int64_t R, int64_t correction, const T* x, T* out, cudaStream_t stream);

// values[m] = max_r x[m, r], indices[m] = the first r attaining it (NaN is the maximum).
// requires R >= 1; values or indices may be null.
template <class T>
void max_rows(int64_t M, int64_t R, const T* x, T* values, int64_t* indices, cudaStream_t stream);

// dx[m, r] = (r == indices[m]) ? dy[m] : 0.
template <class T>
void scatter_rows(int64_t M, int64_t R, const int64_t* indices, const T* dy, T* dx, cudaStream_t stream);

}  // namespace nd::kernels::cuda
