// kernels/cuda/optim.cu in the emulator against kernels/cpu/optim.cpp, and both against
// the formulas written out here in double: SGD (plain, momentum first and later steps,
// dampening, Nesterov, weight decay) and Adam (Adam / AdamW, AMSGrad, weight decay), f32
// and f64, over several tensors in one multi-tensor step: lengths of 1, one chunk exactly,
// a chunk and one, an empty tensor, several chunks with a tail (partial groups of 4), one
// tensor whose buffers start off 16-byte alignment (element by element where the others
// load float4 / double2), each tensor with its own step (Adam) or first step (SGD); more
// tensors and distinct steps than one launch holds (several launches); Adam with its step
// counts on the device (counted by the launch, three steps in a row); a GradScaler skip flag
// on the device (nothing changes), the unscale's factor and the scale's update on the device
// against the host's. GradScaler's unscale_grad (exact: one multiply by a
// power of two, and the same non-finite answer). CUDA and CPU evaluate
// kernels/common/optim_math.h per element, so they agree within 8 ulps of the largest value
// (compilations may contract multiply-adds differently: check_ulps); the reference in
// double checks the formulas and that every element of every tensor was updated.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "emu_test.h"
#include "kernels/common/optim_math.h"
#include "kernels/cpu/optim.h"
#include "kernels/cuda/optim.h"

