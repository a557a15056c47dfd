// CPU-vs-CUDA: every op with a CUDA kernel runs the same graph on both devices, forward
// and backward through autograd, on random inputs of odd sizes; outputs on the GPU come
// from allocations poisoned with NaN (set_fill_on_allocate), so an element a kernel
// never writes fails the comparison. Also: the caching allocator's steady state, the
// errors a CUDA tensor mixed with a CPU tensor gives, and non-blocking copies from pinned
// memory (the emulator's view of their pending copies: tests/emu/emulib_runtime_test.cpp).
// Without a GPU every case reports "SKIPPED:" and returns (CTest counts it as skipped).
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cuda/cuda_compare.h"
#include "data/data_loader.h"
#include "harness.h"
#include "kernels/cuda/allocator.h"
#include "kernels/cuda/host_allocator.h"
#include "kernels/cuda/runtime.h"

using namespace nd;
using namespace nd::testing::cuda_compare;


TEST_CASE("cuda ops: elementwise forward and backward match the CPU") {
  if (skip_without_gpu()) return;
  run_table({
      {"add broadcast", {{37, 53}, {53}}, [](const V& x) { return add(x[0], x[1], 2.5); }},
      {"sub broadcast", {{5, 1, 7}, {3, 1}}, [](const V& x) { return sub(x[0], x[1], 0.5); }},
      {"mul broadcast", {{3, 17, 5}, {1, 17, 1}}, [](const V& x) { return x[0] * x[1]; }},
      {"div", {{29, 31}, {29, 31}}, [](const V& x) { return x[0] / x[1]; }, 0.5, 2},
      {"pow tensor", {{13, 9}, {13, 9}}, [](const V& x) { return pow(x[0], x[1]); }, 0.5, 2},
      {"pow scalar", {{13, 9}}, [](const V& x) { return pow(x[0], 3.0); }},
      {"maximum", {{33, 7}, {33, 7}}, [](const V& x) { return maximum(x[0], x[1]); }},
      {"minimum broadcast", {{33, 7}, {7}}, [](const V& x) { return minimum(x[0], x[1]); }},
      {"scalar ops", {{21, 3}}, [](const V& x) { return (2.0 - x[0]) * 3.0 / (x[0] + 4.0) - 1.0; }},
      {"neg", {{129, 3}}, [](const V& x) { return -x[0]; }},
      {"exp", {{129, 3}}, [](const V& x) { return exp(x[0]); }},
      {"log", {{129, 3}}, [](const V& x) { return log(x[0]); }, 0.2, 2},
      {"sqrt", {{129, 3}}, [](const V& x) { return sqrt(x[0]); }, 0.2, 2},
      {"rsqrt", {{129, 3}}, [](const V& x) { return rsqrt(x[0]); }, 0.2, 2},
      {"abs", {{129, 3}}, [](const V& x) { return abs(x[0]); }},
      {"tanh", {{129, 3}}, [](const V& x) { return tanh(x[0]); }},
      {"sigmoid", {{129, 3}}, [](const V& x) { return sigmoid(x[0]); }},
      {"relu", {{129, 3}}, [](const V& x) { return relu(x[0]); }},
      {"leaky_relu", {{129, 3}}, [](const V& x) { return leaky_relu(x[0], 0.2); }},
      {"gelu", {{129, 3}}, [](const V& x) { return gelu(x[0]); }, -3, 3},
      {"gelu tanh", {{129, 3}}, [](const V& x) { return gelu(x[0], "tanh"); }, -3, 3},
      {"clamp", {{129, 3}}, [](const V& x) { return clamp(x[0], -0.5, 0.5); }},
      {"gt", {{17, 5}, {5}}, [](const V& x) { return gt(x[0], x[1]); }, -1, 1, false},
      {"eq", {{17, 5}}, [](const V& x) { return eq(x[0], x[0] * 1.0); }, -1, 1, false},
  });
}

