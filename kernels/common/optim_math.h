#pragma once
// The per-element updates of the fused optimizer steps, shared by kernels/cpu/optim.cpp and
// kernels/cuda/optim.cu so both devices do the same arithmetic in the same order
// (formulas in kernels/cpu/optim.h). The coefficients are derived once per tensor on the
// host (bias corrections in double), then each element is updated in place.
//
// A step over many tensors works in chunks of kChunk elements of one tensor: an entry per
// tensor (its coefficients, length and pointers, and `update(i)` for element i), and a
// chunk list that both twins share out (CPU: among OpenMP threads; CUDA: a block each).
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/counter_rng.h"  // ND_HOST_DEVICE
#include "kernels/cpu/optim.h"

namespace nd::kernels::optim_math {

constexpr int64_t kChunk = 4096;

template <class T>
struct Sgd {
  T lr, mom, damp, wd;
  bool use_momentum, first_step, nesterov;
};

template <class T>
inline Sgd<T> sgd(const cpu::SgdParams& hp, bool first_step) {
  return {T(hp.lr), T(hp.momentum), T(hp.dampening), T(hp.weight_decay), hp.momentum != 0, first_step,
          hp.nesterov};
}

template <class T>
ND_HOST_DEVICE void sgd_update(const Sgd<T>& c, int64_t i, T* p, const T* g, T* buf) {
  T d = g[i] + c.wd * p[i];
  if (c.use_momentum) {
    buf[i] = c.first_step ? d : c.mom * buf[i] + (T(1) - c.damp) * d;
    d = c.nesterov ? d + c.mom * buf[i] : buf[i];
  }
  p[i] -= c.lr * d;
}

template <class T>
struct Adam {
  T step_size, sqrt_bc2, b1, b2, eps, wd, decay;
  bool decoupled, amsgrad;
};

// The coefficients of a tensor at its `step` (counted from 1).
template <class T>
inline Adam<T> adam(const cpu::AdamParams& hp, int64_t step) {
  const double bc1 = 1 - std::pow(hp.beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(hp.beta2, static_cast<double>(step));
  return {T(hp.lr / bc1), T(std::sqrt(bc2)), T(hp.beta1), T(hp.beta2), T(hp.eps), T(hp.weight_decay),
          T(1 - hp.lr * hp.weight_decay), hp.decoupled_weight_decay, hp.amsgrad};
}

template <class T>
ND_HOST_DEVICE void adam_update(const Adam<T>& c, int64_t i, T* p, const T* g, T* m, T* v, T* vmax) {
  using std::sqrt;
  T grad = g[i];
  if (c.decoupled)
    p[i] *= c.decay;
  else
    grad += c.wd * p[i];
  m[i] = c.b1 * m[i] + (T(1) - c.b1) * grad;
  v[i] = c.b2 * v[i] + (T(1) - c.b2) * grad * grad;
  T second = v[i];
  if (c.amsgrad) second = vmax[i] = vmax[i] < v[i] ? v[i] : vmax[i];  // std::max(vmax, v)
  p[i] -= c.step_size * m[i] / (sqrt(second) / c.sqrt_bc2 + c.eps);
}

// The entries of a multi-tensor step (plain data: CUDA copies them to the device).
template <class T>
struct SgdEntry {
  Sgd<T> c;
  int64_t n;
  T* p;
  const T* g;
  T* buf;
  ND_HOST_DEVICE void update(int64_t i) const { sgd_update(c, i, p, g, buf); }
};

template <class T>
struct AdamEntry {
  Adam<T> c;
  int64_t n;
  T* p;
  const T* g;
  T *m, *v, *vmax;
  ND_HOST_DEVICE void update(int64_t i) const { adam_update(c, i, p, g, m, v, vmax); }
};

template <class T>
std::vector<SgdEntry<T>> sgd_entries(const std::vector<cpu::SgdTensor<T>>& tensors, const cpu::SgdParams& hp) {
  std::vector<SgdEntry<T>> entries;
  for (const cpu::SgdTensor<T>& t : tensors)
    if (t.n > 0) entries.push_back({sgd<T>(hp, t.first_step), t.n, t.p, t.g, t.buf});
  return entries;
}

template <class T>
std::vector<AdamEntry<T>> adam_entries(const std::vector<cpu::AdamTensor<T>>& tensors, const cpu::AdamParams& hp) {
  std::vector<AdamEntry<T>> entries;
  for (const cpu::AdamTensor<T>& t : tensors)
    if (t.n > 0) entries.push_back({adam<T>(hp, t.step), t.n, t.p, t.g, t.m, t.v, t.vmax});
  return entries;
}

// Elements [start, min(start + kChunk, n)) of entry `entry`.
struct Chunk {
  int64_t entry, start;
};

template <class Entry>
std::vector<Chunk> chunks_of(const std::vector<Entry>& entries) {
  std::vector<Chunk> chunks;
  for (size_t e = 0; e < entries.size(); ++e)
    for (int64_t start = 0; start < entries[e].n; start += kChunk) chunks.push_back({int64_t(e), start});
  return chunks;
}

}  // namespace nd::kernels::optim_math
