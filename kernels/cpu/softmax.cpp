#include "kernels/cpu/softmax.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/twin_types.h"

namespace nd::kernels::cpu {

namespace {
// Row maximum; a row of all -inf has max -inf, and x - max would be NaN, so use 0 then
// (exp(-inf - 0) = 0 and the row comes out as 0/0 = NaN, as in PyTorch).
template <typename T>
T row_max(const T* x, int64_t D) {
  T mx = x[0];
  for (int64_t d = 1; d < D; ++d) mx = std::max(mx, x[d]);
  return std::isinf(mx) && mx < 0 ? T(0) : mx;
}
}  // namespace

template <typename T>
void softmax_forward(const T* x, int64_t M, int64_t D, T* y) {
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const T* xr = x + m * D;
    T* yr = y + m * D;
    const T mx = row_max(xr, D);
    T sum = 0;
    for (int64_t d = 0; d < D; ++d) {
      yr[d] = std::exp(xr[d] - mx);
      sum += yr[d];
    }
    const T inv = T(1) / sum;
    for (int64_t d = 0; d < D; ++d) yr[d] *= inv;
  }
}

template <typename T>
void log_softmax_forward(const T* x, int64_t M, int64_t D, T* y) {
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const T* xr = x + m * D;
    T* yr = y + m * D;
    const T mx = row_max(xr, D);
    T sum = 0;
    for (int64_t d = 0; d < D; ++d) sum += std::exp(xr[d] - mx);
    const T shift = mx + std::log(sum);
    for (int64_t d = 0; d < D; ++d) yr[d] = xr[d] - shift;
  }
}

template <typename T>
void softmax_backward(const T* dy, const T* y, int64_t M, int64_t D, T* dx) {
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const T* g = dy + m * D;
    const T* yr = y + m * D;
    T dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += g[d] * yr[d];
    T* out = dx + m * D;
    for (int64_t d = 0; d < D; ++d) out[d] = yr[d] * (g[d] - dot);
  }
}

template <typename T>
void log_softmax_backward(const T* dy, const T* y, int64_t M, int64_t D, T* dx) {
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const T* g = dy + m * D;
    const T* yr = y + m * D;
    T sum = 0;
    for (int64_t d = 0; d < D; ++d) sum += g[d];
    T* out = dx + m * D;
    for (int64_t d = 0; d < D; ++d) out[d] = g[d] - std::exp(yr[d]) * sum;
  }
}

#define ND_INSTANTIATE(T)                                                         \
  template void softmax_forward<T>(const T*, int64_t, int64_t, T*);               \
  template void log_softmax_forward<T>(const T*, int64_t, int64_t, T*);           \
  template void softmax_backward<T>(const T*, const T*, int64_t, int64_t, T*);    \
  template void log_softmax_backward<T>(const T*, const T*, int64_t, int64_t, T*);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cpu
