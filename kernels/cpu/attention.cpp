// Flash-style attention on the CPU, built from small dense tile GEMMs.
//
// Why tiles: a query tile of kQueryTile rows against a key tile of kKeyTile keys turns the
// per-row dot products into two (forward) or five (backward) GEMMs (cpu::gemm, run
// single-threaded inside the OpenMP region) big enough for Eigen's packed, vectorised kernel,
// while the score block stays in L2. The softmax is done row by row over the tile by the
// lane-wise loop below (exp_shifted_sum). Only one score tile (and, in the backward, one
// dP tile) per thread is ever held, never an Sq x Sk matrix.
//
// Races: the forward's work items are (b, h, query tile); each writes only its own rows of
// out and logsumexp. The backward's are key tiles, each writing only its rows of dk and dv;
// dq sums over key tiles, so either one thread owns a whole head (B*H >= threads) or, for
// few heads, each thread sums into its own dq and the copies are added in thread order
// (deterministic). Benchmark: bench_cpu_ops "attention". Tests: tests/kernels/
// attention_kernel_test.cpp, tests/ops/attention_test.cpp.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

// GCC 12 false positives inside Eigen's AVX-512 packet code (see kernels/cpu/matmul.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Core>
#include <omp.h>

#include "kernels/common/elementwise_math.h"
#include "kernels/cpu/matmul.h"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cpu {

namespace {

// Measured in bench_cpu_ops "attention" (B=4 H=8 S=512 E=64, one thread): with 64 x 64
// tiles the backward ran at ~0.6x the unfused Eigen baseline, with 64 x 256 at ~0.83x, with
// 128 x 256 at ~0.85x (Eigen's packing is paid per GEMM call, so bigger tiles amortise it).
// A 128 x 256 tile is 128 KiB in f32; the backward's two stay in a 2 MiB L2.
constexpr int64_t kQueryTile = 128;
constexpr int64_t kKeyTile = 256;

template <typename T>
using TileMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

// Scratch with a fixed (Eigen's maximal) alignment: Eigen's vectorised row reductions
// peel a number of leading elements that depends on the address, so a scratch buffer
// whose alignment varied between runs made the sums, and so training, differ in the
// last bits from run to run (caught by the apps' exact-resume tests).
template <class T>
using Scratch = std::vector<T, Eigen::aligned_allocator<T>>;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The softmax's exponentials as a loop over kLanes-wide chunks, which GCC turns into one
// vector instruction each. It replaces Eigen row expressions, which on the short rows of
// small heads (13 or 50 keys in the MAE) ran most elements through scalar peeling and
// libm's expf (MAE decoder attention, 50 keys: forward -40%, backward -18%). Score rows
// are padded to whole chunks (padded_cols) with -inf, whose exp is 0, so no element
// takes a scalar tail (encoder, 13 keys: a further -15% forward). The sum is
// kept per lane and added in a fixed order, so a row's result does not depend on its
// address. The exp is math::exp_nonpositive (kernels/common: for float the vectorisable
// f32 exp, within ~1 ulp; its argument here is a score minus the row's running max or
// logsumexp, <= 0 up to the scores' rounding; double keeps libm's). (The row max stays Eigen's maxCoeff: a max does
// not depend on the order, and a lane-array max measured 2x slower on 256-key rows.)
constexpr int64_t kLanes = 16;

// A score tile's row length: cols rounded up to whole chunks.
int64_t padded_cols(int64_t cols) { return (cols + kLanes - 1) / kLanes * kLanes; }

// x[i] = exp(x[i] - shift) for i < n; returns the sum of the new x[0, n).
// requires: n a multiple of kLanes (a padded score row).
template <typename T>
T exp_shifted_sum(T* x, int64_t n, T shift) {
  T lane[kLanes] = {};
  for (int64_t i = 0; i < n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      x[i + l] = math::exp_nonpositive(x[i + l] - shift);
      lane[l] += x[i + l];
    }
  }
  T sum = 0;
  for (int64_t l = 0; l < kLanes; ++l) sum += lane[l];
  return sum;
}

// Element offset of head (b, h)'s first row.
int64_t head_offset(const AttentionRows& rows, int64_t b, int64_t h) {
  return b * rows.stride_b + h * rows.stride_h;
}

// One (b, h) head: its q, k, v rows with their row strides (the GEMMs' leading dims) and
// the (b, h) corner of the mask (nullptr: none).
template <typename T>
struct Head {
  const T *q, *k, *v, *mask;
  int64_t ldq, ldk, ldv;
};

template <typename T>
Head<T> head(const T* q, const T* k, const T* v, const AttentionMask<T>& mask,
             const AttentionLayout& lay, int64_t b, int64_t h) {
  const T* m = mask.data ? mask.data + b * mask.stride_b + h * mask.stride_h : nullptr;
  return {q + head_offset(lay.q, b, h), k + head_offset(lay.k, b, h), v + head_offset(lay.v, b, h),
          m,  lay.q.stride_row, lay.k.stride_row, lay.v.stride_row};
}

