// The host side of the CUDA backend under the emulator (nanoddp_emulib, tests/emu/README.md):
// the REAL kernels/cuda/{runtime,stream,allocator,host_allocator}.cpp against the runtime
// stand-in include/cuda_runtime.h, which counts the calls it receives. What tests/cuda cannot
// see from its tensors: how many cudaMalloc calls a steady step makes, how many kernels it
// launches and where it makes the host wait for the device, the allocator's out-of-memory
// path, the errors a bad device index or a destroyed event gives, and (with events held
// pending) which pinned blocks a non-blocking copy keeps from reuse and from host writes.
// The collectives' side: emulib_collectives_test.cpp.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <vector>

#include "harness.h"
#include "kernels/cuda/allocator.h"
#include "kernels/cuda/host_allocator.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream.h"
#include "models/dcgan.h"
#include "models/mae.h"

using namespace nd;
namespace kc = nd::kernels::cuda;

namespace {
const Device kGpu(kCUDA, 0);
}

TEST_CASE("emulib: one emulated device, and a device index beyond it is an nd::Error naming the device") {
  CHECK(kc::built_with_cuda());
  CHECK(kc::device_count() == 1);
  CHECK(kc::unavailable_reason() == "available");
  CHECK(cuda::is_available());
  const std::string msg = testing::error_message([] { (void)ones({3}).to(Device(kCUDA, 1)); });
  CHECK(msg.find("cuda:1") != std::string::npos);
  CHECK(msg.find("only 1") != std::string::npos);
  // Past the engine's own check: the runtime's error, and nothing left behind for the next
  // kernel launch to report (kernels/cuda/stream.cpp check() clears the thread's last error;
  // it did not, and the next op failed with "kernel launch failed in copy_strided:
  // cudaErrorInvalidDevice").
  const std::string set_msg = testing::error_message([] { (void)kc::use_device(-1); });
  CHECK(set_msg == "cudaSetDevice failed in cuda:-1: cudaErrorInvalidDevice (invalid device ordinal)");
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK(testing::to_vector((ones({3}).to(kGpu) + 1).cpu()) == std::vector<double>{2, 2, 2});
}

TEST_CASE("emulib: copies host -> device -> device -> host round-trip through pinned memory") {
  const Tensor x = testing::random_input({1000, 37}, 7).to(kFloat32);
  const emu_rt::Stats before = emu_rt::stats();
  const Tensor g = x.to(kGpu);  // through a pinned block of its own, without waiting
  CHECK(emu_rt::stats().host_waits == before.host_waits);
  const Tensor g2 = g.clone();  // device -> device
  const Tensor back = g2.cpu();  // through the staging buffer, waiting for the device
  CHECK(emu_rt::stats().host_waits == before.host_waits + 1);
  CHECK(testing::to_vector(back) == testing::to_vector(x));
  const emu_rt::Stats after = emu_rt::stats();
  CHECK(after.memcpys >= before.memcpys + 2);  // at least the host -> device and device -> host copies
  // At most the block for the upload and the process's one staging buffer (either may be
  // there from an earlier case).
  CHECK(after.host_allocs <= before.host_allocs + 2);
  // Beyond 16 MiB, the upload goes through the staging buffer in chunks, each waited for.
  const Tensor big = zeros({(16 << 20) / 4 + 5});
  const long waits = emu_rt::stats().host_waits;
  CHECK(testing::to_vector(big.to(kGpu).sum()) == std::vector<double>{0.0});
  CHECK(emu_rt::stats().host_waits == waits + 2 + 1);  // two chunks, then sum()'s read back
}

