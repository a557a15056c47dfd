// kernels/cuda/optim.cu in the emulator against kernels/cpu/optim.cpp, and both against
// the formulas written out here in double: SGD (plain, momentum first and later steps,
// dampening, Nesterov, weight decay) and Adam (Adam / AdamW, AMSGrad, weight decay), f32
// and f64, over several tensors in one multi-tensor step: lengths of 1, one chunk exactly,
// a chunk and one, an empty tensor, several chunks with a tail (partial groups of 4), one
// tensor whose buffers start off 16-byte alignment (element by element where the others
// load float4 / double2), each tensor with its own step (Adam) or first step (SGD); more
// tensors and distinct steps than one launch holds (several launches); Adam with its step
// counts on the device (counted by the launch, three steps in a row). GradScaler's unscale_grad (exact: one multiply by a
// power of two, and the same non-finite answer). CUDA and CPU evaluate
// kernels/common/optim_math.h per element, so they agree within 8 ulps of the largest value
// (compilations may contract multiply-adds differently: check_ulps); the reference in
// double checks the formulas and that every element of every tensor was updated.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "emu_test.h"
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
  std::vector<int32_t> flags(kSizes.size(), 7);  // left alone when every value is finite
  std::vector<cuda::UnscaleTensor<T>> tensors;
  for (size_t k = 0; k < kSizes.size(); ++k) tensors.push_back({kSizes[k], on_gpu[k].data(), &flags[k]});
  cuda::unscale_grad<T>(0, tensors, T(1.0 / 1024), nullptr);
  for (size_t k = 0; k < kSizes.size(); ++k) {
    INFO("tensor ", k);
    const bool cpu_found = cpu::unscale_grad<T>(kSizes[k], on_cpu[k].data(), T(1.0 / 1024));
    CHECK(cpu_found == (int(k) == bad_tensor));
    CHECK(flags[k] == (int(k) == bad_tensor ? 1 : 7));
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
