// Loss ops: gradcheck table over reductions and options, known values, argument errors.
#include <cmath>

#include "engine/ops/loss.h"
#include "harness.h"

using namespace nd;
using nd::testing::OpCase;

TEST_CASE("loss: gradcheck table (f64, reductions, non-contiguous, batch size 1)") {
  using V = std::vector<Tensor>;
  const Tensor bce_weight = nd::testing::random_input({5}, 50, false, 0.5, 2);
  const Tensor pos_weight = nd::testing::random_input({5}, 51, false, 0.5, 3);
  const Tensor cls = tensor({1, 4, -100, 0}, kInt64);                // [N] with one ignored
  const Tensor cls_nd = tensor({0, 3, 2, 1, 1, -100}, kInt64).reshape({2, 3});  // [N, d1]
  const Tensor cls_0d = tensor({2}, kInt64).reshape({});
  const Tensor cls_weight = nd::testing::random_input({5}, 52, false, 0.2, 2);
  const std::vector<OpCase> cases = {
      {"mse mean", {{3, 4}, {3, 4}}, [](const V& x) { return mse_loss(x[0], x[1]); }},
      {"mse sum", {{3, 4}, {3, 4}}, [](const V& x) { return mse_loss(x[0], x[1], Reduction::Sum); }},
      {"mse none", {{3, 4}, {3, 4}}, [](const V& x) { return mse_loss(x[0], x[1], Reduction::None); }},
      {"mse batch size 1", {{1, 3}, {1, 3}}, [](const V& x) { return mse_loss(x[0], x[1]); }},
      {"bce_with_logits mean", {{4, 5}, {4, 5}}, [](const V& x) { return binary_cross_entropy_with_logits(x[0], x[1]); },
       -3, 3},
      {"bce_with_logits weight + pos_weight, none", {{3, 5}, {3, 5}},
       [&](const V& x) {
         return binary_cross_entropy_with_logits(x[0], x[1], bce_weight, pos_weight, Reduction::None);
       },
       -3, 3},
      {"bce_with_logits sum", {{2, 5}, {2, 5}},
       [&](const V& x) { return binary_cross_entropy_with_logits(x[0], x[1], {}, pos_weight, Reduction::Sum); }, -3, 3},
      {"cross_entropy mean, ignore_index", {{4, 5}}, [&](const V& x) { return cross_entropy(x[0], cls); }, -3, 3},
      {"cross_entropy weight + label_smoothing", {{4, 5}},
       [&](const V& x) { return cross_entropy(x[0], cls, cls_weight, Reduction::Mean, -100, 0.2); }, -3, 3},
      {"cross_entropy none", {{4, 5}},
       [&](const V& x) { return cross_entropy(x[0], cls, {}, Reduction::None, -100, 0.1); }, -3, 3},
      {"cross_entropy sum", {{4, 5}}, [&](const V& x) { return cross_entropy(x[0], cls, cls_weight, Reduction::Sum); },
       -3, 3},
      {"cross_entropy [N, C, d1]", {{2, 4, 3}},
       [&](const V& x) { return cross_entropy(x[0], cls_nd, {}, Reduction::None, -100, 0.1); }, -3, 3},
      {"cross_entropy [C], 0-d target", {{5}}, [&](const V& x) { return cross_entropy(x[0], cls_0d); }, -3, 3},
  };
  for (const OpCase& c : cases) {
    CAPTURE(c.name);
    nd::testing::run_gradcheck(c);
  }
}

