#include "kernels/cpu/embedding.h"

#include <algorithm>
#include <cstring>

#include "kernels/common/twin_types.h"

namespace nd::kernels::cpu {

template <typename T>
int64_t embedding_forward(const T* weight, int64_t num_embeddings, int64_t D,
                          const int64_t* indices, int64_t n, T* out) {
  for (int64_t i = 0; i < n; ++i) {
    if (indices[i] < 0 || indices[i] >= num_embeddings) return i;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out + i * D, weight + indices[i] * D, static_cast<size_t>(D) * sizeof(T));
  }
  return -1;
}

template <typename T>
void embedding_backward(const T* dout, const int64_t* indices, int64_t n, int64_t num_embeddings,
                        int64_t D, int64_t padding_idx, T* dweight) {
  std::fill(dweight, dweight + num_embeddings * D, T(0));
  // Scatter-add has write conflicts on repeated indices; splitting the columns among
  // threads instead of the indices keeps it race-free and the order fixed.
  constexpr int64_t kColumnBlock = 64;
  const int64_t blocks = (D + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t d0 = blk * kColumnBlock, d1 = std::min(D, d0 + kColumnBlock);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = indices[i];
      if (r == padding_idx) continue;
      const T* g = dout + i * D;
      T* w = dweight + r * D;
      for (int64_t d = d0; d < d1; ++d) w[d] += g[d];
    }
  }
}

#define ND_INSTANTIATE(T) \
  template int64_t embedding_forward<T>(const T*, int64_t, int64_t, const int64_t*, int64_t, T*); \
  template void embedding_backward<T>(const T*, const int64_t*, int64_t, int64_t, int64_t, int64_t, T*);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cpu
