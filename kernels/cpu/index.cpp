#include "kernels/cpu/index.h"

#include <cstring>

#include "kernels/common/float16.h"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cpu {

template <class T>
void index_select(int64_t outer, int64_t D, int64_t inner, const T* x, int64_t K, const int64_t* index, T* out) {
#pragma omp parallel for collapse(2) schedule(static) if (outer * K * inner > 65536)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < K; ++k)
      std::memcpy(out + (o * K + k) * inner, x + (o * D + index[k]) * inner, sizeof(T) * inner);
}

template <class T>
void index_add(int64_t outer, int64_t D, int64_t inner, int64_t K, const int64_t* index, const T* dy, T* dx) {
#pragma omp parallel for schedule(static) if (outer * K * inner > 65536 && outer > 1)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < K; ++k) {
      const T* src = dy + (o * K + k) * inner;
      T* dst = dx + (o * D + index[k]) * inner;
      for (int64_t i = 0; i < inner; ++i) dst[i] += src[i];
    }
}

#define ND_INST(T)                                                                                    \
  template void index_select<T>(int64_t, int64_t, int64_t, const T*, int64_t, const int64_t*, T*);
ND_INST(float)
ND_INST(double)
ND_INST(BFloat16)
ND_INST(Half)
ND_INST(int64_t)
ND_INST(int32_t)
ND_INST(uint8_t)
ND_INST(bool)
#define ND_INSTANTIATE(T) \
  template void index_add<T>(int64_t, int64_t, int64_t, int64_t, const int64_t*, const T*, T*);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cpu
