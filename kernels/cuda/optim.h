#pragma once
// CUDA twins of kernels/cpu/optim.h: each optimizer step over many parameters in one
// kernel launch (PyTorch's multi-tensor apply), p, g and the state buffers each read once
// and written once.
#include <cstdint>
#include <vector>

#include "kernels/common/optim_params.h"
#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

using kernels::AdamParams;
using kernels::AdamTensor;
using kernels::SgdParams;
using kernels::SgdTensor;

// Formulas and contracts as cpu::sgd_step / cpu::adam_step, with the same arithmetic
// per element (kernels/common/optim_math.h). Each block updates one chunk of one tensor,
// found in a table of the tensors' pointers and lengths that stays on the device between
// steps (uploaded on `stream`, queued without a wait, only when the tensors change; one
// table per stream, so a launch never reads a table another stream is still copying).
// requires: every pointer on `device`, `stream` a stream of `device` (its compute stream in
// the engine).
// `skip_if`, when set: an int32 on `device`; the launches change nothing (parameters, state,
// Adam's step counts) when it holds a nonzero value as they run (GradScaler's skipped step,
// decided on the device so that a CUDA graph can capture it).
template <class T>
void sgd_step(int device, const std::vector<SgdTensor<T>>& tensors, const SgdParams& hp, cudaStream_t stream,
              const int32_t* skip_if = nullptr);

template <class T>
void adam_step(int device, const std::vector<AdamTensor<T>>& tensors, const AdamParams& hp, cudaStream_t stream,
               const int32_t* skip_if = nullptr);

// One gradient of a multi-tensor unscale: its n elements and an int32 flag on the device.
template <class T>
struct UnscaleTensor {
  int64_t n = 0;
  T* g = nullptr;
  int32_t* found_nonfinite = nullptr;
};

// cpu::unscale_grad for every tensor in one launch, with the answers on the device: each
// tensor's *found_nonfinite (an int32 the caller sets to 0, or below; tensors may share one)
// is set to 1 (an atomic max) when one of its values was inf or NaN, and left alone
// otherwise, so the flags can be
// read once after every launch is queued. With `scale_on_device` (an f64 on `device`) the
// factor is T(1 / *scale_on_device), read as the launch runs, and `inv_scale` is ignored.
template <class T>
void unscale_grad(int device, const std::vector<UnscaleTensor<T>>& tensors, T inv_scale, cudaStream_t stream,
                  const double* scale_on_device = nullptr);

// GradScaler::update on the device (torch.amp's _amp_update_scale_), one thread:
// optim_math::update_scale on *scale and *growth_tracker (f64s), found when any of the
// num_found int32 flags is nonzero; *found_any = 1 or 0 after it.
struct ScaleUpdate {
  static constexpr int kMaxFound = 16;  // optimizers sharing one scaler
  double *scale = nullptr, *growth_tracker = nullptr;
  int32_t* found_any = nullptr;
  const int32_t* found[kMaxFound] = {};
  int num_found = 0;
  double growth_factor = 2, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};
void update_scale(int device, const ScaleUpdate& update, cudaStream_t stream);

}  // namespace nd::kernels::cuda
