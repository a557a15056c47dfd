#pragma once
// The per-element updates of the fused optimizer steps, shared by kernels/cpu/optim.cpp and
// kernels/cuda/optim.cu so both devices do the same arithmetic in the same order
// (formulas in kernels/cpu/optim.h). The coefficients are derived once per tensor on the
// host (bias corrections in double), then each element is updated in place.
//
// A step over many tensors works in chunks of kChunk elements of one tensor. Each tensor
// has an entry (its length and pointers) and the index of its coefficients in a short list
// (Coefficients: tensors at the same step share one). CUDA passes entries and list by value
// with each launch and keeps the table of chunks, which depends on the lengths only, on the
// device between steps. Both twins share the chunks out (CPU: among
// OpenMP threads; CUDA: a block each) and walk a chunk in groups of kGroup elements: every
// value of a group is loaded before the first update and stored after the last, so a GPU
// thread has all its loads in flight at once (float4 / double2 where every pointer of the
// entry is 16-byte aligned: Entry::vector).
#include <cmath>
#include <cstdint>
#include <map>
#include <type_traits>
#include <vector>

#include "kernels/common/host_device.h"
#include "kernels/common/optim_params.h"

namespace nd::kernels::optim_math {

constexpr int64_t kChunk = 4096;
constexpr int kGroup = 4;             // elements a thread loads before it updates them
constexpr int kMaxCoefficients = 8;  // coefficient sets per launch (distinct steps in one step call)

// ---- group loads and stores ---------------------------------------------------------------

// How a group's values move: ScalarIO element by element (the CPU twin; `vector` is
// ignored), kernels/cuda/vector_io.cuh's VectorIO with one or two 16-byte accesses when
// `vector` (then count == kGroup and the address is 16-byte aligned).
//   load(x, src, i, count, vector):  x[k] = src[i + k] for k < count, 0 beyond;
//   store(x, dst, i, count, vector): dst[i + k] = x[k] for k < count.
struct ScalarIO {
  template <class T>
  ND_HOST_DEVICE static void load(T (&x)[kGroup], const T* __restrict__ src, int64_t i, int64_t count, bool) {
    for (int k = 0; k < kGroup; ++k) x[k] = k < count ? src[i + k] : T(0);
  }
  template <class T>
  ND_HOST_DEVICE static void store(const T (&x)[kGroup], T* __restrict__ dst, int64_t i, int64_t count, bool) {
    for (int k = 0; k < kGroup; ++k)
      if (k < count) dst[i + k] = x[k];
  }
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- SGD ----------------------------------------------------------------------------------

template <class T>
struct Sgd {
  T lr, mom, damp, wd;
  bool use_momentum, first_step, nesterov;
};

template <class T>
inline Sgd<T> sgd(const SgdParams& hp, bool first_step) {
  return {T(hp.lr), T(hp.momentum), T(hp.dampening), T(hp.weight_decay), hp.momentum != 0, first_step,
          hp.nesterov};
}

template <class T>
ND_HOST_DEVICE void sgd_update(const Sgd<T>& c, T& p, T g, T& buf) {
  T d = g + c.wd * p;
  if (c.use_momentum) {
    buf = c.first_step ? d : c.mom * buf + (T(1) - c.damp) * d;
    d = c.nesterov ? d + c.mom * buf : buf;
  }
  p -= c.lr * d;
}

// One tensor of an SGD step (buf null without momentum).
template <class T>
struct SgdEntry {
  using Coefficients = Sgd<T>;
  int64_t n;
  T* p;
  const T* g;
  T* buf;
  int32_t coefficients;  // index into the launch's Coefficients list
  int32_t vector;        // every pointer 16-byte aligned: whole groups load as vectors
  template <class IO>
  ND_HOST_DEVICE void update_group(const Sgd<T>& c, int64_t i, int64_t count, bool vec) const {
    T xp[kGroup], xg[kGroup], xb[kGroup] = {};
    IO::load(xp, p, i, count, vec);
    IO::load(xg, g, i, count, vec);
    if (c.use_momentum && !c.first_step) IO::load(xb, buf, i, count, vec);
    for (int k = 0; k < kGroup; ++k) sgd_update(c, xp[k], xg[k], xb[k]);
    IO::store(xp, p, i, count, vec);
    if (c.use_momentum) IO::store(xb, buf, i, count, vec);
  }
};

// ---- Adam / AdamW ---------------------------------------------------------------------------

template <class T>
struct Adam {
  T step_size, sqrt_bc2, b1, b2, eps, wd, decay;
  bool decoupled, amsgrad;
};

// The coefficients of a tensor at its `step` (counted from 1), on the host or, for a step
// count kept on the device (AdamCountedEntry), in the kernel.
template <class T>
ND_HOST_DEVICE Adam<T> adam(const AdamParams& hp, int64_t step) {
  using std::pow;
  using std::sqrt;
  const double bc1 = 1 - pow(hp.beta1, static_cast<double>(step));
  const double bc2 = 1 - pow(hp.beta2, static_cast<double>(step));
  return {T(hp.lr / bc1), T(sqrt(bc2)), T(hp.beta1), T(hp.beta2), T(hp.eps), T(hp.weight_decay),
          T(1 - hp.lr * hp.weight_decay), hp.decoupled_weight_decay, hp.amsgrad};
}

template <class T>
ND_HOST_DEVICE void adam_update(const Adam<T>& c, T& p, T grad, T& m, T& v, T& vmax) {
  using std::sqrt;
  if (c.decoupled)
    p *= c.decay;
  else
    grad += c.wd * p;
  m = c.b1 * m + (T(1) - c.b1) * grad;
  v = c.b2 * v + (T(1) - c.b2) * grad * grad;
  T second = v;
  if (c.amsgrad) second = vmax = vmax < v ? v : vmax;  // std::max(vmax, v)
  p -= c.step_size * m / (sqrt(second) / c.sqrt_bc2 + c.eps);
}

template <class T>
struct AdamEntry {
  using Coefficients = Adam<T>;
  int64_t n;
  T* p;
  const T* g;
  T *m, *v, *vmax;  // vmax null unless amsgrad
  int32_t coefficients;
  int32_t vector;
  template <class IO>
  ND_HOST_DEVICE void update_group(const Adam<T>& c, int64_t i, int64_t count, bool vec) const {
    T xp[kGroup], xg[kGroup], xm[kGroup], xv[kGroup], xmax[kGroup] = {};
    IO::load(xp, p, i, count, vec);
    IO::load(xg, g, i, count, vec);
    IO::load(xm, m, i, count, vec);
    IO::load(xv, v, i, count, vec);
    if (c.amsgrad) IO::load(xmax, vmax, i, count, vec);
    for (int k = 0; k < kGroup; ++k) adam_update(c, xp[k], xg[k], xm[k], xv[k], xmax[k]);
    IO::store(xp, p, i, count, vec);
    IO::store(xm, m, i, count, vec);
    IO::store(xv, v, i, count, vec);
    if (c.amsgrad) IO::store(xmax, vmax, i, count, vec);
  }
};

// An Adam entry whose step count lives on the device (CUDA only, AdamTensor::step_on_device):
// every entry of a step shares the one coefficient set, the hyperparameters; each block
// derives its coefficients from *step + 1 with adam() above, the host's arithmetic, and the
// entry's last block to finish stores *step + 1 (kernels/cuda/optim.cu).
template <class T>
struct AdamCountedEntry : AdamEntry<T> {
  using Coefficients = AdamParams;
  using Scalar = T;
  double* step;  // the steps taken before this one
};

template <class Entry>
struct IsCounted : std::false_type {};
template <class T>
struct IsCounted<AdamCountedEntry<T>> : std::true_type {};

// ---- GradScaler's unscale -------------------------------------------------------------------

template <class T>
struct Unscale {
  T inv_scale;
  const double* scale;  // when set, the factor is T(1 / *scale), read on the device
};

// Every group holding an inf or NaN sets *found to 1 through IO::flag (CUDA: an atomic max,
// so that many non-finite values, a NaN loss's whole gradient, are no write conflict).
template <class T>
struct UnscaleEntry {
  using Coefficients = Unscale<T>;
  int64_t n;
  T* g;
  int32_t* found;
  int32_t coefficients;
  int32_t vector;
  template <class IO>
  ND_HOST_DEVICE void update_group(const Unscale<T>& c, int64_t i, int64_t count, bool vec) const {
    T xg[kGroup];
    IO::load(xg, g, i, count, vec);  // 0 past the end: finite
    const T inv_scale = c.scale != nullptr ? T(1.0 / *c.scale) : c.inv_scale;
    bool nonfinite = false;
    for (int k = 0; k < kGroup; ++k) {
      nonfinite = nonfinite || !(xg[k] - xg[k] == T(0));  // x - x: 0 if finite, NaN otherwise
      xg[k] *= inv_scale;
    }
    IO::store(xg, g, i, count, vec);
    if (nonfinite) IO::flag(found);
  }
};

// GradScaler's update (torch.amp's _amp_update_scale_), on the host and on the device: after
// a step with a non-finite gradient scale *= backoff and the count of good steps restarts;
// else one more good step, and scale *= growth after `interval` of them in a row (unless the
// product overflows).
ND_HOST_DEVICE void update_scale(double& scale, int64_t& growth_tracker, bool found_nonfinite, double growth,
                                 double backoff, int64_t interval) {
  using std::isfinite;
  if (found_nonfinite) {
    scale *= backoff;
    growth_tracker = 0;
  } else if (++growth_tracker == interval) {
    const double grown = scale * growth;
    if (isfinite(grown)) scale = grown;
    growth_tracker = 0;
  }
}

// ---- the tables of a step -------------------------------------------------------------------

// A step's entries and the distinct coefficient sets they point into.
template <class Entry>
struct Step {
  std::vector<Entry> entries;
  std::vector<typename Entry::Coefficients> coefficients;
};

// The index of the coefficients for `key` (a step count, a first-step flag), made by `make`
// the first time the key is seen.
template <class Entry, class Key, class Make>
int32_t coefficients_for(Step<Entry>& step, std::map<Key, int32_t>& seen, const Key& key, Make&& make) {
  const auto [it, added] = seen.emplace(key, static_cast<int32_t>(step.coefficients.size()));
  if (added) step.coefficients.push_back(make());
  return it->second;
}

template <class T>
Step<SgdEntry<T>> sgd_step_of(const std::vector<SgdTensor<T>>& tensors, const SgdParams& hp) {
  Step<SgdEntry<T>> step;
  std::map<bool, int32_t> seen;
  for (const SgdTensor<T>& t : tensors) {
    if (t.n == 0) continue;
    const int32_t c = coefficients_for(step, seen, t.first_step, [&] { return sgd<T>(hp, t.first_step); });
    const bool vec = aligned16(t.p) && aligned16(t.g) && (t.buf == nullptr || aligned16(t.buf));
    step.entries.push_back({t.n, t.p, t.g, t.buf, c, vec});
  }
  return step;
}

template <class T>
bool adam_vector(const AdamTensor<T>& t) {
  return aligned16(t.p) && aligned16(t.g) && aligned16(t.m) && aligned16(t.v) &&
         (t.vmax == nullptr || aligned16(t.vmax));
}

template <class T>
Step<AdamEntry<T>> adam_step_of(const std::vector<AdamTensor<T>>& tensors, const AdamParams& hp) {
  Step<AdamEntry<T>> step;
  std::map<int64_t, int32_t> seen;
  for (const AdamTensor<T>& t : tensors) {
    if (t.n == 0) continue;
    const int32_t c = coefficients_for(step, seen, t.step, [&] { return adam<T>(hp, t.step); });
    step.entries.push_back({t.n, t.p, t.g, t.m, t.v, t.vmax, c, adam_vector(t)});
  }
  return step;
}

// The step counts stay on the device: one coefficient set, the hyperparameters. An empty
// tensor keeps its entry (and a chunk of no elements), so its count is incremented as the
// others'.
template <class T>
Step<AdamCountedEntry<T>> adam_counted_step_of(const std::vector<AdamTensor<T>>& tensors, const AdamParams& hp) {
  Step<AdamCountedEntry<T>> step;
  step.coefficients.push_back(hp);
  for (const AdamTensor<T>& t : tensors)
    step.entries.push_back({{t.n, t.p, t.g, t.m, t.v, t.vmax, 0, adam_vector(t)}, t.step_on_device});
  return step;
}

// Elements [start, min(start + kChunk, n)) of entry `entry`.
struct Chunk {
  int64_t entry, start;
};

// The chunks of an entry of n elements; one at least for an entry whose step is counted on
// the device (an empty tensor's block counts its step).
ND_HOST_DEVICE int64_t num_chunks(int64_t n, bool counted) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  return counted && chunks == 0 ? 1 : chunks;
}

template <class Entry>
std::vector<Chunk> chunks_of(const std::vector<Entry>& entries) {
  std::vector<Chunk> chunks;
  for (size_t e = 0; e < entries.size(); ++e)
    for (int64_t k = 0; k < num_chunks(entries[e].n, IsCounted<Entry>::value); ++k)
      chunks.push_back({int64_t(e), k * kChunk});
  return chunks;
}

// Chunk `chunk` of `e`: groups of kGroup elements from the chunk's start, group g handled
// by `worker` g % workers (CPU: one worker; CUDA: the block's threads). A whole group loads
// as vectors when the entry allows; the chunk's last group may be partial.
template <class IO, class Entry>
ND_HOST_DEVICE void update_chunk(const Entry& e, const typename Entry::Coefficients& c, int64_t start, int64_t worker,
                                 int64_t workers) {
  const int64_t end = start + kChunk < e.n ? start + kChunk : e.n;
  for (int64_t i = start + kGroup * worker; i < end; i += kGroup * workers) {
    const int64_t count = end - i < kGroup ? end - i : kGroup;
    e.template update_group<IO>(c, i, count, e.vector != 0 && count == kGroup);
  }
}

}  // namespace nd::kernels::optim_math
