#pragma once
// Iteration over N-d strided operands, shared by the elementwise and copy kernels.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace nd::kernels::cpu {

// The dimensions of an N-d strided problem after dropping size-1 dimensions and merging
// those that every operand walks as one (stride[d] == stride[d+1] * shape[d+1], e.g.
// all of a contiguous tensor), innermost last. Visiting the merged index space visits
// the same elements with the same offsets.
template <size_t K>
struct MergedDims {
  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, K>> strides;  // [dim][operand]
  bool empty = false;                           // some dimension has size 0
};

template <size_t K>
MergedDims<K> merge_dims(int64_t ndim, const int64_t* shape, const std::array<const int64_t*, K>& strides) {
  MergedDims<K> m;
  for (int64_t d = 0; d < ndim; ++d) {
    if (shape[d] == 0) m.empty = true;
    if (shape[d] <= 1) continue;  // size 1: any stride, it is never stepped
    std::array<int64_t, K> s{};
    bool merge = !m.sizes.empty();
    for (size_t k = 0; k < K; ++k) {
      s[k] = strides[k][d];
      merge = merge && m.strides.back()[k] == s[k] * shape[d];
    }
    if (merge) {
      m.sizes.back() *= shape[d];
      m.strides.back() = s;
    } else {
      m.sizes.push_back(shape[d]);
      m.strides.push_back(s);
    }
  }
  return m;
}

// Operand k's offset of row r of the merged dimensions [0, outer) (row-major over them).
template <size_t K>
std::array<int64_t, K> row_offsets(const MergedDims<K>& m, int64_t outer, int64_t r) {
  std::array<int64_t, K> off{};
  for (int64_t d = outer - 1; d >= 0; --d) {
    const int64_t i = r % m.sizes[d];
    r /= m.sizes[d];
    for (size_t k = 0; k < K; ++k) off[k] += i * m.strides[d][k];
  }
  return off;
}

// Calls body(offsets, n, inner_strides) for pieces of the innermost dimension's rows:
// offsets[k] is operand k's element offset of the piece start, n its length and
// inner_strides[k] operand k's stride along it. Every element is visited by exactly one
// call. Why the pieces are not simply the rows of `shape`:
//  - dimensions are merged first (merge_dims), so that rows are long and the per-row
//    index arithmetic is paid once per row, not once per 64 elements;
//  - rows longer than kPiece are cut into pieces, so a single long row still spreads
//    over the threads.
// Pieces run in parallel (OpenMP) when the problem is large. Requires ndim >= 0; a 0-d
// problem is one row of length 1. This overload takes the dims merged already, for a
// caller that looked at them first (copy_strided); the one below merges them.
template <size_t K, class Body>
void for_each_row(const MergedDims<K>& m, Body&& body) {
  constexpr int64_t kPiece = 16384;
  if (m.empty) return;
  const int64_t n = m.sizes.empty() ? 1 : m.sizes.back();
  const std::array<int64_t, K> inner = m.strides.empty() ? std::array<int64_t, K>{} : m.strides.back();
  const int64_t outer = m.sizes.empty() ? 0 : static_cast<int64_t>(m.sizes.size()) - 1;
  int64_t rows = 1;
  for (int64_t d = 0; d < outer; ++d) rows *= m.sizes[d];
  const int64_t pieces = (n + kPiece - 1) / kPiece, work = rows * pieces;
#pragma omp parallel for schedule(static) if (rows * n > 65536 && work > 1)
  for (int64_t w = 0; w < work; ++w) {
    const int64_t start = (w % pieces) * kPiece;
    std::array<int64_t, K> off = row_offsets(m, outer, w / pieces);
    for (size_t k = 0; k < K; ++k) off[k] += start * inner[k];
    body(off, std::min(kPiece, n - start), inner);
  }
}

template <size_t K, class Body>
void for_each_row(int64_t ndim, const int64_t* shape, const std::array<const int64_t*, K>& strides, Body&& body) {
  for_each_row(merge_dims<K>(ndim, shape, strides), body);
}

}  // namespace nd::kernels::cpu
