// CPU-vs-CUDA for conv2d and conv_transpose2d (kernels/cuda/conv.cu): the forward output
// and the gradients of input, weight and bias through autograd against the CPU reference,
// on poisoned allocations (tests/cuda/cuda_compare.h), for DCGAN's discriminator and
// generator layers, odd sizes with stride / padding / dilation / groups, 1x1 kernels and
// bias on and off. Also: f64 matches to double precision, the weight gradient (split-K)
// is bit-identical run to run, and an empty batch still writes zero weight and bias
// gradients. Under autocast (ConvOperands::kBf16, the tensor-core kernel) all six passes
// match the CPU's bf16- (or f16-) operand reference (tests/ops/autocast_conv_test.cpp pins that one
// down) element by element and are bit-identical run to run; so do the 64-bit index
// kernels, forced (set_conv_index_width). Without a GPU every case
// reports "SKIPPED:" (the index math these kernels run is tested on the CPU in
// tests/kernels/conv_index_test.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_compare.h"
#include "harness.h"
#include "kernels/cuda/conv.h"

using namespace nd;
using namespace nd::testing::cuda_compare;

TEST_CASE("cuda conv: conv2d forward and gradients match the CPU") {
  if (skip_without_gpu()) return;
  run_table({
      {"DCGAN D 1->32 k4 s2 p1 on 28x28", {{3, 1, 28, 28}, {32, 1, 4, 4}, {32}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {2}, {1}); }},
      {"DCGAN D 32->64 k4 s2 p1 on 14x14", {{3, 32, 14, 14}, {64, 32, 4, 4}, {64}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {2}, {1}); }},
      {"DCGAN D 64->1 k7 on 7x7, no bias", {{3, 64, 7, 7}, {1, 64, 7, 7}},
       [](const V& x) { return conv2d(x[0], x[1]); }},
      {"3->5 on 13x13 k3 s2 p1 dilation 2", {{2, 3, 13, 13}, {5, 3, 3, 3}, {5}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {2}, {1}, {2}); }},
      {"groups 3, 6->9 k3 p1", {{2, 6, 11, 9}, {9, 2, 3, 3}, {9}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {1}, {1}, {1}, 3); }},
      {"stride 3x2, padding 0x2, dilation 1x2, groups 2", {{2, 4, 10, 7}, {6, 2, 2, 3}, {6}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {3, 2}, {0, 2}, {1, 2}, 2); }},
      {"1x1, no bias", {{2, 7, 5, 6}, {11, 7, 1, 1}}, [](const V& x) { return conv2d(x[0], x[1]); }},
      {"1x1 stride 2, bias", {{2, 7, 9, 8}, {11, 7, 1, 1}, {11}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {2}); }},
      {"stride larger than the kernel", {{2, 3, 11, 10}, {4, 3, 2, 2}, {4}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {3}); }},
      {"70 output channels, depth 180: past one tile", {{2, 20, 9, 9}, {70, 20, 3, 3}, {70}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {1}, {1}); }},
      {"unbatched input", {{3, 9, 9}, {4, 3, 3, 3}}, [](const V& x) { return conv2d(x[0], x[1], {}, {1}, {1}); }},
  });
}

