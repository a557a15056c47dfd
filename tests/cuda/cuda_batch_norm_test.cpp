// CPU-vs-CUDA for batch normalisation (kernels/cuda/batch_norm.cu through nd::batch_norm,
// nn::BatchNorm2d and nn::SyncBatchNorm): training forward with running-stat updates and
// every gradient, eval forward and backward, affine and track_running_stats off, [N, C]
// and [N, C, H, W] at odd sizes (C = 129, a channel of 2^20 + 3 values in both kernel
// layouts), f32 and f64; SyncBatchNorm at world size 1 against BatchNorm2d on the GPU;
// outputs and statistics bit-identical run to run; zero-size batches. GPU outputs come from poisoned
// allocations, so an unwritten element fails. Without a GPU each case prints "SKIPPED:".
#include <string>
#include <vector>

#include "cuda/cuda_compare.h"
#include "harness.h"
#include "kernels/cpu/batch_norm.h"
#include "kernels/cuda/batch_norm.h"
#include "kernels/cuda/stream.h"

using namespace nd;
using namespace nd::testing::cuda_compare;

namespace {

struct BnCase {
  std::string name;
  Shape shape;
  bool affine = true;
  bool track = true;  // running statistics given (and updated in training)
  ScalarType dtype = kFloat32;
  bool transposed = false;  // x with column-major strides in its last two dims
};

double tolerance(ScalarType dtype) { return dtype == kFloat64 ? 1e-12 : 2e-5; }

// Inputs of one case; on(device) gives the same values there, x, weight and bias as
// leaves that require grad.
struct Inputs {
  Tensor x, weight, bias, running_mean, running_var, grad_out;
  Inputs on(const Device& device) const {
    auto place = [&](const Tensor& t, bool grad) {
      if (!t.defined()) return Tensor();
      return t.to(device).detach().requires_grad_(grad);
    };
    return {place(x, true), place(weight, true), place(bias, true), place(running_mean, false),
            place(running_var, false), place(grad_out, false)};
  }
};

Inputs make_inputs(const BnCase& c, uint64_t seed) {
  const int64_t C = c.shape[1];
  Inputs in;
  // Channels away from zero mean, so that a kernel that forgets to subtract it shows.
  in.x = testing::random_input(c.shape, seed, false, -1, 3).to(c.dtype);
  in.grad_out = testing::random_input(c.shape, seed + 1).to(c.dtype);
  if (c.affine) {
    in.weight = testing::random_input({C}, seed + 2, false, 0.5, 1.5).to(c.dtype);
    in.bias = testing::random_input({C}, seed + 3).to(c.dtype);
  }
  if (c.track) {
    in.running_mean = testing::random_input({C}, seed + 4).to(c.dtype);
    in.running_var = testing::random_input({C}, seed + 5, false, 0.5, 2).to(c.dtype);
  }
  return in;
}

// Forward (training or eval) then backward of sum(y * grad_out) on one device.
Tensor run(const Inputs& in, bool training, bool transposed) {
  // The same values with column-major strides in the last two dims.
  const Tensor x = transposed ? in.x.transpose(-1, -2).contiguous().transpose(-1, -2) : in.x;
  const Tensor y = batch_norm(x, in.running_mean, in.running_var, in.weight, in.bias, training, 0.1, 1e-5);
  (y * in.grad_out).sum().backward();
  return y;
}

void compare_bn(const BnCase& c, bool training, uint64_t seed) {
  CAPTURE(c.name);
  CAPTURE(training);
  PoisonAllocations poison;
  const Inputs base = make_inputs(c, seed);
  const Inputs cpu = base.on(Device(kCPU)), gpu = base.on(kGpu);
  const Tensor y_cpu = run(cpu, training, c.transposed), y_gpu = run(gpu, training, c.transposed);
  const double rel = tolerance(c.dtype);
  const std::string what = c.name + (training ? " training" : " eval");
  check_matches(y_gpu, y_cpu, what + " output", rel);
  check_matches(gpu.x.grad(), cpu.x.grad(), what + " input gradient", rel);
  if (c.affine) {
    check_matches(gpu.weight.grad(), cpu.weight.grad(), what + " weight gradient", rel);
    check_matches(gpu.bias.grad(), cpu.bias.grad(), what + " bias gradient", rel);
  }
  if (c.track) {  // updated in training, untouched in eval
    check_matches(gpu.running_mean, cpu.running_mean, what + " running_mean", rel);
    check_matches(gpu.running_var, cpu.running_var, what + " running_var", rel);
  }
}

// 2^20 + 3 values per channel: hundreds of chunks per channel (more than the combining
// block has threads) and, as the rows of [N, C], more than the chunk cap. Emulated
// (tests/emu), where every CUDA thread is an OS thread, the whole-op cases take minutes at
// that size: they use 2^14 + 3 there (still several chunks, the last partial), and the
// kernel-level statistics case below keeps kHuge on both.
const int64_t kHuge = (int64_t(1) << 20) + 3;
const int64_t kBig = emulated() ? (int64_t(1) << 14) + 3 : kHuge;
const std::string kBigName = emulated() ? "2^14+3" : "2^20+3";

}  // namespace