TEST_CASE("emulib: a steady training step makes no cudaMalloc, and empty_cache returns every cached block") {
  manual_seed(3);
  nn::Linear layer(nn::LinearOptions(48, 32));
  layer->to(kGpu);
  optim::Adam opt(layer->parameters(), optim::AdamOptions(1e-3));
  const Tensor x = testing::random_input({16, 48}, 1).to(kFloat32).to(kGpu);
  const Tensor y = testing::random_input({16, 32}, 2).to(kFloat32).to(kGpu);
  auto step = [&] {
    opt.zero_grad();
    Tensor loss = mse_loss(layer(x), y);
    loss.backward();
    opt.step();
    return loss.item<float>();
  };
  step();  // allocates the optimizer state and fills the cache
  step();
  const emu_rt::Stats s0 = emu_rt::stats();
  const kc::AllocatorStats a0 = kc::memory_stats(0);
  for (int i = 0; i < 3; ++i) step();
  const emu_rt::Stats s1 = emu_rt::stats();
  const kc::AllocatorStats a1 = kc::memory_stats(0);
  CHECK(s1.mallocs == s0.mallocs);  // the emulated runtime saw no cudaMalloc ...
  CHECK(a1.num_mallocs == a0.num_mallocs);  // ... and the allocator counted none
  CHECK(a1.num_cache_hits > a0.num_cache_hits);
  CHECK(a1.allocated_bytes == a0.allocated_bytes);
  // The allocator's count is the runtime's: every cudaMalloc it made is one the stand-in saw.
  CHECK(a1.num_mallocs <= s1.mallocs);
  // The public view (nd::cuda::memory_stats, which the apps log as cuda_mallocs) is the same.
  const cuda::MemoryStats m1 = cuda::memory_stats(kGpu);
  CHECK(m1.num_mallocs == a1.num_mallocs);
  CHECK(m1.num_cache_hits == a1.num_cache_hits);
  CHECK(m1.allocated_bytes == a1.allocated_bytes);
  CHECK(m1.reserved_bytes == a1.reserved_bytes);
  kc::empty_cache(0);
  const kc::AllocatorStats a2 = kc::memory_stats(0);
  CHECK(a2.reserved_bytes == a2.allocated_bytes);  // blocks are never split: reserved = live
  CHECK(int64_t(emu_rt::device_bytes_in_use(0)) >= a2.reserved_bytes);
}

// The host blocks on the GPU only where it reads a value: the losses' item(). Anything
// else (a buffer read back, a copy to the device that waits for the queue) would drain
// the queue mid-step and leave the GPU idle while the host issues the next kernels.
TEST_CASE("emulib: a steady DCGAN or MAE training step waits for the device only in its loss item() calls, and launches a known number of kernels") {
  long launches = 0;  // of the measured step
  auto waits_of = [&](const std::function<void()>& step) {
    step();  // optimizer state, caches
    const long before = emu_rt::stats().host_waits, launches_before = emu_launches;
    step();
    launches = emu_launches - launches_before;
    return emu_rt::stats().host_waits - before;
  };
  SUBCASE("DCGAN (apps/train_gan's step: BatchNorm in G and D, D called three times, two Adams)") {
    manual_seed(5);
    models::DCGANGenerator G(8, 4);
    models::DCGANDiscriminator D(4);
    G->to(kGpu);
    D->to(kGpu);
    optim::Adam opt_g(G->parameters(), optim::AdamOptions(2e-4)), opt_d(D->parameters(), optim::AdamOptions(2e-4));
    const Tensor real = (rand({2, 1, 28, 28}) * 2.0 - 1.0).to(kGpu);
    auto bce = [](const Tensor& logits, bool real_label) {
      return binary_cross_entropy_with_logits(logits, real_label ? ones_like(logits) : zeros_like(logits));
    };
    const long waits = waits_of([&] {
      const Tensor fake = G(randn({2, 8}).to(kGpu));
      opt_d.zero_grad();
      const Tensor loss_d = bce(D(real), true) + bce(D(fake.detach()), false);
      loss_d.backward();
      opt_d.step();
      opt_g.zero_grad();
      const Tensor loss_g = bce(D(fake), true);
      loss_g.backward();
      opt_g.step();
      (void)loss_d.item();
      (void)loss_g.item();
    });
    CHECK(waits == 2);
    // The step's launches (bench/RESULTS.md lists them): 128 before 2026-12-02, 113 since,
    // 98 since batch norm's statistics kernel finishes mean/invstd (and applies them: these
    // channels fit a block) and its gradient sums the weight and bias gradients, 93 since
    // those sums compute dx too (one launch per backward: 3 through D's batch norm, 2
    // through G's; kernels/cuda/batch_norm.cu), 94 since split-K's chunks may be 128 deep
    // (conv.cu kMinChunk, was 256): G.main.0's conv_transpose2d forward (depth 8 x 49 = 392)
    // now runs as 3 chunks on 6 blocks, not 1 chunk on 2, plus the launch that sums them;
    // 84 since Sequential runs each BatchNorm2d with the ReLU / LeakyReLU after it in one
    // pass (nn::BatchNorm2dImpl::forward_activated): G's 2 pairs once and D's pair three
    // times forward (-5), the same 5 backward (-5).
    CHECK(launches == 84);
  }
  SUBCASE("MAE (apps/train_mae's step: masking noise on the host, AdamW)") {
    manual_seed(6);
    models::MAEConfig config;  // tiny's layers, one block and one head each (emulated attention is slow)
    config.depth = 1;
    config.num_heads = config.decoder_num_heads = 1;
    models::MAE mae(config);
    mae->to(kGpu);
    optim::AdamW opt(mae->parameters(), optim::AdamWOptions(1e-3));
    const Tensor images = (rand({2, 1, 28, 28}) * 2.0 - 1.0).to(kGpu);
    const long waits = waits_of([&] {
      opt.zero_grad();
      const Tensor loss = mae->forward(images, rand({2, mae->config.num_patches()})).loss;
      loss.backward();
      opt.step();
      (void)loss.item();
    });
    CHECK(waits == 1);
    // 185 before this test counted them (2026-12-02); 180 with number operands by value,
    // 152 with the packed self-attention projection and slices' gradients added in place,
    // 141 with linear's weight gradient made contiguous (no copy in AccumulateGrad), 128
    // with the bias gradients' sums over leading dims read in place (sum_columns), 129
    // since the patch embedding is models_mae.py's strided Conv2d (one launch more than
    // the patch copy and Linear it replaced).
    CHECK(launches == 129);
  }
}

