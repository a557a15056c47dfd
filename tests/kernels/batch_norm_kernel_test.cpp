// Batch norm kernels against two-pass statistics, finite differences and known values.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "numeric.h"
#include "kernels/cpu/batch_norm.h"

namespace {

using namespace nd::kernels::cpu;
using nd::testing::numeric_grad;
using nd::testing::random_normal;

struct Naive {
  std::vector<double> mean, var;  // two-pass, biased
};

Naive naive_stats(const std::vector<double>& x, int64_t N, int64_t C, int64_t S) {
  Naive r{std::vector<double>(C, 0.0), std::vector<double>(C, 0.0)};
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) r.mean[c] += x[(n * C + c) * S + s];
    r.mean[c] /= static_cast<double>(N * S);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) {
        const double d = x[(n * C + c) * S + s] - r.mean[c];
        r.var[c] += d * d;
      }
    r.var[c] /= static_cast<double>(N * S);
  }
  return r;
}

}  // namespace

TEST_CASE("batch_norm training forward: known values and running stats") {
  // One channel, x = 1, 2, 3, 4: mean 2.5, biased var 1.25, unbiased var 5/3.
  const std::vector<double> x = {1, 2, 3, 4};
  std::vector<double> y(4), mean(1), invstd(1), rm = {0.0}, rv = {1.0};
  batch_norm_forward_training<double>(x.data(), nullptr, nullptr, rm.data(), rv.data(), 4, 1, 1,
                                      0.1, 0.0, y.data(), mean.data(), invstd.data());
  CHECK(mean[0] == doctest::Approx(2.5));
  CHECK(invstd[0] == doctest::Approx(1.0 / std::sqrt(1.25)));
  CHECK(y[0] == doctest::Approx(-1.5 / std::sqrt(1.25)));
  CHECK(y[3] == doctest::Approx(1.5 / std::sqrt(1.25)));
  CHECK(rm[0] == doctest::Approx(0.25));
  CHECK(rv[0] == doctest::Approx(0.9 + 0.1 * 5.0 / 3.0));
}

TEST_CASE("batch_norm training forward matches two-pass statistics (f64 and f32)") {
  const int64_t N = 3, C = 5, S = 7;
  const auto x = random_normal(N * C * S, 1, 2.0, 3.0);
  const auto w = random_normal(C, 2), b = random_normal(C, 3);
  const Naive ref = naive_stats(x, N, C, S);
  const double eps = 1e-5, momentum = 0.3;

  std::vector<double> y(x.size()), mean(C), invstd(C), rm = random_normal(C, 4), rv(C, 0.5);
  const auto rm0 = rm, rv0 = rv;
  batch_norm_forward_training<double>(x.data(), w.data(), b.data(), rm.data(), rv.data(), N, C, S,
                                      momentum, eps, y.data(), mean.data(), invstd.data());
  std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), bf(b.begin(), b.end());
  std::vector<float> yf(x.size()), meanf(C), invstdf(C);
  batch_norm_forward_training<float>(xf.data(), wf.data(), bf.data(), nullptr, nullptr, N, C, S,
                                     momentum, eps, yf.data(), meanf.data(), invstdf.data());
  for (int64_t c = 0; c < C; ++c) {
    CHECK(mean[c] == doctest::Approx(ref.mean[c]).epsilon(1e-12));
    CHECK(invstd[c] == doctest::Approx(1.0 / std::sqrt(ref.var[c] + eps)).epsilon(1e-12));
    CHECK(rm[c] == doctest::Approx((1 - momentum) * rm0[c] + momentum * ref.mean[c]));
    const double unbiased = ref.var[c] * (N * S) / (N * S - 1.0);
    CHECK(rv[c] == doctest::Approx((1 - momentum) * rv0[c] + momentum * unbiased));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t i = (n * C + c) * S + s;
        const double expect = (x[i] - ref.mean[c]) / std::sqrt(ref.var[c] + eps) * w[c] + b[c];
        CHECK(y[i] == doctest::Approx(expect).epsilon(1e-12));
        CHECK(yf[i] == doctest::Approx(expect).epsilon(1e-5));
      }
  }
}