namespace {

using namespace nd::kernels;
using namespace nd::emu_test;

const std::vector<int64_t> kSizes{1, 4096, 0, 4097, 3 * 4096 + 77};
const std::vector<int64_t> kShifts{0, 0, 0, 1, 0};  // tensor k's elements start at element kShifts[k]

// Per tensor: parameters and state, one vector per buffer.
template <class T>
struct Buffers {
  std::vector<T> p, g, s1, s2, s3;
};

template <class T>
std::vector<Buffers<T>> random_buffers() {
  std::vector<Buffers<T>> out;
  for (size_t k = 0; k < kSizes.size(); ++k) {
    const int64_t n = kSizes[k] + kShifts[k];
    const auto seed = static_cast<unsigned>(10 * k);
    out.push_back({cast<T>(uniform(n, seed + 1)), cast<T>(uniform(n, seed + 2)), cast<T>(uniform(n, seed + 3)),
                   cast<T>(uniform(n, seed + 4, 0, 1)), cast<T>(uniform(n, seed + 5, 0, 1))});
  }
  return out;
}

template <class T>
void check_buffers(const std::string& what, const std::vector<Buffers<T>>& got, const std::vector<Buffers<T>>& ref) {
  for (size_t k = 0; k < got.size(); ++k) {
    INFO("tensor ", k, " of ", kSizes[k], " elements");
    check_ulps(what + " p", got[k].p, ref[k].p);
    check_ulps(what + " state 1", got[k].s1, ref[k].s1);
    check_ulps(what + " state 2", got[k].s2, ref[k].s2);
    check_ulps(what + " state 3", got[k].s3, ref[k].s3);
  }
}

// SGD: s1 is the momentum buffer; tensor k takes its first step when k is even.
template <class T>
std::vector<cpu::SgdTensor<T>> sgd_tensors(std::vector<Buffers<T>>& b, const cpu::SgdParams& hp) {
  std::vector<cpu::SgdTensor<T>> t;
  for (size_t k = 0; k < b.size(); ++k)
    t.push_back({kSizes[k], b[k].p.data() + kShifts[k], b[k].g.data() + kShifts[k],
                 hp.momentum != 0 ? b[k].s1.data() + kShifts[k] : nullptr, k % 2 == 0});
  return t;
}

template <class T>
void sgd_reference(std::vector<Buffers<T>>& b, const cpu::SgdParams& hp) {
  for (size_t k = 0; k < b.size(); ++k)
    for (int64_t i = kShifts[k]; i < kShifts[k] + kSizes[k]; ++i) {
      double d = double(b[k].g[i]) + hp.weight_decay * double(b[k].p[i]);
      if (hp.momentum != 0) {
        const double buf = k % 2 == 0 ? d : hp.momentum * double(b[k].s1[i]) + (1 - hp.dampening) * d;
        b[k].s1[i] = T(buf);
        d = hp.nesterov ? d + hp.momentum * buf : buf;
      }
      b[k].p[i] = T(double(b[k].p[i]) - hp.lr * d);
    }
}

template <class T>
void check_sgd(const cpu::SgdParams& hp) {
  INFO("momentum ", hp.momentum, " dampening ", hp.dampening, " nesterov ", hp.nesterov, sizeof(T) == 4 ? " f32" : " f64");
  auto on_gpu = random_buffers<T>();
  auto on_cpu = on_gpu, ref = on_gpu;
  cuda::sgd_step<T>(0, sgd_tensors(on_gpu, hp), hp, nullptr);
  cpu::sgd_step<T>(sgd_tensors(on_cpu, hp), hp);
  sgd_reference(ref, hp);
  check_buffers("cuda vs cpu", on_gpu, on_cpu);
  check_buffers("cpu vs formulas", on_cpu, ref);
}

// Adam: s1 = m, s2 = v, s3 = vmax; tensor k takes step k + 1.
template <class T>
std::vector<cpu::AdamTensor<T>> adam_tensors(std::vector<Buffers<T>>& b, const cpu::AdamParams& hp) {
  std::vector<cpu::AdamTensor<T>> t;
  for (size_t k = 0; k < b.size(); ++k)
    t.push_back({kSizes[k], b[k].p.data() + kShifts[k], b[k].g.data() + kShifts[k], b[k].s1.data() + kShifts[k],
                 b[k].s2.data() + kShifts[k], hp.amsgrad ? b[k].s3.data() + kShifts[k] : nullptr, int64_t(k) + 1});
  return t;
}

template <class T>
void adam_reference(std::vector<Buffers<T>>& b, const cpu::AdamParams& hp) {
  for (size_t k = 0; k < b.size(); ++k) {
    const double t = double(k + 1), bc1 = 1 - std::pow(hp.beta1, t), bc2 = 1 - std::pow(hp.beta2, t);
    for (int64_t i = kShifts[k]; i < kShifts[k] + kSizes[k]; ++i) {
      double p = b[k].p[i], g = b[k].g[i];
      if (hp.decoupled_weight_decay)
        p *= 1 - hp.lr * hp.weight_decay;
      else
        g += hp.weight_decay * p;
      const double m = hp.beta1 * double(b[k].s1[i]) + (1 - hp.beta1) * g;
      const double v = hp.beta2 * double(b[k].s2[i]) + (1 - hp.beta2) * g * g;
      double second = v;
      if (hp.amsgrad) b[k].s3[i] = T(second = std::max(double(b[k].s3[i]), v));
      b[k].p[i] = T(p - hp.lr / bc1 * m / (std::sqrt(second) / std::sqrt(bc2) + hp.eps));
      b[k].s1[i] = T(m);
      b[k].s2[i] = T(v);
    }
  }
}

template <class T>
void check_adam(const cpu::AdamParams& hp) {
  INFO("amsgrad ", hp.amsgrad, " decoupled ", hp.decoupled_weight_decay, sizeof(T) == 4 ? " f32" : " f64");
  auto on_gpu = random_buffers<T>();
  auto on_cpu = on_gpu, ref = on_gpu;
  cuda::adam_step<T>(0, adam_tensors(on_gpu, hp), hp, nullptr);
  cpu::adam_step<T>(adam_tensors(on_cpu, hp), hp);
  adam_reference(ref, hp);
  check_buffers("cuda vs cpu", on_gpu, on_cpu);
  check_buffers("cpu vs formulas", on_cpu, ref);
}

TEST_CASE("sgd_step: plain, momentum (first and later steps), dampening, nesterov, weight decay") {
  for (const cpu::SgdParams& hp : {cpu::SgdParams{0.1, 0, 0, 0, false}, cpu::SgdParams{0.1, 0.9, 0, 0.01, false},
                                   cpu::SgdParams{0.1, 0.9, 0.1, 0.01, false},
                                   cpu::SgdParams{0.05, 0.9, 0, 0, true}}) {
    check_sgd<float>(hp);
    check_sgd<double>(hp);
  }
}

TEST_CASE("adam_step: Adam, AdamW, AMSGrad, weight decay, each tensor at its own step") {
  for (const cpu::AdamParams& hp : {cpu::AdamParams{1e-3, 0.9, 0.999, 1e-8, 0, false, false},
                                    cpu::AdamParams{1e-3, 0.9, 0.95, 1e-8, 0.05, true, false},
                                    cpu::AdamParams{1e-2, 0.8, 0.99, 1e-6, 0.1, false, true}}) {
    check_adam<float>(hp);
    check_adam<double>(hp);
  }
}

TEST_CASE("adam_step: more tensors and distinct steps than one launch holds") {
  // f32 Adam launches hold 59 tensors and 8 coefficient sets: tensors 0-19 at steps 1..11 in
  // turn split the step at the 9th set twice, the next 110 at step 1 at the 60th tensor.
  const cpu::AdamParams hp{1e-2, 0.9, 0.99, 1e-8, 0.01, false, false};
  constexpr size_t kTensors = 130;
  std::vector<std::vector<float>> gpu_buffers, cpu_buffers;
  for (unsigned k = 0; k < kTensors * 4; ++k) gpu_buffers.push_back(cast<float>(uniform(37, 100 + k, 0, 1)));
  cpu_buffers = gpu_buffers;
  auto tensors = [](std::vector<std::vector<float>>& b) {
    std::vector<cpu::AdamTensor<float>> t;
    for (size_t k = 0; k < kTensors; ++k)
      t.push_back({37, b[4 * k].data(), b[4 * k + 1].data(), b[4 * k + 2].data(), b[4 * k + 3].data(), nullptr,
                   k < 20 ? int64_t(k % 11) + 1 : 1});
    return t;
  };
  cuda::adam_step<float>(0, tensors(gpu_buffers), hp, nullptr);
  cpu::adam_step<float>(tensors(cpu_buffers), hp);
  for (size_t k = 0; k < gpu_buffers.size(); ++k) {
    INFO("tensor ", k / 4, " buffer ", k % 4);
    check_ulps("cuda vs cpu", gpu_buffers[k], cpu_buffers[k]);
  }
}

TEST_CASE("adam_step: step counts on the device are incremented by the launch and give its bias corrections") {
  // Three steps with the same arguments (a captured step's replays): the CPU twin at steps
  // 1, 2, 3 of tensor k, counted from k (so each takes its own corrections), and the empty
  // tensor's count increments as the others'.
  for (const cpu::AdamParams& hp : {cpu::AdamParams{1e-2, 0.9, 0.99, 1e-8, 0.01, false, true},
                                    cpu::AdamParams{1e-3, 0.8, 0.95, 1e-8, 0.05, true, false}}) {
    auto on_gpu = random_buffers<float>();
    auto on_cpu = on_gpu;
    std::vector<double> counts(kSizes.size());
    for (size_t k = 0; k < counts.size(); ++k) counts[k] = double(k);
    std::vector<cpu::AdamTensor<float>> counted = adam_tensors(on_gpu, hp);
    for (size_t k = 0; k < counted.size(); ++k) counted[k].step_on_device = &counts[k];
    for (int s = 1; s <= 3; ++s) {
      INFO("step ", s, " decoupled ", hp.decoupled_weight_decay);
      cuda::adam_step<float>(0, counted, hp, nullptr);
      std::vector<cpu::AdamTensor<float>> host = adam_tensors(on_cpu, hp);
      for (size_t k = 0; k < host.size(); ++k) host[k].step = int64_t(k) + s;
      cpu::adam_step<float>(host, hp);
      check_buffers("cuda (counts on the device) vs cpu", on_gpu, on_cpu);
      for (size_t k = 0; k < counts.size(); ++k) CHECK(counts[k] == double(k) + s);
    }
  }
  std::vector<float> one(1);
  double count = 0;
  const std::vector<cpu::AdamTensor<float>> mixed{{1, one.data(), one.data(), one.data(), one.data(), nullptr, 1, &count},
                                                  {1, one.data(), one.data(), one.data(), one.data(), nullptr, 1}};
  CHECK_THROWS_WITH(cuda::adam_step<float>(0, mixed, cpu::AdamParams{}, nullptr),
                    "adam_step: either every tensor or none has its step count on the device");
}

// Tensor `bad_tensor` (or none, -1) holds `bad` at its element `bad_at` (clamped to its
// last); one multi-tensor launch against the CPU's unscale per tensor.
template <class T>
void check_unscale(int bad_tensor, int64_t bad_at, T bad) {
  INFO("bad in tensor ", bad_tensor, " at ", bad_at, sizeof(T) == 4 ? " f32" : " f64");
  std::vector<std::vector<T>> on_cpu, on_gpu;
  for (size_t k = 0; k < kSizes.size(); ++k) {
    on_cpu.push_back(cast<T>(uniform(kSizes[k], 6 + unsigned(k), -1e3, 1e3)));
    if (int(k) == bad_tensor) on_cpu[k][std::min(bad_at, kSizes[k] - 1)] = bad;
  }
  on_gpu = on_cpu;
  std::vector<int32_t> flags(kSizes.size(), -1);  // left alone when every value is finite
  std::vector<cuda::UnscaleTensor<T>> tensors;
  for (size_t k = 0; k < kSizes.size(); ++k) tensors.push_back({kSizes[k], on_gpu[k].data(), &flags[k]});
  cuda::unscale_grad<T>(0, tensors, T(1.0 / 1024), nullptr);
  for (size_t k = 0; k < kSizes.size(); ++k) {
    INFO("tensor ", k);
    const bool cpu_found = cpu::unscale_grad<T>(kSizes[k], on_cpu[k].data(), T(1.0 / 1024));
    CHECK(cpu_found == (int(k) == bad_tensor));
    CHECK(flags[k] == (int(k) == bad_tensor ? 1 : -1));
    for (int64_t i = 0; i < kSizes[k]; ++i)
      if (!(int(k) == bad_tensor && i == std::min(bad_at, kSizes[k] - 1))) REQUIRE(on_gpu[k][i] == on_cpu[k][i]);
  }
}

TEST_CASE("unscale_grad: every value of every tensor scaled, inf and NaN found in their own tensor's flag") {
  const double inf = std::numeric_limits<double>::infinity();
  check_unscale<float>(-1, 0, 0.0f);
  check_unscale<double>(-1, 0, 0.0);
  for (int k : {0, 1, 3, 4})  // (tensor 2 is empty)
    for (int64_t at : {int64_t(0), int64_t(517), int64_t(4096), int64_t(1 << 20)}) {
      check_unscale<float>(k, at, float(inf));
      check_unscale<double>(k, at, -inf);
      check_unscale<float>(k, at, std::nanf(""));
    }
}

}  // namespace

