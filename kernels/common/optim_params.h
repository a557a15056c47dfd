#pragma once
// The hyperparameters and per-parameter operands of the fused optimizer steps, shared by the
// CPU kernels (kernels/cpu/optim.h, which gives the formulas), the CUDA kernels and the
// update math both use (optim_math.h).
#include <cstdint>

namespace nd::kernels {

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

struct AdamParams {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled_weight_decay = false;  // AdamW
  bool amsgrad = false;
};

// One parameter of an Adam step: its n elements and buffers (vmax null unless amsgrad),
// and the step it takes, counted from 1 (bias corrections are per parameter). CUDA only:
// `step_on_device` instead, the parameter's count of steps taken as an f64 on the device,
// which the launch increments and takes the bias corrections from (PyTorch's capturable
// Adam: a replayed CUDA graph then counts on); `step` is ignored.
template <class T>
struct AdamTensor {
  int64_t n = 0;
  T* p = nullptr;
  const T* g = nullptr;
  T *m = nullptr, *v = nullptr, *vmax = nullptr;
  int64_t step = 1;
  double* step_on_device = nullptr;
};

}  // namespace nd::kernels
