#pragma once
// Gradient clipping: torch.nn.utils.clip_grad_norm_ and clip_grad_value_, same formulas.
// Under f16 loss scaling, clip after scaler.unscale_(optimizer) and before
// scaler.step(optimizer) (engine/optim/grad_scaler.h), as PyTorch documents; under DDP every
// rank holds the same averaged gradients after backward, so every rank clips alike.
// Tests: tests/nn/clip_grad_test.cpp (against torch.nn.utils, tests/golden/make_nn_golden.py).
#include <limits>
#include <vector>

#include "engine/tensor.h"

namespace nd::nn::utils {

// total = the norm_type-norm of all gradients together (the norm of the per-tensor norms;
// norm_type = infinity: the largest |g|); every gradient is multiplied by
// min(1, max_norm / (total + 1e-6)). Returns total as a 0-d tensor on the gradients' device
// (0 when none has a gradient), in the first gradient's dtype. Parameters without a
// gradient are skipped.
// error_if_nonfinite: a total that is inf or NaN is an nd::Error instead of being applied.
// requires: floating gradients on one device; norm_type > 0 (or infinity).
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// Clamps every gradient to [-clip_value, clip_value] in place. requires: clip_value >= 0.
void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value);

}  // namespace nd::nn::utils
