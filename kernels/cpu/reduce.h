#pragma once
// Row reductions over a contiguous [M, R] view: the engine moves the reduced
// dimensions last (a permute, plus a copy only when that view is not contiguous).
#include <cstdint>

namespace nd::kernels::cpu {

// out[m] = sum_r x[m, r]; accumulates in double. requires R >= 0 (an empty row sums to 0).
template <class T>
void sum_rows(int64_t M, int64_t R, const T* x, T* out);

// out[m] = sum_r (x[m, r] - mean_m)^2 / (R - correction); two-pass for accuracy.
// requires R - correction > 0 (the engine checks and reports otherwise).
template <class T>
void var_rows(int64_t M, int64_t R, int64_t correction, const T* x, T* out);

// values[m] = max_r x[m, r], indices[m] = the first r attaining it (NaN counts as
// the maximum, as in PyTorch). requires R >= 1. values or indices may be null.
template <class T>
void max_rows(int64_t M, int64_t R, const T* x, T* values, int64_t* indices);

// dx[m, r] = (r == indices[m]) ? dy[m] : 0: the backward of max_rows.
template <class T>
void scatter_rows(int64_t M, int64_t R, const int64_t* indices, const T* dy, T* dx);

}  // namespace nd::kernels::cpu
