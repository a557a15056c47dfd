// Softmax / log-softmax kernels against naive formulas, finite differences and known values.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "numeric.h"
#include "kernels/cpu/softmax.h"

using namespace nd::kernels::cpu;
using nd::testing::numeric_grad;
using nd::testing::random_normal;

TEST_CASE("softmax: known values, large logits do not overflow") {
  // softmax(0, log 3) = (1/4, 3/4), also after shifting by 1000.
  const std::vector<double> x = {0.0, std::log(3.0), 1000.0, 1000.0 + std::log(3.0)};
  std::vector<double> y(4), ly(4);
  softmax_forward<double>(x.data(), 2, 2, y.data());
  log_softmax_forward<double>(x.data(), 2, 2, ly.data());
  CHECK(y[0] == doctest::Approx(0.25));
  CHECK(y[1] == doctest::Approx(0.75));
  CHECK(y[2] == doctest::Approx(0.25));
  CHECK(y[3] == doctest::Approx(0.75));
  CHECK(ly[2] == doctest::Approx(std::log(0.25)));
  CHECK(ly[3] == doctest::Approx(std::log(0.75)));
  std::vector<float> xf = {-1e4f, 0.0f, -std::numeric_limits<float>::infinity()}, yf(3);
  softmax_forward<float>(xf.data(), 1, 3, yf.data());
  CHECK(yf[0] == 0.0f);
  CHECK(yf[1] == 1.0f);
  CHECK(yf[2] == 0.0f);
}

TEST_CASE("softmax and log_softmax match naive formulas (f64, f32, in place)") {
  const int64_t M = 6, D = 11;
  const auto x = random_normal(M * D, 1, 4.0);
  std::vector<double> y(M * D), ly(M * D);
  softmax_forward<double>(x.data(), M, D, y.data());
  log_softmax_forward<double>(x.data(), M, D, ly.data());
  std::vector<float> xf(x.begin(), x.end()), yf(M * D);
  softmax_forward<float>(xf.data(), M, D, yf.data());
  auto inplace = x;
  log_softmax_forward<double>(inplace.data(), M, D, inplace.data());
  for (int64_t m = 0; m < M; ++m) {
    double z = 0;
    for (int64_t d = 0; d < D; ++d) z += std::exp(x[m * D + d]);
    for (int64_t d = 0; d < D; ++d) {
      const int64_t i = m * D + d;
      CHECK(y[i] == doctest::Approx(std::exp(x[i]) / z).epsilon(1e-12));
      CHECK(yf[i] == doctest::Approx(std::exp(x[i]) / z).epsilon(1e-5));
      CHECK(ly[i] == doctest::Approx(x[i] - std::log(z)).epsilon(1e-12));
      CHECK(inplace[i] == ly[i]);
    }
  }
}

TEST_CASE("softmax and log_softmax backward match finite differences") {
  const int64_t M = 4, D = 7;
  const auto x = random_normal(M * D, 2, 2.0), r = random_normal(M * D, 3);
  for (bool log : {false, true}) {
    CAPTURE(log);
    auto loss = [&](const std::vector<double>& xx) {
      std::vector<double> y(xx.size());
      if (log) log_softmax_forward<double>(xx.data(), M, D, y.data());
      else softmax_forward<double>(xx.data(), M, D, y.data());
      double s = 0;
      for (size_t i = 0; i < y.size(); ++i) s += r[i] * y[i];
      return s;
    };
    std::vector<double> y(M * D), dx(M * D);
    if (log) {
      log_softmax_forward<double>(x.data(), M, D, y.data());
      log_softmax_backward<double>(r.data(), y.data(), M, D, dx.data());
    } else {
      softmax_forward<double>(x.data(), M, D, y.data());
      softmax_backward<double>(r.data(), y.data(), M, D, dx.data());
    }
    const auto ndx = numeric_grad(x, loss);
    for (size_t i = 0; i < x.size(); ++i) CHECK(dx[i] == doctest::Approx(ndx[i]).epsilon(1e-6));
    auto inplace = r;  // dx may alias dy
    if (log) log_softmax_backward<double>(inplace.data(), y.data(), M, D, inplace.data());
    else softmax_backward<double>(inplace.data(), y.data(), M, D, inplace.data());
    for (size_t i = 0; i < x.size(); ++i) CHECK(inplace[i] == doctest::Approx(dx[i]));
  }
}

TEST_CASE("softmax backward: known value") {
  // y = (1/4, 3/4), dy = (1, 0): dot = 1/4, dx = (1/4 * 3/4, 3/4 * -1/4).
  const std::vector<double> y = {0.25, 0.75}, dy = {1.0, 0.0};
  std::vector<double> dx(2);
  softmax_backward<double>(dy.data(), y.data(), 1, 2, dx.data());
  CHECK(dx[0] == doctest::Approx(0.1875));
  CHECK(dx[1] == doctest::Approx(-0.1875));
}