TEST_CASE("batch_norm statistics pieces combine across shards like one batch") {
  // What SyncBatchNorm does: per-shard sums, added, equal the whole batch's sums.
  const int64_t C = 4, S = 5, N1 = 2, N2 = 3;
  const auto x = random_normal((N1 + N2) * C * S, 7);
  std::vector<double> s_all(C), ss_all(C), s1(C), ss1(C), s2(C), ss2(C);
  batch_norm_channel_stats<double>(x.data(), N1 + N2, C, S, s_all.data(), ss_all.data());
  batch_norm_channel_stats<double>(x.data(), N1, C, S, s1.data(), ss1.data());
  batch_norm_channel_stats<double>(x.data() + N1 * C * S, N2, C, S, s2.data(), ss2.data());
  for (int64_t c = 0; c < C; ++c) {
    CHECK(s1[c] + s2[c] == doctest::Approx(s_all[c]));
    CHECK(ss1[c] + ss2[c] == doctest::Approx(ss_all[c]));
  }
  // Backward sums split the same way.
  const auto dy = random_normal(x.size(), 8);
  std::vector<double> mean(C), invstd(C), sd(C), sdx(C), sd1(C), sdx1(C), sd2(C), sdx2(C);
  batch_norm_stats_to_mean_invstd<double>(s_all.data(), ss_all.data(), (N1 + N2) * S, C, 1e-5,
                                          0.1, mean.data(), invstd.data(), nullptr, nullptr);
  batch_norm_backward_reduce<double>(dy.data(), x.data(), mean.data(), N1 + N2, C, S, sd.data(),
                                     sdx.data());
  batch_norm_backward_reduce<double>(dy.data(), x.data(), mean.data(), N1, C, S, sd1.data(),
                                     sdx1.data());
  batch_norm_backward_reduce<double>(dy.data() + N1 * C * S, x.data() + N1 * C * S, mean.data(),
                                     N2, C, S, sd2.data(), sdx2.data());
  for (int64_t c = 0; c < C; ++c) {
    CHECK(sd1[c] + sd2[c] == doctest::Approx(sd[c]));
    CHECK(sdx1[c] + sdx2[c] == doctest::Approx(sdx[c]));
  }
  // Each shard's dx from the global sums and count equals its slice of the whole batch's dx.
  const auto w = random_normal(C, 9);
  std::vector<double> dx(x.size()), dx2(N2 * C * S);
  batch_norm_backward<double>(dy.data(), x.data(), mean.data(), invstd.data(), w.data(), N1 + N2, C, S,
                              true, dx.data(), nullptr, nullptr);
  batch_norm_backward_elemt<double>(dy.data() + N1 * C * S, x.data() + N1 * C * S, mean.data(),
                                    invstd.data(), w.data(), sd.data(), sdx.data(), (N1 + N2) * S, N2,
                                    C, S, dx2.data());
  for (size_t i = 0; i < dx2.size(); ++i) {
    CHECK(dx2[i] == doctest::Approx(dx[N1 * C * S + i]).epsilon(1e-12));
  }
}

