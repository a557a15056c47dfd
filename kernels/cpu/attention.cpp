#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace nd::kernels::cpu {

namespace {

constexpr int64_t kKeyTile = 64;

template <typename T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

template <typename T>
void axpy(T alpha, const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Number of keys query row i may see.
inline int64_t key_end(int64_t i, int64_t Sk, bool is_causal) {
  return is_causal ? std::min(Sk, i + 1) : Sk;
}

// Scores s_j = scale * q_i . k_j + mask_ij for j in [j0, j1), written to s[0 .. j1-j0).
template <typename T>
void tile_scores(const T* qi, const T* kbh, const T* mask_row, int64_t stride_k, int64_t j0,
                 int64_t j1, int64_t E, T scale, T* s) {
  for (int64_t j = j0; j < j1; ++j) {
    T v = scale * dot(qi, kbh + j * E, E);
    if (mask_row) v += mask_row[j * stride_k];
    s[j - j0] = v;
  }
}

template <typename T>
const T* mask_row_ptr(const AttentionMask<T>& mask, int64_t b, int64_t h, int64_t i) {
  if (mask.data == nullptr) return nullptr;
  return mask.data + b * mask.stride_b + h * mask.stride_h + i * mask.stride_q;
}

}  // namespace

template <typename T>
void scaled_dot_product_attention_forward(const T* q, const T* k, const T* v,
                                          AttentionMask<T> mask, int64_t B, int64_t H,
                                          int64_t Sq, int64_t Sk, int64_t E, int64_t Ev,
                                          bool is_causal, double scale, T* out, T* logsumexp) {
  const T sc = static_cast<T>(scale);
  const T neg_inf = -std::numeric_limits<T>::infinity();
#pragma omp parallel
  {
    std::vector<T> s(kKeyTile), acc(Ev);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t bh = b * H + h;
        const T* kbh = k + bh * Sk * E;
        const T* vbh = v + bh * Sk * Ev;
        for (int64_t i = 0; i < Sq; ++i) {
          const T* qi = q + (bh * Sq + i) * E;
          const T* mrow = mask_row_ptr(mask, b, h, i);
          // Online softmax: running max m, running sum l of exp(s - m), acc = sum exp(s - m) v.
          T m = neg_inf, l = 0;
          std::fill(acc.begin(), acc.end(), T(0));
          const int64_t jend = key_end(i, Sk, is_causal);
          for (int64_t j0 = 0; j0 < jend; j0 += kKeyTile) {
            const int64_t j1 = std::min(jend, j0 + kKeyTile);
            tile_scores(qi, kbh, mrow, mask.stride_k, j0, j1, E, sc, s.data());
            const T tile_max = *std::max_element(s.begin(), s.begin() + (j1 - j0));
            if (tile_max == neg_inf) continue;  // every key of the tile masked
            const T m_new = std::max(m, tile_max);
            const T correction = std::exp(m - m_new);  // exp(-inf) = 0 on the first tile
            l *= correction;
            for (int64_t e = 0; e < Ev; ++e) acc[e] *= correction;
            for (int64_t j = j0; j < j1; ++j) {
              const T p = std::exp(s[j - j0] - m_new);
              l += p;
              axpy(p, vbh + j * Ev, acc.data(), Ev);
            }
            m = m_new;
          }
          T* oi = out + (bh * Sq + i) * Ev;
          if (l == T(0)) {
            std::fill(oi, oi + Ev, T(0));
            logsumexp[bh * Sq + i] = neg_inf;
            continue;
          }
          const T inv = T(1) / l;
          for (int64_t e = 0; e < Ev; ++e) oi[e] = acc[e] * inv;
          logsumexp[bh * Sq + i] = m + std::log(l);
        }
      }
    }
  }
}

template <typename T>
void scaled_dot_product_attention_backward(const T* dout, const T* q, const T* k, const T* v,
                                           AttentionMask<T> mask, const T* out,
                                           const T* logsumexp, int64_t B, int64_t H, int64_t Sq,
                                           int64_t Sk, int64_t E, int64_t Ev, bool is_causal,
                                           double scale, T* dq, T* dk, T* dv) {
  const T sc = static_cast<T>(scale);
  const T neg_inf = -std::numeric_limits<T>::infinity();
#pragma omp parallel
  {
    std::vector<T> p(kKeyTile);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        // Each (b, h) is owned by one thread, so dq/dk/dv rows are written race-free.
        const int64_t bh = b * H + h;
        const T* kbh = k + bh * Sk * E;
        const T* vbh = v + bh * Sk * Ev;
        T* dkbh = dk + bh * Sk * E;
        T* dvbh = dv + bh * Sk * Ev;
        std::fill(dq + bh * Sq * E, dq + (bh + 1) * Sq * E, T(0));
        std::fill(dkbh, dkbh + Sk * E, T(0));
        std::fill(dvbh, dvbh + Sk * Ev, T(0));
        for (int64_t i = 0; i < Sq; ++i) {
          const T lse = logsumexp[bh * Sq + i];
          if (lse == neg_inf) continue;  // fully masked row: output was constant 0
          const T* qi = q + (bh * Sq + i) * E;
          const T* gi = dout + (bh * Sq + i) * Ev;
          const T Di = dot(gi, out + (bh * Sq + i) * Ev, Ev);
          T* dqi = dq + (bh * Sq + i) * E;
          const T* mrow = mask_row_ptr(mask, b, h, i);
          const int64_t jend = key_end(i, Sk, is_causal);
          for (int64_t j0 = 0; j0 < jend; j0 += kKeyTile) {
            const int64_t j1 = std::min(jend, j0 + kKeyTile);
            tile_scores(qi, kbh, mrow, mask.stride_k, j0, j1, E, sc, p.data());
            for (int64_t j = j0; j < j1; ++j) {
              const T pij = std::exp(p[j - j0] - lse);
              if (pij == T(0)) continue;
              axpy(pij, gi, dvbh + j * Ev, Ev);
              const T ds = pij * (dot(gi, vbh + j * Ev, Ev) - Di) * sc;
              axpy(ds, kbh + j * E, dqi, E);
              axpy(ds, qi, dkbh + j * E, E);
            }
          }
        }
      }
    }
  }
}

#define ND_INSTANTIATE(T)                                                                   \
  template void scaled_dot_product_attention_forward<T>(                                    \
      const T*, const T*, const T*, AttentionMask<T>, int64_t, int64_t, int64_t, int64_t,   \
      int64_t, int64_t, bool, double, T*, T*);                                              \
  template void scaled_dot_product_attention_backward<T>(                                   \
      const T*, const T*, const T*, const T*, AttentionMask<T>, const T*, const T*, int64_t, \
      int64_t, int64_t, int64_t, int64_t, int64_t, bool, double, T*, T*, T*);
ND_INSTANTIATE(float)
ND_INSTANTIATE(double)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cpu
