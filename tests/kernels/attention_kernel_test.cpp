// Flash-style attention kernels against an explicit full score matrix, finite
// differences and known values.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "omp_threads.h"

#include "numeric.h"
#include "kernels/cpu/attention.h"

namespace {

using namespace nd::kernels::cpu;
using nd::testing::random_normal;
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Problem {
  int64_t B, H, Sq, Sk, E, Ev;
  bool causal;
  double scale;
  std::vector<double> mask;  // empty, or full [B, H, Sq, Sk] additive mask
};

// Reference: materialise S = scale Q K^T + mask (with the causal tril), P = softmax(S),
// out = P V; backward dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)),
// dQ = scale dS K, dK = scale dS^T Q. Fully masked rows give 0 and no gradient.
struct Reference {
  std::vector<double> out, dq, dk, dv;
};

Reference reference(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout) {
  Reference r{std::vector<double>(p.B * p.H * p.Sq * p.Ev, 0.0),
              std::vector<double>(q.size(), 0.0), std::vector<double>(k.size(), 0.0),
              std::vector<double>(v.size(), 0.0)};
  for (int64_t bh = 0; bh < p.B * p.H; ++bh) {
    std::vector<double> P(p.Sq * p.Sk, 0.0);
    for (int64_t i = 0; i < p.Sq; ++i) {
      std::vector<double> s(p.Sk);
      double mx = -kInf;
      for (int64_t j = 0; j < p.Sk; ++j) {
        double d = 0;
        for (int64_t e = 0; e < p.E; ++e) d += q[(bh * p.Sq + i) * p.E + e] * k[(bh * p.Sk + j) * p.E + e];
        s[j] = p.scale * d + (p.mask.empty() ? 0.0 : p.mask[(bh * p.Sq + i) * p.Sk + j]);
        if (p.causal && j > i) s[j] = -kInf;
        mx = std::max(mx, s[j]);
      }
      if (mx == -kInf) continue;
      double z = 0;
      for (int64_t j = 0; j < p.Sk; ++j) z += std::exp(s[j] - mx);
      for (int64_t j = 0; j < p.Sk; ++j) P[i * p.Sk + j] = std::exp(s[j] - mx) / z;
    }
    for (int64_t i = 0; i < p.Sq; ++i)
      for (int64_t j = 0; j < p.Sk; ++j)
        for (int64_t e = 0; e < p.Ev; ++e) {
          r.out[(bh * p.Sq + i) * p.Ev + e] += P[i * p.Sk + j] * v[(bh * p.Sk + j) * p.Ev + e];
          r.dv[(bh * p.Sk + j) * p.Ev + e] += P[i * p.Sk + j] * dout[(bh * p.Sq + i) * p.Ev + e];
        }
    for (int64_t i = 0; i < p.Sq; ++i) {
      std::vector<double> dP(p.Sk, 0.0);
      double rowsum = 0;
      for (int64_t j = 0; j < p.Sk; ++j) {
        for (int64_t e = 0; e < p.Ev; ++e)
          dP[j] += dout[(bh * p.Sq + i) * p.Ev + e] * v[(bh * p.Sk + j) * p.Ev + e];
        rowsum += dP[j] * P[i * p.Sk + j];
      }
      for (int64_t j = 0; j < p.Sk; ++j) {
        const double ds = P[i * p.Sk + j] * (dP[j] - rowsum);
        for (int64_t e = 0; e < p.E; ++e) {
          r.dq[(bh * p.Sq + i) * p.E + e] += p.scale * ds * k[(bh * p.Sk + j) * p.E + e];
          r.dk[(bh * p.Sk + j) * p.E + e] += p.scale * ds * q[(bh * p.Sq + i) * p.E + e];
        }
      }
    }
  }
  return r;
}

template <typename T>
void check_against_reference(const Problem& p, double tol) {
  const auto q = random_normal(p.B * p.H * p.Sq * p.E, 1), k = random_normal(p.B * p.H * p.Sk * p.E, 2),
             v = random_normal(p.B * p.H * p.Sk * p.Ev, 3), dout = random_normal(p.B * p.H * p.Sq * p.Ev, 4);
  const Reference ref = reference(p, q, k, v, dout);
  auto cast = [](const std::vector<double>& a) { return std::vector<T>(a.begin(), a.end()); };
  const auto qt = cast(q), kt = cast(k), vt = cast(v), dt = cast(dout), mt = cast(p.mask);
  AttentionMask<T> mask;
  if (!p.mask.empty()) mask = {mt.data(), p.H * p.Sq * p.Sk, p.Sq * p.Sk, p.Sk, 1};
  std::vector<T> out(ref.out.size()), lse(p.B * p.H * p.Sq), dq(q.size()), dk(k.size()),
      dv(v.size());
  scaled_dot_product_attention_forward<T>(qt.data(), kt.data(), vt.data(), mask, p.B, p.H, p.Sq,
                                          p.Sk, p.E, p.Ev, p.causal, p.scale, {}, out.data(),
                                          lse.data());
  scaled_dot_product_attention_backward<T>(dt.data(), qt.data(), kt.data(), vt.data(), mask,
                                           out.data(), lse.data(), p.B, p.H, p.Sq, p.Sk, p.E,
                                           p.Ev, p.causal, p.scale, {}, dq.data(), dk.data(),
                                           dv.data());
  auto close = [tol](const std::vector<T>& got, const std::vector<double>& want) {
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::abs(static_cast<double>(got[i]) - want[i]) > tol * (1 + std::abs(want[i]))) {
        FAIL_CHECK("element " << i << ": got " << got[i] << ", expected " << want[i]);
        return;
      }
    }
  };
  close(out, ref.out);
  close(dq, ref.dq);
  close(dk, ref.dk);
  close(dv, ref.dv);
}

}  // namespace

