#pragma once
// Shared by the .cu files: launch geometry and N-d strided offsets (the device-side
// counterpart of kernels/cpu/strided.h). Shapes and strides travel by value in the
// kernel's parameters, so no device buffer is needed for them.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda::detail {

constexpr int kMaxDims = 10;
constexpr int kThreads = 256;

// The grid's limits as the launchers that size every dimension use them (gridDim.x up to
// 2^31 - 1, kept to 2^30; y and z up to 65535); past them a grid-stride loop covers the rest.
constexpr int64_t kMaxGridX = int64_t(1) << 30, kMaxGridYZ = 65535;

// Blocks for a grid-stride loop over n elements (at least one; capped, the loop covers the rest).
inline unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, int64_t(1) << 20));
}

inline int64_t numel(int64_t ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int64_t d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

// Offsets of N operands for a linear (row-major) index into `shape`.
template <int N>
struct Indexer {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  __device__ void offsets(int64_t i, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t idx = i % shape[d];
      i /= shape[d];
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += idx * strides[k][d];
    }
  }
};

template <int N>
Indexer<N> make_indexer(const char* kernel, int64_t ndim, const int64_t* shape,
                        const std::array<const int64_t*, N>& strides) {
  require(ndim <= kMaxDims, kernel, "at most " + std::to_string(kMaxDims) + " dimensions are supported, found " +
                                        std::to_string(ndim));
  Indexer<N> ix;
  ix.ndim = static_cast<int>(ndim);
  for (int64_t d = 0; d < ndim; ++d) {
    ix.shape[d] = shape[d];
    for (int k = 0; k < N; ++k) ix.strides[k][d] = strides[k][d];
  }
  return ix;
}

// The unsigned integer of an element's size: kernels that only move elements (fill,
// gathers) move bit patterns, whatever the element type.
template <size_t Bytes>
struct Bits;
template <> struct Bits<1> { using type = uint8_t; };
template <> struct Bits<2> { using type = uint16_t; };
template <> struct Bits<4> { using type = uint32_t; };
template <> struct Bits<8> { using type = uint64_t; };

}  // namespace nd::kernels::cuda::detail
