#pragma once
// Elementwise math with broadcasting, activations and comparisons (PyTorch
// semantics). Members of Tensor (x.add(y), x.add_(y), operators) call these.
#include "engine/anomaly_mode.h"
#include "engine/tensor.h"

namespace nd {

Tensor add(const Tensor& a, const Tensor& b, double alpha = 1, autograd::CallSite = {});  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1, autograd::CallSite = {});  // a - alpha * b
Tensor mul(const Tensor& a, const Tensor& b, autograd::CallSite = {});
Tensor div(const Tensor& a, const Tensor& b, autograd::CallSite = {});
Tensor pow(const Tensor& a, const Tensor& exponent, autograd::CallSite = {});
Tensor pow(const Tensor& a, double exponent, autograd::CallSite = {});
Tensor maximum(const Tensor& a, const Tensor& b, autograd::CallSite = {});
Tensor minimum(const Tensor& a, const Tensor& b, autograd::CallSite = {});

Tensor neg(const Tensor& x, autograd::CallSite = {});
Tensor exp(const Tensor& x, autograd::CallSite = {});
Tensor log(const Tensor& x, autograd::CallSite = {});
Tensor sqrt(const Tensor& x, autograd::CallSite = {});
Tensor rsqrt(const Tensor& x, autograd::CallSite = {});
Tensor abs(const Tensor& x, autograd::CallSite = {});
// -1, 0 or 1 (0 at NaN); its gradient is 0 everywhere, as PyTorch's.
Tensor sign(const Tensor& x, autograd::CallSite = {});
Tensor tanh(const Tensor& x, autograd::CallSite = {});
Tensor sigmoid(const Tensor& x, autograd::CallSite = {});
Tensor relu(const Tensor& x, autograd::CallSite = {});
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01, autograd::CallSite = {});
// approximate: "none" (exact erf form) or "tanh", as in PyTorch.
Tensor gelu(const Tensor& x, const std::string& approximate = "none", autograd::CallSite = {});
Tensor clamp(const Tensor& x, double min, double max, autograd::CallSite = {});
// Tensor bounds (either may be undefined), broadcast against x: minimum(maximum(x, min), max),
// with PyTorch's gradient: x between the bounds gets it, the bound x is beyond gets it, x equal
// to one bound splits it with that bound (halves); where min == max, x equal to them gets it
// all, and where min > max (the result is max), max does.
Tensor clamp(const Tensor& x, const Tensor& min, const Tensor& max, autograd::CallSite = {});

// Comparisons give bool tensors and no gradient.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

}  // namespace nd
