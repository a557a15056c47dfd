// Elementwise ops: gradcheck table, known values, argument errors.
#include <cmath>

#include "harness.h"

using namespace nd;
using nd::testing::OpCase;

TEST_CASE("elementwise: gradcheck table (f64, broadcast, non-contiguous)") {
  using V = std::vector<Tensor>;
  const std::vector<OpCase> cases = {
      {"add", {{3, 4}, {3, 4}}, [](const V& x) { return x[0] + x[1]; }},
      {"add broadcast", {{3, 4}, {4}}, [](const V& x) { return add(x[0], x[1], 2.5); }},
      {"sub broadcast", {{2, 1, 4}, {3, 1}}, [](const V& x) { return sub(x[0], x[1], 0.5); }},
      {"mul broadcast", {{2, 3, 4}, {1, 3, 1}}, [](const V& x) { return x[0] * x[1]; }},
      {"div", {{3, 5}, {3, 5}}, [](const V& x) { return x[0] / x[1]; }, 0.5, 2},
      {"pow tensor", {{4, 3}, {4, 3}}, [](const V& x) { return pow(x[0], x[1]); }, 0.5, 2},
      {"pow scalar", {{4, 3}}, [](const V& x) { return pow(x[0], 3.0); }},
      {"pow 2 (a * a)", {{4, 3}}, [](const V& x) { return pow(x[0], 2.0); }},
      {"pow 1", {{4, 3}}, [](const V& x) { return pow(x[0], 1.0) * x[0]; }},
      {"pow 0.5", {{4, 3}}, [](const V& x) { return pow(x[0], 0.5); }, 0.5, 2},
      {"maximum", {{3, 4}, {3, 4}}, [](const V& x) { return maximum(x[0], x[1]); }},
      {"minimum", {{3, 4}, {4}}, [](const V& x) { return minimum(x[0], x[1]); }},
      {"scalar ops", {{2, 3}}, [](const V& x) { return (2.0 - x[0]) * 3.0 / (x[0] + 4.0) - 1.0; }},
      {"number / x", {{2, 3}}, [](const V& x) { return 2.0 / x[0]; }, 0.5, 2},
      {"number operands, transposed x", {{3, 2}}, [](const V& x) { return 1.5 / (x[0].t() * 2.0 + 3.0) - 0.5; }},
      {"neg", {{5, 2}}, [](const V& x) { return -x[0]; }},
      {"exp", {{5, 2}}, [](const V& x) { return exp(x[0]); }},
      {"log", {{5, 2}}, [](const V& x) { return log(x[0]); }, 0.2, 2},
      {"sqrt", {{5, 2}}, [](const V& x) { return sqrt(x[0]); }, 0.2, 2},
      {"rsqrt", {{5, 2}}, [](const V& x) { return rsqrt(x[0]); }, 0.2, 2},
      {"abs", {{5, 3}}, [](const V& x) { return abs(x[0]); }},
      {"tanh", {{5, 3}}, [](const V& x) { return tanh(x[0]); }},
      {"sigmoid", {{5, 3}}, [](const V& x) { return sigmoid(x[0]); }},
      {"relu", {{5, 3}}, [](const V& x) { return relu(x[0]); }},
      {"leaky_relu", {{5, 3}}, [](const V& x) { return leaky_relu(x[0], 0.2); }},
      {"gelu", {{5, 3}}, [](const V& x) { return gelu(x[0]); }},
      {"gelu tanh", {{5, 3}}, [](const V& x) { return gelu(x[0], "tanh"); }},
      {"clamp", {{5, 3}}, [](const V& x) { return clamp(x[0], -0.5, 0.5); }},
      {"clamp tensor bounds", {{3, 4}, {4}, {3, 1}}, [](const V& x) { return clamp(x[0], x[1] - 0.5, x[2] + 0.5); }},
      {"batch size 1", {{1, 4}, {1, 1}}, [](const V& x) { return tanh(x[0] * x[1]); }},
  };
  for (const OpCase& c : cases) {
    CAPTURE(c.name);
    nd::testing::run_gradcheck(c);
  }
}