TEST_CASE("loss: known values") {
  Tensor x = tensor({1, 2, 3}, kFloat64), t = tensor({0, 2, 5}, kFloat64);
  nd::testing::check_close(mse_loss(x, t), {5.0 / 3}, 1e-12, 0, "mse mean");
  nd::testing::check_close(mse_loss(x, t, Reduction::Sum), {5}, 1e-12, 0, "mse sum");
  nd::testing::check_close(mse_loss(x, t, Reduction::None), {1, 0, 4}, 0, 0, "mse none");
  CHECK(mse_loss(x, t).dim() == 0);

  // x = 1, t = 1 with pos_weight 3: 3 log(1 + e^-1); x = -2, t = 0: log(1 + e^-2).
  Tensor logits = tensor({1, -2}, kFloat64).reshape({2, 1}), targets = tensor({1, 0}, kFloat64).reshape({2, 1});
  nd::testing::check_close(
      binary_cross_entropy_with_logits(logits, targets, {}, tensor({3}, kFloat64), Reduction::None),
      {3 * std::log1p(std::exp(-1.0)), std::log1p(std::exp(-2.0))}, 1e-12, 0, "bce pos_weight");
  // Large logits do not overflow.
  nd::testing::check_close(binary_cross_entropy_with_logits(tensor({100, -100}), tensor({0, 1}), {}, {}, Reduction::None),
                           {100, 100}, 1e-4, 0, "bce large");

  // logits (0, ln 2): p = (1/3, 2/3). Target 0: log 3; label_smoothing 0.2:
  // 0.8 log 3 + 0.1 (log 3 + log 1.5).
  Tensor ce_x = tensor({0, std::log(2.0)}, kFloat64).reshape({1, 2});
  Tensor ce_t = tensor({0}, kInt64);
  nd::testing::check_close(cross_entropy(ce_x, ce_t), {std::log(3.0)}, 1e-12, 0, "ce");
  nd::testing::check_close(cross_entropy(ce_x, ce_t, {}, Reduction::Mean, -100, 0.2),
                           {0.9 * std::log(3.0) + 0.1 * std::log(1.5)}, 1e-12, 0, "ce smoothed");
  Tensor ce_xg = ce_x.detach().requires_grad_();
  cross_entropy(ce_xg, ce_t).backward();
  nd::testing::check_close(ce_xg.grad(), {1.0 / 3 - 1, 2.0 / 3}, 1e-12, 0, "ce grad = softmax - onehot");
  // Weighted mean divides by the kept targets' weights: (w0 l0 + w1 l1) / (w0 + w1).
  Tensor two = tensor({0, 0, 0, 0}, kFloat64).reshape({2, 2});
  nd::testing::check_close(cross_entropy(two, tensor({0, 1}, kInt64), tensor({1, 3}, kFloat64)), {std::log(2.0)}, 1e-12,
                           0, "ce weighted mean");
  // Every target ignored: the mean is 0/0 = NaN, as in PyTorch.
  CHECK(std::isnan(cross_entropy(two, tensor({-100, -100}, kInt64)).item()));
}

TEST_CASE("loss: argument errors") {
  using nd::testing::error_message;
  CHECK(error_message([] { mse_loss(ones({2, 3}), ones({3})); })
            .find("mse_loss: expected target of the same shape as input [2, 3], found [cpu f32 [3]]") !=
        std::string::npos);
  CHECK(error_message([] { mse_loss(ones({2}), ones({2}, kFloat64)); }).find("same dtype") != std::string::npos);
  CHECK(error_message([] { binary_cross_entropy_with_logits(ones({2, 3}), ones({2, 3}), {}, ones({2})); })
            .find("expected pos_weight with 3 elements (one per class, the last dim of input [2, 3]), found") !=
        std::string::npos);
  CHECK(error_message([] { binary_cross_entropy_with_logits(ones({2, 3}), ones({2, 3}), ones({4})); })
            .find("cannot be broadcast") != std::string::npos);
  CHECK(error_message([] { binary_cross_entropy_with_logits(ones({2}), ones({2}), ones({2}).requires_grad_()); })
            .find("gradients for weight are not supported") != std::string::npos);
  CHECK(error_message([] { cross_entropy(ones({2, 3}), tensor({0, 3}, kInt64)); })
            .find("cross_entropy: target 3 is out of bounds; expected class indices in [0, 3) or ignore_index -100, "
                  "found it at flat position 1") != std::string::npos);
  CHECK(error_message([] { cross_entropy(ones({2, 3}), tensor({0, 1})); })
            .find("expected class-probability target of input's shape [2, 3], found [cpu f32 [2]]") !=
        std::string::npos);
  CHECK(error_message([] { cross_entropy(ones({2, 3}), tensor({0, 1}, kInt32)); })
            .find("expected target of int64 class indices or of class probabilities (f32, input's shape), found "
                  "[cpu i32 [2]]") != std::string::npos);
  CHECK(error_message([] { cross_entropy(ones({2, 3}), ones({2, 3}), {}, Reduction::Mean, 0); })
            .find("ignore_index is not supported for class-probability targets (found 0)") != std::string::npos);
  CHECK(error_message([] { cross_entropy(ones({2, 3}), ones({2, 3}, TensorOptions(kFloat64))); })
            .find("cross_entropy") != std::string::npos);
  CHECK(error_message([] { cross_entropy(ones({2, 3}), tensor({0, 1, 2}, kInt64)); })
            .find("expected target of shape [2] for input [cpu f32 [2, 3]] (the class dim removed), found") !=
        std::string::npos);
  CHECK(error_message([] { cross_entropy(ones({2, 3}), tensor({0, 1}, kInt64), ones({2})); })
            .find("expected weight of shape [3] (one per class), found [cpu f32 [2]]") != std::string::npos);
  CHECK(error_message([] { cross_entropy(ones({2, 3}), tensor({0, 1}, kInt64), {}, Reduction::Mean, -100, 1.5); })
            .find("expected label_smoothing in [0, 1], found 1.5") != std::string::npos);
}