TEST_CASE("batch_norm backward (training) matches finite differences") {
  const int64_t N = 2, C = 3, S = 5;
  const double eps = 1e-5;
  const auto x = random_normal(N * C * S, 11), w = random_normal(C, 12), b = random_normal(C, 13), r = random_normal(N * C * S, 14);
  // Scalar objective L = sum(r * y); dL/dy = r.
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww,
                  const std::vector<double>& bb) {
    std::vector<double> y(xx.size()), m(C), is(C);
    batch_norm_forward_training<double>(xx.data(), ww.data(), bb.data(), nullptr, nullptr, N, C, S,
                                        0.1, eps, y.data(), m.data(), is.data());
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += r[i] * y[i];
    return s;
  };
  std::vector<double> y(x.size()), mean(C), invstd(C);
  batch_norm_forward_training<double>(x.data(), w.data(), b.data(), nullptr, nullptr, N, C, S, 0.1,
                                      eps, y.data(), mean.data(), invstd.data());
  std::vector<double> dx(x.size()), dw(C), db(C);
  batch_norm_backward<double>(r.data(), x.data(), mean.data(), invstd.data(), w.data(), N, C, S,
                              true, dx.data(), dw.data(), db.data());
  const auto ndx = numeric_grad(x, [&](const auto& v) { return loss(v, w, b); });
  const auto ndw = numeric_grad(w, [&](const auto& v) { return loss(x, v, b); });
  const auto ndb = numeric_grad(b, [&](const auto& v) { return loss(x, w, v); });
  for (size_t i = 0; i < x.size(); ++i) CHECK(dx[i] == doctest::Approx(ndx[i]).epsilon(1e-6));
  for (int64_t c = 0; c < C; ++c) {
    CHECK(dw[c] == doctest::Approx(ndw[c]).epsilon(1e-6));
    CHECK(db[c] == doctest::Approx(ndb[c]).epsilon(1e-6));
  }
  // Without affine parameters the input gradient is the weight = 1 case.
  std::vector<double> ones(C, 1.0), dx1(x.size()), dx_none(x.size());
  batch_norm_backward<double>(r.data(), x.data(), mean.data(), invstd.data(), ones.data(), N, C, S,
                              true, dx1.data(), nullptr, nullptr);
  batch_norm_backward<double>(r.data(), x.data(), mean.data(), invstd.data(), nullptr, N, C, S,
                              true, dx_none.data(), nullptr, nullptr);
  for (size_t i = 0; i < x.size(); ++i) CHECK(dx_none[i] == doctest::Approx(dx1[i]));
}

TEST_CASE("batch_norm eval forward and backward use running stats") {
  const int64_t N = 3, C = 2, S = 3;
  const double eps = 1e-3;
  const auto x = random_normal(N * C * S, 21), w = random_normal(C, 22), b = random_normal(C, 23), r = random_normal(N * C * S, 24);
  const std::vector<double> rm = {0.5, -1.0}, rv = {2.0, 0.25};
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    std::vector<double> y(xx.size());
    batch_norm_forward_eval<double>(xx.data(), rm.data(), rv.data(), ww.data(), b.data(), N, C, S,
                                    eps, y.data());
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += r[i] * y[i];
    return s;
  };
  std::vector<double> y(x.size());
  batch_norm_forward_eval<double>(x.data(), rm.data(), rv.data(), w.data(), b.data(), N, C, S, eps,
                                  y.data());
  CHECK(y[0] == doctest::Approx((x[0] - 0.5) / std::sqrt(2.0 + eps) * w[0] + b[0]));
  std::vector<double> invstd(C);
  batch_norm_invstd<double>(rv.data(), C, eps, invstd.data());
  CHECK(invstd[1] == doctest::Approx(1 / std::sqrt(0.25 + eps)));
  std::vector<double> dx(x.size()), dw(C), db(C);
  batch_norm_backward<double>(r.data(), x.data(), rm.data(), invstd.data(), w.data(), N, C, S,
                              false, dx.data(), dw.data(), db.data());
  const auto ndx = numeric_grad(x, [&](const auto& v) { return loss(v, w); });
  const auto ndw = numeric_grad(w, [&](const auto& v) { return loss(x, v); });
  for (size_t i = 0; i < x.size(); ++i) CHECK(dx[i] == doctest::Approx(ndx[i]).epsilon(1e-6));
  for (int64_t c = 0; c < C; ++c) CHECK(dw[c] == doctest::Approx(ndw[c]).epsilon(1e-6));
}

TEST_CASE("batch_norm f32 keeps precision when |mean| >> std") {
  const int64_t N = 16, C = 1, S = 9;
  const auto x = random_normal(N * S, 31, 0.01, 100.0);
  std::vector<float> xf(x.begin(), x.end()), yf(x.size()), m(1), is(1);
  std::vector<double> xd(xf.begin(), xf.end());  // the exact f32 inputs
  const Naive ref = naive_stats(xd, N, C, S);
  batch_norm_forward_training<float>(xf.data(), nullptr, nullptr, nullptr, nullptr, N, C, S, 0.1,
                                     1e-5, yf.data(), m.data(), is.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const double expect = (xd[i] - ref.mean[0]) / std::sqrt(ref.var[0] + 1e-5);
    CHECK(yf[i] == doctest::Approx(expect).epsilon(1e-2));
  }
}
