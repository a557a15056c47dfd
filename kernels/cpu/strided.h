#pragma once
// Iteration over N-d strided operands, shared by the elementwise and copy kernels.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace nd::kernels::cpu {

// Calls body(offsets, n, inner_strides) for pieces of the innermost dimension's rows:
// offsets[k] is operand k's element offset of the piece start, n its length and
// inner_strides[k] operand k's stride along it. Every element is visited by exactly one
// call. Why the pieces are not simply the rows of `shape`:
//  - dimensions that every operand walks as one (stride[d] == stride[d+1] * shape[d+1],
//    e.g. all of a contiguous tensor) are merged first, so that rows are long and the
//    per-row index arithmetic is paid once per row, not once per 64 elements;
//  - rows longer than kPiece are cut into pieces, so a single long row still spreads
//    over the threads.
// Pieces run in parallel (OpenMP) when the problem is large. Requires ndim >= 0; a 0-d
// problem is one row of length 1.
template <size_t K, class Body>
void for_each_row(int64_t ndim, const int64_t* shape, const std::array<const int64_t*, K>& strides, Body&& body) {
  constexpr int64_t kPiece = 16384;
  std::vector<int64_t> dims;                  // merged sizes, innermost last
  std::vector<std::array<int64_t, K>> steps;  // their strides per operand
  for (int64_t d = 0; d < ndim; ++d) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue;  // any stride: it is never stepped
    std::array<int64_t, K> s{};
    bool merge = !dims.empty();
    for (size_t k = 0; k < K; ++k) {
      s[k] = strides[k][d];
      merge = merge && steps.back()[k] == s[k] * shape[d];
    }
    if (merge) {
      dims.back() *= shape[d];
      steps.back() = s;
    } else {
      dims.push_back(shape[d]);
      steps.push_back(s);
    }
  }
  const int64_t n = dims.empty() ? 1 : dims.back();
  const std::array<int64_t, K> inner = steps.empty() ? std::array<int64_t, K>{} : steps.back();
  const int64_t outer = dims.empty() ? 0 : static_cast<int64_t>(dims.size()) - 1;
  int64_t rows = 1;
  for (int64_t d = 0; d < outer; ++d) rows *= dims[d];
  const int64_t pieces = (n + kPiece - 1) / kPiece, work = rows * pieces;
#pragma omp parallel for schedule(static) if (rows * n > 65536 && work > 1)
  for (int64_t w = 0; w < work; ++w) {
    const int64_t start = (w % pieces) * kPiece;
    std::array<int64_t, K> off{};
    int64_t rem = w / pieces;
    for (int64_t d = outer - 1; d >= 0; --d) {
      const int64_t i = rem % dims[d];
      rem /= dims[d];
      for (size_t k = 0; k < K; ++k) off[k] += i * steps[d][k];
    }
    for (size_t k = 0; k < K; ++k) off[k] += start * inner[k];
    body(off, std::min(kPiece, n - start), inner);
  }
}

}  // namespace nd::kernels::cpu
