// Dropout kernels: the mask is the counter RNG's, scaling is 1/(1-p), backward reuses it.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kernels/common/counter_rng.h"
#include "kernels/cpu/dropout.h"

using namespace nd::kernels::cpu;
using nd::kernels::counter_uniform;

TEST_CASE("dropout forward: mask from counter_uniform(seed, offset + i) < p, scale 1/(1-p)") {
  const int64_t n = 1001;
  const double p = 0.3;
  const uint64_t seed = 42, offset = 17;
  std::vector<double> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) x[i] = 0.5 + static_cast<double>(i);
  dropout_forward<double>(x.data(), n, p, seed, offset, y.data());
  int64_t dropped = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool drop = counter_uniform(seed, offset + i) < p;
    dropped += drop;
    CHECK(y[i] == (drop ? 0.0 : doctest::Approx(x[i] / 0.7)));
  }
  // Binomial(1001, 0.3): mean 300, sd 14.5.
  CHECK(dropped > 300 - 75);
  CHECK(dropped < 300 + 75);
}

TEST_CASE("dropout backward regenerates the same mask, also in place") {
  const int64_t n = 257;
  const double p = 0.5;
  std::vector<float> x(n, 1.0f), y(n), dy(n), dx(n);
  for (int64_t i = 0; i < n; ++i) dy[i] = static_cast<float>(i % 7) - 3.0f;
  dropout_forward<float>(x.data(), n, p, 7, 1000, y.data());
  dropout_backward<float>(dy.data(), n, p, 7, 1000, dx.data());
  for (int64_t i = 0; i < n; ++i) {
    // y = x * keep / (1 - p) = keep * 2, so dx = dy * y / x.
    CHECK(dx[i] == dy[i] * y[i]);
  }
  dropout_backward<float>(dy.data(), n, p, 7, 1000, dy.data());
  for (int64_t i = 0; i < n; ++i) CHECK(dy[i] == dx[i]);
}

TEST_CASE("dropout edge probabilities and offsets") {
  const int64_t n = 64;
  std::vector<double> x(n, 3.0), y(n), z(n);
  dropout_forward<double>(x.data(), n, 0.0, 1, 0, y.data());
  for (double v : y) CHECK(v == 3.0);
  dropout_forward<double>(x.data(), n, 1.0, 1, 0, y.data());
  for (double v : y) CHECK(v == 0.0);
  // Element i of the stream at offset 0 is element i - 10 of the stream at offset 10.
  std::vector<double> a(n + 10, 1.0), ya(n + 10);
  dropout_forward<double>(a.data(), n + 10, 0.5, 9, 0, ya.data());
  dropout_forward<double>(x.data(), n, 0.5, 9, 10, z.data());
  for (int64_t i = 0; i < n; ++i) CHECK((ya[i + 10] == 0.0) == (z[i] == 0.0));
}
