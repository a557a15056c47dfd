#pragma once
// Fused optimizer updates (PyTorch's formulas) over many parameters at once, the elements
// of all of them shared out among the threads together, so that many small parameters do
// not each run on one thread (PyTorch's "foreach" variant; a single parameter is a list
// of one). Twins of the multi-tensor CUDA kernels.
#include <cstdint>
#include <vector>

namespace nd::kernels::cpu {

struct SgdParams {
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};

// One parameter of an SGD step: its n elements, gradient and momentum buffer (null when
// momentum == 0), and whether this is the buffer's first step (it starts as the gradient).
template <class T>
struct SgdTensor {
  int64_t n = 0;
  T* p = nullptr;
  const T* g = nullptr;
  T* buf = nullptr;
  bool first_step = true;
};

// For every tensor: g' = g + wd p;  buf = first ? g' : momentum buf + (1 - dampening) g';
// d = nesterov ? g' + momentum buf : buf  (d = g' without momentum);  p -= lr d.
// In place on p and buf.
template <class T>
void sgd_step(const std::vector<SgdTensor<T>>& tensors, const SgdParams& hp);

struct AdamParams {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled_weight_decay = false;  // AdamW
  bool amsgrad = false;
};

// One parameter of an Adam step: its n elements and buffers (vmax null unless amsgrad),
// and the step it takes, counted from 1 (bias corrections are per parameter).
template <class T>
struct AdamTensor {
  int64_t n = 0;
  T* p = nullptr;
  const T* g = nullptr;
  T *m = nullptr, *v = nullptr, *vmax = nullptr;
  int64_t step = 1;
};

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
