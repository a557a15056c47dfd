#include "kernels/cpu/dropout.h"

#include "kernels/common/dropout_mask.h"

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

template void dropout_forward<float>(const float*, int64_t, double, uint64_t, uint64_t, float*);
template void dropout_forward<double>(const double*, int64_t, double, uint64_t, uint64_t,
                                      double*);
template void dropout_backward<float>(const float*, int64_t, double, uint64_t, uint64_t, float*);
template void dropout_backward<double>(const double*, int64_t, double, uint64_t, uint64_t,
                                       double*);

}  // namespace nd::kernels::cpu