TEST_CASE("cuda conv: conv_transpose2d forward and gradients match the CPU") {
  if (skip_without_gpu()) return;
  run_table({
      {"DCGAN G 100->64 k4 on 1x1, no bias", {{3, 100, 1, 1}, {100, 64, 4, 4}},
       [](const V& x) { return conv_transpose2d(x[0], x[1]); }},
      {"DCGAN G 64->32 k4 s2 p1 on 7x7", {{3, 64, 7, 7}, {64, 32, 4, 4}, {32}},
       [](const V& x) { return conv_transpose2d(x[0], x[1], x[2], {2}, {1}); }},
      {"DCGAN G 32->1 k4 s2 p1 on 14x14, no bias", {{3, 32, 14, 14}, {32, 1, 4, 4}},
       [](const V& x) { return conv_transpose2d(x[0], x[1], {}, {2}, {1}); }},
      {"one input channel 1->6 k3 s2 p1 (its input and weight gradients: conv2d's of one output channel)",
       {{2, 1, 5, 4}, {1, 6, 3, 3}, {6}}, [](const V& x) { return conv_transpose2d(x[0], x[1], x[2], {2}, {1}); }},
      {"output_padding 1, stride 2", {{2, 6, 7, 7}, {6, 4, 3, 3}, {4}},
       [](const V& x) { return conv_transpose2d(x[0], x[1], x[2], {2}, {1}, {1}); }},
      {"stride 3, dilation 2, groups 2, output_padding 1", {{2, 4, 5, 6}, {4, 3, 3, 2}, {6}},
       [](const V& x) { return conv_transpose2d(x[0], x[1], x[2], {3}, {1}, {1}, 2, {2}); }},
  });
}

TEST_CASE("cuda conv: f64 conv2d and conv_transpose2d match the CPU to double precision") {
  if (skip_without_gpu()) return;
  PoisonAllocations poison;
  // groups 3, stride 2, padding 1, dilation 2 (conv_transpose2d: output_padding 1).
  auto run = [](const Device& d, bool transposed) {
    const Tensor x = testing::random_input({2, 6, 11, 9}, 1).to(d).detach().requires_grad_(true);
    const Tensor w = testing::random_input({transposed ? 6 : 9, transposed ? 3 : 2, 3, 3}, 2).to(d).detach()
                         .requires_grad_(true);
    const Tensor b = testing::random_input({9}, 3).to(d).detach().requires_grad_(true);
    const Tensor y = transposed ? conv_transpose2d(x, w, b, {2}, {1}, {1}, 3, {2}) : conv2d(x, w, b, {2}, {1}, {2}, 3);
    (y * testing::random_input(y.sizes(), 4).to(d)).sum().backward();
    return std::vector<Tensor>{y, x.grad(), w.grad(), b.grad()};
  };
  for (bool transposed : {false, true}) {
    CAPTURE(transposed);
    const auto on_cpu = run(Device(kCPU), transposed), on_gpu = run(kGpu, transposed);
    const char* what[] = {"output", "input gradient", "weight gradient", "bias gradient"};
    for (size_t i = 0; i < on_cpu.size(); ++i) check_matches(on_gpu[i], on_cpu[i], what[i], 1e-13);
  }
}

TEST_CASE("cuda conv: weight gradients (split-K) are bit-identical run to run") {
  if (skip_without_gpu()) return;
  PoisonAllocations poison;
  // Batch 16 of DCGAN's second D layer and second G layer: depth 16*7*7 = 784 against
  // 8 column tiles, so the weight gradient is summed in three chunks.
  const Tensor x_conv = testing::random_input({16, 32, 14, 14}, 1).to(kFloat32);
  const Tensor w_conv = testing::random_input({64, 32, 4, 4}, 2).to(kFloat32);
  const Tensor x_tconv = testing::random_input({16, 64, 7, 7}, 3).to(kFloat32);
  const Tensor w_tconv = testing::random_input({64, 32, 4, 4}, 4).to(kFloat32);
  const Tensor g_conv = testing::random_input({16, 64, 7, 7}, 5).to(kFloat32);
  const Tensor g_tconv = testing::random_input({16, 32, 14, 14}, 6).to(kFloat32);
  // The weight's gradient of sum(op(x, w) * g) on `d`.
  auto wgrad = [](const Device& d, bool transposed, const Tensor& x, const Tensor& w0, const Tensor& g) {
    const Tensor w = w0.to(d).detach().requires_grad_(true);
    const Tensor y = transposed ? conv_transpose2d(x.to(d), w, {}, {2}, {1}) : conv2d(x.to(d), w, {}, {2}, {1});
    (y * g.to(d)).sum().backward();
    return w.grad();
  };
  for (bool transposed : {false, true}) {
    CAPTURE(transposed);
    const Tensor& x = transposed ? x_tconv : x_conv;
    const Tensor& w = transposed ? w_tconv : w_conv;
    const Tensor& g = transposed ? g_tconv : g_conv;
    const Tensor first = wgrad(kGpu, transposed, x, w, g), second = wgrad(kGpu, transposed, x, w, g);
    check_matches(first, wgrad(Device(kCPU), transposed, x, w, g), "weight gradient vs the CPU");
    const Tensor a = first.cpu().contiguous(), b = second.cpu().contiguous();
    REQUIRE(a.numel() == b.numel());
    CHECK_MESSAGE(std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), sizeof(float) * a.numel()) == 0,
                  "two runs of the same weight gradient differ in some bits");
  }
}

