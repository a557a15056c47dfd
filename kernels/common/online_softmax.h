#pragma once
// The online softmax and the tile bounds of flash-style attention, shared by the CUDA
// kernels (kernels/cuda/attention.cu, attention_tc_forward.cu) and tested on the CPU (tests/kernels/
// online_softmax_test.cpp), so that the parts no CPU test can run stay small.
//
// Online softmax of one row of scores seen in blocks: keep the running maximum m and
// l = sum exp(s - m) over the scores seen so far. A new block with maximum m_b moves the
// maximum to m' = max(m, m_b); everything accumulated so far (l, and any weighted sum
// acc = sum exp(s - m) v) is multiplied by exp(m - m'). At the end
//   lse = m + log l,   softmax_j = exp(s_j - lse),   out = acc / l.
// A row that has seen only -inf (every key masked) keeps m = -inf, l = 0 and ends with
// lse = -inf and out = 0; it shifts by 0 instead of m so that exp(-inf - shift) is 0, not NaN.
// kBase2: the scores come in log2 units (s2 = log2(e) s, the scale folded in beforehand, as
// FlashAttention's exp2 does) and every exp above is exp2; lse is still the natural one,
// ln 2 (m + log2 l), which the backward and the CPU twin take.
#include <cmath>
#include <cstdint>

#include "kernels/common/host_device.h"

namespace nd::kernels {

template <class T, bool kBase2 = false>
struct OnlineSoftmax {
  T m = -static_cast<T>(INFINITY);  // running maximum (-inf: nothing allowed seen yet)
  T l = 0;                          // sum over seen scores of exp(s - m)

  // The value scores are shifted by before exp: m, or 0 while m = -inf.
  ND_HOST_DEVICE T shift() const { return m == -static_cast<T>(INFINITY) ? T(0) : m; }

  // Starts a block whose largest score is block_max: moves m, rescales l and returns the
  // factor exp(m_old - m_new) the caller must apply to its own accumulators. The caller
  // then adds p_j = exp(s_j - shift()) to l (add) and p_j v_j to its accumulators.
  ND_HOST_DEVICE T begin_block(T block_max) {
    const T m_new = block_max > m ? block_max : m;
    const T new_shift = m_new == -static_cast<T>(INFINITY) ? T(0) : m_new;
    const T correction = power(m - new_shift);  // 0 while nothing was seen (m = -inf)
    l *= correction;
    m = m_new;
    return correction;
  }
  // p = exp(s - shift()) (exp2 when kBase2) of one score of the current block.
  ND_HOST_DEVICE T weight(T s) const { return power(s - shift()); }
  ND_HOST_DEVICE void add(T p) { l += p; }

  // log sum exp over every score seen; -inf when none was allowed.
  ND_HOST_DEVICE T logsumexp() const {
    using std::log;
    using std::log2;
    if (l == T(0)) return -static_cast<T>(INFINITY);
    if constexpr (kBase2) return (m + log2(l)) * static_cast<T>(0.6931471805599453);
    else return m + log(l);
  }
  // 1 / l, or 0 for a row that saw no allowed score (its accumulators are 0: out = 0).
  ND_HOST_DEVICE T inverse_sum() const { return l == T(0) ? T(0) : T(1) / l; }

 private:
  ND_HOST_DEVICE static T power(T x) {
    using std::exp;
    using std::exp2;
    if constexpr (kBase2) return exp2(x);
    else return exp(x);
  }
};

// The state of the union of two disjoint sets of scores; with acc_a, acc_b their weighted
// sums, the union's is acc_a * scale_a + acc_b * scale_b (the two factors returned).
template <class T>
ND_HOST_DEVICE OnlineSoftmax<T> merge(OnlineSoftmax<T> a, OnlineSoftmax<T> b, T* scale_a, T* scale_b) {
  using std::exp;
  OnlineSoftmax<T> out;
  out.m = a.m > b.m ? a.m : b.m;
  const T shift = out.shift();
  *scale_a = exp(a.m - shift);
  *scale_b = exp(b.m - shift);
  out.l = a.l * *scale_a + b.l * *scale_b;
  return out;
}

// The backward's probability from a saved logsumexp: exp(s - lse), and 0 for a fully
// masked row (lse = -inf), which has no gradient.
template <class T>
ND_HOST_DEVICE T probability_from_lse(T s, T lse) {
  using std::exp;
  return lse == -static_cast<T>(INFINITY) ? T(0) : exp(s - lse);
}

// ---- Tile bounds (causal: PyTorch's top-left aligned tril, key j allowed for query i iff j <= i)

// Whether query i may see key j (j < Sk; the additive mask comes on top).
ND_HOST_DEVICE bool attention_allowed(int64_t i, int64_t j, int64_t Sk, bool is_causal) {
  return j < Sk && (!is_causal || j <= i);
}
// The keys [0, end) that the query rows [i0, i1) may see: no row of the tile sees a key
// j >= i1 when causal.
ND_HOST_DEVICE int64_t attention_key_end(int64_t i1, int64_t Sk, bool is_causal) {
  return is_causal && i1 < Sk ? i1 : Sk;
}
// The first query tile (of `tile` rows) with a row that sees key j0: row i sees j0 only if
// i >= j0 when causal.
ND_HOST_DEVICE int64_t attention_first_query_tile(int64_t j0, int64_t tile, bool is_causal) {
  return is_causal ? j0 / tile : 0;
}

// Inside a tile, as one range per row (the tensor-core kernels compare an element's column
// with it instead of testing attention_allowed element by element): query i sees the keys
// j0 + c of [j0, j1) (j1 <= Sk) for 0 <= c < attention_keys_seen(i, j0, j1, is_causal), and
// key j is seen by the queries i0 + c of [i0, i1) for attention_first_query_seeing(j, i0, i1,
// is_causal) <= c < i1 - i0.
ND_HOST_DEVICE int64_t attention_keys_seen(int64_t i, int64_t j0, int64_t j1, bool is_causal) {
  const int64_t end = is_causal && i + 1 < j1 ? i + 1 : j1;
  return end > j0 ? end - j0 : 0;
}
ND_HOST_DEVICE int64_t attention_first_query_seeing(int64_t j, int64_t i0, int64_t i1, bool is_causal) {
  const int64_t first = is_causal && j > i0 ? j : i0;
  return (first < i1 ? first : i1) - i0;
}

// A 1-D grid of n_tiles * BH blocks (x is not limited to 65535 like y and z): block ->
// (bh, tile). Tiles of one head are neighbours, so a head's K, V stay warm in L2.
struct TileOfBlock {
  int64_t bh, tile;
};
ND_HOST_DEVICE TileOfBlock tile_of_block(int64_t block, int64_t n_tiles) {
  return {block / n_tiles, block % n_tiles};
}

}  // namespace nd::kernels