TEST_CASE("emulib: a BatchNorm training forward launches its statistics (applied in the same kernel when a block holds a channel) and one counter add") {
  nn::BatchNorm2d bn(nn::BatchNormOptions(4));
  bn->to(kGpu);
  const Tensor x = testing::random_input({2, 4, 3, 3}, 15).to(kFloat32).to(kGpu);
  long launches = emu_launches;
  (void)bn(x);
  // 7 until num_batches_tracked stopped going through f64 and back, 4 until the statistics
  // kernel finished mean and invstd itself and applied them (kernels/cuda/batch_norm.cu).
  CHECK(emu_launches - launches == 2);
  CHECK(bn->num_batches_tracked.item<int64_t>() == 1);
  // 2 * 48 * 48 = 4608 values per channel: two blocks each, so apply is a launch of its own.
  const Tensor split = testing::random_input({2, 4, 48, 48}, 16).to(kFloat32).to(kGpu);
  launches = emu_launches;
  (void)bn(split);
  CHECK(emu_launches - launches == 3);
}

TEST_CASE("emulib: an op with a number operand is one launch, and so is fill_") {
  const Tensor x = testing::random_input({3, 5}, 16).to(kFloat32).to(kGpu).requires_grad_();
  const Tensor cpu = x.detach().to(kCPU);
  auto launches_of = [](const std::function<Tensor()>& op) {
    const long before = emu_launches;
    const Tensor y = op();
    return std::pair{emu_launches - before, y};
  };
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops = {
      {"x * 2", [](const Tensor& t) { return t * 2.0; }},   {"x + eps", [](const Tensor& t) { return t + 1e-5; }},
      {"1 - x", [](const Tensor& t) { return 1.0 - t; }},   {"x / 3", [](const Tensor& t) { return t / 3.0; }},
      {"2 / x", [](const Tensor& t) { return 2.0 / t; }},   {"x - 0.5", [](const Tensor& t) { return t - 0.5; }},
      {"x ^ 3", [](const Tensor& t) { return pow(t, 3.0); }},
  };
  for (const auto& entry : ops) {
    INFO(entry.first);
    const auto& op = entry.second;
    const auto [n, y] = launches_of([&] { return op(x); });
    CHECK(n == 1);  // was 2: the number's fill, then the binary kernel
    CHECK(testing::bitwise_equal(y.to(kCPU), op(cpu)));
  }
  // The backward of x * 2 is one launch as well (g * 2), after the seed's fill.
  const Tensor y = x * 2.0;
  const long before = emu_launches;
  y.backward(ones_like(y));
  CHECK(emu_launches - before == 2);
  CHECK(testing::bitwise_equal(x.grad().to(kCPU), full({3, 5}, 2.0)));
  Tensor z = zeros({4, 4}, kFloat32).to(kGpu);
  const long fill_before = emu_launches;
  z.fill_(1.5);
  z.zero_();
  CHECK(emu_launches - fill_before == 2);  // was 4: a scalar's fill, then a copy, each time
  z.narrow(1, 1, 2).fill_(3.0);            // not contiguous: the copy of a filled scalar
  CHECK(testing::bitwise_equal(z.to(kCPU).sum(), scalar_tensor(24.0)));
}

