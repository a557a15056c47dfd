// Gradients at kinks and ties equal PyTorch's, one table row per op (golden values from
// tests/golden/make_kinks_golden.py, torch, f64): relu, leaky_relu, abs and sign at 0; clamp
// at its bounds, with tensor bounds in every order of x, min and max (min == max included); max()/min() of all elements and amax/amin with ties (split evenly);
// max/min along a dim with ties (the first one); maximum/minimum of equal inputs (halves).
// Each gradient is of sum(w * f(x)) with w = 1, 2, 3, ..., so a gradient sent to the wrong
// element shows. The values are exact (halves and small integers): compared with ==.
#include <cmath>
#include <functional>
#include <map>
#include <string>

#include "harness.h"

using namespace nd;
using nd::testing::to_vector;

namespace {

using Golden = std::map<std::string, std::vector<double>>;
const Golden& golden() {
  static const Golden g =
      nd::testing::read_golden_table(std::string(NANODDP_SOURCE_DIR) + "/tests/golden/kinks_golden.txt");
  return g;
}
const std::vector<double>& row(const std::string& name) {
  const auto it = golden().find(name);
  REQUIRE_MESSAGE(it != golden().end(), "kinks_golden.txt has no row ", name);
  return it->second;
}

Tensor input(const std::string& name, const std::string& letter) {
  const std::vector<double>& v = row(name + "." + letter);
  Shape shape;
  for (double s : row(name + ".shape")) shape.push_back(static_cast<int64_t>(s));
  return tensor(v, TensorOptions(kFloat64)).reshape(shape).requires_grad_(true);
}

struct Case {
  std::string name;
  std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)> f;  // unused inputs are undefined
  int inputs = 1;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"relu", [](const Tensor& x, const Tensor&, const Tensor&) { return relu(x); }},
      {"leaky_relu", [](const Tensor& x, const Tensor&, const Tensor&) { return leaky_relu(x, 0.1); }},
      {"abs", [](const Tensor& x, const Tensor&, const Tensor&) { return abs(x); }},
      {"sign", [](const Tensor& x, const Tensor&, const Tensor&) { return sign(x); }},
      {"clamp", [](const Tensor& x, const Tensor&, const Tensor&) { return clamp(x, -1.0, 1.0); }},
      {"clamp_min_only", [](const Tensor& x, const Tensor&, const Tensor&) { return clamp(x, -1.0, INFINITY); }},
      {"max_all", [](const Tensor& x, const Tensor&, const Tensor&) { return max(x); }},
      {"min_all", [](const Tensor& x, const Tensor&, const Tensor&) { return min(x); }},
      {"max_all_2d", [](const Tensor& x, const Tensor&, const Tensor&) { return x.max(); }},
      {"max_dim", [](const Tensor& x, const Tensor&, const Tensor&) { return std::get<0>(max(x, 1)); }},
      {"min_dim", [](const Tensor& x, const Tensor&, const Tensor&) { return std::get<0>(min(x, 1)); }},
      {"amax_dim1", [](const Tensor& x, const Tensor&, const Tensor&) { return amax(x, {1}); }},
      {"amax_dim0", [](const Tensor& x, const Tensor&, const Tensor&) { return amax(x, {0}); }},
      {"amax_all", [](const Tensor& x, const Tensor&, const Tensor&) { return amax(x, {0, 1}); }},
      {"amin_dim1", [](const Tensor& x, const Tensor&, const Tensor&) { return amin(x, {-1}); }},
      {"amin_keepdim", [](const Tensor& x, const Tensor&, const Tensor&) { return amin(x, {0}, /*keepdim=*/true); }},
      {"maximum", [](const Tensor& x, const Tensor& y, const Tensor&) { return maximum(x, y); }, 2},
      {"minimum", [](const Tensor& x, const Tensor& y, const Tensor&) { return minimum(x, y); }, 2},
      {"clamp_tensor", [](const Tensor& x, const Tensor& lo, const Tensor& hi) { return clamp(x, lo, hi); }, 3},
      {"clamp_tensor_min_only", [](const Tensor& x, const Tensor& lo, const Tensor&) { return clamp(x, lo, {}); }, 2},
      {"clamp_tensor_pinned", [](const Tensor& x, const Tensor& lo, const Tensor& hi) { return clamp(x, lo, hi); }, 3},
      {"clamp_tensor_ties", [](const Tensor& x, const Tensor& lo, const Tensor& hi) { return clamp(x, lo, hi); }, 3},
  };
  return c;
}

TEST_CASE("gradients at kinks and ties equal PyTorch's") {
  for (const Case& c : cases()) {
    INFO(c.name);
    Tensor x = input(c.name, "x"), y = c.inputs > 1 ? input(c.name, "y") : Tensor();
    Tensor z = c.inputs > 2 ? input(c.name, "z") : Tensor();
    Tensor out = c.f(x, y, z);
    Tensor w = arange(1, double(out.numel() + 1), 1, TensorOptions(kFloat64)).reshape(out.sizes());
    (out * w).sum().backward();
    CHECK(to_vector(x.grad()) == row(c.name + ".dx"));
    if (c.inputs > 1) CHECK(to_vector(y.grad()) == row(c.name + ".dy"));
    if (c.inputs > 2) CHECK(to_vector(z.grad()) == row(c.name + ".dz"));
  }
}

TEST_CASE("the forward values at ties and zeros: sign, min, amin, min along a dim") {
  CHECK(to_vector(sign(tensor({-2.0, 0.0, 3.0, -0.0, NAN}))) == std::vector<double>{-1, 0, 1, 0, 0});  // as torch.sign: 0 at NaN
  Tensor x = tensor({2.0, 1.0, 1.0, 3.0, 1.0, 5.0}).reshape({2, 3});
  CHECK(min(x).item() == 1.0);
  CHECK(to_vector(amin(x, {1})) == std::vector<double>{1, 1});
  CHECK(to_vector(amin(x, {0})) == std::vector<double>{2, 1, 1});
  auto [v, i] = min(x, 1);
  CHECK(to_vector(v) == std::vector<double>{1, 1});
  CHECK(to_vector(i.to(kFloat64)) == std::vector<double>{1, 1});  // the first minimum
  CHECK(to_vector(amax(x, {})) == std::vector<double>{5});
  CHECK(amax(x, {0}, true).sizes() == Shape{1, 3});
  CHECK_THROWS_WITH_AS(amax(x, {0, 0}), doctest::Contains("dim 0 appears multiple times"), Error);
}

}  // namespace