// Scores of query rows [i0, i1) against keys [j0, j1), row-major into s with leading dim
// lds = padded_cols(j1 - j0):
//   s_ij = scale * q_i . k_j + mask_ij,   and -inf where is_causal removes key j > i
// and in each row's padding.
template <typename T>
void tile_scores(const Head<T>& hd, const AttentionMask<T>& mask, int64_t i0, int64_t i1,
                 int64_t j0, int64_t j1, int64_t E, bool is_causal, T scale, T* s) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t rows = i1 - i0, cols = j1 - j0, lds = padded_cols(cols);
  gemm(false, true, rows, cols, E, scale, hd.q + i0 * hd.ldq, hd.ldq, hd.k + j0 * hd.ldk, hd.ldk,
       T(0), s, lds);
  if (hd.mask) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* mrow = hd.mask + (i0 + r) * mask.stride_q + j0 * mask.stride_k;
      for (int64_t c = 0; c < cols; ++c) s[r * lds + c] += mrow[c * mask.stride_k];
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    // the tile crosses the diagonal from column first_hidden of this row on
    const int64_t first_hidden = is_causal ? std::clamp<int64_t>(i0 + r + 1 - j0, 0, cols) : cols;
    std::fill(s + r * lds + first_hidden, s + (r + 1) * lds, neg_inf);
  }
}

// Forward for query rows [i0, i1) of one head, over all the keys they may see; out is the
// head's first output row, ldo its row stride.
// Online softmax per row: running max m, running sum l = sum exp(s - m), acc = sum exp(s - m) Z v;
// a new tile with max m' rescales l and acc by exp(m - m'). Dropout (Z, factors of head bh)
// scales the weights after they were added to l: the normaliser is the undropped softmax's.
template <typename T>
void query_tile_forward(const Head<T>& hd, const AttentionMask<T>& mask, int64_t i0, int64_t i1,
                        int64_t Sq, int64_t Sk, int64_t E, int64_t Ev, bool is_causal, T scale,
                        const AttentionDropout& dropout, int64_t bh, T* out, int64_t ldo,
                        T* logsumexp, Scratch<T>& s, Scratch<T>& acc_buf, Scratch<T>& m,
                        Scratch<T>& l) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t rows = i1 - i0;
  const int64_t jend = is_causal ? std::min(Sk, i1) : Sk;  // no row of the tile sees keys >= i1
  TileMap<T> acc(acc_buf.data(), rows, Ev);
  acc.setZero();
  std::fill(m.begin(), m.begin() + rows, neg_inf);
  std::fill(l.begin(), l.begin() + rows, T(0));
  for (int64_t j0 = 0; j0 < jend; j0 += kKeyTile) {
    const int64_t j1 = std::min(jend, j0 + kKeyTile), cols = j1 - j0, lds = padded_cols(cols);
    tile_scores(hd, mask, i0, i1, j0, j1, E, is_causal, scale, s.data());
    for (int64_t r = 0; r < rows; ++r) {
      T* pr = s.data() + r * lds;
      const T m_new = std::max(m[r], TileMap<T>(pr, 1, cols).maxCoeff());
      if (m_new == neg_inf) {  // only masked keys so far: nothing to add (and -inf - -inf
        std::fill(pr, pr + cols, T(0));  // would be NaN)
        continue;
      }
      const T correction = math::exp_nonpositive(m[r] - m_new);  // 0 on the row's first unmasked tile
      l[r] = l[r] * correction + exp_shifted_sum(pr, lds, m_new);
      if (dropout.p != 0.0)
        for (int64_t c = 0; c < cols; ++c) pr[c] *= dropout.factor<T>(bh, Sq, Sk, i0 + r, j0 + c);
      acc.row(r) *= correction;
      m[r] = m_new;
    }
    // acc += P V_tile
    gemm(false, false, rows, Ev, cols, T(1), s.data(), lds, hd.v + j0 * hd.ldv, hd.ldv, T(1),
         acc_buf.data(), Ev);
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* oi = out + (i0 + r) * ldo;
    if (l[r] == T(0)) {  // no allowed key
      std::fill(oi, oi + Ev, T(0));
      logsumexp[i0 + r] = neg_inf;
      continue;
    }
    const T inv = T(1) / l[r];
    for (int64_t e = 0; e < Ev; ++e) oi[e] = acc(r, e) * inv;
    logsumexp[i0 + r] = m[r] + std::log(l[r]);
  }
}

