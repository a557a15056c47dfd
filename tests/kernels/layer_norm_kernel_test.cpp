// Layer norm kernels against naive references (the sequential kernels), finite differences,
// known values, thread-count independence and rows with a large mean.
#include <doctest/doctest.h>

#include "omp_threads.h"

#include <cmath>
#include <random>
#include <vector>

#include "numeric.h"
#include "kernels/cpu/layer_norm.h"

using namespace nd::kernels::cpu;
using nd::testing::numeric_grad;
using nd::testing::random_normal;

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
  const auto x = random_normal(M * D, 1, 3.0, -2.0), w = random_normal(D, 2), b = random_normal(D, 3);
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
  const auto x = random_normal(M * D, 11), w = random_normal(D, 12), b = random_normal(D, 13), r = random_normal(M * D, 14);
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
  const auto x = random_normal(M * D, 5), w = random_normal(D, 6), dy = random_normal(M * D, 7);
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

namespace {

// Naive kernels: sequential sums (forward statistics in long double), column sums for the
// parameter gradients. The fast path must agree with it at rounding level.
template <typename T>
void naive_forward(const std::vector<T>& x, const T* w, const T* b, int64_t M, int64_t D,
                   double eps, std::vector<double>& y, std::vector<double>& mean,
                   std::vector<double>& rstd) {
  y.assign(x.size(), 0.0), mean.assign(M, 0.0), rstd.assign(M, 0.0);
  for (int64_t m = 0; m < M; ++m) {
    long double s = 0, ss = 0;
    for (int64_t d = 0; d < D; ++d) s += x[m * D + d];
    const long double mu = s / D;
    for (int64_t d = 0; d < D; ++d) ss += (x[m * D + d] - mu) * (x[m * D + d] - mu);
    const long double r = 1 / std::sqrt(ss / D + eps);
    for (int64_t d = 0; d < D; ++d) {
      const long double xhat = (x[m * D + d] - mu) * r;
      y[m * D + d] = static_cast<double>(xhat * (w ? w[d] : T(1)) + (b ? b[d] : T(0)));
    }
    mean[m] = static_cast<double>(mu), rstd[m] = static_cast<double>(r);
  }
}

template <typename T>
void naive_backward(const std::vector<T>& dy, const std::vector<T>& x, const std::vector<T>& mean,
                    const std::vector<T>& rstd, const T* w, int64_t M, int64_t D,
                    std::vector<double>& dx, std::vector<double>& dw, std::vector<double>& db) {
  dx.assign(x.size(), 0.0), dw.assign(D, 0.0), db.assign(D, 0.0);
  for (int64_t m = 0; m < M; ++m) {
    const double mu = mean[m], r = rstd[m];
    double sg = 0, sgx = 0;
    for (int64_t d = 0; d < D; ++d) {
      const double g = double(dy[m * D + d]) * (w ? w[d] : T(1)), xhat = (x[m * D + d] - mu) * r;
      sg += g, sgx += g * xhat;
      dw[d] += dy[m * D + d] * xhat, db[d] += dy[m * D + d];
    }
    for (int64_t d = 0; d < D; ++d) {
      const double g = double(dy[m * D + d]) * (w ? w[d] : T(1)), xhat = (x[m * D + d] - mu) * r;
      dx[m * D + d] = r * (g - sg / D - xhat * sgx / D);
    }
  }
}

template <typename T>
void check_near(const std::vector<T>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(double(got[i]) - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

template <typename T>
std::vector<T> as(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// Forward and backward against the naive kernels, every output, with and without affine.
template <typename T>
void check_against_naive(int64_t M, int64_t D, double tol) {
  CAPTURE(M);
  CAPTURE(D);
  const double eps = 1e-5;
  const auto x = as<T>(random_normal(M * D, 21, 2.0, 0.5)), dy = as<T>(random_normal(M * D, 22));
  const auto w = as<T>(random_normal(D, 23)), b = as<T>(random_normal(D, 24));
  for (bool affine : {true, false}) {
    CAPTURE(affine);
    const T* wp = affine ? w.data() : nullptr;
    std::vector<T> y(M * D), mean(M), rstd(M);
    layer_norm_forward<T>(x.data(), wp, affine ? b.data() : nullptr, M, D, eps, y.data(),
                          mean.data(), rstd.data());
    std::vector<double> ey, emean, erstd;
    naive_forward<T>(x, wp, affine ? b.data() : nullptr, M, D, eps, ey, emean, erstd);
    check_near(y, ey, tol);
    check_near(mean, emean, tol);
    check_near(rstd, erstd, tol);

    std::vector<T> dx(M * D, T(-99)), dw(D, T(-99)), db(D, T(-99));
    layer_norm_backward<T>(dy.data(), x.data(), mean.data(), rstd.data(), wp, M, D, dx.data(),
                           dw.data(), db.data());
    std::vector<double> edx, edw, edb;
    naive_backward<T>(dy, x, mean, rstd, wp, M, D, edx, edw, edb);
    check_near(dx, edx, tol);
    // Column sums over M rows: their rounding grows with M.
    check_near(dw, edw, tol * (1 + M / 64.0));
    check_near(db, edb, tol * (1 + M / 64.0));

    // Each output alone, and dx in place over dy, gives the same values.
    std::vector<T> dx_only(M * D), dw_only(D), inplace = dy;
    layer_norm_backward<T>(dy.data(), x.data(), mean.data(), rstd.data(), wp, M, D,
                           dx_only.data(), nullptr, nullptr);
    layer_norm_backward<T>(dy.data(), x.data(), mean.data(), rstd.data(), wp, M, D, nullptr,
                           dw_only.data(), nullptr);
    layer_norm_backward<T>(inplace.data(), x.data(), mean.data(), rstd.data(), wp, M, D,
                           inplace.data(), nullptr, nullptr);
    CHECK(dx_only == dx);
    CHECK(inplace == dx);
    CHECK(dw_only == dw);
  }
}

}  // namespace

TEST_CASE("layer_norm forward and backward match the naive kernels (edge and large sizes)") {
  // D below, at and above the 8-lane width; M = 0, 1, odd, and past the 64K-element parallel
  // threshold and many dweight chunks (2000 x 64).
  for (int64_t D : {1, 3, 8, 13, 32, 64, 65}) {
    for (int64_t M : {0, 1, 7, 130}) {
      check_against_naive<double>(M, D, 1e-12);
      check_against_naive<float>(M, D, 2e-6);
    }
  }
  check_against_naive<double>(2000, 64, 1e-12);
  check_against_naive<float>(2000, 64, 2e-6);
  check_against_naive<float>(6400, 32, 2e-6);
}

TEST_CASE("layer_norm: results do not depend on the number of threads") {
  for (auto [M, D] : {std::pair<int64_t, int64_t>{1500, 64}, {6400, 32}, {301, 257}}) {
    CAPTURE(M);
    CAPTURE(D);
    const auto x = as<float>(random_normal(M * D, 31)), dy = as<float>(random_normal(M * D, 32));
    const auto w = as<float>(random_normal(D, 33)), b = as<float>(random_normal(D, 34));
    std::vector<float> y1, dx1, dw1, db1;
    nd::testing::OmpThreads scoped(1);
    for (int threads : {1, 2, 3, 7}) {
      CAPTURE(threads);
      scoped.set(threads);
      std::vector<float> y(M * D), mean(M), rstd(M), dx(M * D), dw(D), db(D);
      layer_norm_forward<float>(x.data(), w.data(), b.data(), M, D, 1e-5, y.data(), mean.data(),
                                rstd.data());
      layer_norm_backward<float>(dy.data(), x.data(), mean.data(), rstd.data(), w.data(), M, D,
                                 dx.data(), dw.data(), db.data());
      if (threads == 1) {
        y1 = y, dx1 = dx, dw1 = dw, db1 = db;
      } else {
        CHECK(y == y1);
        CHECK(dx == dx1);
        CHECK(dw == dw1);
        CHECK(db == db1);
      }
    }
  }
}

TEST_CASE("layer_norm f32: rows with |mean| >> std keep float accuracy") {
  // mean 1e4, std 1e-2: a one-pass E[x^2] - E[x]^2, even in double, cancels 12 digits here
  // (relative error ~1e-3 in var); two passes stay at float rounding.
  const int64_t M = 4, D = 64;
  const auto x = as<float>(random_normal(M * D, 41, 1e-2, 1e4));
  std::vector<float> y(M * D), mean(M), rstd(M);
  layer_norm_forward<float>(x.data(), nullptr, nullptr, M, D, 0.0, y.data(), mean.data(),
                            rstd.data());
  std::vector<double> ey, emean, erstd;
  naive_forward<float>(x, nullptr, nullptr, M, D, 0.0, ey, emean, erstd);
  check_near(rstd, erstd, 1e-6);
  check_near(y, ey, 2e-6);
}

TEST_CASE("layer_norm backward with no rows writes zero parameter gradients") {
  std::vector<float> dw(5, -1.f), db(5, -1.f);
  layer_norm_backward<float>(nullptr, nullptr, nullptr, nullptr, nullptr, 0, 5, nullptr,
                             dw.data(), db.data());
  CHECK(dw == std::vector<float>(5, 0.f));
  CHECK(db == std::vector<float>(5, 0.f));
}