TEST_CASE("cuda ops: reductions and copies and indexing and matmul match the CPU") {
  if (skip_without_gpu()) return;
  run_table({
      {"sum all", {{1031, 7}}, [](const V& x) { return x[0].sum(); }},
      {"sum dim 0", {{37, 53}}, [](const V& x) { return x[0].sum({0}); }},
      {"sum leading dims, two launches", {{3, 100, 33}}, [](const V& x) { return x[0].sum({0, 1}); }},
      {"sum dim 0 of a narrow view", {{37, 53}}, [](const V& x) { return x[0].narrow(1, 2, 40).sum({0}); }},
      {"sum dim 0 of an expanded row", {{1, 70}}, [](const V& x) { return x[0].expand({200, 70}).sum({0}); }},
      {"mean keepdim", {{5, 37, 3}}, [](const V& x) { return x[0].mean({0, 2}, true); }},
      {"var", {{9, 301}}, [](const V& x) { return x[0].var({1}, 1, false); }},
      {"max dim", {{23, 19}}, [](const V& x) { return std::get<0>(max(x[0], 1, false)); }},
      {"argmax", {{23, 19}}, [](const V& x) { return argmax(x[0], 0); }, -1, 1, false},
      {"contiguous of permute", {{3, 5, 7}}, [](const V& x) { return x[0].permute({2, 0, 1}).contiguous(); }},
      {"clone", {{17, 9}}, [](const V& x) { return x[0].clone(); }},
      {"to f64 and back", {{17, 9}}, [](const V& x) { return x[0].to(kFloat64).mul(3.0).to(kFloat32); }},
      {"to bf16 and back", {{17, 9}}, [](const V& x) { return x[0].to(kBFloat16).to(kFloat32); }, -1, 1, false},
      {"to f16 and back", {{17, 9}}, [](const V& x) { return x[0].to(kFloat16).to(kFloat32); }, -1, 1, false},
      {"index_select", {{7, 11, 3}},
       [](const V& x) {
         return index_select(x[0], 1, tensor({4, 0, 10, 4, 7}, TensorOptions(kInt64).device(x[0].device())));
       }},
      {"index_select, index on the cpu", {{7, 11, 3}},
       [](const V& x) { return index_select(x[0], 1, tensor({4, 0, 10, 4, 7}, TensorOptions(kInt64))); }},
      {"cat", {{3, 5}, {3, 2}}, [](const V& x) { return cat({x[0], x[1] * 2.0}, 1); }},
      {"stack", {{4, 3}, {4, 3}}, [](const V& x) { return stack({x[0], x[1]}, 0); }},
      {"mm", {{37, 53}, {53, 29}}, [](const V& x) { return mm(x[0], x[1]); }},
      {"mm transposed", {{53, 37}, {29, 53}}, [](const V& x) { return mm(x[0].t(), x[1].t()); }},
      {"mm empty inner", {{5, 0}, {0, 3}}, [](const V& x) { return mm(x[0], x[1]); }},
      {"bmm", {{3, 17, 33}, {3, 33, 9}}, [](const V& x) { return bmm(x[0], x[1]); }},
      {"matmul broadcast", {{2, 3, 17, 33}, {33, 5}}, [](const V& x) { return matmul(x[0], x[1]); }},
      {"matmul batch broadcast", {{4, 1, 7, 9}, {3, 9, 5}}, [](const V& x) { return matmul(x[0], x[1]); }},
  });
}

TEST_CASE("cuda ops: in-place ops and copy_ into views match the CPU") {
  if (skip_without_gpu()) return;
  PoisonAllocations poison;
  NoGradGuard no_grad;
  const Tensor a = testing::random_input({19, 23}, 7).to(kFloat32), b = testing::random_input({23}, 8).to(kFloat32);
  auto run = [&](const Device& d) {
    Tensor x = a.to(d).clone(), y = b.to(d);
    x.add_(y, 0.5).mul_(y).clamp_(-0.3, 0.3);
    x.div_(3.0).sub_(y, 1.0);
    Tensor z = zeros({23, 19}, TensorOptions(kFloat32).device(d));
    z.t().copy_(x);  // a non-contiguous destination
    Tensor w = empty({4, 5}, TensorOptions(kFloat64).device(d));
    w.fill_(2.5);
    w.narrow(1, 1, 2).zero_();
    return std::vector<Tensor>{x, z, w};
  };
  const auto on_cpu = run(Device(kCPU)), on_gpu = run(kGpu);
  check_matches(on_gpu[0], on_cpu[0], "add_ mul_ clamp_ div_ sub_");
  check_matches(on_gpu[1], on_cpu[1], "copy_ into a transposed view");
  check_matches(on_gpu[2], on_cpu[2], "fill_ and zero_ of a narrow view");
}

