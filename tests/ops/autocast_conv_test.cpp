// Mixed precision (engine/autocast.h) for conv2d and conv_transpose2d on the CPU: under an
// AutocastGuard the forward is, bit for bit, the f32 conv of the bf16-rounded (or, with f16
// as the guard's dtype, f16-rounded) input and weight (the bias added in f32); dx and dw are the f32 kernels on rounded operands (dy
// rounded too) whether the backward runs inside the guard or not, and the bias gradient
// sums the exact dy. f64 tensors, a disabled guard, a CUDA-only guard and a forward run
// outside the guard are bitwise untouched. A small conv net trained with SGD under
// autocast follows the f32 run. The CUDA twin of this path is compared against this one
// in tests/cuda/cuda_conv_test.cpp.
#include <cmath>
#include <functional>
#include <utility>

#include "harness.h"

using namespace nd;

namespace {

using testing::bf16_rounded, testing::bitwise_equal, testing::relative_error, testing::rounded;

// One conv call: (input, weight, bias) -> output, bias possibly undefined.
using ConvFn = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;

struct Case {
  const char* name;
  Shape x, w;
  bool bias;
  ConvFn fn;
};

// conv2d: stride, padding, dilation, groups, bias on and off, odd sizes, unbatched.
const Case kConv2d[] = {
    {"k4 s2 p1 (DCGAN D)", {3, 2, 13, 11}, {5, 2, 4, 4}, true,
     [](const Tensor& x, const Tensor& w, const Tensor& b) { return conv2d(x, w, b, {2}, {1}); }},
    {"k3 stride 2x1, padding 1x2, dilation 2x1, groups 3", {2, 6, 11, 9}, {9, 2, 3, 3}, true,
     [](const Tensor& x, const Tensor& w, const Tensor& b) { return conv2d(x, w, b, {2, 1}, {1, 2}, {2, 1}, 3); }},
    {"1x1, no bias, depth 37", {2, 37, 5, 7}, {3, 37, 1, 1}, false,
     [](const Tensor& x, const Tensor& w, const Tensor& b) { return conv2d(x, w, b); }},
    {"unbatched k3 p1", {4, 7, 6}, {6, 4, 3, 3}, true,
     [](const Tensor& x, const Tensor& w, const Tensor& b) { return conv2d(x, w, b, {1}, {1}); }},
};

// conv_transpose2d: the DCGAN generator's k4 s2 p1, output_padding, dilation, groups.
const Case kConvTranspose2d[] = {
    {"k4 s2 p1 (DCGAN G)", {3, 6, 7, 5}, {6, 4, 4, 4}, true,
     [](const Tensor& x, const Tensor& w, const Tensor& b) { return conv_transpose2d(x, w, b, {2}, {1}); }},
    {"stride 3, dilation 2, groups 2, output_padding 1", {2, 4, 5, 6}, {4, 3, 3, 2}, true,
     [](const Tensor& x, const Tensor& w, const Tensor& b) {
       return conv_transpose2d(x, w, b, {3}, {1}, {1}, 2, {2});
     }},
    {"k1 from 1x1, no bias", {3, 9, 1, 1}, {9, 5, 1, 1}, false,
     [](const Tensor& x, const Tensor& w, const Tensor& b) { return conv_transpose2d(x, w, b); }},
};

struct Run {
  Tensor y, dx, dw, db;
};

// y = fn(x, w, b) and the gradients of sum(y * gy); autocast (to dt) on CPU during the forward
// only when `amp` (the backward always runs outside any guard). No bias when b0 is undefined.
Run run(const Case& c, const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& gy, bool amp,
        ScalarType dt = kBFloat16) {
  const Tensor x = x0.detach().requires_grad_(true), w = w0.detach().requires_grad_(true);
  const Tensor b = c.bias && b0.defined() ? b0.detach().requires_grad_(true) : Tensor();
  Tensor y;
  {
    AutocastGuard guard(kCPU, amp, dt);
    y = c.fn(x, w, b);
  }
  (y * gy).sum().backward();  // dy = gy exactly
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : Tensor()};
}

