#pragma once
// CUDA twins of kernels/cpu/optim.h: one fused kernel per optimizer step over one
// contiguous parameter (p, g and the state buffers each read once and written once),
// and Adam over many parameters in one launch.
#include <cstdint>
#include <vector>

#include "kernels/cpu/optim.h"
#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

using cpu::AdamParams;
using cpu::AdamTensor;
using cpu::SgdParams;

// Formulas and contracts as cpu::sgd_step / cpu::adam_step.
template <class T>
void sgd_step(int64_t n, const SgdParams& hp, T* p, const T* g, T* buf, cudaStream_t stream);

template <class T>
void adam_step(int64_t n, const AdamParams& hp, T* p, const T* g, T* m, T* v, T* vmax, cudaStream_t stream);

// cpu::adam_step_multi in one kernel launch (PyTorch's multi-tensor apply): each
// block updates one chunk of one tensor, found in a table copied to the device on
// `stream` (queued, no wait). The same arithmetic as adam_step per element, so results
// are bit-identical to one call per tensor. hp.step is ignored (each tensor's own).
// requires: every pointer on `device`, whose compute stream `stream` is.
template <class T>
void adam_step_multi(int device, const std::vector<AdamTensor<T>>& tensors, const AdamParams& hp,
                     cudaStream_t stream);

// As cpu::unscale_grad, with the answer on the device: *found_nonfinite (an int32 the
// caller zeroes) is set to 1 when some g was inf or NaN, and left alone otherwise, so one
// flag can collect many tensors and be read once.
template <class T>
void unscale_grad(int64_t n, T* g, T inv_scale, int32_t* found_nonfinite, cudaStream_t stream);

}  // namespace nd::kernels::cuda
