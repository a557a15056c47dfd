// softmax / log_softmax ops: gradcheck table over dims and layouts, known values, errors.
#include <cmath>

#include "engine/ops/softmax.h"
#include "harness.h"

using namespace nd;
using nd::testing::OpCase;

TEST_CASE("softmax: gradcheck table (f64, any dim, non-contiguous, batch size 1)") {
  using V = std::vector<Tensor>;
  const std::vector<OpCase> cases = {
      {"softmax last dim", {{3, 7}}, [](const V& x) { return softmax(x[0], -1); }, -3, 3},
      {"softmax dim 0", {{4, 5}}, [](const V& x) { return softmax(x[0], 0); }, -3, 3},
      {"softmax middle dim", {{2, 3, 4}}, [](const V& x) { return x[0].softmax(1); }, -3, 3},
      {"softmax 1-D", {{5}}, [](const V& x) { return softmax(x[0], 0); }},
      {"log_softmax last dim", {{3, 7}}, [](const V& x) { return log_softmax(x[0], 1); }, -3, 3},
      {"log_softmax dim 0", {{4, 5}}, [](const V& x) { return x[0].log_softmax(0); }, -3, 3},
      {"log_softmax middle dim", {{2, 3, 4}}, [](const V& x) { return log_softmax(x[0], -2); }, -3, 3},
      {"softmax batch size 1", {{1, 6}}, [](const V& x) { return softmax(x[0], 1); }},
      {"softmax then log", {{3, 4}}, [](const V& x) { return log(softmax(x[0], -1)); }},
  };
  for (const OpCase& c : cases) {
    CAPTURE(c.name);
    nd::testing::run_gradcheck(c);
  }
}

TEST_CASE("softmax: known values, stability, layout of the result") {
  // softmax(0, ln 3) = (1/4, 3/4), also shifted by 1000 (no overflow).
  Tensor x = tensor({0, std::log(3.0), 1000, 1000 + std::log(3.0)}, kFloat64).reshape({2, 2});
  nd::testing::check_close(softmax(x, 1), {0.25, 0.75, 0.25, 0.75}, 1e-12, 0, "softmax");
  nd::testing::check_close(log_softmax(x, 1), {std::log(0.25), std::log(0.75), std::log(0.25), std::log(0.75)},
                           1e-12, 0, "log_softmax");
  // Along dim 0 of [[0, 0], [ln 3, ln 3]]: each column is (1/4, 3/4).
  Tensor c = tensor({0, 0, std::log(3.0), std::log(3.0)}).reshape({2, 2});
  Tensor y = softmax(c, 0);
  CHECK(y.sizes() == Shape{2, 2});
  CHECK(y.is_contiguous());
  nd::testing::check_close(y, {0.25, 0.25, 0.75, 0.75}, 1e-6, 0, "dim 0 (f32)");
  nd::testing::check_close(softmax(scalar_tensor(5.0), 0), {1.0}, 0, 0, "0-d");
}

TEST_CASE("softmax: saved output is version-checked") {
  Tensor x = nd::testing::random_input({2, 3}, 1).requires_grad_();
  Tensor y = softmax(x, -1);
  {
    NoGradGuard g;
    y.mul_(2.0);
  }
  const std::string msg = nd::testing::error_message([&] { y.sum().backward(); });
  CHECK_MESSAGE(msg.find("SoftmaxBackward") != std::string::npos, msg);
}

TEST_CASE("softmax: argument errors") {
  using nd::testing::error_message;
  CHECK(error_message([] { softmax(ones({2, 3}), 2); }).find("softmax") != std::string::npos);
  CHECK(error_message([] { log_softmax(ones({2, 3}, kInt64), 1); })
            .find("log_softmax: expected a f32 or f64 tensor, found [cpu i64 [2, 3]]") != std::string::npos);
}
