#include "kernels/cpu/optim.h"

#include "kernels/common/optim_math.h"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cpu {

namespace {
// Every element of every entry, chunk by chunk, the chunks shared out among the threads.
template <class Entry>
void run_chunks(const optim_math::Step<Entry>& step) {
  const std::vector<optim_math::Chunk> chunks = optim_math::chunks_of(step.entries);
  const auto count = static_cast<int64_t>(chunks.size());
  int64_t total = 0;
  for (const Entry& e : step.entries) total += e.n;
#pragma omp parallel for schedule(static) if (total > 65536)
  for (int64_t k = 0; k < count; ++k) {
    const Entry& e = step.entries[chunks[k].entry];
    optim_math::update_chunk<optim_math::ScalarIO>(e, step.coefficients[e.coefficients], chunks[k].start, 0, 1);
  }
}
}  // namespace

template <class T>
void sgd_step(const std::vector<SgdTensor<T>>& tensors, const SgdParams& hp) {
  run_chunks(optim_math::sgd_step_of(tensors, hp));
}

template <class T>
void adam_step(const std::vector<AdamTensor<T>>& tensors, const AdamParams& hp) {
  run_chunks(optim_math::adam_step_of(tensors, hp));
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

#define ND_INSTANTIATE(T) \
  template void sgd_step<T>(const std::vector<SgdTensor<T>>&, const SgdParams&); \
  template void adam_step<T>(const std::vector<AdamTensor<T>>&, const AdamParams&); \
  template bool unscale_grad<T>(int64_t, T*, T);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cpu