TEST_CASE("elementwise: known values") {
  Tensor a = tensor({1, 2, 3, 4}).reshape({2, 2});
  Tensor b = tensor({10, 20});
  nd::testing::check_close(a + b, {11, 22, 13, 24}, 0, 0, "broadcast add");
  nd::testing::check_close(a * b - 1.0, {9, 39, 29, 79}, 0, 0, "mul sub");
  nd::testing::check_close(exp(tensor({0, 1})), {1, std::exp(1.0)}, 1e-6, 0, "exp");
  nd::testing::check_close(sigmoid(tensor({0})), {0.5}, 0, 0, "sigmoid(0)");
  // gelu(1) = 0.5 * (1 + erf(1/sqrt 2)) = 0.8413447460685429
  nd::testing::check_close(gelu(tensor({1}, kFloat64)), {0.8413447460685429}, 1e-12, 0, "gelu(1)");
  nd::testing::check_close(leaky_relu(tensor({-2, 3}), 0.1), {-0.2, 3}, 1e-7, 0, "leaky_relu");
  nd::testing::check_close(clamp(tensor({-2, 0.25, 3}), -1, 1), {-1, 0.25, 1}, 0, 0, "clamp");
  nd::testing::check_close(pow(tensor({2, 3}), 2.0), {4, 9}, 0, 0, "pow");
  nd::testing::check_close(gt(tensor({1, 5}), tensor({2, 2})), {0, 1}, 0, 0, "gt");
}

TEST_CASE("elementwise: pow with a number exponent, values and gradients") {
  const Tensor x = tensor({-1.5, 0, 0.5, 3}, kFloat64).requires_grad_();
  // a^2 is the exact product a * a; its gradient 2 a g.
  Tensor y = pow(x, 2.0);
  CHECK(y.grad_fn()->name() == "PowBackward");
  nd::testing::check_close(y, {2.25, 0, 0.25, 9}, 0, 0, "x^2");
  y.backward(tensor({1, 2, 3, 4}, kFloat64));
  nd::testing::check_close(x.grad(), {-3, 0, 3, 24}, 0, 0, "d x^2");
  // a^0 = 1 and its gradient is 0 everywhere, also at a = 0 (PyTorch's convention).
  x.grad().zero_();
  pow(x, 0.0).sum().backward();
  nd::testing::check_close(x.grad(), {0, 0, 0, 0}, 0, 0, "d x^0");
  // a^1 passes the gradient through.
  x.grad().zero_();
  pow(x, 1.0).backward(tensor({5, 6, 7, 8}, kFloat64));
  nd::testing::check_close(x.grad(), {5, 6, 7, 8}, 0, 0, "d x^1");
  // Saved for backward: modifying x in place after x^2 is the version error.
  const Tensor w = tensor({1, 2}, kFloat64).requires_grad_();
  Tensor h = w * 1.0;
  Tensor sq = pow(h, 2.0);
  h.add_(1.0);
  CHECK_THROWS_WITH_AS(sq.sum().backward(), doctest::Contains("PowBackward"), Error);
}

// A number operand goes to the kernel by value (binary_scalar); the result is the one the
// number as a 0-d tensor gives, bit for bit, in either order, on strided input and in place.
TEST_CASE("elementwise: a number operand equals the number as a tensor, out of place and in place") {
  for (ScalarType dt : {kFloat32, kFloat64}) {
    INFO(std::string(dtype_name(dt)));
    const Tensor x = (rand({4, 5}, dt) + 0.5).t();  // transposed: strides (1, 5)
    const double s = 0.3;
    const Tensor st = scalar_tensor(s, dt);
    auto same = [](const Tensor& got, const Tensor& want, const char* what) {
      INFO(std::string(what));
      CHECK(got.sizes() == want.sizes());
      CHECK(nd::testing::bitwise_equal(got, want));
    };
    same(x + s, add(x, st), "x + s");
    same(x - s, sub(x, st), "x - s");
    same(s - x, sub(st, x), "s - x");
    same(x * s, mul(x, st), "x * s");
    same(s * x, mul(st, x), "s * x");
    same(x / s, div(x, st), "x / s");
    same(s / x, div(st, x), "s / x");
    same(pow(x, 3.0), pow(x, scalar_tensor(3.0, dt)), "x ^ 3");
    Tensor y = x.contiguous();
    y.add_(s);
    same(y, x + s, "add_");
    y = x.contiguous();
    y.mul_(s);
    same(y, x * s, "mul_");
    y = x.contiguous();
    y.div_(s);
    same(y, x / s, "div_ divides (not a multiplication by 1 / s)");
    y = x.clone();  // in place on a transposed tensor
    y.mul_(s);
    same(y, x * s, "mul_ transposed");
  }
  // 7 / 3 and 7 * (1 / 3) differ in f64: div_ is the division, as div is.
  Tensor z = tensor({7.0}, kFloat64);
  z.div_(3.0);
  CHECK(z.item() == 7.0 / 3.0);
  CHECK(z.item() != 7.0 * (1.0 / 3.0));
  // Gradients through in-place number ops on a non-leaf.
  const Tensor w = tensor({1, 2, 4}, kFloat64).requires_grad_();
  Tensor h = w * 1.0;
  h.add_(2.0);
  h.div_(4.0);
  h.sub_(tensor({1.0}, kFloat64));
  (h * h).sum().backward();  // d/dw = 2 h / 4, h = (w + 2) / 4 - 1
  nd::testing::check_close(w.grad(), {-0.125, 0, 0.25}, 0, 0, "d/dw");
  // The number's node names: what a version error would print.
  CHECK(((w * 1.0) + 1.0).grad_fn()->name() == "AddBackward");
  CHECK((1.0 - w).grad_fn()->name() == "RsubBackward");
  CHECK((w / 2.0).grad_fn()->name() == "DivBackward");
  CHECK((w * 2.0).grad_fn()->name() == "MulBackward");
  CHECK_THROWS_WITH_AS(ones({2}, kInt64) * 2.0, doctest::Contains("mul: expected a f32 or f64 tensor"), Error);
}

