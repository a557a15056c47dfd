#pragma once
// Indexing by index tensors, and joining: index_select, cat, stack.
#include <vector>

#include "engine/tensor.h"

namespace nd {

// Rows of x along dim picked by a 1-D int64 index (repeats allowed); the backward
// adds gradients of repeated indices. The index is checked on the host: give it on the
// cpu (it is then copied to x's device without waiting) or on x's device (read back
// first: the host waits for the GPU).
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// Concatenates along an existing dim; shapes must match elsewhere.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Joins along a new dim; shapes must be equal.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);

}  // namespace nd
