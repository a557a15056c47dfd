// Where the library queues its work and where a fault is reported, under the emulator
// (nanoddp_emulib, tests/emu/README.md): the REAL kernels/cuda/{runtime,stream}.cpp and the
// launchers against the runtime stand-in include/cuda_runtime.h, which keeps a trace of the
// stream each copy, launch and event went to (emu_rt::record_trace) and can make a launch
// fault (emu_rt::fault_launch).
//
// What this can and cannot prove: the stand-in runs every operation when it is queued, so two
// streams never race here and a kernel reading a table a copy on another stream has not yet
// written cannot be seen reading garbage. What it sees is the order the host asks for: a
// kernel reading data copied on another stream is safe only if an event recorded after the
// copy on that stream is waited for by the kernel's stream before the launch. `ordered`
// checks exactly that on the trace.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "harness.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/optim.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream.h"

using namespace nd;
namespace kc = nd::kernels::cuda;

namespace {

const Device kGpu(kCUDA, 0);

// Trace entry `before` (on stream A) runs before entry `after` (on stream B): A == B, or an
// event recorded on A after `before` is waited for by B before `after`.
bool ordered(const std::vector<emu_rt::TraceEntry>& t, size_t before, size_t after) {
  if (t[before].stream == t[after].stream) return true;
  for (size_t r = before + 1; r < after; ++r) {
    if (t[r].event == nullptr || t[r].event_wait || t[r].stream != t[before].stream) continue;
    for (size_t w = r + 1; w < after; ++w)
      if (t[w].event == t[r].event && t[w].event_wait && t[w].stream == t[after].stream) return true;
  }
  return false;
}

// Runs step with the trace on; every launch whose name contains `kernel` must come after
// every copy queued before it in the trace, on its stream or ordered by an event. Returns
// the launches found and the copies they were checked against.
template <class Step>
std::pair<int, int> check_copies_ordered_before(const char* kernel, Step&& step) {
  emu_rt::clear_trace();
  emu_rt::record_trace(true);
  step();
  emu_rt::record_trace(false);
  const std::vector<emu_rt::TraceEntry> t = emu_rt::trace();
  int launches = 0, copies = 0;
  for (size_t l = 0; l < t.size(); ++l) {
    if (t[l].kernel.find(kernel) == std::string::npos) continue;
    ++launches;
    for (size_t c = 0; c < l; ++c) {
      if (!t[c].kernel.empty() || t[c].dst == nullptr) continue;
      ++copies;
      CHECK_MESSAGE(ordered(t, c, l), "the copy to ", t[c].dst, " is not ordered before ", t[l].kernel);
    }
  }
  return {launches, copies};
}

}  // namespace

// The multi-tensor optimizers keep their chunk table on the device and upload it when the
// tensors' lengths change. It was uploaded on the device's compute stream whatever stream the
// launch was given: a step on another stream read a table nothing ordered after its copy.
TEST_CASE("emulib: a multi-tensor step on another stream than the compute stream reads a chunk table copied in its order") {
  manual_seed(7);
  std::vector<Tensor> p, g;
  std::vector<kc::SgdTensor<float>> tensors;
  std::vector<double> p0;  // p[2] before the steps
  // Lengths no other step in the process uses: a table not yet cached for any stream.
  auto make = [&](std::initializer_list<int64_t> lengths) {
    for (int64_t n : lengths) {
      p.push_back(randn({n}).to(kGpu));
      g.push_back(randn({n}).to(kGpu));
      tensors.push_back({n, p.back().data_ptr<float>(), g.back().data_ptr<float>(), nullptr, true});
    }
    p0 = testing::to_vector(p[2].cpu());
  };
  const kc::SgdParams hp{0.1};
  int steps = 0;
  auto comm_step = [&] { kc::sgd_step<float>(0, tensors, hp, kc::comm_stream(0)); };
  SUBCASE("a new table, first launched on the communication stream") {
    make({5000, 123, 8193});
    const auto [launches, copies] = check_copies_ordered_before("multi_tensor_kernel", comm_step);
    CHECK(launches == 1);
    CHECK(copies == 1);  // the table
    steps = 1;
  }
  SUBCASE("a table uploaded for the compute stream, then a launch on the communication stream") {
    make({4000, 77, 9000});
    kc::sgd_step<float>(0, tensors, hp, kc::compute_stream(0));
    const auto [launches, copies] = check_copies_ordered_before("multi_tensor_kernel", comm_step);
    CHECK(launches == 1);
    CHECK(copies == 1);  // its own table: the compute stream's copy is not ordered before it
    steps = 2;
  }
  // The steps did what SGD does (p -= lr g for each step): the table was read right.
  kc::synchronize(0);
  const std::vector<double> g2 = testing::to_vector(g[2].cpu()), p2 = testing::to_vector(p[2].cpu());
  for (size_t i = 0; i < p2.size(); i += 97)
    CHECK(p2[i] == doctest::Approx(p0[i] - 0.1 * steps * g2[i]).epsilon(1e-5));
}

