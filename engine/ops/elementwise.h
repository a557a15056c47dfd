#pragma once
// Elementwise math with broadcasting, activations and comparisons (PyTorch
// semantics). Members of Tensor (x.add(y), x.add_(y), operators) call these.
#include "engine/tensor.h"

namespace nd {

Tensor add(const Tensor& a, const Tensor& b, double alpha = 1);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1);  // a - alpha * b
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& exponent);
Tensor pow(const Tensor& a, double exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
// -1, 0 or 1 (0 at NaN); its gradient is 0 everywhere, as PyTorch's.
Tensor sign(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
// approximate: "none" (exact erf form) or "tanh", as in PyTorch.
Tensor gelu(const Tensor& x, const std::string& approximate = "none");
Tensor clamp(const Tensor& x, double min, double max);
// Tensor bounds (either may be undefined), broadcast against x: minimum(maximum(x, min), max),
// so a tie splits the gradient between x and the bound, as PyTorch's tensor-bound clamp.
Tensor clamp(const Tensor& x, const Tensor& min, const Tensor& max);

// Comparisons give bool tensors and no gradient.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

}  // namespace nd
