#pragma once
// Reductions over dimensions (PyTorch semantics). Members: x.sum(), x.sum({1}, true),
// x.mean(...), x.var(...), x.max(), x.min(), x.argmax(dim).
// Gradients at ties follow PyTorch (docs/architecture.md, "Gradients at kinks and ties"): max() and min() of
// all elements and amax/amin split the gradient evenly among the tied elements; max/min along
// a dim send it to the first one, whose index they return.
#include <tuple>

#include "engine/anomaly_mode.h"
#include "engine/tensor.h"

namespace nd {

Tensor sum(const Tensor& x, autograd::CallSite = {});
Tensor sum(const Tensor& x, const Shape& dims, bool keepdim = false, autograd::CallSite = {});
Tensor mean(const Tensor& x, autograd::CallSite = {});
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim = false, autograd::CallSite = {});
// Variance with Bessel-style correction (1 = unbiased, 0 = population).
Tensor var(const Tensor& x, const Shape& dims, int64_t correction = 1, bool keepdim = false, autograd::CallSite = {});
Tensor max(const Tensor& x, autograd::CallSite = {});
// (values, indices) of the maximum along dim; the gradient flows to the first maximum.
std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false, autograd::CallSite = {});
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor min(const Tensor& x, autograd::CallSite = {});
std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false, autograd::CallSite = {});
// The maximum (minimum) over dims (empty: all), torch.amax / torch.amin.
Tensor amax(const Tensor& x, const Shape& dims, bool keepdim = false, autograd::CallSite = {});
Tensor amin(const Tensor& x, const Shape& dims, bool keepdim = false, autograd::CallSite = {});

}  // namespace nd