TEST_CASE("a GradScaler skip on the device: the steps change nothing while the flag is set, the scale is read and updated on the device") {
  // SGD and Adam (step counts on the device) with the flag set: every buffer and count as it
  // was; with it clear: the same as without a flag.
  auto gpu = random_buffers<float>();
  const auto before = gpu;
  std::vector<double> counts(kSizes.size(), 3.0);
  const cpu::AdamParams hp{1e-2, 0.9, 0.99, 1e-8, 0.01, false, true};
  std::vector<cpu::AdamTensor<float>> adam = adam_tensors(gpu, hp);
  for (size_t k = 0; k < adam.size(); ++k) adam[k].step_on_device = &counts[k];
  const cpu::SgdParams sgd_hp{0.1, 0.9, 0, 0.01, false};
  std::vector<cpu::SgdTensor<float>> sgd;
  for (size_t k = 0; k < gpu.size(); ++k)
    sgd.push_back({kSizes[k], gpu[k].p.data() + kShifts[k], gpu[k].g.data() + kShifts[k], gpu[k].s1.data() + kShifts[k], false});
  int32_t found = 1;
  cuda::adam_step<float>(0, adam, hp, nullptr, &found);
  cuda::sgd_step<float>(0, sgd, sgd_hp, nullptr, &found);
  check_buffers("skipped", gpu, before);
  CHECK(counts == std::vector<double>(kSizes.size(), 3.0));
  found = 0;
  auto unflagged = before;
  std::vector<double> unflagged_counts(kSizes.size(), 3.0);
  std::vector<cpu::AdamTensor<float>> adam2 = adam_tensors(unflagged, hp);
  for (size_t k = 0; k < adam2.size(); ++k) adam2[k].step_on_device = &unflagged_counts[k];
  cuda::adam_step<float>(0, adam, hp, nullptr, &found);
  cuda::adam_step<float>(0, adam2, hp, nullptr);
  check_buffers("flag clear", gpu, unflagged);
  CHECK(counts == std::vector<double>(kSizes.size(), 4.0));

  // The unscale's factor from an f64 scale on the device: the same values as 1 / scale by value.
  // Then NaNs all over two tensors that share one flag (a NaN loss's gradients): many threads
  // of many blocks set it, which the sanitizer accepts only as an atomic.
  std::vector<float> g1 = cast<float>(uniform(4099, 9, -1e3, 1e3)), g2 = g1;
  int32_t f1 = 0, f2 = 0;
  const double scale = 4096.0;
  cuda::unscale_grad<float>(0, {{4099, g1.data(), &f1}}, 0.0f, nullptr, &scale);
  cuda::unscale_grad<float>(0, {{4099, g2.data(), &f2}}, float(1.0 / scale), nullptr);
  CHECK(g1 == g2);
  CHECK(f1 == 0);
  std::vector<float> nan1(9000, std::nanf("")), nan2(77, -std::numeric_limits<float>::infinity());
  cuda::unscale_grad<float>(0, {{9000, nan1.data(), &f1}, {77, nan2.data(), &f1}}, 0.0f, nullptr, &scale);
  CHECK(f1 == 1);

  // The scale's update against the host's (optim_math::update_scale) over a run of flags:
  // growth every 2 good steps, backoff on a non-finite one, any of two optimizers' flags.
  double dev_scale = 1024, dev_tracker = 0, host_scale = 1024;
  int64_t host_tracker = 0;
  int32_t any = 7, a = 0, b = 0;
  cuda::ScaleUpdate u;
  u.scale = &dev_scale, u.growth_tracker = &dev_tracker, u.found_any = &any, u.found[0] = &a, u.found[1] = &b;
  u.num_found = 2, u.growth_factor = 2, u.backoff_factor = 0.5, u.growth_interval = 2;
  for (const auto& [fa, fb] : std::vector<std::pair<int, int>>{{0, 0}, {0, 0}, {0, 1}, {0, 0}, {1, 1}, {0, 0}, {0, 0}}) {
    a = fa, b = fb;
    cuda::update_scale(0, u, nullptr);
    optim_math::update_scale(host_scale, host_tracker, fa || fb, 2, 0.5, 2);
    CHECK(dev_scale == host_scale);
    CHECK(dev_tracker == double(host_tracker));
    CHECK(any == ((fa || fb) ? 1 : 0));
  }
  CHECK(host_scale == 1024);  // 2048, 1024, 512, 1024 (after two good ones)
  u.num_found = cuda::ScaleUpdate::kMaxFound + 1;
  CHECK_THROWS_WITH(cuda::update_scale(0, u, nullptr), "update_scale: expected 0 to 16 flags, found 17");
}