TEST_CASE("cuda conv: an empty batch gives an empty output and zero weight and bias gradients") {
  if (skip_without_gpu()) return;
  PoisonAllocations poison;
  auto run = [](const Device& d) {
    const TensorOptions o = TensorOptions(kFloat32).device(d);
    const Tensor x = zeros({0, 3, 8, 8}, o).requires_grad_(true);
    const Tensor w = testing::random_input({4, 3, 3, 3}, 1).to(kFloat32).to(d).detach().requires_grad_(true);
    const Tensor b = testing::random_input({4}, 2).to(kFloat32).to(d).detach().requires_grad_(true);
    const Tensor y = conv2d(x, w, b, {2}, {1});
    y.sum().backward();
    return std::vector<Tensor>{y, x.grad(), w.grad(), b.grad()};
  };
  const auto on_cpu = run(Device(kCPU)), on_gpu = run(kGpu);
  CHECK(on_gpu[0].sizes() == Shape{0, 4, 4, 4});
  check_matches(on_gpu[1], on_cpu[1], "empty input gradient");
  check_matches(on_gpu[2], on_cpu[2], "weight gradient of an empty batch");
  check_matches(on_gpu[3], on_cpu[3], "bias gradient of an empty batch");
}

namespace {

// Under autocast both devices multiply the same bf16 values, and a product of two bf16
// values is exact in f32, so the CUDA and CPU results are sums of the same numbers that
// differ only in the order of their f32 additions (tensor-core fragments, tiles, split-K
// chunks against the CPU's GEMM blocking). An order's error is sum_k d_k S_k over its
// partial sums S_k with |d_k| <= u = 2^-24; the terms here have random signs, so the
// partial sums stay far below sum|a||b| and the error is a few u times sum|a||b| at any
// depth (the kernel run in a CPU emulator: <= 1.5e-7 at depths up to 1024). The bound,
// 1e-5 sum|a||b| per element (160 u), leaves wide room for any order, tensor-core
// accumulation included, yet is 200x under one bf16 rounding (2^-9), which an operand
// left unrounded, or rounded twice, on one side would cost.
struct AmpCase {
  std::string name;
  Shape x, w;
  bool bias;
  Fn fn;  // {input, weight, bias (may be undefined)}
};

struct AmpRun {
  Tensor y, dx, dw, db;
};

// y = fn(x, w, b) with autocast (to dt) on for `d` during the forward, and the gradients of
// sum(y * gy) (so dy = gy); the backward runs outside the guard (its node remembers).
AmpRun amp_run(const AmpCase& c, const Device& d, const Tensor& x0, const Tensor& w0, const Tensor& b0,
               const Tensor& gy, ScalarType dt) {
  const Tensor x = x0.to(d).detach().requires_grad_(true), w = w0.to(d).detach().requires_grad_(true);
  const Tensor b = c.bias ? b0.to(d).detach().requires_grad_(true) : Tensor();
  Tensor y;
  {
    AutocastGuard amp(d.type, true, dt);
    y = c.fn({x, w, b});
  }
  (y * gy.to(d)).sum().backward();
  return {y.detach(), x.grad(), w.grad(), c.bias ? b.grad() : Tensor()};
}

// |on_gpu - on_cpu| <= rel * bound elementwise (bound: sum |a||b| of each result), no NaN.
void check_within(const Tensor& on_gpu, const Tensor& on_cpu, const Tensor& bound, const std::string& what,
                  double rel) {
  REQUIRE_MESSAGE(on_gpu.is_cuda(), what, ": expected a CUDA result, found ", on_gpu.describe());
  REQUIRE_MESSAGE(on_gpu.sizes() == on_cpu.sizes(), what, ": shape ", on_gpu.describe(), " vs ", on_cpu.describe());
  REQUIRE(on_gpu.dtype() == kFloat32);
  const std::vector<double> a = testing::to_vector(on_gpu.cpu()), b = testing::to_vector(on_cpu),
                            m = testing::to_vector(bound);
  size_t bad = 0, first = a.size();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::abs(a[i] - b[i]);
    if (!(err <= rel * m[i])) {  // NaN (an unwritten, poisoned element) fails too
      first = bad++ ? first : i;
    }
    if (m[i] > 0) worst = std::max(worst, err / m[i]);
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", a.size(), " elements off by more than ", rel,
                " sum|a||b| (first at ", first, "); largest err / sum|a||b| = ", worst);
}

