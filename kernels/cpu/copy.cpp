#include "kernels/cpu/copy.h"

#include <algorithm>
#include <array>
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

// A batch of transposes: the innermost merged dimension is contiguous in dst but
// strided in src, and the next one out is contiguous in src (x.t().contiguous(), the
// permuted copies of reductions and attention heads). Row by row, every src read would
// touch a new cache line; 32 x 32 tiles read and write whole lines instead.
template <class S, class D>
bool copy_transposed(const MergedDims<2>& m, const S* src, D* dst) {
  const int64_t nd = static_cast<int64_t>(m.sizes.size());
  if (nd < 2 || m.strides[nd - 1][1] != 1 || m.strides[nd - 1][0] == 1 || m.strides[nd - 2][0] != 1) return false;
  constexpr int64_t kTile = 32;
  const int64_t A = m.sizes[nd - 2], B = m.sizes[nd - 1];  // src walks A with stride 1, dst walks B with stride 1
  const int64_t src_b = m.strides[nd - 1][0], dst_a = m.strides[nd - 2][1];
  int64_t rows = 1;
  for (int64_t d = 0; d < nd - 2; ++d) rows *= m.sizes[d];
  const int64_t tiles_a = (A + kTile - 1) / kTile, tiles_b = (B + kTile - 1) / kTile;
  const int64_t tiles = tiles_a * tiles_b, work = rows * tiles;
#pragma omp parallel for schedule(static) if (rows * A * B > 65536 && work > 1)
  for (int64_t w = 0; w < work; ++w) {
    const std::array<int64_t, 2> off = row_offsets(m, nd - 2, w / tiles);
    const int64_t a0 = (w % tiles) / tiles_b * kTile, b0 = (w % tiles) % tiles_b * kTile;
    const int64_t a1 = std::min(a0 + kTile, A), b1 = std::min(b0 + kTile, B);
    const S* s = src + off[0];
    D* d = dst + off[1];
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t a = a0; a < a1; ++a) d[a * dst_a + b] = convert<D>(s[a + b * src_b]);
  }
  return true;
}

}  // namespace

template <class S, class D>
void copy_strided(int64_t ndim, const int64_t* shape, const S* src, const int64_t* src_strides, D* dst,
                  const int64_t* dst_strides) {
  const MergedDims<2> m = merge_dims<2>(ndim, shape, {src_strides, dst_strides});
  if (m.empty || copy_transposed(m, src, dst)) return;
  for_each_row(m, [&](auto off, int64_t n, auto st) {
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

template <class T>
void add_constant(int64_t n, T value, T* dst) {
  using U = std::make_unsigned_t<T>;
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(static_cast<U>(dst[i]) + static_cast<U>(value));
}
template void add_constant<int64_t>(int64_t, int64_t, int64_t*);
template void add_constant<int32_t>(int64_t, int32_t, int32_t*);

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
