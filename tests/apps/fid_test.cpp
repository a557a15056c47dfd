// app::frechet_distance (apps/common/fid.cpp), the FID that train_gan --eval reports,
// against closed forms that need no matrix square root: with S the (unbiased) covariance
// of a set A and m its mean,
//   d(A, A) = 0,   d(A, A + c) = |c|^2,   d(A, 2A) = |m|^2 + tr(S)
// (for B = 2A: mean 2m, covariance 4S, tr((S 4S)^1/2) = 2 tr S, so
//  |m - 2m|^2 + tr S + 4 tr S - 2 * 2 tr S). tr S is summed from the column variances
// here, independently of the code under test.
#include "common/fid.h"

#include <cmath>

#include "harness.h"

using namespace nd;

namespace {

// A [N, D] set with correlated columns and a non-zero mean, in f64.
Tensor features(int64_t n, int64_t d, uint64_t seed) {
  Generator gen{seed, 0};
  const Tensor z = randn({n, d}, kFloat64, &gen);
  const Tensor mix = randn({d, d}, kFloat64, &gen) * 0.5;
  return matmul(z, mix) + z + 0.3;
}

double trace_of_covariance(const Tensor& a) {
  const auto v = testing::to_vector(a);
  const int64_t n = a.size(0), d = a.size(1);
  double tr = 0;
  for (int64_t j = 0; j < d; ++j) {
    double mean = 0, ss = 0;
    for (int64_t i = 0; i < n; ++i) mean += v[i * d + j];
    mean /= n;
    for (int64_t i = 0; i < n; ++i) ss += (v[i * d + j] - mean) * (v[i * d + j] - mean);
    tr += ss / (n - 1);
  }
  return tr;
}

double squared_norm_of_mean(const Tensor& a) {
  const auto m = testing::to_vector(a.mean({0}));
  double s = 0;
  for (double x : m) s += x * x;
  return s;
}

}  // namespace

TEST_CASE("frechet_distance: closed forms") {
  const Tensor a = features(300, 6, 1);
  const double tr = trace_of_covariance(a), m2 = squared_norm_of_mean(a);
  CHECK(std::abs(app::frechet_distance(a, a)) <= 1e-9 * tr);
  // A shifted copy: equal covariances, so only the mean term remains.
  const Tensor c = tensor({1.0, -2.0, 0.5, 0.0, 3.0, -1.5}, kFloat64);
  const double c2 = 1 + 4 + 0.25 + 0 + 9 + 2.25;
  CHECK(std::abs(app::frechet_distance(a, a + c) - c2) <= 1e-9 * (c2 + tr));
  // A scaled copy: the matrix square root term is 2 tr S.
  const double expected = m2 + tr;
  CHECK(std::abs(app::frechet_distance(a, a * 2.0) - expected) <= 1e-9 * expected);
  // Symmetric, and the same for f32 features (converted to f64 inside) up to f32 input rounding.
  const Tensor b = features(250, 6, 2);
  const double ab = app::frechet_distance(a, b);
  CHECK(ab > 0);
  CHECK(std::abs(app::frechet_distance(b, a) - ab) <= 1e-9 * ab);
  CHECK(std::abs(app::frechet_distance(a.to(kFloat32), b.to(kFloat32)) - ab) <= 1e-5 * ab);
}

TEST_CASE("frechet_distance: bad input names what was expected") {
  using testing::error_message;
  const std::string one_row = error_message([] { app::frechet_distance(ones({1, 3}), ones({5, 3})); });
  CHECK_MESSAGE(one_row.find("expected [N >= 2, D] features") != std::string::npos, one_row);
  const std::string sizes = error_message([] { app::frechet_distance(ones({4, 3}), ones({5, 2})); });
  CHECK_MESSAGE(sizes.find("feature sizes differ (3 vs 2)") != std::string::npos, sizes);
  const std::string flat = error_message([] { app::frechet_distance(ones({4}), ones({5, 2})); });
  CHECK_MESSAGE(flat.find("expected [N >= 2, D] features, got 1-d") != std::string::npos, flat);
}
