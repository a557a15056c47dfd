// f16 as autocast's dtype (engine/autocast.h) together with loss scaling
// (engine/optim/grad_scaler.h), on the CPU reference path: the backward keeps the forward's
// f16 even under a bf16 guard; gradients too small for f16 vanish without a GradScaler and
// survive with one; a scale too large for f16's range makes the first steps overflow, and
// the scaler backs off until the gradients fit, then trains. The bit-level rounding of each
// op under f16 is checked with bf16's in autocast_test, autocast_conv_test and
// autocast_attention_test; the CUDA kernels against these in tests/cuda and tests/emu.
#include <cmath>

#include "harness.h"

using namespace nd;

namespace {

using testing::bitwise_equal, testing::relative_error, testing::rounded;

Tensor f32_input(const Shape& shape, uint64_t seed) { return testing::random_input(shape, seed).to(kFloat32); }

// A Linear(16, 4) without bias (its gradient is a product, so f16 rounding shows) and an input.
struct Layer {
  Tensor w = f32_input({4, 16}, 21).requires_grad_(true).set_name("fc.weight");
  Tensor x = f32_input({8, 16}, 22);
};

}  // namespace

TEST_CASE("autocast f16: the backward multiplies in f16 even when it runs under a bf16 guard") {
  const Tensor a0 = f32_input({6, 11}, 9), b0 = f32_input({11, 4}, 10), g = f32_input({6, 4}, 11);
  Tensor a = a0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
  Tensor loss;
  {
    AutocastGuard f16(kCPU, true, kFloat16);
    loss = (mm(a, b) * g).sum();
  }
  {
    AutocastGuard bf16(kCPU);  // the node remembers f16
    loss.backward();
  }
  CHECK(bitwise_equal(a.grad(), mm(rounded(g, kFloat16), rounded(b0, kFloat16).t())));
  CHECK(bitwise_equal(b.grad(), mm(rounded(a0, kFloat16).t(), rounded(g, kFloat16))));
  CHECK_FALSE(bitwise_equal(a.grad(), mm(rounded(g, kBFloat16), rounded(b0, kBFloat16).t())));
}

TEST_CASE("autocast f16: gradients under f16's range vanish without loss scaling, a GradScaler keeps them") {
  // d loss / d y = 1e-9 for every element: under half of f16's smallest subnormal (6e-8),
  // so the backward's f16 operand dy is 0 and so is the weight's gradient. The model would
  // silently stop training. Scaled by 2^16, dy is 6.6e-5, a normal f16 number.
  const double tiny = 1e-9;
  Layer exact_layer, plain_layer, scaled_layer;
  (mm(exact_layer.x, exact_layer.w.t()).sum() * tiny).backward();  // f32: the truth
  {
    AutocastGuard f16(kCPU, true, kFloat16);
    (mm(plain_layer.x, plain_layer.w.t()).sum() * tiny).backward();
  }
  for (double v : testing::to_vector(plain_layer.w.grad())) REQUIRE(v == 0.0);
  for (double v : testing::to_vector(exact_layer.w.grad())) REQUIRE(v != 0.0);

  optim::SGD opt(std::vector<Tensor>{scaled_layer.w}, optim::SGDOptions(0.1));
  optim::GradScaler scaler;
  {
    AutocastGuard f16(kCPU, true, kFloat16);
    scaler.scale(mm(scaled_layer.x, scaled_layer.w.t()).sum() * tiny).backward();
  }
  scaler.unscale_(opt);
  // Within f16's resolution of the f32 gradient (x rounded to 11 bits; dy is one value).
  const double err = relative_error(scaled_layer.w.grad(), exact_layer.w.grad());
  CHECK(err > 0);
  CHECK(err < 1e-3);
  CHECK(scaler.step(opt));
  scaler.update();
}

TEST_CASE("autocast f16: a scale too large for f16 overflows the first steps, and the scaler backs off and trains") {
  // dy = 10 per element: times 2^16 it is 655360, past f16's 65504, so dy rounds to inf
  // and the weight's gradient is inf. Each skipped step halves the scale; at 2^12 (40960)
  // dy fits and every later step is taken.
  Layer layer;
  const std::vector<double> w0 = testing::to_vector(layer.w);
  optim::SGD opt(std::vector<Tensor>{layer.w}, optim::SGDOptions(1e-3));
  optim::GradScaler scaler;
  std::vector<int64_t> stepped;
  std::vector<double> scales;
  for (int step = 0; step < 6; ++step) {
    opt.zero_grad();
    {
      AutocastGuard f16(kCPU, true, kFloat16);
      scaler.scale(mm(layer.x, layer.w.t()).sum() * 10.0).backward();
    }
    scales.push_back(scaler.get_scale());
    stepped.push_back(scaler.step(opt));
    if (step < 4) CHECK(testing::to_vector(layer.w) == w0);  // a skipped step changes nothing
    scaler.update();
  }
  CHECK(stepped == std::vector<int64_t>{0, 0, 0, 0, 1, 1});
  CHECK(scales == std::vector<double>{65536, 32768, 16384, 8192, 4096, 4096});
  CHECK(testing::to_vector(layer.w) != w0);
  for (double v : testing::to_vector(layer.w)) CHECK(std::isfinite(v));
}
