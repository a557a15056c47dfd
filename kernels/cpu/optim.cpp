#include "kernels/cpu/optim.h"

#include <algorithm>

#include "kernels/common/optim_math.h"

namespace nd::kernels::cpu {

template <class T>
void sgd_step(int64_t n, const SgdParams& hp, T* p, const T* g, T* buf) {
  const auto c = optim_math::sgd<T>(hp);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) optim_math::sgd_update(c, i, p, g, buf);
}

template <class T>
void adam_step(int64_t n, const AdamParams& hp, T* p, const T* g, T* m, T* v, T* vmax) {
  const auto c = optim_math::adam<T>(hp);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) optim_math::adam_update(c, i, p, g, m, v, vmax);
}

template <class T>
void adam_step_multi(const std::vector<AdamTensor<T>>& tensors, const AdamParams& hp) {
  constexpr int64_t kChunk = optim_math::kAdamChunk;
  struct Chunk {
    optim_math::Adam<T> c;
    const AdamTensor<T>* t;
    int64_t start;
  };
  std::vector<Chunk> chunks;
  int64_t total = 0;
  for (const AdamTensor<T>& t : tensors) {
    const auto c = optim_math::adam_at_step<T>(hp, t.step);
    for (int64_t start = 0; start < t.n; start += kChunk) chunks.push_back({c, &t, start});
    total += t.n;
  }
  const auto count = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(static) if (total > 65536)
  for (int64_t k = 0; k < count; ++k) {
    const Chunk& ch = chunks[k];
    const AdamTensor<T>& t = *ch.t;
    const int64_t end = std::min(ch.start + kChunk, t.n);
    for (int64_t i = ch.start; i < end; ++i) optim_math::adam_update(ch.c, i, t.p, t.g, t.m, t.v, t.vmax);
  }
}

template <class T>
bool unscale_grad(int64_t n, T* g, T inv_scale) {
  // A bit per element, or'ed: no branch in the loop, so it vectorises; x - x is 0 for a
  // finite x and NaN for inf or NaN.
  bool nonfinite = false;
#pragma omp parallel for schedule(static) reduction(|| : nonfinite) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    nonfinite = nonfinite || !(g[i] - g[i] == T(0));
    g[i] *= inv_scale;
  }
  return nonfinite;
}

template void sgd_step<float>(int64_t, const SgdParams&, float*, const float*, float*);
template void sgd_step<double>(int64_t, const SgdParams&, double*, const double*, double*);
template void adam_step<float>(int64_t, const AdamParams&, float*, const float*, float*, float*, float*);
template void adam_step<double>(int64_t, const AdamParams&, double*, const double*, double*, double*, double*);

template void adam_step_multi<float>(const std::vector<AdamTensor<float>>&, const AdamParams&);
template void adam_step_multi<double>(const std::vector<AdamTensor<double>>&, const AdamParams&);

template bool unscale_grad<float>(int64_t, float*, float);
template bool unscale_grad<double>(int64_t, double*, double);

}  // namespace nd::kernels::cpu
