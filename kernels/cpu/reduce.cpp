#include "kernels/cpu/reduce.h"

#include <omp.h>

#include <algorithm>
#include <vector>

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

// Each thread owns a range of whole column chunks and sweeps every row once, adding the
// row's slice of its range into double partial sums (L1-resident); rows are read forwards
// and each row's slice is contiguous. Chunks of 16 keep the threads' slices a cache line
// of f32 apart. Column c's sum never depends on the split: rows 0..R-1 in order.
constexpr int64_t kColumnChunk = 16;

template <class T>
void sum_columns(int64_t R, int64_t C, int64_t ld, const T* x, T* out) {
  const int64_t chunks = (C + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel if (R * C > 65536 && chunks > 1)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t c_begin = std::min(C, chunks * t / threads * kColumnChunk);
    const int64_t c_end = std::min(C, chunks * (t + 1) / threads * kColumnChunk);
    std::vector<double> acc(c_end - c_begin, 0.0);
    for (int64_t r = 0; r < R; ++r) {
      const T* row = x + r * ld + c_begin;
      for (int64_t c = 0; c < c_end - c_begin; ++c) acc[c] += row[c];
    }
    for (int64_t c = c_begin; c < c_end; ++c) out[c] = static_cast<T>(acc[c - c_begin]);
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
  template void sum_columns<T>(int64_t, int64_t, int64_t, const T*, T*);             \
  template void var_rows<T>(int64_t, int64_t, int64_t, const T*, T*);                \
  template void max_rows<T>(int64_t, int64_t, const T*, T*, int64_t*);               \
  template void scatter_rows<T>(int64_t, int64_t, const int64_t*, const T*, T*);
ND_INST(float)
ND_INST(double)
ND_INST(int64_t)
ND_INST(int32_t)

}  // namespace nd::kernels::cpu
