// Loss kernels against naive formulas, finite differences and known values.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "numeric.h"
#include "kernels/cpu/loss.h"

namespace {

using namespace nd::kernels::cpu;
using nd::testing::numeric_grad;
using nd::testing::random_normal;
using R = LossReduction;

std::vector<double> uniform(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(0.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Reduces per-sample losses by hand, to compare with the kernels' reductions.
double reduce(const std::vector<double>& l, R reduction, double denominator) {
  double s = 0;
  for (double v : l) s += v;
  return reduction == R::Mean ? s / denominator : s;
}

// L = sum(r * out) for None, r[0] * out for Mean/Sum; r is the incoming gradient.
double weighted(const std::vector<double>& out, const std::vector<double>& r) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += r[i] * out[i];
  return s;
}

}  // namespace

TEST_CASE("mse_loss: known values, reductions, gradients") {
  const std::vector<double> x = {1, 2, 3}, t = {0, 2, 5};
  std::vector<double> out(3);
  mse_loss_forward<double>(x.data(), t.data(), 3, R::None, out.data());
  CHECK(out == std::vector<double>{1, 0, 4});
  mse_loss_forward<double>(x.data(), t.data(), 3, R::Sum, out.data());
  CHECK(out[0] == 5.0);
  mse_loss_forward<double>(x.data(), t.data(), 3, R::Mean, out.data());
  CHECK(out[0] == doctest::Approx(5.0 / 3));
  const double g = 1.0;
  std::vector<double> dx(3), dt(3);
  mse_loss_backward<double>(&g, x.data(), t.data(), 3, R::Mean, dx.data(), dt.data());
  CHECK(dx[0] == doctest::Approx(2.0 / 3));
  CHECK(dx[2] == doctest::Approx(-4.0 / 3));
  CHECK(dt[2] == doctest::Approx(4.0 / 3));

  const int64_t n = 17;
  const auto xr = random_normal(n, 1), tr = random_normal(n, 2);
  for (R red : {R::None, R::Mean, R::Sum}) {
    const auto r = random_normal(red == R::None ? n : 1, 3);
    auto loss = [&](const std::vector<double>& a, const std::vector<double>& b) {
      std::vector<double> o(red == R::None ? n : 1);
      mse_loss_forward<double>(a.data(), b.data(), n, red, o.data());
      return weighted(o, r);
    };
    std::vector<double> gx(n), gt(n);
    mse_loss_backward<double>(r.data(), xr.data(), tr.data(), n, red, gx.data(), gt.data());
    const auto ngx = numeric_grad(xr, [&](const auto& v) { return loss(v, tr); });
    const auto ngt = numeric_grad(tr, [&](const auto& v) { return loss(xr, v); });
    for (int64_t i = 0; i < n; ++i) {
      CHECK(gx[i] == doctest::Approx(ngx[i]).epsilon(1e-6));
      CHECK(gt[i] == doctest::Approx(ngt[i]).epsilon(1e-6));
    }
  }
}

TEST_CASE("binary_cross_entropy_with_logits: known values and no overflow") {
  // x = 1, t = 1 with pos_weight 3: 3 log(1 + e^-1); x = -2, t = 0: log(1 + e^-2).
  const std::vector<double> x = {1, -2}, t = {1, 0}, pw = {3};
  std::vector<double> out(2);
  binary_cross_entropy_with_logits_forward<double>(x.data(), t.data(), nullptr, pw.data(), 2, 1,
                                                   R::None, out.data());
  CHECK(out[0] == doctest::Approx(3 * std::log1p(std::exp(-1.0))));
  CHECK(out[1] == doctest::Approx(std::log1p(std::exp(-2.0))));
  binary_cross_entropy_with_logits_forward<double>(x.data(), t.data(), nullptr, nullptr, 2, 1,
                                                   R::Mean, out.data());
  CHECK(out[0] == doctest::Approx((std::log1p(std::exp(-1.0)) + std::log1p(std::exp(-2.0))) / 2));
  const std::vector<float> big = {100.f, -100.f, 0.f}, tb = {0.f, 1.f, 1.f};
  std::vector<float> ob(3);
  binary_cross_entropy_with_logits_forward<float>(big.data(), tb.data(), nullptr, nullptr, 3, 3,
                                                  R::None, ob.data());
  CHECK(ob[0] == doctest::Approx(100.0));
  CHECK(ob[1] == doctest::Approx(100.0));
  CHECK(ob[2] == doctest::Approx(std::log(2.0)));
}

TEST_CASE("binary_cross_entropy_with_logits matches the naive formula and finite differences") {
  const int64_t C = 3, n = 5 * C;
  const auto x = random_normal(n, 1, 3.0), t = uniform(n, 2), w = uniform(n, 3), pw = uniform(C, 4);
  for (bool with_pw : {false, true}) {
    for (R red : {R::None, R::Mean, R::Sum}) {
      CAPTURE(with_pw);
      CAPTURE(static_cast<int>(red));
      const double* pwp = with_pw ? pw.data() : nullptr;
      auto naive = [&](const std::vector<double>& a, const std::vector<double>& b) {
        std::vector<double> l(n);
        for (int64_t i = 0; i < n; ++i) {
          const double s = 1 / (1 + std::exp(-a[i]));
          const double p = with_pw ? pw[i % C] : 1.0;
          l[i] = -w[i] * (p * b[i] * std::log(s) + (1 - b[i]) * std::log(1 - s));
        }
        return l;
      };
      const auto r = random_normal(red == R::None ? n : 1, 5);
      auto loss = [&](const std::vector<double>& a, const std::vector<double>& b) {
        std::vector<double> o(red == R::None ? n : 1);
        binary_cross_entropy_with_logits_forward<double>(a.data(), b.data(), w.data(), pwp, n, C,
                                                         red, o.data());
        return o;
      };
      const auto out = loss(x, t), ref = naive(x, t);
      if (red == R::None) {
        for (int64_t i = 0; i < n; ++i) CHECK(out[i] == doctest::Approx(ref[i]).epsilon(1e-10));
      } else {
        CHECK(out[0] == doctest::Approx(reduce(ref, red, n)).epsilon(1e-10));
      }
      std::vector<double> gx(n), gt(n);
      binary_cross_entropy_with_logits_backward<double>(r.data(), x.data(), t.data(), w.data(),
                                                        pwp, n, C, red, gx.data(), gt.data());
      const auto ngx = numeric_grad(x, [&](const auto& v) { return weighted(loss(v, t), r); });
      const auto ngt = numeric_grad(t, [&](const auto& v) { return weighted(loss(x, v), r); });
      for (int64_t i = 0; i < n; ++i) {
        CHECK(gx[i] == doctest::Approx(ngx[i]).epsilon(1e-6));
        CHECK(gt[i] == doctest::Approx(ngt[i]).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("cross_entropy: known values") {
  // logits (0, ln 2): p = (1/3, 2/3). Target 0: log 3. With label_smoothing 0.2:
  // 0.8 log 3 + 0.1 (log 3 + log 1.5).
  const std::vector<double> x = {0, std::log(2.0)};
  const std::vector<int64_t> y = {0};
  double out = 0, lse = 0;
  CHECK(cross_entropy_forward<double>(x.data(), y.data(), nullptr, 1, 2, -100, 0.0, R::Mean, &out,
                                      &lse) == -1);
  CHECK(out == doctest::Approx(std::log(3.0)));
  CHECK(lse == doctest::Approx(std::log(3.0)));
  cross_entropy_forward<double>(x.data(), y.data(), nullptr, 1, 2, -100, 0.2, R::Mean, &out, &lse);
  CHECK(out == doctest::Approx(0.9 * std::log(3.0) + 0.1 * std::log(1.5)));
  const double g = 1.0;
  std::vector<double> dx(2);
  cross_entropy_backward<double>(&g, x.data(), y.data(), nullptr, &lse, 1, 2, -100, 0.0, R::Mean,
                                 dx.data());
  CHECK(dx[0] == doctest::Approx(1.0 / 3 - 1));
  CHECK(dx[1] == doctest::Approx(2.0 / 3));
  // Bad targets are reported by position; ignore_index is not bad.
  const std::vector<int64_t> bad = {1, -100, 2}, xs = {0, 0, 0};
  std::vector<double> x3(6, 0.0), o3(3), l3(3);
  CHECK(cross_entropy_forward<double>(x3.data(), bad.data(), nullptr, 3, 2, -100, 0.0, R::None,
                                      o3.data(), l3.data()) == 2);
  // All targets ignored: mean is 0/0 = NaN, as in PyTorch.
  const std::vector<int64_t> ignored = {-100, -100};
  cross_entropy_forward<double>(x3.data(), ignored.data(), nullptr, 2, 2, -100, 0.0, R::Mean,
                                o3.data(), l3.data());
  CHECK(std::isnan(o3[0]));
}

TEST_CASE("cross_entropy matches naive smoothed-target formula and finite differences") {
  const int64_t N = 9, C = 5, ignore = 3;
  const auto x = random_normal(N * C, 1, 3.0), w = uniform(C, 2);
  std::vector<int64_t> y = {0, 4, 3, 2, 1, 3, 4, 0, 2};  // class 3 is ignore_index
  for (bool with_w : {false, true}) {
    for (double eps : {0.0, 0.25}) {
      for (R red : {R::None, R::Mean, R::Sum}) {
        CAPTURE(with_w);
        CAPTURE(eps);
        CAPTURE(static_cast<int>(red));
        const double* wp = with_w ? w.data() : nullptr;
        // Naive: l_i = -sum_c w_c q_ic log_softmax(x_i)_c, q = (1 - eps) onehot + eps / C;
        // Mean divides by sum of w_y over kept samples.
        std::vector<double> ref(N, 0.0);
        double denominator = 0;
        for (int64_t i = 0; i < N; ++i) {
          if (y[i] == ignore) continue;
          double z = 0;
          for (int64_t c = 0; c < C; ++c) z += std::exp(x[i * C + c]);
          for (int64_t c = 0; c < C; ++c) {
            const double q = (1 - eps) * (c == y[i]) + eps / C;
            ref[i] -= (with_w ? w[c] : 1.0) * q * (x[i * C + c] - std::log(z));
          }
          denominator += with_w ? w[y[i]] : 1.0;
        }
        const auto r = random_normal(red == R::None ? N : 1, 5);
        auto loss = [&](const std::vector<double>& a) {
          std::vector<double> o(red == R::None ? N : 1), l(N);
          CHECK(cross_entropy_forward<double>(a.data(), y.data(), wp, N, C, ignore, eps, red,
                                              o.data(), l.data()) == -1);
          return o;
        };
        const auto out = loss(x);
        if (red == R::None) {
          for (int64_t i = 0; i < N; ++i) CHECK(out[i] == doctest::Approx(ref[i]).epsilon(1e-10));
        } else {
          CHECK(out[0] == doctest::Approx(reduce(ref, red, denominator)).epsilon(1e-10));
        }
        std::vector<double> o(red == R::None ? N : 1), lse(N), dx(N * C);
        cross_entropy_forward<double>(x.data(), y.data(), wp, N, C, ignore, eps, red, o.data(),
                                      lse.data());
        cross_entropy_backward<double>(r.data(), x.data(), y.data(), wp, lse.data(), N, C, ignore,
                                       eps, red, dx.data());
        const auto ndx = numeric_grad(x, [&](const auto& v) { return weighted(loss(v), r); });
        for (int64_t i = 0; i < N * C; ++i) CHECK(dx[i] == doctest::Approx(ndx[i]).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("cross_entropy f32 with large logits stays finite") {
  const std::vector<float> x = {1000.f, 0.f, -1000.f, 500.f};
  const std::vector<int64_t> y = {1, 0};
  std::vector<float> out(2), lse(2), dx(4);
  cross_entropy_forward<float>(x.data(), y.data(), nullptr, 2, 2, -100, 0.0, R::None, out.data(),
                               lse.data());
  CHECK(out[0] == doctest::Approx(1000.0));
  CHECK(out[1] == doctest::Approx(1500.0));
  const std::vector<float> g = {1.f, 1.f};
  cross_entropy_backward<float>(g.data(), x.data(), y.data(), nullptr, lse.data(), 2, 2, -100, 0.0,
                                R::None, dx.data());
  CHECK(dx[0] == doctest::Approx(1.0));
  CHECK(dx[1] == doctest::Approx(-1.0));
  CHECK(dx[2] == doctest::Approx(-1.0));
  CHECK(dx[3] == doctest::Approx(1.0));
}