void check_case(const Case& c, uint64_t seed, ScalarType dt) {
  CAPTURE(c.name);
  CAPTURE(dtype_name(dt));
  const Tensor x = testing::random_input(c.x, seed).to(kFloat32);
  const Tensor w = testing::random_input(c.w, seed + 1).to(kFloat32);
  Tensor b;
  Shape y_shape;
  {
    NoGradGuard no_grad;
    const Tensor y = c.fn(x, w, Tensor());
    b = testing::random_input({c.x.size() == 3 ? y.size(0) : y.size(1)}, seed + 2).to(kFloat32);
    y_shape = y.sizes();
  }
  const Tensor gy = testing::random_input(y_shape, seed + 3).to(kFloat32);

  const Run amp = run(c, x, w, b, gy, true, dt);
  const Run plain = run(c, x, w, b, gy, false);
  // The reference: plain f32 convs of the rounded operands, and dy rounded as the
  // products' operand (rounded(gy) is then dy of sum(y * rounded(gy))).
  const Run ref = run(c, rounded(x, dt), rounded(w, dt), b, rounded(gy, dt), false);
  CHECK(amp.y.dtype() == kFloat32);
  CHECK(bitwise_equal(amp.y, ref.y));
  CHECK(bitwise_equal(amp.dx, ref.dx));
  CHECK(bitwise_equal(amp.dw, ref.dw));
  if (c.bias) CHECK(bitwise_equal(amp.db, plain.db));  // a sum of the exact dy, not a product
  // The reference is not the plain f32 result: bf16 keeps 8 bits (f16 11), so the results
  // differ by about 2^-9 (2^-12) relative, far above f32's 2^-24 and far under 1.
  const std::pair<Tensor, Tensor> pairs[] = {{amp.y, plain.y}, {amp.dx, plain.dx}, {amp.dw, plain.dw}};
  for (const auto& [got, exact] : pairs) {
    const double err = relative_error(got, exact);
    CHECK(err > 1e-5);
    CHECK(err < 1e-2);
  }
}

}  // namespace

TEST_CASE("autocast conv: conv2d forward, dx and dw equal f32 convs of bf16- or f16-rounded operands") {
  uint64_t seed = 100;
  for (const ScalarType dt : {kBFloat16, kFloat16})
    for (const Case& c : kConv2d) check_case(c, seed += 10, dt);
}

TEST_CASE("autocast conv: conv_transpose2d forward, dx and dw equal f32 convs of bf16- or f16-rounded operands") {
  uint64_t seed = 200;
  for (const ScalarType dt : {kBFloat16, kFloat16})
    for (const Case& c : kConvTranspose2d) check_case(c, seed += 10, dt);
}

TEST_CASE("autocast conv: the backward takes the forward's precision, not the guard's at backward time") {
  const Case& c = kConv2d[1];
  const Tensor x0 = testing::random_input(c.x, 1).to(kFloat32), w0 = testing::random_input(c.w, 2).to(kFloat32);
  const Tensor gy = testing::random_input({2, 9, 5, 11}, 3).to(kFloat32);  // the output's shape
  // Forward under autocast, backward inside a guard that turns it off: still bf16.
  {
    const Tensor x = x0.detach().requires_grad_(true), w = w0.detach().requires_grad_(true);
    Tensor loss;
    {
      AutocastGuard amp(kCPU);
      loss = (c.fn(x, w, Tensor()) * gy).sum();
    }
    {
      AutocastGuard off(kCPU, false);
      loss.backward();
    }
    const Run ref = run(c, bf16_rounded(x0), bf16_rounded(w0), Tensor(), bf16_rounded(gy), false);
    CHECK(bitwise_equal(x.grad(), ref.dx));
    CHECK(bitwise_equal(w.grad(), ref.dw));
  }
  // Forward without autocast, backward inside a guard: exact f32.
  {
    const Tensor x = x0.detach().requires_grad_(true), w = w0.detach().requires_grad_(true);
    const Tensor loss = (c.fn(x, w, Tensor()) * gy).sum();
    {
      AutocastGuard amp(kCPU);
      loss.backward();
    }
    const Run plain = run(c, x0, w0, Tensor(), gy, false);
    CHECK(bitwise_equal(x.grad(), plain.dx));
    CHECK(bitwise_equal(w.grad(), plain.dw));
  }
}

