// Layer norm kernels against a naive two-pass reference, finite differences and known values.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/layer_norm.h"

namespace {

using namespace nd::kernels::cpu;

std::vector<double> randn(size_t n, unsigned seed, double scale = 1.0, double shift = 0.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(shift, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

template <typename F>
std::vector<double> numeric_grad(std::vector<double> x, F f, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = f(x);
    x[i] = saved - h;
    const double down = f(x);
    x[i] = saved;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

}  // namespace

TEST_CASE("layer_norm forward: known values") {
  // Row (1, 3): mean 2, var 1 -> (-1, 1) / sqrt(1 + eps); with weight (2, 3), bias (0, 1).
  const std::vector<double> x = {1, 3}, w = {2, 3}, b = {0, 1};
  std::vector<double> y(2), mean(1), rstd(1);
  layer_norm_forward<double>(x.data(), w.data(), b.data(), 1, 2, 0.0, y.data(), mean.data(),
                             rstd.data());
  CHECK(mean[0] == doctest::Approx(2.0));
  CHECK(rstd[0] == doctest::Approx(1.0));
  CHECK(y[0] == doctest::Approx(-2.0));
  CHECK(y[1] == doctest::Approx(4.0));
}

TEST_CASE("layer_norm forward matches a naive reference (f64 and f32, odd sizes)") {
  const int64_t M = 7, D = 13;
  const double eps = 1e-5;
  const auto x = randn(M * D, 1, 3.0, -2.0), w = randn(D, 2), b = randn(D, 3);
  std::vector<double> y(M * D), mean(M), rstd(M);
  layer_norm_forward<double>(x.data(), w.data(), b.data(), M, D, eps, y.data(), mean.data(),
                             rstd.data());
  std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), bf(b.begin(), b.end());
  std::vector<float> yf(M * D), meanf(M), rstdf(M);
  layer_norm_forward<float>(xf.data(), wf.data(), bf.data(), M, D, eps, yf.data(), meanf.data(),
                            rstdf.data());
  for (int64_t m = 0; m < M; ++m) {
    double mu = 0, var = 0;
    for (int64_t d = 0; d < D; ++d) mu += x[m * D + d] / D;
    for (int64_t d = 0; d < D; ++d) var += (x[m * D + d] - mu) * (x[m * D + d] - mu) / D;
    CHECK(mean[m] == doctest::Approx(mu).epsilon(1e-12));
    CHECK(rstd[m] == doctest::Approx(1 / std::sqrt(var + eps)).epsilon(1e-12));
    for (int64_t d = 0; d < D; ++d) {
      const double expect = (x[m * D + d] - mu) / std::sqrt(var + eps) * w[d] + b[d];
      CHECK(y[m * D + d] == doctest::Approx(expect).epsilon(1e-12));
      CHECK(yf[m * D + d] == doctest::Approx(expect).epsilon(1e-5));
    }
  }
}

TEST_CASE("layer_norm backward matches finite differences, with and without affine") {
  const int64_t M = 5, D = 9;
  const double eps = 1e-5;
  const auto x = randn(M * D, 11), w = randn(D, 12), b = randn(D, 13), r = randn(M * D, 14);
  for (bool affine : {true, false}) {
    CAPTURE(affine);
    auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww,
                    const std::vector<double>& bb) {
      std::vector<double> y(xx.size()), m(M), rs(M);
      layer_norm_forward<double>(xx.data(), affine ? ww.data() : nullptr,
                                 affine ? bb.data() : nullptr, M, D, eps, y.data(), m.data(),
                                 rs.data());
      double s = 0;
      for (size_t i = 0; i < y.size(); ++i) s += r[i] * y[i];
      return s;
    };
    std::vector<double> y(M * D), mean(M), rstd(M), dx(M * D), dw(D), db(D);
    layer_norm_forward<double>(x.data(), affine ? w.data() : nullptr, affine ? b.data() : nullptr,
                               M, D, eps, y.data(), mean.data(), rstd.data());
    layer_norm_backward<double>(r.data(), x.data(), mean.data(), rstd.data(),
                                affine ? w.data() : nullptr, M, D, dx.data(), dw.data(),
                                db.data());
    const auto ndx = numeric_grad(x, [&](const auto& v) { return loss(v, w, b); });
    for (size_t i = 0; i < x.size(); ++i) CHECK(dx[i] == doctest::Approx(ndx[i]).epsilon(1e-6));
    if (affine) {
      const auto ndw = numeric_grad(w, [&](const auto& v) { return loss(x, v, b); });
      const auto ndb = numeric_grad(b, [&](const auto& v) { return loss(x, w, v); });
      for (int64_t d = 0; d < D; ++d) {
        CHECK(dw[d] == doctest::Approx(ndw[d]).epsilon(1e-6));
        CHECK(db[d] == doctest::Approx(ndb[d]).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("layer_norm backward: dx may alias dy, null outputs are skipped") {
  const int64_t M = 3, D = 4;
  const auto x = randn(M * D, 5), w = randn(D, 6), dy = randn(M * D, 7);
  std::vector<double> y(M * D), mean(M), rstd(M), dx(M * D);
  layer_norm_forward<double>(x.data(), w.data(), nullptr, M, D, 1e-5, y.data(), mean.data(),
                             rstd.data());
  layer_norm_backward<double>(dy.data(), x.data(), mean.data(), rstd.data(), w.data(), M, D,
                              dx.data(), nullptr, nullptr);
  auto inplace = dy;
  layer_norm_backward<double>(inplace.data(), x.data(), mean.data(), rstd.data(), w.data(), M, D,
                              inplace.data(), nullptr, nullptr);
  for (size_t i = 0; i < dx.size(); ++i) CHECK(inplace[i] == doctest::Approx(dx[i]));
}
