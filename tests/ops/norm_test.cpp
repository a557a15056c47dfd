// batch_norm and layer_norm ops: gradcheck table, known values, running stats and
// their versions, batch_norm with its activation against the unfused pair, argument errors.
#include <cmath>

#include "engine/ops/batch_norm.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/layer_norm.h"
#include "harness.h"

using namespace nd;
using nd::testing::OpCase;

TEST_CASE("norm: gradcheck table (f64, non-contiguous, batch size 1)") {
  using V = std::vector<Tensor>;
  // Running stats are updated by every training call; training outputs do not read them.
  Tensor rm = zeros({3}, kFloat64), rv = ones({3}, kFloat64);
  Tensor eval_mean = tensor({0.1, -0.2, 0.3}, kFloat64), eval_var = tensor({0.5, 1.5, 2.0}, kFloat64);
  const std::vector<OpCase> cases = {
      {"batch_norm train [N, C, S]", {{4, 3, 5}, {3}, {3}},
       [&](const V& x) { return batch_norm(x[0], rm, rv, x[1], x[2], true, 0.1, 1e-5); }},
      {"batch_norm train [N, C, H, W]", {{2, 3, 2, 3}, {3}, {3}},
       [&](const V& x) { return batch_norm(x[0], {}, {}, x[1], x[2], true, 0.1, 1e-5); }},
      {"batch_norm train [N, C]", {{5, 3}, {3}, {3}},
       [&](const V& x) { return batch_norm(x[0], rm, rv, x[1], x[2], true, 0.1, 1e-5); }},
      {"batch_norm train no affine", {{3, 3, 4}}, [&](const V& x) { return batch_norm(x[0], {}, {}, {}, {}, true); }},
      {"batch_norm train batch size 1", {{1, 3, 4}, {3}, {3}},
       [&](const V& x) { return batch_norm(x[0], rm, rv, x[1], x[2], true); }},
      {"batch_norm eval", {{4, 3, 2}, {3}, {3}},
       [&](const V& x) { return batch_norm(x[0], eval_mean, eval_var, x[1], x[2], false, 0.1, 1e-3); }},
      {"batch_norm then tanh", {{3, 3, 3}, {3}}, [&](const V& x) { return tanh(batch_norm(x[0], {}, {}, x[1], {}, true)); }},
      {"batch_norm + relu train", {{4, 3, 5}, {3}, {3}},
       [&](const V& x) { return batch_norm(x[0], {}, {}, x[1], x[2], true, 0.1, 1e-5, {BatchNormActivation::Kind::relu}); }},
      {"batch_norm + leaky_relu eval", {{4, 3, 2}, {3}, {3}},
       [&](const V& x) {
         return batch_norm(x[0], eval_mean, eval_var, x[1], x[2], false, 0.1, 1e-3,
                           {BatchNormActivation::Kind::leaky_relu, 0.2});
       }},
      {"layer_norm [M, D]", {{3, 7}, {7}, {7}}, [](const V& x) { return layer_norm(x[0], {7}, x[1], x[2]); }},
      {"layer_norm two trailing dims", {{2, 3, 4}, {3, 4}, {3, 4}},
       [](const V& x) { return layer_norm(x[0], {3, 4}, x[1], x[2], 1e-3); }},
      {"layer_norm no affine", {{4, 5}}, [](const V& x) { return layer_norm(x[0], {5}); }},
      {"layer_norm weight only", {{2, 5}, {5}}, [](const V& x) { return layer_norm(x[0], {5}, x[1]); }},
      {"layer_norm batch size 1", {{1, 6}, {6}, {6}}, [](const V& x) { return layer_norm(x[0], {6}, x[1], x[2]); }},
  };
  for (const OpCase& c : cases) {
    CAPTURE(c.name);
    nd::testing::run_gradcheck(c);
  }
}