void compare_amp_case(const AmpCase& c, uint64_t seed, ScalarType dt) {
  CAPTURE(c.name);
  CAPTURE(dtype_name(dt));
  PoisonAllocations poison;
  const Tensor x = testing::random_input(c.x, seed).to(kFloat32), w = testing::random_input(c.w, seed + 1).to(kFloat32);
  Shape y_shape;
  {
    NoGradGuard no_grad;
    y_shape = c.fn({x, w, Tensor()}).sizes();
  }
  const Tensor b = testing::random_input({y_shape[1]}, seed + 2).to(kFloat32);
  const Tensor gy = testing::random_input(y_shape, seed + 3).to(kFloat32);
  const AmpRun on_cpu = amp_run(c, Device(kCPU), x, w, b, gy, dt), on_gpu = amp_run(c, kGpu, x, w, b, gy, dt);
  // sum |a||b| of every result: the f64 pass on |rounded operands| (all terms >= 0).
  const Tensor ax = abs(testing::rounded(x, dt)).to(kFloat64).requires_grad_(true);
  const Tensor aw = abs(testing::rounded(w, dt)).to(kFloat64).requires_grad_(true);
  const Tensor ab = abs(b).to(kFloat64).requires_grad_(true);
  const Tensor bound_y = c.fn({ax, aw, c.bias ? ab : Tensor()});
  (bound_y * abs(testing::rounded(gy, dt)).to(kFloat64)).sum().backward();
  check_within(on_gpu.y, on_cpu.y, bound_y.detach(), c.name + " forward", 1e-5);
  check_within(on_gpu.dx, on_cpu.dx, ax.grad(), c.name + " input gradient", 1e-5);
  check_within(on_gpu.dw, on_cpu.dw, aw.grad(), c.name + " weight gradient", 1e-5);
  if (c.bias) check_within(on_gpu.db, on_cpu.db, ab.grad(), c.name + " bias gradient (f32)", 1e-5);
  // The same bits on a second run: fixed tiling and split-K order, no atomics.
  const AmpRun again = amp_run(c, kGpu, x, w, b, gy, dt);
  const std::pair<Tensor, Tensor> runs[] = {{on_gpu.y, again.y}, {on_gpu.dx, again.dx}, {on_gpu.dw, again.dw}};
  for (const auto& [first, second] : runs) {
    const Tensor u = first.cpu().contiguous(), v = second.cpu().contiguous();
    CHECK_MESSAGE(std::memcmp(u.data_ptr<float>(), v.data_ptr<float>(), sizeof(float) * u.numel()) == 0,
                  c.name, ": two autocast runs differ in some bits");
  }
}

}  // namespace