TEST_CASE("emulib: SGD, Adam and AdamW update every GPU parameter of a group in one kernel launch, with no upload in a steady step") {
  manual_seed(4);
  nn::Linear a(nn::LinearOptions(8, 16)), b(nn::LinearOptions(16, 4));
  a->to(kGpu);
  b->to(kGpu);
  std::vector<Tensor> params = a->parameters();
  for (const Tensor& p : b->parameters()) params.push_back(p);
  const Tensor x = testing::random_input({5, 8}, 3).to(kFloat32).to(kGpu);
  auto check_one_launch = [&](optim::Optimizer& opt) {
    INFO(opt.name());
    auto backward = [&] {
      opt.zero_grad();
      b(a(x)).pow(2).sum().backward();
    };
    backward();
    opt.step();  // creates the state buffers (Adam's are filled on the device: launches of their own)
    backward();
    const long launches = emu_launches, copies = emu_rt::stats().memcpys;
    opt.step();
    CHECK(emu_launches == launches + 1);  // four parameters, one multi-tensor step (Adam's counting its steps)
    // Its table of tensors (pointers, lengths) stayed on the device from the first step.
    CHECK(emu_rt::stats().memcpys == copies);
  };
  optim::SGD sgd(params, optim::SGDOptions(1e-2).momentum(0.9));
  check_one_launch(sgd);
  optim::Adam adam(params, optim::AdamOptions(1e-2));
  check_one_launch(adam);
  optim::AdamW adamw(params, optim::AdamWOptions(1e-2));
  check_one_launch(adamw);
  // The GradScaler's unscale: one launch for the four gradients, besides its flags' fill.
  optim::GradScaler scaler;
  adamw.zero_grad();
  scaler.scale(b(a(x)).pow(2).sum()).backward();
  const long launches = emu_launches;
  scaler.unscale_(adamw);
  CHECK(emu_launches == launches + 2);  // zeros() for the flags, then the unscale
}

TEST_CASE("emulib: out of device memory frees the cache, retries, then throws naming the request") {
  kc::empty_cache(0);
  const size_t in_use = emu_rt::device_bytes_in_use(0);
  // Room for one 1 MiB block and not two.
  emu_rt::set_device_memory_limit(0, in_use + (size_t(3) << 19));
  {
    const kc::AllocatorStats a0 = kc::memory_stats(0);
    { const Tensor a = empty({1 << 18}, TensorOptions(kFloat32).device(kGpu)); }  // 1 MiB, now cached
    // Another size class: the cached 1 MiB block is in the way until the retry frees it.
    const Tensor b = empty({(1 << 18) + (1 << 16)}, TensorOptions(kFloat32).device(kGpu));
    CHECK(kc::memory_stats(0).num_frees == a0.num_frees + 1);
    const std::string msg = testing::error_message([] { (void)empty({1 << 18}, TensorOptions(kFloat32).device(kGpu)); });
    CHECK(msg.find("CUDA out of memory") != std::string::npos);
    CHECK(msg.find("1048576 bytes on cuda:0") != std::string::npos);
  }
  emu_rt::set_device_memory_limit(0, SIZE_MAX);
  CHECK_NOTHROW((void)empty({1 << 18}, TensorOptions(kFloat32).device(kGpu)));
  CHECK(cudaGetLastError() == cudaSuccess);  // the allocator cleared the error it handled
}