TEST_CASE("cuda batch_norm: training and eval, forward and every gradient, match the CPU") {
  if (skip_without_gpu()) return;
  const std::vector<BnCase> cases = {
      {"NCHW 3x5x7x9", {3, 5, 7, 9}},
      {"NCHW no affine", {3, 5, 7, 9}, false},
      {"NCHW no running stats", {3, 5, 7, 9}, true, false},
      {"NC 37x129 (S = 1)", {37, 129}},
      {"NCHW C = 129", {2, 129, 3, 5}},
      {"NCHW transposed layout", {3, 5, 7, 9}, true, true, kFloat32, true},
      {"NC " + kBigName + " rows (S = 1, many chunks)", {kBig, 2}},
      {"N=1 C=2 S = " + kBigName + " (many chunks per channel)", {1, 2, kBig}},
      {"NCHW f64", {3, 5, 7, 9}, true, true, kFloat64},
      {"NC f64 no affine", {6, 33}, false, true, kFloat64},
      {"NC f64 no running stats", {5, 3}, true, false, kFloat64},
  };
  uint64_t seed = 100;
  for (const BnCase& c : cases) {
    compare_bn(c, /*training=*/true, seed);
    if (c.track) compare_bn(c, /*training=*/false, seed + 10);  // eval needs running stats
    seed += 100;
  }
}

TEST_CASE("cuda batch_norm: one value per channel in training is refused as on the CPU") {
  if (skip_without_gpu()) return;
  for (const Device& device : {Device(kCPU), kGpu}) {
    CAPTURE(device.str());
    const Tensor x = testing::random_input({1, 3}, 5).to(kFloat32).to(device);
    const Tensor rm = zeros({3}, TensorOptions(kFloat32).device(device));
    const Tensor rv = ones({3}, TensorOptions(kFloat32).device(device));
    CHECK_THROWS_WITH_AS(batch_norm(x, rm, rv, Tensor(), Tensor(), true),
                         doctest::Contains("expected more than 1 value per channel when training"), Error);
    CHECK_NOTHROW(batch_norm(x, rm, rv, Tensor(), Tensor(), false));  // eval is fine
  }
}

