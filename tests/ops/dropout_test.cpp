// dropout op: gradcheck with a fixed seed, the mask is the generator's counter stream,
// backward reuses it, eval and p = 0 are the identity, argument errors.
#include "engine/ops/dropout.h"
#include "harness.h"
#include "kernels/common/counter_rng.h"

using namespace nd;
using nd::testing::OpCase;

TEST_CASE("dropout: gradcheck table (f64, fixed seed, non-contiguous, batch size 1)") {
  using V = std::vector<Tensor>;
  // Re-seeding inside fn keeps the mask fixed across the finite-difference evaluations.
  const std::vector<OpCase> cases = {
      {"dropout p=0.3", {{4, 5}}, [](const V& x) { manual_seed(5); return dropout(x[0], 0.3, true); }},
      {"dropout p=0.5 3-D", {{2, 3, 4}}, [](const V& x) { manual_seed(6); return dropout(x[0], 0.5, true); }},
      {"dropout eval", {{3, 4}}, [](const V& x) { return dropout(x[0], 0.5, false); }},
      {"dropout batch size 1", {{1, 7}}, [](const V& x) { manual_seed(7); return dropout(x[0], 0.2, true); }},
  };
  for (const OpCase& c : cases) {
    CAPTURE(c.name);
    nd::testing::run_gradcheck(c);
  }
}

TEST_CASE("dropout: mask from the default generator, scaling, offset advance, backward") {
  const int64_t n = 2000;
  const double p = 0.25;
  manual_seed(11);
  const Generator before = default_generator();
  Tensor x = (arange(static_cast<double>(n), kFloat64) + 1.0).requires_grad_();
  Tensor y = dropout(x, p, true);
  CHECK(default_generator().offset == before.offset + n);
  y.sum().backward();
  const auto yv = nd::testing::to_vector(y), gv = nd::testing::to_vector(x.grad());
  int64_t dropped = 0;
  int mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool drop = kernels::counter_uniform(before.seed, before.offset + i) < p;
    dropped += drop;
    const double expect = drop ? 0.0 : (i + 1) / (1 - p);
    const double expect_grad = drop ? 0.0 : 1 / (1 - p);
    if (std::abs(yv[i] - expect) > 1e-9 || std::abs(gv[i] - expect_grad) > 1e-12) ++mismatches;
  }
  CHECK(mismatches == 0);
  CHECK(dropped > 500 - 100);  // Binomial(2000, 0.25): mean 500, sd 19
  CHECK(dropped < 500 + 100);
  // The next call continues the stream: a different mask.
  Tensor y2 = dropout(ones({n}, kFloat64), p, true);
  CHECK(nd::testing::to_vector(y2) != nd::testing::to_vector(dropout(ones({n}, kFloat64), p, true)));
}

TEST_CASE("dropout: eval and p = 0 return the input, p = 1 gives zeros") {
  Tensor x = ones({3, 4});
  CHECK(dropout(x, 0.5, false).impl_ptr() == x.impl_ptr());
  CHECK(dropout(x, 0.0, true).impl_ptr() == x.impl_ptr());
  nd::testing::check_close(dropout(x, 1.0, true), std::vector<double>(12, 0.0), 0, 0, "p = 1");
  // f32 keeps scaling exact for kept elements: 1 / (1 - 0.5) = 2.
  for (double v : nd::testing::to_vector(dropout(x, 0.5, true))) CHECK((v == 0.0 || v == 2.0));
}

TEST_CASE("dropout: argument errors") {
  using nd::testing::error_message;
  CHECK(error_message([] { dropout(ones({2}), 1.5, true); })
            .find("dropout: dropout probability has to be between 0 and 1, but got 1.5") != std::string::npos);
  CHECK(error_message([] { dropout(ones({2}), -0.1, false); }).find("between 0 and 1") != std::string::npos);
  CHECK(error_message([] { dropout(ones({2}, kInt64), 0.5, true); })
            .find("dropout: expected a f32 or f64 tensor, found [cpu i64 [2]]") != std::string::npos);
}
