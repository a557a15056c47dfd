#pragma once
// Iteration over N-d strided operands, shared by the elementwise and copy kernels.
#include <array>
#include <cstdint>

namespace nd::kernels::cpu {

// Calls body(offsets, n, inner_strides) for every row of the innermost dimension:
// offsets[k] is operand k's element offset of the row start, n the row length and
// inner_strides[k] its stride along the row. Rows run in parallel (OpenMP) when the
// problem is large. Requires ndim >= 0; a 0-d problem is one row of length 1.
template <size_t K, class Body>
void for_each_row(int64_t ndim, const int64_t* shape, const std::array<const int64_t*, K>& strides, Body&& body) {
  std::array<int64_t, K> inner{};
  int64_t n = 1;
  if (ndim > 0) {
    n = shape[ndim - 1];
    for (size_t k = 0; k < K; ++k) inner[k] = strides[k][ndim - 1];
  }
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < ndim; ++d) rows *= shape[d];
  if (n == 0 || rows == 0) return;
#pragma omp parallel for schedule(static) if (rows * n > 65536 && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    std::array<int64_t, K> off{};
    int64_t rem = r;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      const int64_t i = rem % shape[d];
      rem /= shape[d];
      for (size_t k = 0; k < K; ++k) off[k] += i * strides[k][d];
    }
    body(off, n, inner);
  }
}

}  // namespace nd::kernels::cpu