TEST_CASE("attention: known value with equal scores averages v") {
  // q . k_j equal for both keys -> P = (1/2, 1/2), out = mean of v rows, lse = s + log 2.
  const std::vector<double> q = {1, 0}, k = {2, 5, 2, -3}, v = {1, 10, 3, 20};
  std::vector<double> out(2), lse(1);
  scaled_dot_product_attention_forward<double>(q.data(), k.data(), v.data(), {}, 1, 1, 1, 2, 2, 2,
                                               false, 0.5, {}, out.data(), lse.data());
  CHECK(out[0] == doctest::Approx(2.0));
  CHECK(out[1] == doctest::Approx(15.0));
  CHECK(lse[0] == doctest::Approx(1.0 + std::log(2.0)));
  // Causal: query 0 sees only key 0.
  scaled_dot_product_attention_forward<double>(q.data(), k.data(), v.data(), {}, 1, 1, 1, 2, 2, 2,
                                               true, 0.5, {}, out.data(), lse.data());
  CHECK(out[0] == doctest::Approx(1.0));
  CHECK(out[1] == doctest::Approx(10.0));
  CHECK(lse[0] == doctest::Approx(1.0));
}

TEST_CASE("attention forward and backward match the full-matrix reference") {
  const double s5 = 1 / std::sqrt(5.0);
  SUBCASE("plain, odd sizes") { check_against_reference<double>({2, 3, 5, 7, 5, 3, false, s5, {}}, 1e-10); }
  SUBCASE("causal, Sq > Sk") { check_against_reference<double>({1, 2, 9, 4, 5, 6, true, s5, {}}, 1e-10); }
  SUBCASE("causal, Sq < Sk") { check_against_reference<double>({2, 1, 3, 8, 5, 2, true, 0.7, {}}, 1e-10); }
  // Tiles are 128 queries x 256 keys (kernels/cpu/attention.cpp): these cross both, with
  // partial last tiles (and rows padded to 16 lanes) in each direction.
  SUBCASE("several query and key tiles, causal") {
    check_against_reference<double>({1, 2, 300, 530, 5, 4, true, s5, {}}, 1e-10);
  }
  SUBCASE("several key tiles") { check_against_reference<double>({1, 1, 70, 600, 5, 4, false, s5, {}}, 1e-10); }
  SUBCASE("f32") { check_against_reference<float>({2, 2, 13, 137, 8, 8, false, 0.35, {}}, 2e-4); }
  SUBCASE("f32, several tiles, causal") { check_against_reference<float>({1, 1, 200, 270, 16, 8, true, 0.25, {}}, 2e-4); }
  SUBCASE("additive mask with fully masked rows") {
    Problem p{2, 2, 6, 5, 3, 4, false, 0.5, {}};
    p.mask = random_normal(p.B * p.H * p.Sq * p.Sk, 9);
    for (size_t i = 0; i < p.mask.size(); i += 3) p.mask[i] = -kInf;
    for (int64_t j = 0; j < p.Sk; ++j) p.mask[2 * p.Sk + j] = -kInf;  // (b0, h0) row 2
    check_against_reference<double>(p, 1e-10);
  }
}

TEST_CASE("attention: fully masked row gives zero output, -inf lse, no gradient") {
  const std::vector<double> q = random_normal(4, 1), k = random_normal(6, 2), v = random_normal(6, 3), dout = {1, 1};
  const std::vector<double> mask = {-kInf, -kInf, -kInf};
  const AttentionMask<double> m{mask.data(), 0, 0, 0, 1};
  std::vector<double> out(2), lse(1), dq(2), dk(6), dv(6);
  scaled_dot_product_attention_forward<double>(q.data(), k.data(), v.data(), m, 1, 1, 1, 3, 2, 2,
                                               false, 1.0, {}, out.data(), lse.data());
  CHECK(out[0] == 0.0);
  CHECK(out[1] == 0.0);
  CHECK(lse[0] == -kInf);
  scaled_dot_product_attention_backward<double>(dout.data(), q.data(), k.data(), v.data(), m,
                                                out.data(), lse.data(), 1, 1, 1, 3, 2, 2, false,
                                                1.0, {}, dq.data(), dk.data(), dv.data());
  for (double g : dq) CHECK(g == 0.0);
  for (double g : dk) CHECK(g == 0.0);
  for (double g : dv) CHECK(g == 0.0);
}