TEST_CASE("elementwise: in-place ops bump the version and record history") {
  Tensor x = ones({3});
  CHECK(x._version() == 0);
  x.add_(tensor({1, 2, 3}));
  CHECK(x._version() == 1);
  CHECK(x.storage()->last_modified_by() == "add_");
  nd::testing::check_close(x, {2, 3, 4}, 0, 0, "add_");

  // add_ on a non-leaf keeps gradients flowing to both operands.
  Tensor w = tensor({1, 2, 3}, kFloat64).requires_grad_();
  Tensor v = tensor({4, 5, 6}, kFloat64).requires_grad_();
  Tensor h = w * 2.0;
  h.add_(v, 3.0);
  h.mul_(0.5);
  h.sum().backward();
  nd::testing::check_close(w.grad(), {1, 1, 1}, 0, 0, "d/dw");
  nd::testing::check_close(v.grad(), {1.5, 1.5, 1.5}, 0, 0, "d/dv");
}

TEST_CASE("elementwise: argument errors name what was expected and found") {
  using nd::testing::error_message;
  CHECK(error_message([] { ones({2, 3}) + ones({4}); }).find("shapes [2, 3] and [4] cannot be broadcast") !=
        std::string::npos);
  CHECK(error_message([] { ones({2}) + ones({2}, kFloat64); }).find("same dtype") != std::string::npos);
  CHECK(error_message([] { exp(ones({2}, kInt64)); }).find("expected a f32 or f64 tensor, found [cpu i64 [2]]") !=
        std::string::npos);
  CHECK(error_message([] { ones({1, 3}).add_(ones({2, 3})); }).find("does not fit in-place") != std::string::npos);
  Tensor leaf = ones({2}).requires_grad_();
  CHECK(error_message([&] { leaf.add_(1.0); }).find("a leaf tensor that requires grad is being used in an in-place") !=
        std::string::npos);
  CHECK(error_message([] { gelu(ones({1}), "fast"); }).find("approximate must be 'none' or 'tanh'") !=
        std::string::npos);
}

TEST_CASE("elementwise: add_ of an integral number counts in an int64 or int32 tensor, other uses are errors") {
  Tensor c = zeros({}, kInt64);
  const auto v0 = c._version();
  c.add_(1);
  c.add_(1);
  CHECK(c.item<int64_t>() == 2);
  CHECK(c._version() == v0 + 2);
  Tensor i = tensor({1, -2, 3}, kInt32);
  i.add_(-4);
  CHECK(nd::testing::to_vector(i) == std::vector<double>{-3, -6, -1});
  CHECK(nd::testing::error_message([&] { c.add_(0.5); }).find("expected an integral value") != std::string::npos);
  CHECK(nd::testing::error_message([] { zeros({2}, kBool).add_(1); }).find("found") != std::string::npos);
  Tensor m = zeros({3, 4}, kInt64);
  CHECK(nd::testing::error_message([&] { m.t().add_(1); }).find("contiguous") != std::string::npos);
}