TEST_CASE("cuda conv: under autocast all six passes match the CPU's bf16- or f16-operand reference, bit-stable") {
  if (skip_without_gpu()) return;
  const std::vector<AmpCase> cases = {
      // conv2d: forward, dgrad, wgrad. DCGAN D at batch 16: wgrad depth 16*14*14 = 3136
      // and 16*7*7 = 784 against a few column tiles, so split-K runs.
      {"conv2d DCGAN D 1->64 k4 s2 p1 on 28x28", {16, 1, 28, 28}, {64, 1, 4, 4}, true,
       [](const V& v) { return conv2d(v[0], v[1], v[2], {2}, {1}); }},
      {"conv2d DCGAN D 64->128 k4 s2 p1 on 14x14", {16, 64, 14, 14}, {128, 64, 4, 4}, true,
       [](const V& v) { return conv2d(v[0], v[1], v[2], {2}, {1}); }},
      {"conv2d DCGAN D 128->1 k7 on 7x7, no bias", {16, 128, 7, 7}, {1, 128, 7, 7}, false,
       [](const V& v) { return conv2d(v[0], v[1], v[2]); }},
      {"conv2d stride 3x2, padding 0x2, dilation 1x2, groups 2", {2, 4, 10, 7}, {6, 2, 2, 3}, true,
       [](const V& v) { return conv2d(v[0], v[1], v[2], {3, 2}, {0, 2}, {1, 2}, 2); }},
      {"conv2d groups 3, 6->9 k3 p1 on 11x9", {2, 6, 11, 9}, {9, 2, 3, 3}, true,
       [](const V& v) { return conv2d(v[0], v[1], v[2], {1}, {1}, {1}, 3); }},
      {"conv2d 70 output channels, depth 180, 1x1 and 3x3 tails", {3, 20, 9, 9}, {70, 20, 3, 3}, true,
       [](const V& v) { return conv2d(v[0], v[1], v[2], {1}, {1}); }},
      // conv_transpose2d: forward (conv dgrad), dgrad (conv forward), wgrad.
      {"conv_transpose2d DCGAN G 100->256 k7 on 1x1, no bias", {16, 100, 1, 1}, {100, 256, 7, 7}, false,
       [](const V& v) { return conv_transpose2d(v[0], v[1], v[2]); }},
      {"conv_transpose2d DCGAN G 256->128 k4 s2 p1 on 7x7", {16, 256, 7, 7}, {256, 128, 4, 4}, true,
       [](const V& v) { return conv_transpose2d(v[0], v[1], v[2], {2}, {1}); }},
      {"conv_transpose2d DCGAN G 128->1 k4 s2 p1 on 14x14", {16, 128, 14, 14}, {128, 1, 4, 4}, true,
       [](const V& v) { return conv_transpose2d(v[0], v[1], v[2], {2}, {1}); }},
      {"conv_transpose2d stride 3, dilation 2, groups 2, output_padding 1", {2, 4, 5, 6}, {4, 3, 3, 2}, true,
       [](const V& v) { return conv_transpose2d(v[0], v[1], v[2], {3}, {1}, {1}, 2, {2}); }},
  };
  uint64_t seed = 5000;
  for (const AmpCase& c : cases) {
    seed += 10;
    // Emulated (tests/emu), the DCGAN-sized rows take minutes: every CUDA thread is an OS
    // thread. The smaller rows run the same bf16 kernels through groups, strides, dilation,
    // padding and partial tiles; split-K wgrad in bf16, which only the DCGAN rows reach
    // here, is checked by tests/emu/conv_emu_test.cpp ("conv2d wgrad split-K (f32, bf16, f16)").
    if (emulated() && c.name.find("DCGAN") != std::string::npos) continue;
    compare_amp_case(c, seed, kBFloat16);
    compare_amp_case(c, seed + 5, kFloat16);  // the same kernel with __half tiles
  }
}

