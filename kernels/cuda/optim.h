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
template <class T>
void sgd_step(int device, const std::vector<SgdTensor<T>>& tensors, const SgdParams& hp, cudaStream_t stream);

template <class T>
void adam_step(int device, const std::vector<AdamTensor<T>>& tensors, const AdamParams& hp, cudaStream_t stream);

// One gradient of a multi-tensor unscale: its n elements and an int32 flag on the device.
template <class T>
struct UnscaleTensor {
  int64_t n = 0;
  T* g = nullptr;
  int32_t* found_nonfinite = nullptr;
};

// cpu::unscale_grad for every tensor in one launch, with the answers on the device: each
// tensor's *found_nonfinite (an int32 the caller zeroes; tensors may share one) is set to
// 1 when one of its values was inf or NaN, and left alone otherwise, so the flags can be
// read once after every launch is queued.
template <class T>
void unscale_grad(int device, const std::vector<UnscaleTensor<T>>& tensors, T inv_scale, cudaStream_t stream);

}  // namespace nd::kernels::cuda
