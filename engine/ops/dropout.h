#pragma once
// dropout (LibTorch: torch::dropout). Backward node: NativeDropoutBackward, which
// stores no mask: it regenerates it from the generator's (seed, offset) at forward time.
#include "engine/tensor.h"

namespace nd {

// training: y_i = 0 with probability p, else x_i / (1 - p); element i draws
//   counter_uniform(seed, offset + i) from the default generator, whose offset then
//   advances by numel. Not training (or p == 0): returns x itself.
// requires: 0 <= p <= 1; x floating point.
Tensor dropout(const Tensor& x, double p, bool training);

}  // namespace nd
