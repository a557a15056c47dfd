#pragma once
// layer_norm (LibTorch: torch::layer_norm): normalise over the trailing
// `normalized_shape` dimensions, then scale and shift elementwise.
// Backward node: NativeLayerNormBackward (saves input, mean, rstd, weight).
#include "engine/tensor.h"

namespace nd {

// With D = prod(normalized_shape) and each input row of D elements:
//   y = (x - mean) / sqrt(var + eps) * weight + bias   (biased var; weight/bias optional)
// requires: input [*, normalized_shape...]; weight, bias of shape normalized_shape or undefined.
Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);

}  // namespace nd