TEST_CASE("autocast conv: f64 tensors, a disabled guard and a CUDA-only guard leave the CPU conv exact") {
  const Case& conv = kConv2d[0];
  const Case& tconv = kConvTranspose2d[1];
  for (const Case* c : {&conv, &tconv}) {
    CAPTURE(c->name);
    const Tensor x = testing::random_input(c->x, 11), w = testing::random_input(c->w, 12);  // no gradients
    const Tensor b = testing::random_input({c->fn(x, w, Tensor()).size(1)}, 13);
    // f64 under the guard: bitwise the f64 conv (forward and all gradients).
    const Tensor gy = testing::random_input(c->fn(x, w, b).sizes(), 14);
    const Run f64_amp = run(*c, x, w, b, gy, true), f64_plain = run(*c, x, w, b, gy, false);
    CHECK(f64_amp.y.dtype() == kFloat64);
    CHECK(bitwise_equal(f64_amp.y, f64_plain.y));
    CHECK(bitwise_equal(f64_amp.dx, f64_plain.dx));
    CHECK(bitwise_equal(f64_amp.dw, f64_plain.dw));
    CHECK(bitwise_equal(f64_amp.db, f64_plain.db));
    // f32 with the guard off, and with a guard for CUDA tensors only.
    const Tensor x32 = x.to(kFloat32), w32 = w.to(kFloat32), b32 = b.to(kFloat32);
    const Tensor plain = c->fn(x32, w32, b32);
    {
      AutocastGuard off(kCPU, false);
      CHECK(bitwise_equal(c->fn(x32, w32, b32), plain));
    }
    {
      AutocastGuard cuda_only(kCUDA);
      CHECK(bitwise_equal(c->fn(x32, w32, b32), plain));
    }
  }
}

TEST_CASE("autocast conv: a small conv net trained with SGD under autocast follows f32 training") {
  // An encoder-decoder (conv k3 s2 -> tanh -> conv_transpose k4 s2) fitted to a fixed
  // target, 25 SGD steps with momentum. bf16 rounds each operand by at most 2^-9
  // relative; the rounding errors of the many terms of each sum are independent and
  // mostly cancel, so outputs and gradients move by far less, and the losses of the two
  // runs stay within 3e-4 of each other relative (measured over the 25 steps). The bound
  // 0.5% leaves 15x margin and still catches a wrong gradient, which sends the runs
  // apart by far more. The losses must also differ (it did run in bf16) and both fall.
  auto train = [](bool amp) {
    manual_seed(21);
    nn::Sequential net(nn::Conv2d(nn::Conv2dOptions(3, 8, 3).stride(2).padding(1)), nn::Tanh(),
                       nn::ConvTranspose2d(nn::ConvTranspose2dOptions(8, 3, 4).stride(2).padding(1)));
    optim::SGD opt(net->parameters(), optim::SGDOptions(0.2).momentum(0.9));
    Generator data{22, 0};
    const Tensor X = randn({8, 3, 10, 10}, kFloat32, &data);
    const Tensor Y = tanh(X) * 0.5;
    return testing::train_losses(opt, [&] { return mse_loss(net(X), Y); }, 25, amp);
  };
  const auto f32 = train(false), bf16 = train(true);
  CHECK(f32.back() < 0.5 * f32.front());
  CHECK(bf16.back() < 0.5 * bf16.front());
  for (size_t i = 0; i < f32.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(bf16[i] - f32[i]) <= 0.005 * f32[i]);
  }
  CHECK(bf16 != f32);
}
