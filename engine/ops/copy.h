#pragma once
// Copies between dtypes, devices and layouts: Tensor::to, clone, copy_, contiguous.
#include "engine/tensor.h"

namespace nd {

// Writes src (broadcast to dst's shape, converted to dst's dtype) into dst, across
// devices. Raw data movement: no autograd, no version bump (callers do both).
// non_blocking: see Tensor::to (only a dense pinned source to a GPU returns early).
void copy_data(const Tensor& dst, const Tensor& src, bool non_blocking = false);

// Writes value (converted to dst's dtype) into every element of dst, where dst lives: a
// contiguous dst is one fill kernel (on a GPU, on the compute stream: no copy, no wait).
// Raw data movement like copy_data: no autograd, no version bump.
void fill_data(const Tensor& dst, double value);

}  // namespace nd
