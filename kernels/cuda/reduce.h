#pragma once
// CUDA twins of kernels/cpu/reduce.h: row reductions over a contiguous [M, R] array,
// one thread block per row, accumulating in double like the CPU reference; column sums
// of an [R, C] view whose rows are ld elements apart.
#include <cstdint>

#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

// out[m] = sum_r x[m, r]. R >= 0 (an empty row sums to 0).
template <class T>
void sum_rows(int64_t M, int64_t R, const T* x, T* out, cudaStream_t stream);

// out[c] = sum_r x[r * ld + c] for c < C (ld = 0 repeats one row), as the CPU's sum_columns:
// in double, in a fixed order (the same bits every run); one launch while R <= 128, two
// (partials in allocator scratch, then their sum) for more rows.
template <class T>
void sum_columns(int64_t R, int64_t C, int64_t ld, const T* x, T* out, cudaStream_t stream);

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
