// Mixed precision (engine/autocast.h) on the CPU: under an AutocastGuard the GEMM ops
// multiply bf16-rounded f32 operands in f32, forward and backward (the backward in the
// precision its forward used, wherever it runs); everything else, f64 and other devices'
// tensors are untouched; the guard nests and restores; an MLP trained under autocast
// tracks the f32 run.
#include <cmath>

#include "harness.h"

using namespace nd;

namespace {

using testing::bf16_rounded, testing::bitwise_equal, testing::relative_error;

Tensor f32_input(const Shape& shape, uint64_t seed) { return testing::random_input(shape, seed).to(kFloat32); }

}  // namespace

TEST_CASE("autocast: the guard turns the CPU's GEMMs to bf16 operands, nests and restores") {
  CHECK_FALSE(is_autocast_enabled(kCPU));
  {
    AutocastGuard on(kCPU);
    CHECK(is_autocast_enabled(kCPU));
    CHECK_FALSE(is_autocast_enabled(kCUDA));
    {
      AutocastGuard off(kCPU, false);
      CHECK_FALSE(is_autocast_enabled(kCPU));
    }
    CHECK(is_autocast_enabled(kCPU));
  }
  CHECK_FALSE(is_autocast_enabled(kCPU));
  {
    AutocastGuard f16(kCPU, true, kFloat16);  // the dtype nests and restores with it
    CHECK(autocast_dtype(kCPU) == kFloat16);
    CHECK(autocast_dtype(kCUDA) == kBFloat16);
    {
      AutocastGuard bf16(kCPU);
      CHECK(autocast_dtype(kCPU) == kBFloat16);
    }
    CHECK(autocast_dtype(kCPU) == kFloat16);
  }
  CHECK(autocast_dtype(kCPU) == kBFloat16);
  CHECK(testing::error_message([] { AutocastGuard bad(kCPU, true, kFloat64); }) ==
        "AutocastGuard: expected dtype bf16 or f16, found f64");
  CHECK_FALSE(is_autocast_enabled(kCPU));
  AutocastGuard cuda_only(kCUDA);  // does not reach CPU tensors
  const Tensor a = f32_input({7, 33}, 1), b = f32_input({33, 5}, 2);
  CHECK(bitwise_equal(mm(a, b), mm(a, b)));
  CHECK_FALSE(is_autocast_enabled(kCPU));
}

TEST_CASE("autocast: mm, bmm and matmul equal f32 products of bf16- or f16-rounded operands") {
  const Tensor a = f32_input({7, 33}, 3), b = f32_input({33, 5}, 4);
  const Tensor x = f32_input({3, 6, 17}, 5), y = f32_input({3, 17, 4}, 6);
  const Tensor exact = mm(a, b);
  double errors[2];
  for (const ScalarType dt : {kBFloat16, kFloat16}) {
    CAPTURE(dtype_name(dt));
    auto r = [dt](const Tensor& t) { return testing::rounded(t, dt); };
    Tensor under_mm, under_bmm, under_matmul, under_t;
    {
      AutocastGuard amp(kCPU, true, dt);
      under_mm = mm(a, b);
      under_bmm = bmm(x, y);
      under_matmul = matmul(x, b.narrow(0, 0, 17));
      under_t = mm(b.t(), a.t());  // transposed operands
    }
    CHECK(bitwise_equal(under_mm, mm(r(a), r(b))));
    CHECK(bitwise_equal(under_bmm, bmm(r(x), r(y))));
    CHECK(bitwise_equal(under_matmul, matmul(r(x), r(b.narrow(0, 0, 17)))));
    CHECK(bitwise_equal(under_t, mm(r(b).t(), r(a).t())));
    CHECK(under_mm.dtype() == kFloat32);
    // bf16 keeps 8 bits of mantissa, f16 11: different from f32, within their resolution.
    const double err = relative_error(under_mm, exact);
    CHECK(err > 1e-5);
    CHECK(err < 1e-2);
    errors[dt == kFloat16] = err;
  }
  CHECK(errors[1] < errors[0] / 4);  // f16's 3 more bits show
}

TEST_CASE("autocast: f64 products are untouched") {
  const Tensor a = testing::random_input({5, 9}, 7), b = testing::random_input({9, 4}, 8);
  const Tensor exact = mm(a, b);
  AutocastGuard amp(kCPU);
  CHECK(bitwise_equal(mm(a, b), exact));
}

TEST_CASE("autocast: the backward multiplies in the forward's precision, even outside the guard") {
  const Tensor a0 = f32_input({6, 11}, 9), b0 = f32_input({11, 4}, 10), w = f32_input({6, 4}, 11);
  Tensor a = a0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
  Tensor loss;
  {
    AutocastGuard amp(kCPU);
    loss = (mm(a, b) * w).sum();
  }
  loss.backward();  // the guard is gone; the node remembers
  // d/da = w b^T, d/db = a^T w, each a bf16-operand product.
  CHECK(bitwise_equal(a.grad(), mm(bf16_rounded(w), bf16_rounded(b0).t())));
  CHECK(bitwise_equal(b.grad(), mm(bf16_rounded(a0).t(), bf16_rounded(w))));

  // And a forward without autocast keeps an exact backward inside a guard.
  Tensor c = a0.clone().requires_grad_(true);
  Tensor plain = (mm(c, b0) * w).sum();
  {
    AutocastGuard amp(kCPU);
    plain.backward();
  }
  CHECK(bitwise_equal(c.grad(), mm(w, b0.t())));
}

TEST_CASE("autocast: Linear under the guard is x_bf16 W_bf16^T + b, and an MLP trains like f32") {
  manual_seed(12);
  nn::Linear lin(nn::LinearOptions(13, 6));
  const Tensor x = f32_input({9, 13}, 13);
  Tensor out;
  {
    AutocastGuard amp(kCPU);
    out = lin(x);
  }
  {
    NoGradGuard no_grad;
    CHECK(bitwise_equal(out, mm(bf16_rounded(x), bf16_rounded(lin->weight).t()) + lin->bias));
  }

  // A small regression, 30 Adam steps with and without autocast: the losses follow each
  // other to bf16 accuracy and both fall.
  auto train = [](bool amp) {
    manual_seed(13);
    nn::Sequential net(nn::Linear(nn::LinearOptions(8, 32)), nn::Tanh(), nn::Linear(nn::LinearOptions(32, 2)));
    optim::Adam opt(net->parameters(), optim::AdamOptions(1e-2));
    Generator data{14, 0};
    const Tensor X = randn({64, 8}, kFloat32, &data), Y = randn({64, 2}, kFloat32, &data) * 0.1 + X.narrow(1, 0, 2);
    return testing::train_losses(opt, [&] { return mse_loss(net(X), Y); }, 30, amp);
  };
  const auto f32 = train(false), bf16 = train(true);
  CHECK(f32.back() < 0.5 * f32.front());
  CHECK(bf16.back() < 0.5 * bf16.front());
  for (size_t i = 0; i < f32.size(); ++i) CHECK(std::abs(bf16[i] - f32[i]) <= 0.02 * f32[i] + 1e-3);
  CHECK(bf16 != f32);  // it did run in another precision
}
