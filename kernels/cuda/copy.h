#pragma once
// CUDA twins of kernels/cpu/copy.h: strided copy with dtype conversion, and fill.
#include <cstdint>

#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

// dst[i] = convert<D>(src[i]) over an N-d index space (ndim <= 10) with independent
// strides; src and dst on the same device. Conversions as the CPU twin (bool: != 0;
// bf16/f16 through float, round to nearest even).
// requires: dst does not partially overlap src (exact aliasing with equal strides is fine).
template <class S, class D>
void copy_strided(int64_t ndim, const int64_t* shape, const S* src, const int64_t* src_strides, D* dst,
                  const int64_t* dst_strides, cudaStream_t stream);

// dst[i] = value for n contiguous elements.
template <class T>
void fill(int64_t n, T value, T* dst, cudaStream_t stream);

// As the CPU twin: dst[i] += value, integers (int64, int32), wrapping.
template <class T>
void add_constant(int64_t n, T value, T* dst, cudaStream_t stream);

}  // namespace nd::kernels::cuda
