#pragma once
// CUDA twins of kernels/cpu/optim.h: one fused kernel per optimizer step over one
// contiguous parameter (p, g and the state buffers each read once and written once).
#include <cstdint>

#include "kernels/cpu/optim.h"
#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

using cpu::AdamParams;
using cpu::SgdParams;

// Formulas and contracts as cpu::sgd_step / cpu::adam_step.
template <class T>
void sgd_step(int64_t n, const SgdParams& hp, T* p, const T* g, T* buf, cudaStream_t stream);

template <class T>
void adam_step(int64_t n, const AdamParams& hp, T* p, const T* g, T* m, T* v, T* vmax, cudaStream_t stream);

}  // namespace nd::kernels::cuda