TEST_CASE("cuda SyncBatchNorm at world size 1 equals BatchNorm2d on the GPU") {
  if (skip_without_gpu()) return;
  if (dist::world()->size() != 1) {
    MESSAGE("SKIPPED: a one-rank comparison, run without mpirun");
    return;
  }
  for (ScalarType dtype : {kFloat32, kFloat64}) {
    CAPTURE(dtype_name(dtype));
    PoisonAllocations poison;
    nn::BatchNorm2d bn(5);
    nn::SyncBatchNorm sync(5);
    bn->to(dtype);
    bn->to(kGpu);
    sync->to(dtype);
    sync->to(kGpu);
    {
      NoGradGuard no_grad;
      const Tensor w = testing::random_input({5}, 3, false, 0.5, 1.5).to(dtype).to(kGpu);
      bn->weight.copy_(w);
      sync->weight.copy_(w);
    }
    const double rel = tolerance(dtype);
    for (int step = 0; step < 2; ++step) {
      CAPTURE(step);
      const Tensor x0 = testing::random_input({3, 5, 7, 9}, 10 + step, false, -1, 3).to(dtype).to(kGpu);
      const Tensor g = testing::random_input({3, 5, 7, 9}, 20 + step).to(dtype).to(kGpu);
      const Tensor xa = x0.detach().requires_grad_(true), xb = x0.clone().detach().requires_grad_(true);
      const Tensor ya = bn(xa), yb = sync(xb);
      CHECK(yb.grad_fn()->name() == "SyncBatchNormBackward");
      (ya * g).sum().backward();
      (yb * g).sum().backward();
      check_matches(yb, ya, "output", rel);
      check_matches(xb.grad(), xa.grad(), "input gradient", rel);
      check_matches(sync->weight.grad(), bn->weight.grad(), "weight gradient", rel);
      check_matches(sync->bias.grad(), bn->bias.grad(), "bias gradient", rel);
      check_matches(sync->running_mean, bn->running_mean, "running_mean", rel);
      check_matches(sync->running_var, bn->running_var, "running_var", rel);
      CHECK(sync->num_batches_tracked.item<int64_t>() == step + 1);
      bn->zero_grad();
      sync->zero_grad();
    }
    bn->eval();
    sync->eval();
    const Tensor x = testing::random_input({2, 5, 3, 4}, 30).to(dtype).to(kGpu);
    check_matches(sync(x), bn(x), "eval output", rel);
  }
}

TEST_CASE("cuda SyncBatchNorm given a CPU process group says which group CUDA tensors need") {
  if (skip_without_gpu()) return;
  nn::SyncBatchNorm sync(nn::BatchNormOptions(3), dist::world());
  sync->to(kGpu);
  const Tensor x = testing::random_input({4, 3, 2, 2}, 1).to(kFloat32).to(kGpu);
  CHECK_THROWS_WITH_AS(sync(x), doctest::Contains("nccl_world"), Error);
}

TEST_CASE("cuda batch_norm: the same training step twice gives bit-identical outputs and statistics") {
  if (skip_without_gpu()) return;
  for (const Shape& shape : {Shape{3, 5, 7, 9}, Shape{1, 2, kBig}, Shape{kBig, 2}}) {
    CAPTURE(shape_str(shape));
    const Tensor x = testing::random_input(shape, 3, false, -1, 3).to(kFloat32).to(kGpu);
    auto step = [&] {
      // momentum 1: the running statistics become the batch's mean and unbiased variance.
      const Tensor rm = zeros({shape[1]}, TensorOptions(kFloat32).device(kGpu));
      const Tensor rv = ones({shape[1]}, TensorOptions(kFloat32).device(kGpu));
      const Tensor y = batch_norm(x, rm, rv, Tensor(), Tensor(), true, 1.0);
      return std::vector<std::vector<double>>{testing::to_vector(y.cpu()), testing::to_vector(rm.cpu()),
                                              testing::to_vector(rv.cpu())};
    };
    CHECK_MESSAGE(step() == step(), "not bit-identical run to run");
  }
}

// Kernel-level cases: they call kernels::cuda directly, which CUDA builds alone contain.
#ifdef NANODDP_WITH_CUDA