TEST_CASE("cuda ops: SGD and Adam steps match the CPU") {
  if (skip_without_gpu()) return;
  auto train = [](const Device& d, int which) {
    manual_seed(5);
    nn::Linear lin(nn::LinearOptions(13, 7));
    lin->to(d);
    std::unique_ptr<optim::Optimizer> opt;
    if (which == 0)
      opt = std::make_unique<optim::SGD>(lin->parameters(),
                                         optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01));
    if (which == 1)
      opt = std::make_unique<optim::Adam>(lin->parameters(), optim::AdamOptions(0.01).weight_decay(0.1).amsgrad(true));
    if (which == 2) {
      optim::AdamWOptions o(0.01);
      o.weight_decay(0.1);
      opt = std::make_unique<optim::AdamW>(lin->parameters(), o);
    }
    const Tensor x = testing::random_input({9, 13}, 3).to(kFloat32).to(d);
    for (int step = 0; step < 3; ++step) {
      opt->zero_grad();
      const Tensor y = lin->forward(x);
      (y * y).mean().backward();
      opt->step();
    }
    return std::vector<Tensor>{lin->weight, lin->bias};
  };
  for (int which : {0, 1, 2}) {
    CAPTURE(which);
    const auto cpu = train(Device(kCPU), which), gpu = train(kGpu, which);
    check_matches(gpu[0], cpu[0], "weight after 3 steps");
    check_matches(gpu[1], cpu[1], "bias after 3 steps");
  }
}

TEST_CASE("cuda GradScaler: unscales on the device, skips what the CPU skips, names the non-finite gradient") {
  if (skip_without_gpu()) return;
  // Step 1 puts an inf into the bias gradient only: the per-tensor device flags must find it
  // there (the weight's flag stays 0), skip the step and halve the scale, as on the CPU.
  auto train = [](const Device& d) {
    manual_seed(6);
    nn::Linear lin(nn::LinearOptions(13, 7));
    lin->to(d);
    lin->bias.set_name("lin.bias");
    optim::Adam opt(lin->parameters(), optim::AdamOptions(0.01));
    optim::GradScaler scaler(optim::GradScalerOptions().init_scale(4096.0).growth_interval(2));
    const Tensor x = testing::random_input({9, 13}, 4).to(kFloat32).to(d);
    std::vector<int64_t> stepped;
    for (int step = 0; step < 4; ++step) {
      opt.zero_grad();
      const Tensor y = lin->forward(x);
      scaler.scale((y * y).mean()).backward();
      if (step == 1) {
        NoGradGuard no_grad;
        lin->bias.grad().narrow(0, 3, 1).fill_(std::numeric_limits<double>::infinity());
      }
      stepped.push_back(scaler.step(opt));
      scaler.update();
    }
    CHECK(stepped == std::vector<int64_t>{1, 0, 1, 1});
    CHECK(scaler.get_scale() == 4096.0);  // halved at step 1, doubled after steps 2 and 3
    return std::vector<Tensor>{lin->weight, lin->bias};
  };
  const auto cpu = train(Device(kCPU)), gpu = train(kGpu);
  check_matches(gpu[0], cpu[0], "weight after 4 steps");
  check_matches(gpu[1], cpu[1], "bias after 4 steps");
  // The warning names the parameter whose device flag was set.
  testing::WarningCapture warnings;
  Tensor w = zeros({3}, TensorOptions(kFloat32).device(kGpu)).requires_grad_().set_name("head.weight");
  Tensor v = zeros({5}, TensorOptions(kFloat32).device(kGpu)).requires_grad_().set_name("head.bias");
  optim::SGD opt(std::vector<Tensor>{w, v}, optim::SGDOptions(0.1));
  optim::GradScaler scaler;
  for (int64_t i = 0; i < optim::GradScaler::kWarnAfterSkips; ++i) {
    w.set_grad(zeros({3}, TensorOptions(kFloat32).device(kGpu)));
    v.set_grad(full({5}, std::nan(""), TensorOptions(kFloat32).device(kGpu)));
    CHECK_FALSE(scaler.step(opt));
    scaler.update();
  }
  REQUIRE(warnings.messages.size() == 1);
  CHECK(warnings.messages[0].find("'head.bias' in SGD") != std::string::npos);
  CHECK(warnings.messages[0].find("head.weight") == std::string::npos);
}

