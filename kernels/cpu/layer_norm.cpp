#include "kernels/cpu/layer_norm.h"

#include <cmath>
#include <vector>

namespace nd::kernels::cpu {

template <typename T>
void layer_norm_forward(const T* x, const T* weight, const T* bias, int64_t M, int64_t D,
                        double eps, T* y, T* mean, T* rstd) {
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const T* xr = x + m * D;
    T* yr = y + m * D;
    // Two passes in double: exact enough for f64 gradcheck, cheap next to the row read.
    double s = 0.0;
    for (int64_t d = 0; d < D; ++d) s += static_cast<double>(xr[d]);
    const double mu = s / static_cast<double>(D);
    double ss = 0.0;
    for (int64_t d = 0; d < D; ++d) {
      const double c = static_cast<double>(xr[d]) - mu;
      ss += c * c;
    }
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
    for (int64_t d = 0; d < D; ++d) {
      const double xhat = (static_cast<double>(xr[d]) - mu) * r;
      const double w = weight ? static_cast<double>(weight[d]) : 1.0;
      const double b = bias ? static_cast<double>(bias[d]) : 0.0;
      yr[d] = static_cast<T>(xhat * w + b);
    }
    mean[m] = static_cast<T>(mu);
    rstd[m] = static_cast<T>(r);
  }
}

template <typename T>
void layer_norm_backward(const T* dy, const T* x, const T* mean, const T* rstd, const T* weight,
                         int64_t M, int64_t D, T* dx, T* dweight, T* dbias) {
  if (dweight != nullptr || dbias != nullptr) {
    // Column sums over rows; each thread owns a block of columns, so no atomics and a
    // deterministic order.
#pragma omp parallel for schedule(static)
    for (int64_t d = 0; d < D; ++d) {
      double sw = 0.0, sb = 0.0;
      for (int64_t m = 0; m < M; ++m) {
        const double g = static_cast<double>(dy[m * D + d]);
        sb += g;
        sw += g * (static_cast<double>(x[m * D + d]) - static_cast<double>(mean[m])) *
              static_cast<double>(rstd[m]);
      }
      if (dweight) dweight[d] = static_cast<T>(sw);
      if (dbias) dbias[d] = static_cast<T>(sb);
    }
  }
  if (dx == nullptr) return;
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const T* xr = x + m * D;
    const T* gr = dy + m * D;
    const double mu = static_cast<double>(mean[m]);
    const double r = static_cast<double>(rstd[m]);
    double sg = 0.0, sgx = 0.0;
    for (int64_t d = 0; d < D; ++d) {
      const double g = static_cast<double>(gr[d]) * (weight ? static_cast<double>(weight[d]) : 1.0);
      sg += g;
      sgx += g * (static_cast<double>(xr[d]) - mu) * r;
    }
    const double mg = sg / static_cast<double>(D), mgx = sgx / static_cast<double>(D);
    T* out = dx + m * D;
    for (int64_t d = 0; d < D; ++d) {
      const double g = static_cast<double>(gr[d]) * (weight ? static_cast<double>(weight[d]) : 1.0);
      const double xhat = (static_cast<double>(xr[d]) - mu) * r;
      out[d] = static_cast<T>(r * (g - mg - xhat * mgx));
    }
  }
}

template void layer_norm_forward<float>(const float*, const float*, const float*, int64_t,
                                        int64_t, double, float*, float*, float*);
template void layer_norm_forward<double>(const double*, const double*, const double*, int64_t,
                                         int64_t, double, double*, double*, double*);
template void layer_norm_backward<float>(const float*, const float*, const float*, const float*,
                                         const float*, int64_t, int64_t, float*, float*, float*);
template void layer_norm_backward<double>(const double*, const double*, const double*,
                                          const double*, const double*, int64_t, int64_t,
                                          double*, double*, double*);

}  // namespace nd::kernels::cpu