TEST_CASE("batch_norm: known values, running stats and their versions") {
  // One channel holding 1, 2, 3, 4: mean 2.5, biased var 1.25, unbiased var 5/3.
  Tensor x = tensor({1, 2, 3, 4}, kFloat64).reshape({4, 1});
  Tensor rm = zeros({1}, kFloat64), rv = ones({1}, kFloat64);
  const int64_t v0 = rm._version();
  Tensor y = batch_norm(x, rm, rv, {}, {}, true, 0.1, 0.0);
  const double s = std::sqrt(1.25);
  nd::testing::check_close(y, {-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s}, 1e-12, 0, "normalised");
  nd::testing::check_close(rm, {0.25}, 1e-12, 0, "running_mean");
  nd::testing::check_close(rv, {0.9 + 0.1 * 5.0 / 3.0}, 1e-12, 0, "running_var");
  CHECK(rm._version() == v0 + 1);
  CHECK(rv._version() == 1);
  CHECK(rm.storage()->last_modified_by() == "batch_norm");
  // Eval uses the running stats and leaves them (and their versions) alone.
  Tensor ye = batch_norm(x, rm, rv, tensor({2}, kFloat64), tensor({1}, kFloat64), false, 0.1, 0.0);
  const double rstd = 1 / std::sqrt(0.9 + 0.1 * 5.0 / 3.0);
  nd::testing::check_close(ye, {(1 - 0.25) * rstd * 2 + 1, (2 - 0.25) * rstd * 2 + 1, (3 - 0.25) * rstd * 2 + 1,
                                (4 - 0.25) * rstd * 2 + 1},
                           1e-12, 0, "eval");
  CHECK(rm._version() == v0 + 1);
  // f32 works the same.
  Tensor yf = batch_norm(x.to(kFloat32), {}, {}, {}, {}, true, 0.1, 0.0);
  nd::testing::check_close(yf, {-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s}, 1e-6, 0, "f32");
}

TEST_CASE("batch_norm: eval backward sees a running-stat update made after its forward") {
  Tensor x = nd::testing::random_input({4, 2}, 3).requires_grad_();
  Tensor rm = zeros({2}, kFloat64), rv = ones({2}, kFloat64);
  Tensor y = batch_norm(x, rm, rv, {}, {}, false);
  batch_norm(x.detach(), rm, rv, {}, {}, true);  // a training step updates rm in place
  const std::string msg = nd::testing::error_message([&] { y.sum().backward(); });
  CHECK(msg.find("modified by an inplace operation") != std::string::npos);
  CHECK(msg.find("NativeBatchNormBackward") != std::string::npos);
  CHECK(msg.find("last modified by batch_norm") != std::string::npos);
}

// batch_norm(..., activation) is relu(batch_norm(...)) / leaky_relu(batch_norm(...), 0.2) bit
// for bit: the output, the running statistics and every gradient, training and eval, f32
// and f64; its backward checks the output's version as the activation's would.
TEST_CASE("batch_norm with its activation: bit for bit the unfused pair") {
  using Kind = BatchNormActivation::Kind;
  for (const ScalarType dtype : {kFloat32, kFloat64}) {
    for (const BatchNormActivation act : {BatchNormActivation{Kind::relu, 0}, BatchNormActivation{Kind::leaky_relu, 0.2}}) {
      for (const bool training : {true, false}) {
        CAPTURE(dtype == kFloat32);
        CAPTURE(static_cast<int>(act.kind));
        CAPTURE(training);
        auto run = [&](bool fused) {
          Tensor x = nd::testing::random_input({4, 3, 5, 5}, 1).to(dtype).requires_grad_();
          Tensor w = nd::testing::random_input({3}, 2, false, 0.5, 1.5).to(dtype).requires_grad_();
          Tensor b = nd::testing::random_input({3}, 3).to(dtype).requires_grad_();
          Tensor rm = nd::testing::random_input({3}, 4).to(dtype), rv = ones({3}, dtype);
          Tensor y;
          if (fused) {
            y = batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5, act);
          } else {
            y = batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5);
            y = act.kind == Kind::relu ? relu(y) : leaky_relu(y, act.negative_slope);
          }
          (y * nd::testing::random_input({4, 3, 5, 5}, 5).to(dtype)).sum().backward();
          return std::vector<Tensor>{y.detach(), rm, rv, x.grad(), w.grad(), b.grad()};
        };
        const std::vector<Tensor> fused = run(true), plain = run(false);
        const char* names[] = {"y", "running_mean", "running_var", "x.grad", "weight.grad", "bias.grad"};
        for (size_t i = 0; i < fused.size(); ++i) {
          CAPTURE(names[i]);
          CHECK(nd::testing::bitwise_equal(fused[i], plain[i]));
        }
      }
    }
  }
  // The backward reads the output: modified in place after the forward, it is refused.
  Tensor x = nd::testing::random_input({4, 2, 3}, 6).requires_grad_();
  Tensor y = batch_norm(x, {}, {}, {}, {}, true, 0.1, 1e-5, {BatchNormActivation::Kind::relu});
  {
    NoGradGuard no_grad;
    y.mul_(2.0);
  }
  const std::string msg = nd::testing::error_message([&] { y.sum().backward(); });
  CHECK(msg.find("modified by an inplace operation") != std::string::npos);
  CHECK(msg.find("NativeBatchNormReluBackward") != std::string::npos);
}

