#pragma once
// Copies between dtypes, devices and layouts: Tensor::to, clone, copy_, contiguous.
#include "engine/tensor.h"

namespace nd {

// Writes src (broadcast to dst's shape, converted to dst's dtype) into dst, across
// devices. Raw data movement: no autograd, no version bump (callers do both).
// non_blocking: see Tensor::to (only a dense pinned source to a GPU returns early).
void copy_data(const Tensor& dst, const Tensor& src, bool non_blocking = false);

}  // namespace nd