TEST_CASE("cuda allocator: steady training steps make no cudaMalloc and empty_cache releases") {
  if (skip_without_gpu()) return;
  manual_seed(11);
  nn::Sequential mlp(nn::Linear(nn::LinearOptions(31, 64)), nn::ReLU(), nn::Linear(nn::LinearOptions(64, 5)));
  mlp->to(kGpu);
  optim::Adam opt(mlp->parameters(), optim::AdamOptions(1e-3));
  const Tensor x = randn({17, 31}).to(kGpu), target = randn({17, 5}).to(kGpu);
  auto step = [&] {
    opt.zero_grad();
    const Tensor diff = mlp->forward(x) - target;
    (diff * diff).mean().backward();
    opt.step();
  };
  step();
  step();  // the second step creates nothing new either, but lets every size class settle
  const auto before = kernels::cuda::memory_stats(0);
  for (int i = 0; i < 5; ++i) step();
  const auto after = kernels::cuda::memory_stats(0);
  CHECK_MESSAGE(after.num_mallocs == before.num_mallocs, "cudaMalloc calls in steady steps: ",
                after.num_mallocs - before.num_mallocs);
  CHECK(after.num_frees == before.num_frees);
  CHECK(after.num_cache_hits > before.num_cache_hits);
  CHECK(after.peak_allocated_bytes >= after.allocated_bytes);
  CHECK(after.reserved_bytes >= after.allocated_bytes);

  kernels::cuda::empty_cache(0);
  const auto emptied = kernels::cuda::memory_stats(0);
  CHECK(emptied.reserved_bytes == emptied.allocated_bytes);  // only live tensors stay reserved
  CHECK(emptied.num_frees > after.num_frees);
}

TEST_CASE("cuda allocator: size classes waste at most a quarter") {
  // Runs without a GPU: the rounding is plain arithmetic.
  using kernels::cuda::round_size;
  CHECK(round_size(0) == 0);
  CHECK(round_size(1) == 512);
  CHECK(round_size(512) == 512);
  CHECK(round_size(513) == 640);
  CHECK(round_size(1 << 20) == (1 << 20));
  for (size_t n : {size_t(777), size_t(4097), size_t(123457), size_t(10000001)}) {
    CHECK(round_size(n) >= n);
    CHECK(round_size(n) <= n + n / 4 + 512);
  }
}

TEST_CASE("cuda errors: mixing devices names both devices") {
  if (skip_without_gpu()) return;
  const Tensor c = ones({3}), g = ones({3}).to(kGpu);
  const std::string add_msg = testing::error_message([&] { (void)(c + g); });
  CHECK(add_msg.find("cpu") != std::string::npos);
  CHECK(add_msg.find("cuda:0") != std::string::npos);
  const std::string mm_msg = testing::error_message([&] { (void)mm(ones({2, 3}), ones({3, 2}).to(kGpu)); });
  CHECK(mm_msg.find("cpu") != std::string::npos);
  CHECK(mm_msg.find("cuda:0") != std::string::npos);
  // An index on the cpu serves a GPU input (index_select checks it there); an index on
  // a GPU does not serve a cpu input.
  const std::string idx_msg =
      testing::error_message([&] { (void)index_select(c, 0, tensor({0}, TensorOptions(kInt64).device(kGpu))); });
  CHECK(idx_msg.find("cuda:0") != std::string::npos);
  CHECK(idx_msg.find("cpu") != std::string::npos);
}

TEST_CASE("cuda errors: a kernel's own limit names the kernel and the tensor it ran on") {
  if (skip_without_gpu()) return;
  // 11 dimensions that no merge can fold (a reversed permutation of 2s): past the strided
  // kernels' 10 (the CPU kernels have no such limit).
  const Shape shape(11, 2);
  Shape reversed(11);
  for (int64_t d = 0; d < 11; ++d) reversed[d] = 10 - d;
  const Tensor g = ones(shape).to(kGpu).permute(reversed);
  const std::string msg = testing::error_message([&] { (void)g.contiguous(); });
  CHECK(msg.find("at most 10 dimensions are supported, found 11") != std::string::npos);
  CHECK(msg.find("copy_strided") != std::string::npos);
  CHECK(msg.find("(running on [cuda:0 f32 [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]]") != std::string::npos);
  CHECK(ones(shape).permute(reversed).contiguous().sum().item() == 2048);
}