TEST_CASE("attention: a fully masked row of many keys is exactly zero in f64 and f32 (vectorised exp)") {
  // Enough keys that the row's exp runs in SIMD packets, where exp(-inf) need not be 0.
  auto run = [&]<class T>() {
    const int64_t Sk = 37, E = 8;
    std::vector<T> q(2 * E), k(Sk * E), v(Sk * E), mask(2 * Sk, T(0)), out(2 * E), lse(2);
    for (size_t i = 0; i < k.size(); ++i) k[i] = v[i] = static_cast<T>(0.01 * static_cast<double>(i % 17) + 0.5);
    for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<T>(0.1);
    for (int64_t j = 0; j < Sk; ++j) mask[j] = -std::numeric_limits<T>::infinity();  // row 0 sees nothing
    const AttentionMask<T> m{mask.data(), 0, 0, Sk, 1};
    scaled_dot_product_attention_forward<T>(q.data(), k.data(), v.data(), m, 1, 1, 2, Sk, E, E, false, 1.0, {},
                                            out.data(), lse.data());
    for (int64_t e = 0; e < E; ++e) CHECK(out[e] == T(0));
    CHECK(lse[0] == -std::numeric_limits<T>::infinity());
    CHECK(out[E] > T(0.5));  // row 1 attends normally
    CHECK(std::isfinite(lse[1]));
  };
  run.template operator()<double>();
  run.template operator()<float>();
}

TEST_CASE("attention backward matches finite differences") {
  const Problem p{1, 2, 3, 4, 3, 2, true, 0.6, {}};
  const auto q = random_normal(p.B * p.H * p.Sq * p.E, 5), k = random_normal(p.B * p.H * p.Sk * p.E, 6),
             v = random_normal(p.B * p.H * p.Sk * p.Ev, 7), r = random_normal(p.B * p.H * p.Sq * p.Ev, 8);
  auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk,
                  const std::vector<double>& vv) {
    std::vector<double> out(r.size()), lse(p.B * p.H * p.Sq);
    scaled_dot_product_attention_forward<double>(qq.data(), kk.data(), vv.data(), {}, p.B, p.H,
                                                 p.Sq, p.Sk, p.E, p.Ev, p.causal, p.scale, {},
                                                 out.data(), lse.data());
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += r[i] * out[i];
    return s;
  };
  std::vector<double> out(r.size()), lse(p.B * p.H * p.Sq), dq(q.size()), dk(k.size()),
      dv(v.size());
  scaled_dot_product_attention_forward<double>(q.data(), k.data(), v.data(), {}, p.B, p.H, p.Sq,
                                               p.Sk, p.E, p.Ev, p.causal, p.scale, {}, out.data(),
                                               lse.data());
  scaled_dot_product_attention_backward<double>(r.data(), q.data(), k.data(), v.data(), {},
                                                out.data(), lse.data(), p.B, p.H, p.Sq, p.Sk, p.E,
                                                p.Ev, p.causal, p.scale, {}, dq.data(), dk.data(),
                                                dv.data());
  const double h = 1e-6;
  auto numeric = [&](std::vector<double> x, int which, size_t i) {
    auto eval = [&](const std::vector<double>& xx) {
      return which == 0 ? loss(xx, k, v) : which == 1 ? loss(q, xx, v) : loss(q, k, xx);
    };
    x[i] += h;
    const double up = eval(x);
    x[i] -= 2 * h;
    return (up - eval(x)) / (2 * h);
  };
  for (size_t i = 0; i < q.size(); ++i) CHECK(dq[i] == doctest::Approx(numeric(q, 0, i)).epsilon(1e-6));
  for (size_t i = 0; i < k.size(); ++i) CHECK(dk[i] == doctest::Approx(numeric(k, 1, i)).epsilon(1e-6));
  for (size_t i = 0; i < v.size(); ++i) CHECK(dv[i] == doctest::Approx(numeric(v, 2, i)).epsilon(1e-6));
}

