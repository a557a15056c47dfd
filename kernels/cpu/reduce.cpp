#include "kernels/cpu/reduce.h"

namespace nd::kernels::cpu {

template <class T>
void sum_rows(int64_t M, int64_t R, const T* x, T* out) {
#pragma omp parallel for schedule(static) if (M * R > 65536 && M > 1)
  for (int64_t m = 0; m < M; ++m) {
    const T* row = x + m * R;
    double acc = 0;
    for (int64_t r = 0; r < R; ++r) acc += row[r];
    out[m] = static_cast<T>(acc);
  }
}

template <class T>
void var_rows(int64_t M, int64_t R, int64_t correction, const T* x, T* out) {
#pragma omp parallel for schedule(static) if (M * R > 65536 && M > 1)
  for (int64_t m = 0; m < M; ++m) {
    const T* row = x + m * R;
    double mean = 0;
    for (int64_t r = 0; r < R; ++r) mean += row[r];
    mean /= static_cast<double>(R);
    double ss = 0;
    for (int64_t r = 0; r < R; ++r) ss += (row[r] - mean) * (row[r] - mean);
    out[m] = static_cast<T>(ss / static_cast<double>(R - correction));
  }
}

template <class T>
void max_rows(int64_t M, int64_t R, const T* x, T* values, int64_t* indices) {
#pragma omp parallel for schedule(static) if (M * R > 65536 && M > 1)
  for (int64_t m = 0; m < M; ++m) {
    const T* row = x + m * R;
    int64_t best = 0;
    for (int64_t r = 1; r < R; ++r) {
      if (row[best] != row[best]) break;  // NaN already found
      if (row[r] > row[best] || row[r] != row[r]) best = r;
    }
    if (values) values[m] = row[best];
    if (indices) indices[m] = best;
  }
}

template <class T>
void scatter_rows(int64_t M, int64_t R, const int64_t* indices, const T* dy, T* dx) {
  for (int64_t i = 0; i < M * R; ++i) dx[i] = T(0);
  for (int64_t m = 0; m < M; ++m) dx[m * R + indices[m]] = dy[m];
}

#define ND_INST(T)                                                                   \
  template void sum_rows<T>(int64_t, int64_t, const T*, T*);                         \
  template void var_rows<T>(int64_t, int64_t, int64_t, const T*, T*);                \
  template void max_rows<T>(int64_t, int64_t, const T*, T*, int64_t*);               \
  template void scatter_rows<T>(int64_t, int64_t, const int64_t*, const T*, T*);
ND_INST(float)
ND_INST(double)
ND_INST(int64_t)
ND_INST(int32_t)

}  // namespace nd::kernels::cpu