TEST_CASE("cuda batch_norm statistics are bit-identical run to run and match the CPU sums") {
  if (skip_without_gpu()) return;
  struct Layout {
    int64_t N, C, S;
  };
  // Both kernel layouts, one and many chunks per channel.
  for (const Layout l : {Layout{3, 5, 63}, Layout{1, 2, kHuge}, Layout{37, 129, 1}, Layout{kHuge, 2, 1}}) {
    CAPTURE(l.N);
    CAPTURE(l.C);
    CAPTURE(l.S);
    PoisonAllocations poison;
    const Tensor x_cpu = testing::random_input({l.N, l.C, l.S}, 7, false, -1, 3).to(kFloat32);
    const Tensor dy_cpu = testing::random_input({l.N, l.C, l.S}, 8).to(kFloat32);
    const Tensor mean_cpu = testing::random_input({l.C}, 9).to(kFloat32);
    const Tensor x = x_cpu.to(kGpu), dy = dy_cpu.to(kGpu), mean = mean_cpu.to(kGpu);
    cudaStream_t stream = kernels::cuda::use_device(kGpu.index);
    auto stats = [&](bool backward) {
      const Tensor out = empty({2, l.C}, TensorOptions(kFloat64).device(kGpu));
      double* a = out.data_ptr<double>();
      if (backward)
        kernels::cuda::batch_norm_backward_reduce<float>(dy.data_ptr<float>(), x.data_ptr<float>(),
                                                         mean.data_ptr<float>(), l.N, l.C, l.S, a, a + l.C, stream);
      else
        kernels::cuda::batch_norm_channel_stats<float>(x.data_ptr<float>(), l.N, l.C, l.S, a, a + l.C, stream);
      return testing::to_vector(out.cpu());
    };
    for (bool backward : {false, true}) {
      CAPTURE(backward);
      const std::vector<double> first = stats(backward), second = stats(backward);
      CHECK_MESSAGE(first == second, "not bit-identical run to run");
      std::vector<double> ref(2 * l.C);
      if (backward)
        kernels::cpu::batch_norm_backward_reduce<float>(dy_cpu.data_ptr<float>(), x_cpu.data_ptr<float>(),
                                                        mean_cpu.data_ptr<float>(), l.N, l.C, l.S, ref.data(),
                                                        ref.data() + l.C);
      else
        kernels::cpu::batch_norm_channel_stats<float>(x_cpu.data_ptr<float>(), l.N, l.C, l.S, ref.data(),
                                                      ref.data() + l.C);
      check_matches(tensor(first, kFloat64).to(kGpu), tensor(ref, kFloat64), "sums against the CPU", 1e-12);
    }
  }
}

TEST_CASE("cuda batch_norm: an empty batch gives zero sums, and empty inputs launch nothing") {
  if (skip_without_gpu()) return;
  PoisonAllocations poison;
  cudaStream_t stream = kernels::cuda::use_device(kGpu.index);
  for (int64_t S : {1, 6}) {  // both layouts
    CAPTURE(S);
    const Tensor x = empty({0, 4, S}, TensorOptions(kFloat32).device(kGpu));
    const Tensor mean = zeros({4}, TensorOptions(kFloat32).device(kGpu));
    const Tensor out = empty({4, 4}, TensorOptions(kFloat64).device(kGpu));
    double* o = out.data_ptr<double>();
    kernels::cuda::batch_norm_channel_stats<float>(x.data_ptr<float>(), 0, 4, S, o, o + 4, stream);
    kernels::cuda::batch_norm_backward_reduce<float>(x.data_ptr<float>(), x.data_ptr<float>(),
                                                     mean.data_ptr<float>(), 0, 4, S, o + 8, o + 12, stream);
    CHECK(testing::to_vector(out.cpu()) == std::vector<double>(16, 0.0));
  }
  // Eval on an empty batch: an empty output, on both devices alike.
  const Tensor x = empty({0, 3, 2, 2}, TensorOptions(kFloat32).device(kGpu));
  const Tensor rm = zeros({3}, TensorOptions(kFloat32).device(kGpu));
  const Tensor rv = ones({3}, TensorOptions(kFloat32).device(kGpu));
  CHECK(batch_norm(x, rm, rv, Tensor(), Tensor(), false).sizes() == Shape{0, 3, 2, 2});
}

#endif  // NANODDP_WITH_CUDA
