#pragma once
// Row reductions over a contiguous [M, R] view: the engine moves the reduced
// dimensions last (a permute, plus a copy only when that view is not contiguous).
// Sums over leading dimensions (bias gradients) use sum_columns instead, which reads
// the [R, C] view in place, so no transposed copy is made.
#include <cstdint>

namespace nd::kernels::cpu {

// out[m] = sum_r x[m, r]; accumulates in double. requires R >= 0 (an empty row sums to 0).
template <class T>
void sum_rows(int64_t M, int64_t R, const T* x, T* out);

// out[c] = sum_r x[r * ld + c] for c < C: the column sums of an [R, C] array whose rows
// start ld elements apart (ld = C when contiguous; ld = 0 repeats one row). Accumulates
// in double, every column over rows 0, 1, ..., R - 1 in that order; threads split the
// columns, so the result is the same for any thread count.
// requires R, C >= 0; out[0, C) does not overlap x. ensures out[0, C) written (0 when R = 0).
template <class T>
void sum_columns(int64_t R, int64_t C, int64_t ld, const T* x, T* out);

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
