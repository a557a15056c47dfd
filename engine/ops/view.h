#pragma once
// Views: tensors that share storage (and so the version counter) with their base.
// The member functions live on Tensor (view, reshape, permute, transpose, narrow,
// slice, select, expand, squeeze, unsqueeze, flatten, split); these are the
// functional spellings.
#include <vector>

#include "engine/tensor.h"

namespace nd {

inline Tensor reshape(const Tensor& t, const Shape& shape) { return t.reshape(shape); }
inline Tensor permute(const Tensor& t, const Shape& dims) { return t.permute(dims); }
inline Tensor transpose(const Tensor& t, int64_t d0, int64_t d1) { return t.transpose(d0, d1); }
inline Tensor flatten(const Tensor& t, int64_t start = 0, int64_t end = -1) { return t.flatten(start, end); }
inline std::vector<Tensor> split(const Tensor& t, int64_t size, int64_t dim = 0) { return t.split(size, dim); }

}  // namespace nd