// A kernel that faults does so after its launch returned; CUDA reports the fault at a later
// call, which then takes the blame. NANODDP_LAUNCH_BLOCKING=1 (kc::set_launch_blocking)
// synchronises after every launch, so the fault is reported by the kernel that made it.
TEST_CASE("emulib: a kernel's fault is reported under a later kernel's name, and under its own with launch blocking") {
  const Tensor x = randn({4, 8}).to(kGpu);
  const std::string fault = "cudaErrorIllegalAddress (an illegal memory access was encountered)";
  REQUIRE(!kc::launch_blocking());
  emu_rt::fault_launch("softmax_forward_kernel");
  const Tensor y = softmax(x, -1);  // the launch itself succeeds
  const std::string later = testing::error_message([&] { (void)(x * 2.0); });
  CHECK(later.find("softmax") == std::string::npos);
  CHECK(later.find("kernel launch failed in ") == 0);
  CHECK(later.find(fault) != std::string::npos);

  kc::set_launch_blocking(true);
  emu_rt::fault_launch("softmax_forward_kernel");
  const std::string own = testing::error_message([&] { (void)softmax(x, -1); });
  kc::set_launch_blocking(false);
  CHECK(own == "kernel (NANODDP_LAUNCH_BLOCKING=1: synchronised after its launch) failed in softmax_forward: " + fault +
                   " (running on " + x.describe() + ")");
  // Nothing left behind: the next op runs.
  CHECK(testing::to_vector((ones({3}).to(kGpu) + 1).cpu()) == std::vector<double>{2, 2, 2});
}

// Launch blocking synchronises once per launch, and only when on.
TEST_CASE("emulib: launch blocking makes the host wait after every launch, and only when on") {
  const Tensor x = randn({4, 8}).to(kGpu);
  (void)softmax(x, -1);
  long waits = emu_rt::stats().host_waits;
  (void)softmax(x, -1);
  CHECK(emu_rt::stats().host_waits == waits);
  kc::set_launch_blocking(true);
  waits = emu_rt::stats().host_waits;
  (void)softmax(x, -1);
  kc::set_launch_blocking(false);
  CHECK(emu_rt::stats().host_waits == waits + 1);
}

// The bf16 attention kernels' request for more than 48 KiB of shared memory holds for a
// kernel on one device: asked once per kernel and device, so again on a second device.
TEST_CASE("emulib: two emulated devices: the attention kernels ask for their shared memory once on each") {
  if (emu_rt::device_count() < 2) {
    MESSAGE("SKIPPED: one emulated device; the entry '(emu, 2 devices)' runs this with NANODDP_EMU_DEVICES=2");
    return;
  }
  auto forward = [](int device) {
    const Device d(kCUDA, device);
    const Tensor q = randn({1, 1, 16, 32}).to(kBFloat16).to(d), out = empty_like(q),
                 lse = empty({1, 1, 16}, TensorOptions(kFloat32).device(d));
    const cudaStream_t stream = kc::use_device(device);
    kc::scaled_dot_product_attention_forward(q.data_ptr<BFloat16>(), q.data_ptr<BFloat16>(), q.data_ptr<BFloat16>(),
                                             {}, 1, 1, 16, 16, 32, 32, false, 0.125, {}, out.data_ptr<BFloat16>(),
                                             lse.data_ptr<float>(), stream);
    kc::synchronize(device);
  };
  const long before = emu_rt::stats().func_attributes;
  forward(0);
  forward(0);
  const long on0 = emu_rt::stats().func_attributes - before;
  CHECK(on0 == 1);  // this process's first bf16 forward at head dim 32
  forward(1);
  forward(1);
  CHECK(emu_rt::stats().func_attributes - before == on0 + 1);
}