TEST_CASE("layer_norm: known values") {
  // Row (1, 3): mean 2, var 1 -> (-1, 1); times weight (2, 3) plus bias (0, 1).
  Tensor x = tensor({1, 3}, kFloat64).reshape({1, 2});
  nd::testing::check_close(layer_norm(x, {2}, tensor({2, 3}, kFloat64), tensor({0, 1}, kFloat64), 0.0), {-2, 4},
                           1e-12, 0, "affine");
  nd::testing::check_close(layer_norm(x.to(kFloat32), {2}, {}, {}, 0.0), {-1, 1}, 1e-6, 0, "f32");
}

TEST_CASE("norm: argument errors name what was expected and found") {
  using nd::testing::error_message;
  CHECK(error_message([] { batch_norm(ones({4}), {}, {}, {}, {}, true); })
            .find("batch_norm: expected input of at least 2 dims ([N, C, *]), found [cpu f32 [4]]") !=
        std::string::npos);
  CHECK(error_message([] { batch_norm(ones({4, 3}), {}, {}, ones({2}), {}, true); })
            .find("expected weight of shape [3] (the channel dim of input [cpu f32 [4, 3]]), found [cpu f32 [2]]") !=
        std::string::npos);
  CHECK(error_message([] { batch_norm(ones({1, 3}), {}, {}, {}, {}, true); })
            .find("expected more than 1 value per channel when training, got input [cpu f32 [1, 3]]") !=
        std::string::npos);
  CHECK(error_message([] { batch_norm(ones({2, 3}), {}, {}, {}, {}, false); })
            .find("running_mean and running_var must be defined in evaluation mode") != std::string::npos);
  CHECK(error_message([] { batch_norm(ones({2, 3}), zeros({3}), {}, {}, {}, true); })
            .find("both defined or both undefined, found only running_mean") != std::string::npos);
  CHECK(error_message([] { batch_norm(ones({2, 3}), zeros({3}, kFloat64), ones({3}, kFloat64), {}, {}, true); })
            .find("same dtype") != std::string::npos);
  CHECK(error_message([] { batch_norm(ones({2, 3}, kInt64), {}, {}, {}, {}, true); })
            .find("expected a f32 or f64 tensor") != std::string::npos);
  CHECK(error_message([] {
          batch_norm(ones({2, 3}), {}, {}, {}, {}, true, 0.1, 1e-5, {BatchNormActivation::Kind::leaky_relu, -0.5});
        }).find("batch_norm: expected a LeakyReLU negative_slope >= 0 to apply in the same pass, found -0.5") !=
        std::string::npos);
  CHECK(error_message([] { layer_norm(ones({2, 3}), {4}); })
            .find("layer_norm: given normalized_shape=[4], expected input with shape [*, 4], found [cpu f32 [2, 3]]") !=
        std::string::npos);
  CHECK(error_message([] { layer_norm(ones({2, 3}), {3}, ones({2})); })
            .find("expected weight of shape normalized_shape=[3], found [cpu f32 [2]]") != std::string::npos);
  CHECK(error_message([] { layer_norm(ones({2, 3}), {}); })
            .find("expected normalized_shape to be at least 1-dimensional") != std::string::npos);
}
