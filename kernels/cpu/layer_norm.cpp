#include "kernels/cpu/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/twin_types.h"

// Why this shape: the MAE's layer norms run over thousands of short rows (D = 32 or 64), so
// their cost was the latency of serial double sums (one dependent add per element), not
// memory. Each row sum is now split into kLanes interleaved partial sums (one vector of
// doubles) added in a fixed tree: the loops vectorise and the result is still deterministic.
// Statistics stay two-pass in double: the row is in L1 for the second pass, and a one-pass
// E[x^2] - E[x]^2 loses digits when |mean| >> std.
// The weight and bias gradients sum over rows in fixed chunks of rows, row-major (vectorised
// over d, no strided column walks); the chunks' partial sums are added in chunk order, so the
// results do not depend on the number of threads.

namespace nd::kernels::cpu {

namespace {

constexpr int kLanes = 8;
constexpr int64_t kParallelMin = 65536;  // elements below which one thread does all
constexpr int64_t kChunkElems = 4096;    // rows per dweight/dbias chunk = max(1, this / D)

// sum_{d < D} f(d) in double: lane j sums the d = j (mod kLanes), lanes added pairwise.
template <typename F>
inline double lane_sum(int64_t D, F f) {
  double acc[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= D; d += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += f(d + j);
  }
  for (int j = 0; d + j < D; ++j) acc[j] += f(d + j);
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  return acc[0];
}

// p[0, D) as doubles, or D copies of fill when p is null (so row loops need no branch).
template <typename T>
std::vector<double> doubles_or(const T* p, int64_t D, double fill) {
  std::vector<double> v(static_cast<size_t>(D), fill);
  if (p != nullptr) std::copy(p, p + D, v.begin());
  return v;
}

}  // namespace

template <typename T>
void layer_norm_forward(const T* x, const T* weight, const T* bias, int64_t M, int64_t D,
                        double eps, T* y, T* mean, T* rstd) {
  const std::vector<double> w = doubles_or(weight, D, 1.0), b = doubles_or(bias, D, 0.0);
  const double inv_d = 1.0 / static_cast<double>(D);
#pragma omp parallel for schedule(static) if (M * D > kParallelMin && M > 1)
  for (int64_t m = 0; m < M; ++m) {
    const T* xr = x + m * D;
    T* yr = y + m * D;
    const double mu = lane_sum(D, [&](int64_t d) { return static_cast<double>(xr[d]); }) * inv_d;
    const double ss = lane_sum(D, [&](int64_t d) {
      const double c = static_cast<double>(xr[d]) - mu;
      return c * c;
    });
    const double r = 1.0 / std::sqrt(ss * inv_d + eps);
    for (int64_t d = 0; d < D; ++d) {
      const double xhat = (static_cast<double>(xr[d]) - mu) * r;
      yr[d] = static_cast<T>(xhat * w[d] + b[d]);
    }
    mean[m] = static_cast<T>(mu);
    rstd[m] = static_cast<T>(r);
  }
}

template <typename T>
void layer_norm_backward(const T* dy, const T* x, const T* mean, const T* rstd, const T* weight,
                         int64_t M, int64_t D, T* dx, T* dweight, T* dbias) {
  const std::vector<double> w = doubles_or(weight, D, 1.0);
  const bool param_grads = dweight != nullptr || dbias != nullptr;
  const double inv_d = 1.0 / static_cast<double>(std::max<int64_t>(D, 1));
  const int64_t rows_per_chunk = std::max<int64_t>(1, kChunkElems / std::max<int64_t>(D, 1));
  const int64_t chunks = (M + rows_per_chunk - 1) / rows_per_chunk;
  // Chunk c's partial sums: [c * 2D, c * 2D + D) sum dy * xhat, then D of sum dy.
  std::vector<double> partial(param_grads ? static_cast<size_t>(chunks * 2 * D) : 0, 0.0);
#pragma omp parallel for schedule(static) if (M * D > kParallelMin && chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    double* pw = param_grads ? partial.data() + c * 2 * D : nullptr;
    for (int64_t m = c * rows_per_chunk; m < std::min(M, (c + 1) * rows_per_chunk); ++m) {
      const T* xr = x + m * D;
      const T* gr = dy + m * D;
      const double mu = static_cast<double>(mean[m]), r = static_cast<double>(rstd[m]);
      if (pw != nullptr) {  // before dx is written: dx may alias dy
        for (int64_t d = 0; d < D; ++d) {
          const double g = static_cast<double>(gr[d]);
          pw[d] += g * (static_cast<double>(xr[d]) - mu) * r;
          pw[D + d] += g;
        }
      }
      if (dx == nullptr) continue;
      // g = dy * weight; mg = mean_d(g), mgx = mean_d(g * xhat).
      const double mg =
          lane_sum(D, [&](int64_t d) { return static_cast<double>(gr[d]) * w[d]; }) * inv_d;
      const double mgx = lane_sum(D, [&](int64_t d) {
        return static_cast<double>(gr[d]) * w[d] * (static_cast<double>(xr[d]) - mu) * r;
      }) * inv_d;
      T* out = dx + m * D;
      for (int64_t d = 0; d < D; ++d) {
        const double g = static_cast<double>(gr[d]) * w[d];
        const double xhat = (static_cast<double>(xr[d]) - mu) * r;
        out[d] = static_cast<T>(r * (g - mg - xhat * mgx));
      }
    }
  }
  if (!param_grads) return;
  std::vector<double> total(static_cast<size_t>(2 * D), 0.0);
  for (int64_t c = 0; c < chunks; ++c) {
    for (int64_t i = 0; i < 2 * D; ++i) total[i] += partial[c * 2 * D + i];
  }
  for (int64_t d = 0; d < D; ++d) {
    if (dweight != nullptr) dweight[d] = static_cast<T>(total[d]);
    if (dbias != nullptr) dbias[d] = static_cast<T>(total[D + d]);
  }
}

#define ND_INSTANTIATE(T) \
  template void layer_norm_forward<T>(const T*, const T*, const T*, int64_t, int64_t, double, T*, T*, T*); \
  template void layer_norm_backward<T>(const T*, const T*, const T*, const T*, const T*, int64_t, int64_t, T*, T*, T*);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cpu