TEST_CASE("emulib: events and streams behave as CUDA's, errors as nd::Error") {
  kc::Event e(0);
  CHECK(e.query());  // never recorded: complete, as in CUDA
  e.record(kc::compute_stream(0));
  e.wait(kc::comm_stream(0));
  e.synchronize();
  CHECK(e.query());
  kc::Event moved(std::move(e));
  CHECK(moved.query());
  // Work still queued: query() says so and leaves no error behind for the next launch
  // (the stand-in keeps cudaErrorNotReady as the last error, as PyTorch assumes CUDA may).
  emu_rt::set_hold_events(true);
  moved.record(kc::compute_stream(0));
  CHECK(!moved.query());
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  moved.synchronize();
  CHECK(moved.query());
  emu_rt::set_hold_events(false);
  // A kernel launched on a stream of another device than the current one: the launch
  // error surfaces at check_launch, as cudaGetLastError would report it.
  CHECK(cudaSetDevice(0) == cudaSuccess);
  const std::string msg = testing::error_message([] { kc::check(cudaErrorInvalidResourceHandle, "cudaEventRecord", "test"); });
  CHECK(msg == "cudaEventRecord failed in test: cudaErrorInvalidResourceHandle (invalid resource handle)");
  // The stand-in's own argument checks.
  cudaEvent_t raw = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&raw, cudaEventDisableTiming) == cudaSuccess);
  CHECK(cudaEventDestroy(raw) == cudaSuccess);
  CHECK(cudaEventQuery(raw) == cudaErrorInvalidResourceHandle);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice);
  std::vector<char> host(128);
  CHECK(cudaMemsetAsync(host.data(), 0, host.size(), nullptr) == cudaErrorInvalidValue);  // not device memory
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, 64) == cudaSuccess);
  CHECK(cudaMemcpyAsync(dev, host.data(), 65, cudaMemcpyHostToDevice, nullptr) == cudaErrorInvalidValue);  // past the end
  CHECK(cudaMemcpyAsync(host.data(), dev, 64, cudaMemcpyHostToDevice, nullptr) == cudaErrorInvalidValue);  // reversed
  CHECK(cudaMemcpyAsync(dev, host.data(), 64, cudaMemcpyHostToDevice, nullptr) == cudaSuccess);
  CHECK(cudaMemcpyAsync(host.data(), dev, 64, cudaMemcpyDeviceToHost, nullptr) == cudaSuccess);
  CHECK(cudaFree(host.data()) == cudaErrorInvalidValue);
  CHECK(cudaFree(dev) == cudaSuccess);
  CHECK(cudaFree(dev) == cudaErrorInvalidValue);  // twice
  cudaGetLastError();
}

TEST_CASE("emulib: a pinned block is not reused, nor overwritten by the host, while a non-blocking copy reads it") {
  const Tensor x = testing::random_input({257, 3}, 11).to(kFloat32);
  Tensor pinned = x.pin_memory();
  CHECK(pinned.is_pinned());
  CHECK(!x.is_pinned());
  CHECK(pinned.pin_memory().storage() == pinned.storage());  // pinned already: itself
  CHECK(testing::to_vector(pinned) == testing::to_vector(x));
  CHECK(testing::to_vector(pinned * 2) == testing::to_vector(x * 2));  // a CPU tensor like any other
  const kc::HostAllocatorStats s0 = kc::pinned_memory_stats();

  emu_rt::set_hold_events(true);  // the "GPU" has not run the copies queued from here on
  const long copies = emu_rt::stats().memcpys;
  const Tensor g = pinned.to(kGpu, /*non_blocking=*/true);
  const Tensor g_rows = pinned.narrow(0, 5, 100).to(kGpu, /*non_blocking=*/true);  // inside the block
  CHECK(emu_rt::stats().memcpys == copies + 2);  // straight from the block, not through staging
  CHECK(kc::pinned_memory_stats().num_pending_copies == s0.num_pending_copies + 2);
  // Pageable memory: copied into a pinned block of its own (another size class here) and
  // queued the same way, so the host may overwrite its bytes at once.
  const Tensor pageable = testing::random_input({50, 3}, 12).to(kFloat32);
  const std::vector<double> pageable_values = testing::to_vector(pageable);
  const Tensor g_pageable = pageable.to(kGpu);
  CHECK(kc::pinned_memory_stats().num_pending_copies == s0.num_pending_copies + 3);
  pageable.fill_(-1.0);

  // Dropped while its copies are pending: a request of its size gets another block.
  void* block = pinned.storage()->data();
  pinned = Tensor();
  Tensor other = empty({257, 3}, TensorOptions(kFloat32).pinned_memory(true));
  CHECK(other.storage()->data() != block);
  CHECK(cudaPeekAtLastError() == cudaSuccess);  // the cudaErrorNotReady answers were cleared
  // Once the copies have run, the next request of that size reuses the block.
  emu_rt::complete_events();
  const int64_t hits = kc::pinned_memory_stats().num_cache_hits;
  Tensor again = empty({257, 3}, TensorOptions(kFloat32).pinned_memory(true));
  CHECK(again.storage()->data() == block);
  CHECK(kc::pinned_memory_stats().num_cache_hits == hits + 1);

  // An in-place write to a pinned tensor first waits for the copy that reads it.
  again.fill_(0.5);
  const Tensor g_again = again.to(kGpu, /*non_blocking=*/true);
  const long waits = emu_rt::stats().event_waits;
  const int64_t pending = kc::pinned_memory_stats().num_pending_copies;
  again.add_(1.0);
  CHECK(emu_rt::stats().event_waits == waits + 1);
  CHECK(kc::pinned_memory_stats().num_pending_copies == pending - 1);
  emu_rt::set_hold_events(false);
  CHECK(testing::to_vector(g_pageable.cpu()) == pageable_values);

  CHECK(testing::to_vector(g.cpu()) == testing::to_vector(x));
  CHECK(testing::to_vector(g_rows.cpu()) == testing::to_vector(x.narrow(0, 5, 100)));
  CHECK(testing::to_vector(g_again.cpu()) == std::vector<double>(257 * 3, 0.5));

  // empty_pinned_cache frees the released blocks (their copies are done or waited for).
  other = Tensor();
  again = Tensor();
  const kc::HostAllocatorStats before = kc::pinned_memory_stats();
  CHECK(before.cached_bytes > 0);
  kc::empty_pinned_cache();
  const kc::HostAllocatorStats after = kc::pinned_memory_stats();
  CHECK(after.cached_bytes == 0);
  CHECK(after.num_host_frees > before.num_host_frees);
  CHECK(emu_rt::stats().host_frees >= after.num_host_frees);
}