TEST_CASE("cuda autocast: bf16 and f16 tensor-core products match the CPU's rounded-operand reference, with backward") {
  if (skip_without_gpu()) return;
  PoisonAllocations poison;
  auto f32 = [](const Shape& shape, uint64_t seed) { return testing::random_input(shape, seed).to(kFloat32); };
  const Tensor a = f32({37, 53}, 31), b = f32({53, 29}, 32), x = f32({3, 17, 33}, 33), y = f32({3, 33, 9}, 34);
  for (const ScalarType dt : {kBFloat16, kFloat16}) {
    CAPTURE(dtype_name(dt));
    auto run = [&](const Device& d) {
      // detach(): on the CPU, to() returns `a` itself, whose flag must not leak into the CUDA
      // run (a.to(cuda) would then be a non-leaf copy, with no .grad of its own).
      Tensor ad = a.to(d).detach().requires_grad_(true), bd = b.to(d).detach().requires_grad_(true);
      Tensor xd = x.to(d), yd = y.to(d);
      Tensor out_mm, out_bmm, out_t;
      {
        AutocastGuard amp(d.type, true, dt);
        out_mm = mm(ad, bd);
        out_bmm = bmm(xd, yd);
        out_t = mm(bd.t(), ad.t());
      }
      (out_mm * out_mm).sum().backward();
      return std::vector<Tensor>{out_mm, out_bmm, out_t, ad.grad(), bd.grad()};
    };
    const auto on_cpu = run(Device(kCPU)), on_gpu = run(kGpu);
    // The same bf16 operands and f32 accumulation: only the order of the sums differs.
    const char* names[] = {"mm", "bmm", "mm of transposes", "grad a", "grad b"};
    for (size_t i = 0; i < on_cpu.size(); ++i)
      check_matches(on_gpu[i], on_cpu[i], std::string("autocast ") + names[i], 1e-5);
  }
}

TEST_CASE("cuda matmul: TF32 is off by default and close when allowed") {
  if (skip_without_gpu()) return;
  CHECK_FALSE(kernels::cuda::allow_tf32());
  const Tensor a = testing::random_input({64, 96}, 21).to(kFloat32);
  const Tensor b = testing::random_input({96, 48}, 22).to(kFloat32);
  const Tensor ref = mm(a, b);
  kernels::cuda::set_allow_tf32(true);
  const Tensor tf32 = mm(a.to(kGpu), b.to(kGpu));
  kernels::cuda::set_allow_tf32(false);
  check_matches(tf32, ref, "mm with TF32", 5e-3);
  check_matches(mm(a.to(kGpu), b.to(kGpu)), ref, "mm without TF32");
}

TEST_CASE("cuda pinned memory: non-blocking copies from one reused pinned buffer each see their own values") {
  if (skip_without_gpu()) return;
  // One pinned buffer refilled while the copies of earlier values may still be queued: each
  // refill (an in-place write) waits for the copy that reads the buffer, so every device
  // tensor holds the value of its own step, and the sums on the device agree.
  // 4 MiB: long enough a DMA for a refill to overtake it (emulated: no DMA, fewer threads).
  const int64_t n = emulated() ? 4099 : 1 << 20;
  const Tensor buffer = empty({n}, TensorOptions(kFloat32).pinned_memory(true));
  REQUIRE(buffer.is_pinned());
  std::vector<Tensor> sums;
  for (int step = 0; step < 6; ++step) {
    buffer.fill_(step + 1);
    sums.push_back(buffer.to(kGpu, /*non_blocking=*/true).sum());
  }
  for (int step = 0; step < 6; ++step) CHECK(sums[step].item() == doctest::Approx(double(step + 1) * n));
  CHECK(kernels::cuda::pinned_memory_stats().num_host_allocs >= 1);
}

TEST_CASE("cuda pinned memory: a pin_memory DataLoader gives pinned batches equal to the pageable loader's") {
  if (skip_without_gpu()) return;
  data::Dataset ds{testing::random_input({37, 1, 4, 4}, 5).to(kFloat32), arange(0, 37, 1, TensorOptions(kInt64))};
  auto options = data::DataLoaderOptions(8).shuffle(true).seed(3);
  data::DataLoader pageable(ds, options), pinned(ds, options.pin_memory(true));
  int batches = 0;
  for (auto a = pageable.next(), b = pinned.next(); a && b; a = pageable.next(), b = pinned.next(), ++batches) {
    CHECK(!a->images.is_pinned());
    CHECK(b->images.is_pinned());
    CHECK(b->labels.is_pinned());
    const Tensor on_gpu = b->images.to(kGpu, /*non_blocking=*/true);
    CHECK(testing::to_vector(on_gpu.cpu()) == testing::to_vector(a->images));
    CHECK(testing::to_vector(b->labels) == testing::to_vector(a->labels));
  }
  CHECK(batches == 5);
}
