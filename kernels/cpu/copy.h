#pragma once
#include <cstdint>

namespace nd::kernels::cpu {

// dst[i] = convert<D>(src[i]) over an N-d index space with independent strides.
// requires: dst does not partially overlap src (exact aliasing with equal strides is fine).
// Conversions: built-in arithmetic types by static_cast (bool: != 0); bf16/f16 through float.
template <class S, class D>
void copy_strided(int64_t ndim, const int64_t* shape, const S* src, const int64_t* src_strides, D* dst,
                  const int64_t* dst_strides);

// dst[i] = value for n contiguous elements.
template <class T>
void fill(int64_t n, T value, T* dst);

// dst[i] += value for n contiguous elements of an integer type (int64, int32), with
// two's-complement wrap-around as PyTorch (computed unsigned: no signed overflow).
template <class T>
void add_constant(int64_t n, T value, T* dst);

}  // namespace nd::kernels::cpu