namespace {

// Dense [B, H, S, X] data scattered into heads-inner rows [B, S, H, X + pad] (pad spare
// elements after each row, filled with NaN so a read of them shows), and gathered back.
struct HeadsInner {
  int64_t B, H, S, X, pad;
  AttentionRows rows() const { return {S * H * (X + pad), X + pad, H * (X + pad)}; }
  size_t size() const { return static_cast<size_t>(B * S * H * (X + pad)); }
  int64_t at(int64_t b, int64_t h, int64_t i) const { return b * S * H * (X + pad) + (i * H + h) * (X + pad); }
  template <class T>
  std::vector<T> scatter(const std::vector<T>& dense) const {
    std::vector<T> out(size(), std::numeric_limits<T>::quiet_NaN());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < S; ++i)
          for (int64_t x = 0; x < X; ++x) out[at(b, h, i) + x] = dense[((b * H + h) * S + i) * X + x];
    return out;
  }
  template <class T>
  std::vector<T> gather(const std::vector<T>& strided) const {
    std::vector<T> out(B * H * S * X);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < S; ++i)
          for (int64_t x = 0; x < X; ++x) out[((b * H + h) * S + i) * X + x] = strided[at(b, h, i) + x];
    return out;
  }
};

// The kernels on heads-inner, padded operands give bit for bit what they give on dense ones
// (same GEMMs and row loops, only other leading dims), under `threads` OpenMP threads.
template <class T>
void check_strided_equals_dense(const Problem& p, int threads) {
  const nd::testing::OmpThreads scoped(threads);
  auto cast = [](const std::vector<double>& a) { return std::vector<T>(a.begin(), a.end()); };
  const auto q = cast(random_normal(p.B * p.H * p.Sq * p.E, 11)), k = cast(random_normal(p.B * p.H * p.Sk * p.E, 12)),
             v = cast(random_normal(p.B * p.H * p.Sk * p.Ev, 13)), dout = cast(random_normal(p.B * p.H * p.Sq * p.Ev, 14));
  std::vector<T> out(dout.size()), lse(p.B * p.H * p.Sq), dq(q.size()), dk(k.size()), dv(v.size());
  scaled_dot_product_attention_forward<T>(q.data(), k.data(), v.data(), {}, p.B, p.H, p.Sq, p.Sk, p.E, p.Ev,
                                          p.causal, p.scale, {}, out.data(), lse.data());
  scaled_dot_product_attention_backward<T>(dout.data(), q.data(), k.data(), v.data(), {}, out.data(), lse.data(),
                                           p.B, p.H, p.Sq, p.Sk, p.E, p.Ev, p.causal, p.scale, {}, dq.data(), dk.data(),
                                           dv.data());

  const HeadsInner lq{p.B, p.H, p.Sq, p.E, 3}, lk{p.B, p.H, p.Sk, p.E, 1}, lv{p.B, p.H, p.Sk, p.Ev, 2},
      lo{p.B, p.H, p.Sq, p.Ev, 0}, ldo{p.B, p.H, p.Sq, p.Ev, 5};
  const AttentionLayout layout{lq.rows(), lk.rows(), lv.rows(), lo.rows(), ldo.rows(), lq.rows(), lk.rows(), lv.rows()};
  const auto qs = lq.scatter(q), ks = lk.scatter(k), vs = lv.scatter(v), dos = ldo.scatter(dout);
  std::vector<T> outs(lo.size()), lses(lse.size()), dqs(lq.size()), dks(lk.size()), dvs(lv.size());
  scaled_dot_product_attention_forward<T>(qs.data(), ks.data(), vs.data(), {}, layout, p.B, p.H, p.Sq, p.Sk, p.E,
                                          p.Ev, p.causal, p.scale, {}, outs.data(), lses.data());
  scaled_dot_product_attention_backward<T>(dos.data(), qs.data(), ks.data(), vs.data(), {}, outs.data(), lses.data(),
                                           layout, p.B, p.H, p.Sq, p.Sk, p.E, p.Ev, p.causal, p.scale, {}, dqs.data(),
                                           dks.data(), dvs.data());
  CHECK(lo.gather(outs) == out);
  CHECK(lses == lse);
  CHECK(lq.gather(dqs) == dq);
  CHECK(lk.gather(dks) == dk);
  CHECK(lv.gather(dvs) == dv);
}

}  // namespace

TEST_CASE("attention: strided (heads-inner, padded) operands give the dense results bit for bit") {
  const double s5 = 1 / std::sqrt(5.0);
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    // B*H = 6 >= threads: a thread owns a head in the backward.
    check_strided_equals_dense<double>({2, 3, 5, 7, 5, 3, false, s5, {}}, threads);
    check_strided_equals_dense<float>({2, 3, 13, 50, 16, 16, false, 0.25, {}}, threads);
    // B*H = 1 < threads (from 2): key tiles split, dq summed from per-thread copies.
    check_strided_equals_dense<double>({1, 1, 70, 300, 5, 4, true, s5, {}}, threads);
    check_strided_equals_dense<float>({1, 2, 9, 4, 5, 6, true, s5, {}}, threads);
  }
}