TEST_CASE("emulib: pinned memory errors name the tensor and the device") {
  const Tensor g = ones({4}).to(kGpu);
  CHECK(testing::error_message([&] { (void)g.pin_memory(); }) ==
        "pin_memory: expected a cpu tensor, found " + g.describe() + "; only host memory can be pinned");
  CHECK(testing::error_message([] { (void)empty({4}, TensorOptions(kFloat32).device(kGpu).pinned_memory(true)); }) ==
        "pinned memory is host memory: expected device cpu, found cuda:0");
  const data::Dataset ds{zeros({4, 1, 2, 2}), zeros({4}, TensorOptions(kInt64))};
  auto pinned = data::DataLoaderOptions(2).pin_memory(true);
  CHECK(testing::error_message([&] { data::DataLoader l(ds, pinned.pin_memory_device(Device(kCPU))); }) ==
        "DataLoader: pin_memory_device must be a CUDA device, found cpu");
  CHECK(testing::error_message([&] { data::DataLoader l(ds, pinned.pin_memory_device(Device(kCUDA, 1))); })
            .find("cuda:1 requested, but only 1 CUDA device(s) exist") != std::string::npos);
}

// Runs for real in the CTest entry "emulib_runtime_test (emu, 2 devices)", which sets
// NANODDP_EMU_DEVICES=2 (the device count is read once per process).
TEST_CASE("emulib: two emulated devices: peer copies, ops on cuda:1, mixing the devices refused") {
  if (emu_rt::device_count() < 2) {
    MESSAGE("SKIPPED: one emulated device; the entry '(emu, 2 devices)' runs this with NANODDP_EMU_DEVICES=2");
    return;
  }
  const Device d1(kCUDA, 1);
  const Tensor x = testing::random_input({33, 17}, 4).to(kFloat32);
  const Tensor on0 = x.to(kGpu);
  const Tensor on1 = on0.to(d1);  // cudaMemcpyPeerAsync, checked against each device's blocks
  CHECK(on1.device().str() == "cuda:1");
  const Tensor y = on1 * 2 + 1;  // kernels on cuda:1's stream, with cuda:1 current
  CHECK(y.device().str() == "cuda:1");
  CHECK(testing::to_vector(y.to(kGpu).cpu()) == testing::to_vector(x * 2 + 1));
  CHECK(testing::to_vector(y.cpu()) == testing::to_vector(x * 2 + 1));
  CHECK(kc::memory_stats(1).allocated_bytes > 0);
  const std::string msg = testing::error_message([&] { (void)(on0 + on1); });
  CHECK(msg.find("cuda:0") != std::string::npos);
  CHECK(msg.find("cuda:1") != std::string::npos);
}