// Backward for keys [j0, j1) of one head, over every query tile that sees them: writes the
// tile's dk, dv rows and adds its part of dq (dq_head += scale dS K_tile). `g` holds the
// head's dout, out, dq, dk, dv (first rows of the head; dk, dv at row j0) and their row
// strides. Per query tile, with Z the forward's dropout factors (all 1 without dropout):
//   P = exp(S - lse),  dV += (P Z)^T dO,  dP = dO V^T,  dS = P * (Z dP - D),
//   dQ += scale dS K,  dK += scale dS^T Q,  with D_i = dout_i . out_i.
template <typename T>
struct HeadGrads {
  const T *dout, *out;
  T *dq, *dk, *dv;
  int64_t lddo, ldo, lddq, lddk, lddv;
};

template <typename T>
void key_tile_backward(const Head<T>& hd, const AttentionMask<T>& mask, const HeadGrads<T>& g,
                       const T* logsumexp, int64_t j0, int64_t j1, int64_t Sq, int64_t Sk,
                       int64_t E, int64_t Ev, bool is_causal, T scale,
                       const AttentionDropout& dropout, int64_t bh, Scratch<T>& p_buf,
                       Scratch<T>& dp_buf) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t cols = j1 - j0, lds = padded_cols(cols);  // P and dP tiles: lds per row
  T *dk_tile = g.dk + j0 * g.lddk, *dv_tile = g.dv + j0 * g.lddv;
  for (int64_t c = 0; c < cols; ++c) {
    std::fill(dk_tile + c * g.lddk, dk_tile + c * g.lddk + E, T(0));
    std::fill(dv_tile + c * g.lddv, dv_tile + c * g.lddv + Ev, T(0));
  }
  const int64_t ibegin = is_causal ? j0 : 0;  // queries i < j0 see no key of the tile
  for (int64_t i0 = ibegin; i0 < Sq; i0 += kQueryTile) {
    const int64_t i1 = std::min(Sq, i0 + kQueryTile), rows = i1 - i0;
    tile_scores(hd, mask, i0, i1, j0, j1, E, is_causal, scale, p_buf.data());
    // dP = dO_tile V_tile^T
    gemm(false, true, rows, cols, Ev, T(1), g.dout + i0 * g.lddo, g.lddo, hd.v + j0 * hd.ldv,
         hd.ldv, T(0), dp_buf.data(), lds);
    for (int64_t r = 0; r < rows; ++r) {
      T *pr = p_buf.data() + r * lds, *dsr = dp_buf.data() + r * lds;
      const T lse = logsumexp[i0 + r];
      if (lse == neg_inf) {  // fully masked row: output was constant 0, no gradient
        std::fill(pr, pr + cols, T(0));
        std::fill(dsr, dsr + cols, T(0));
        continue;
      }
      exp_shifted_sum(pr, lds, lse);
      const T* gi = g.dout + (i0 + r) * g.lddo;
      const T* oi = g.out + (i0 + r) * g.ldo;
      T d = 0;
      for (int64_t e = 0; e < Ev; ++e) d += gi[e] * oi[e];
      if (dropout.p == 0.0) {
        for (int64_t c = 0; c < cols; ++c) dsr[c] = pr[c] * (dsr[c] - d);
        continue;
      }
      for (int64_t c = 0; c < cols; ++c) {
        const T z = dropout.factor<T>(bh, Sq, Sk, i0 + r, j0 + c);
        dsr[c] = pr[c] * (z * dsr[c] - d);
        pr[c] *= z;
      }
    }
    // dV_tile += P^T dO_tile
    gemm(true, false, cols, Ev, rows, T(1), p_buf.data(), lds, g.dout + i0 * g.lddo, g.lddo,
         T(1), dv_tile, g.lddv);
    // dQ_tile += scale dS K_tile,   dK_tile += scale dS^T Q_tile
    gemm(false, false, rows, E, cols, scale, dp_buf.data(), lds, hd.k + j0 * hd.ldk, hd.ldk,
         T(1), g.dq + i0 * g.lddq, g.lddq);
    gemm(true, false, cols, E, rows, scale, dp_buf.data(), lds, hd.q + i0 * hd.ldq, hd.ldq,
         T(1), dk_tile, g.lddk);
  }
}

}  // namespace

template <typename T>
void scaled_dot_product_attention_forward(const T* q, const T* k, const T* v,
                                          AttentionMask<T> mask, const AttentionLayout& layout,
                                          int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t E,
                                          int64_t Ev, bool is_causal, double scale,
                                          const AttentionDropout& dropout, T* out, T* logsumexp) {
  const T sc = static_cast<T>(scale);
  const int64_t q_tiles = ceil_div(Sq, kQueryTile);
#pragma omp parallel
  {
    const int64_t rows = std::min(Sq, kQueryTile);
    Scratch<T> s(rows * padded_cols(std::min(Sk, kKeyTile))), acc(rows * Ev), m(rows), l(rows);
#pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t qt = 0; qt < q_tiles; ++qt) {
          const int64_t i0 = qt * kQueryTile;
          query_tile_forward(head(q, k, v, mask, layout, b, h), mask, i0,
                             std::min(Sq, i0 + kQueryTile), Sq, Sk, E, Ev, is_causal, sc, dropout,
                             b * H + h, out + head_offset(layout.out, b, h), layout.out.stride_row,
                             logsumexp + (b * H + h) * Sq, s, acc, m, l);
        }
      }
    }
  }
}

