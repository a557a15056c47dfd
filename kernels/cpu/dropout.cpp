#include "kernels/cpu/dropout.h"

#include "kernels/common/dropout_mask.h"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cpu {

namespace {
// Forward and backward are the same map: multiply by keep_i / (1 - p).
template <typename T>
void apply_mask(const T* x, int64_t n, double p, uint64_t seed, uint64_t offset, T* y) {
  const T scale = dropout_scale<T>(p);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = dropout_apply(x[i], scale, seed, offset, i, p);
}
}  // namespace

template <typename T>
void dropout_forward(const T* x, int64_t n, double p, uint64_t seed, uint64_t offset, T* y) {
  apply_mask(x, n, p, seed, offset, y);
}

template <typename T>
void dropout_backward(const T* dy, int64_t n, double p, uint64_t seed, uint64_t offset, T* dx) {
  apply_mask(dy, n, p, seed, offset, dx);
}

#define ND_INSTANTIATE(T) \
  template void dropout_forward<T>(const T*, int64_t, double, uint64_t, uint64_t, T*); \
  template void dropout_backward<T>(const T*, int64_t, double, uint64_t, uint64_t, T*);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cpu
