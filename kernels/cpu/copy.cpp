#include "kernels/cpu/copy.h"

#include <type_traits>

#include "kernels/common/float16.h"
#include "kernels/cpu/strided.h"

namespace nd::kernels::cpu {

namespace {
template <class D, class S>
inline D convert(S s) {
  if constexpr (std::is_arithmetic_v<S> && std::is_arithmetic_v<D>)
    return static_cast<D>(s);
  else if constexpr (std::is_arithmetic_v<D>)
    return static_cast<D>(static_cast<float>(s));
  else
    return D(static_cast<float>(s));
}
}  // namespace

template <class S, class D>
void copy_strided(int64_t ndim, const int64_t* shape, const S* src, const int64_t* src_strides, D* dst,
                  const int64_t* dst_strides) {
  for_each_row<2>(ndim, shape, {src_strides, dst_strides}, [&](auto off, int64_t n, auto st) {
    const S* s = src + off[0];
    D* d = dst + off[1];
    if (st[0] == 1 && st[1] == 1) {
      for (int64_t j = 0; j < n; ++j) d[j] = convert<D>(s[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) d[j * st[1]] = convert<D>(s[j * st[0]]);
    }
  });
}

template <class T>
void fill(int64_t n, T value, T* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = value;
}

#define ND_TYPES(X, S) X(S, float) X(S, double) X(S, BFloat16) X(S, Half) X(S, int64_t) X(S, int32_t) X(S, uint8_t) X(S, bool)
#define ND_COPY(S, D) \
  template void copy_strided<S, D>(int64_t, const int64_t*, const S*, const int64_t*, D*, const int64_t*);
#define ND_ALL(S) ND_TYPES(ND_COPY, S) template void fill<S>(int64_t, S, S*);
ND_ALL(float)
ND_ALL(double)
ND_ALL(BFloat16)
ND_ALL(Half)
ND_ALL(int64_t)
ND_ALL(int32_t)
ND_ALL(uint8_t)
ND_ALL(bool)

}  // namespace nd::kernels::cpu
