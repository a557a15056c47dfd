#pragma once
// The kernel tests' numeric helpers, without the engine (tests/harness.h includes this for
// the tests that have it): seeded normal draws and central differences.
#include <cstddef>
#include <random>
#include <vector>

namespace nd::testing {

// n draws from N(shift, scale^2) by std::mt19937(seed): the same values on every run.
inline std::vector<double> random_normal(size_t n, unsigned seed, double scale = 1.0, double shift = 0.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(shift, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// d f / d x_i ~ (f(x + h e_i) - f(x - h e_i)) / 2h for every i: the gradient a backward
// kernel is checked against. f takes the whole vector and returns a scalar.
template <class F>
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

}  // namespace nd::testing