TEST_CASE("cuda conv: autocast leaves f64 exact and a forward outside it exact in its backward") {
  if (skip_without_gpu()) return;
  PoisonAllocations poison;
  const Tensor x = testing::random_input({2, 6, 11, 9}, 1), w = testing::random_input({9, 2, 3, 3}, 2);
  auto run = [&](const Tensor& x0, const Tensor& w0, bool amp_forward, bool amp_backward) {
    const Tensor xg = x0.to(kGpu).detach().requires_grad_(true), wg = w0.to(kGpu).detach().requires_grad_(true);
    Tensor y;
    {
      AutocastGuard amp(kCUDA, amp_forward);
      y = conv2d(xg, wg, {}, {2}, {1}, {2}, 3);
    }
    AutocastGuard amp(kCUDA, amp_backward);
    y.sum().backward();
    return std::vector<Tensor>{y.detach().cpu(), xg.grad().cpu(), wg.grad().cpu()};
  };
  // f64 under autocast: the same bits as without (the f64 kernel either way).
  const auto f64_amp = run(x, w, true, true), f64_plain = run(x, w, false, false);
  for (size_t i = 0; i < f64_amp.size(); ++i)
    CHECK(testing::to_vector(f64_amp[i]) == testing::to_vector(f64_plain[i]));
  // f32 forward without autocast, backward inside a guard: the exact f32 kernels.
  const Tensor x32 = x.to(kFloat32), w32 = w.to(kFloat32);
  const auto exact_bwd = run(x32, w32, false, true), plain = run(x32, w32, false, false);
  for (size_t i = 0; i < plain.size(); ++i) CHECK(testing::to_vector(exact_bwd[i]) == testing::to_vector(plain[i]));
}

// Kernel level (kernels::cuda, which CUDA builds alone contain): the int64_t walks, which
// only tensors past 2^31 elements take on their own, forced (kernels/cuda/conv.h
// set_conv_index_width) through conv2d and conv_transpose2d in f32 and under autocast.
#ifdef NANODDP_WITH_CUDA

TEST_CASE("cuda conv: the 64-bit index kernels (forced) match the CPU, f32 and autocast") {
  if (skip_without_gpu()) return;
  namespace kc = kernels::cuda;
  struct Restore {
    ~Restore() { kc::set_conv_index_width(kc::ConvIndexWidth::kAuto); }
  } restore;
  kc::set_conv_index_width(kc::ConvIndexWidth::kInt64);
  run_table({
      {"int64 walks: stride 3x2, padding 0x2, dilation 1x2, groups 2", {{2, 4, 10, 7}, {6, 2, 2, 3}, {6}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {3, 2}, {0, 2}, {1, 2}, 2); }},
      {"int64 walks: 70 output channels, depth 180", {{2, 20, 9, 9}, {70, 20, 3, 3}, {70}},
       [](const V& x) { return conv2d(x[0], x[1], x[2], {1}, {1}); }},
      {"int64 walks: conv_transpose2d stride 3, dilation 2, groups 2, output_padding 1",
       {{2, 4, 5, 6}, {4, 3, 3, 2}, {6}},
       [](const V& x) { return conv_transpose2d(x[0], x[1], x[2], {3}, {1}, {1}, 2, {2}); }},
  });
  const AmpCase amp{"int64 walks: conv2d groups 3, 6->9 k3 p1 on 11x9", {2, 6, 11, 9}, {9, 2, 3, 3}, true,
                    [](const V& v) { return conv2d(v[0], v[1], v[2], {1}, {1}, {1}, 3); }};
  compare_amp_case(amp, 7000, kBFloat16);
  compare_amp_case(amp, 7005, kFloat16);
}
#endif
