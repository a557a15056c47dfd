#pragma once
// Fused optimizer updates (PyTorch's formulas) over many parameters at once, the elements
// of all of them shared out among the threads together, so that many small parameters do
// not each run on one thread (PyTorch's "foreach" variant; a single parameter is a list
// of one). Twins of the multi-tensor CUDA kernels.
#include <cstdint>
#include <vector>

#include "kernels/common/optim_params.h"

namespace nd::kernels::cpu {

using kernels::SgdParams;
using kernels::SgdTensor;
using kernels::AdamParams;
using kernels::AdamTensor;

// For every tensor: g' = g + wd p;  buf = first ? g' : momentum buf + (1 - dampening) g';
// d = nesterov ? g' + momentum buf : buf  (d = g' without momentum);  p -= lr d.
// In place on p and buf.
template <class T>
void sgd_step(const std::vector<SgdTensor<T>>& tensors, const SgdParams& hp);

// For every tensor, at its step t: AdamW: p *= 1 - lr wd;  Adam: g' = g + wd p.
// m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g'^2;  vmax = max(vmax, v) (amsgrad)
// p -= lr / (1 - b1^t) * m / (sqrt(v or vmax) / sqrt(1 - b2^t) + eps).
// In place on p, m, v, vmax.
template <class T>
void adam_step(const std::vector<AdamTensor<T>>& tensors, const AdamParams& hp);

// Loss scaling's unscale (engine/optim/grad_scaler.h): g *= inv_scale for every element,
// and whether any g was inf or NaN before it was scaled (PyTorch's
// _amp_foreach_non_finite_check_and_unscale_ for one tensor: a non-finite value is
// scaled too). requires: n elements. In place on g.
template <class T>
bool unscale_grad(int64_t n, T* g, T inv_scale);

}  // namespace nd::kernels::cpu
