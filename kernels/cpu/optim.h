#pragma once
// Fused optimizer updates over one contiguous parameter (PyTorch's formulas, the
// single-tensor "for-loop" variant), and Adam over many parameters at once (its
// "foreach" variant). Twins of the fused CUDA kernels.
#include <cstdint>
#include <vector>

namespace nd::kernels::cpu {

struct SgdParams {
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool first_step = true;  // momentum buffer starts as the first gradient
};

// g' = g + wd p;  buf = first ? g' : momentum buf + (1 - dampening) g';
// d = nesterov ? g' + momentum buf : buf  (d = g' without momentum);  p -= lr d.
// requires: n elements each; buf may be null when momentum == 0. In place on p and buf.
template <class T>
void sgd_step(int64_t n, const SgdParams& hp, T* p, const T* g, T* buf);

struct AdamParams {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled_weight_decay = false;  // AdamW
  bool amsgrad = false;
  int64_t step = 1;  // the step being taken, counted from 1
};

// AdamW: p *= 1 - lr wd;  Adam: g' = g + wd p.
// m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g'^2;  vmax = max(vmax, v) (amsgrad)
// p -= lr / (1 - b1^t) * m / (sqrt(v or vmax) / sqrt(1 - b2^t) + eps).
// requires: n elements each; vmax null unless amsgrad. In place on p, m, v, vmax.
template <class T>
void adam_step(int64_t n, const AdamParams& hp, T* p, const T* g, T* m, T* v, T* vmax);

// One parameter of a multi-tensor Adam step: its n elements and buffers, and the step it
// takes (bias corrections are per parameter).
template <class T>
struct AdamTensor {
  int64_t n = 0;
  T* p = nullptr;
  const T* g = nullptr;
  T *m = nullptr, *v = nullptr, *vmax = nullptr;
  int64_t step = 1;
};
// adam_step for every tensor (hp.step ignored: each tensor's own), the elements of all of
// them shared out among the threads at once, so many small parameters do not each run
// on one thread; results bit-identical to one adam_step per tensor.
template <class T>
void adam_step_multi(const std::vector<AdamTensor<T>>& tensors, const AdamParams& hp);

// Loss scaling's unscale (engine/optim/grad_scaler.h): g *= inv_scale for every element,
// and whether any g was inf or NaN before it was scaled (PyTorch's
// _amp_foreach_non_finite_check_and_unscale_ for one tensor: a non-finite value is
// scaled too). requires: n elements. In place on g.
template <class T>
bool unscale_grad(int64_t n, T* g, T inv_scale);

}  // namespace nd::kernels::cpu