template <typename T>
void scaled_dot_product_attention_backward(const T* dout, const T* q, const T* k, const T* v,
                                           AttentionMask<T> mask, const T* out,
                                           const T* logsumexp, const AttentionLayout& layout,
                                           int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t E,
                                           int64_t Ev, bool is_causal, double scale,
                                           const AttentionDropout& dropout, T* dq, T* dk, T* dv) {
  const T sc = static_cast<T>(scale);
  const int64_t BH = B * H, k_tiles = ceil_div(Sk, kKeyTile);
  // One key tile of head (b, h), adding its dq part into the head's rows at dq_head (row
  // stride lddq): dq itself or a thread's dense copy.
  auto key_tile = [&](int64_t b, int64_t h, int64_t kt, T* dq_head, int64_t lddq, Scratch<T>& p,
                      Scratch<T>& dp) {
    const int64_t j0 = kt * kKeyTile;
    const HeadGrads<T> g{dout + head_offset(layout.dout, b, h), out + head_offset(layout.out, b, h),
                         dq_head, dk + head_offset(layout.dk, b, h), dv + head_offset(layout.dv, b, h),
                         layout.dout.stride_row, layout.out.stride_row, lddq,
                         layout.dk.stride_row, layout.dv.stride_row};
    key_tile_backward(head(q, k, v, mask, layout, b, h), mask, g, logsumexp + (b * H + h) * Sq, j0,
                      std::min(Sk, j0 + kKeyTile), Sq, Sk, E, Ev, is_causal, sc, dropout, b * H + h,
                      p, dp);
  };
  const int64_t tile_size = std::min(Sq, kQueryTile) * padded_cols(std::min(Sk, kKeyTile));
  const int threads = omp_get_max_threads();
  if (BH >= threads) {
    // A thread owns a whole head: it zeroes that head's dq and walks its key tiles.
#pragma omp parallel
    {
      Scratch<T> p(tile_size), dp(tile_size);
#pragma omp for collapse(2) schedule(static)
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < H; ++h) {
          T* dq_head = dq + head_offset(layout.dq, b, h);
          for (int64_t i = 0; i < Sq; ++i)
            std::fill(dq_head + i * layout.dq.stride_row, dq_head + i * layout.dq.stride_row + E, T(0));
          for (int64_t kt = 0; kt < k_tiles; ++kt)
            key_tile(b, h, kt, dq_head, layout.dq.stride_row, p, dp);
        }
      }
    }
    return;
  }
  // Fewer heads than threads: split key tiles too; each thread sums dq into its own dense
  // [B*H, Sq, E] copy (B*H < threads), then the copies are added in thread order so the
  // result does not depend on scheduling.
  std::vector<Scratch<T>> dq_copies(threads);
#pragma omp parallel num_threads(threads)
  {
    Scratch<T> p(tile_size), dp(tile_size);
    Scratch<T>& own = dq_copies[omp_get_thread_num()];
    own.assign(BH * Sq * E, T(0));
#pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t kt = 0; kt < k_tiles; ++kt)
          key_tile(b, h, kt, own.data() + (b * H + h) * Sq * E, E, p, dp);
#pragma omp for schedule(static)
    for (int64_t row = 0; row < BH * Sq; ++row) {  // row = (b * H + h) * Sq + i
      const int64_t bh = row / Sq, i = row % Sq;
      T* dst = dq + head_offset(layout.dq, bh / H, bh % H) + i * layout.dq.stride_row;
      for (int64_t e = 0; e < E; ++e) {
        T sum = 0;
        for (const auto& c : dq_copies) sum += c.empty() ? T(0) : c[row * E + e];
        dst[e] = sum;
      }
    }
  }
}

#define ND_INSTANTIATE(T)                                                                   \
  template void scaled_dot_product_attention_forward<T>(                                    \
      const T*, const T*, const T*, AttentionMask<T>, const AttentionLayout&, int64_t,      \
      int64_t, int64_t, int64_t, int64_t, int64_t, bool, double, const AttentionDropout&,   \
      T*, T*);                                                                              \
  template void scaled_dot_product_attention_backward<T>(                                   \
      const T*, const T*, const T*, const T*, AttentionMask<T>, const T*, const T*,         \
      const AttentionLayout&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool,   \
      double, const AttentionDropout&, T*, T*, T*);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cpu
