// CPU-vs-CUDA for conv2d and conv_transpose2d (kernels/cuda/conv.cu): the forward output
// and the gradients of input, weight and bias through autograd against the CPU reference,
// on poisoned allocations (tests/cuda/cuda_compare.h), for DCGAN's discriminator and
// generator layers, odd sizes with stride / padding / dilation / groups, 1x1 kernels and
// bias on and off. Also: f64 matches to double precision, the weight gradient (split-K)
// is bit-identical run to run, and an empty batch still writes zero weight and bias
// gradients. Without a GPU every case
// reports "SKIPPED:" (the index math these kernels run is tested on the CPU in
// tests/kernels/conv_index_test.cpp).
#include <cstring>
#include <vector>

#include "cuda/cuda_compare.h"
#include "harness.h"

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
