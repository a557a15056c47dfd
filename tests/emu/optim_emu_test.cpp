// kernels/cuda/optim.cu in the emulator against kernels/cpu/optim.cpp: SGD (plain, momentum
// first and later steps, dampening, Nesterov, weight decay) and Adam (Adam / AdamW, AMSGrad,
// weight decay), f32 and f64, a length that is not a multiple of the block; GradScaler's
// unscale_grad (exact: one multiply by a power of two, and the same non-finite answer). Both sides
// evaluate kernels/common/optim_math.h per element, so the comparison checks the indexing
// and the coefficients: within 8 ulps of the largest value (compilations may contract
// multiply-adds differently: check_ulps).
#include <doctest/doctest.h>

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

template <class T>
void check_sgd(const cpu::SgdParams& hp) {
  INFO("momentum ", hp.momentum, " nesterov ", hp.nesterov, " first ", hp.first_step, sizeof(T) == 4 ? " f32" : " f64");
  const int64_t n = 777;
  auto p1 = cast<T>(uniform(n, 1)), buf1 = cast<T>(uniform(n, 2));
  const auto g = cast<T>(uniform(n, 3));
  auto p2 = p1, buf2 = buf1;
  T* b1 = hp.momentum != 0 ? buf1.data() : nullptr;
  T* b2 = hp.momentum != 0 ? buf2.data() : nullptr;
  cpu::sgd_step<T>(n, hp, p1.data(), g.data(), b1);
  cuda::sgd_step<T>(n, hp, p2.data(), g.data(), b2, nullptr);
  check_ulps("sgd p", p2, p1);
  check_ulps("sgd buf", buf2, buf1);
}

template <class T>
void check_adam(const cpu::AdamParams& hp) {
  INFO("amsgrad ", hp.amsgrad, " decoupled ", hp.decoupled_weight_decay, " step ", hp.step,
       sizeof(T) == 4 ? " f32" : " f64");
  const int64_t n = 777;
  auto p1 = cast<T>(uniform(n, 1)), m1 = cast<T>(uniform(n, 2)), v1 = cast<T>(uniform(n, 3, 0, 1)),
       vmax1 = cast<T>(uniform(n, 4, 0, 1));
  const auto g = cast<T>(uniform(n, 5));
  auto p2 = p1, m2 = m1, v2 = v1, vmax2 = vmax1;
  cpu::adam_step<T>(n, hp, p1.data(), g.data(), m1.data(), v1.data(), hp.amsgrad ? vmax1.data() : nullptr);
  cuda::adam_step<T>(n, hp, p2.data(), g.data(), m2.data(), v2.data(), hp.amsgrad ? vmax2.data() : nullptr, nullptr);
  check_ulps("adam p", p2, p1);
  check_ulps("adam m", m2, m1);
  check_ulps("adam v", v2, v1);
  check_ulps("adam vmax", vmax2, vmax1);
}

TEST_CASE("sgd_step: plain, momentum (first and later steps), dampening, nesterov, weight decay") {
  for (const cpu::SgdParams& hp : {cpu::SgdParams{0.1, 0, 0, 0, false, true}, cpu::SgdParams{0.1, 0.9, 0, 0.01, false, true},
                                   cpu::SgdParams{0.1, 0.9, 0.1, 0.01, false, false},
                                   cpu::SgdParams{0.05, 0.9, 0, 0, true, false}}) {
    check_sgd<float>(hp);
    check_sgd<double>(hp);
  }
}

TEST_CASE("adam_step: Adam, AdamW, AMSGrad, weight decay") {
  for (const cpu::AdamParams& hp : {cpu::AdamParams{1e-3, 0.9, 0.999, 1e-8, 0, false, false, 1},
                                    cpu::AdamParams{1e-3, 0.9, 0.999, 1e-8, 0.01, true, false, 7},
                                    cpu::AdamParams{1e-2, 0.8, 0.99, 1e-6, 0.1, false, true, 3}}) {
    check_adam<float>(hp);
    check_adam<double>(hp);
  }
}

// adam_step_multi against one adam_step per tensor (bit-identical: the same per-element
// code), CUDA's and the CPU's twin each against its own device's single-tensor kernel, and
// CUDA against the CPU (check_ulps): lengths of 1, one chunk exactly, a chunk and one,
// several chunks with a tail, and an empty tensor; each tensor at its own step.
template <class T>
void check_adam_multi(const cpu::AdamParams& hp) {
  INFO("amsgrad ", hp.amsgrad, " decoupled ", hp.decoupled_weight_decay, sizeof(T) == 4 ? " f32" : " f64");
  const std::vector<int64_t> sizes{1, 4096, 0, 4097, 3 * 4096 + 77};
  struct Buffers {
    std::vector<T> p, m, v, vmax;
  };
  std::vector<Buffers> multi, single, host;
  std::vector<std::vector<T>> grads;
  std::vector<cuda::AdamTensor<T>> tensors;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    const auto seed = static_cast<unsigned>(10 * k);
    Buffers b{cast<T>(uniform(n, seed + 1)), cast<T>(uniform(n, seed + 2)), cast<T>(uniform(n, seed + 3, 0, 1)),
              cast<T>(uniform(n, seed + 4, 0, 1))};
    multi.push_back(b), single.push_back(b), host.push_back(b);
    grads.push_back(cast<T>(uniform(n, seed + 5)));
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    Buffers& b = multi[k];
    tensors.push_back({sizes[k], b.p.data(), grads[k].data(), b.m.data(), b.v.data(),
                       hp.amsgrad ? b.vmax.data() : nullptr, int64_t(k) + 1});
  }
  cuda::adam_step_multi<T>(0, tensors, hp, nullptr);
  std::vector<Buffers> cpu_multi = host;  // the CPU twin on the same inputs
  std::vector<cpu::AdamTensor<T>> cpu_tensors;
  for (size_t k = 0; k < sizes.size(); ++k) {
    Buffers& b = cpu_multi[k];
    cpu_tensors.push_back({sizes[k], b.p.data(), grads[k].data(), b.m.data(), b.v.data(),
                           hp.amsgrad ? b.vmax.data() : nullptr, int64_t(k) + 1});
  }
  cpu::adam_step_multi<T>(cpu_tensors, hp);
  for (size_t k = 0; k < sizes.size(); ++k) {
    cpu::AdamParams at = hp;
    at.step = int64_t(k) + 1;
    Buffers &s = single[k], &h = host[k];
    cuda::adam_step<T>(sizes[k], at, s.p.data(), grads[k].data(), s.m.data(), s.v.data(),
                       hp.amsgrad ? s.vmax.data() : nullptr, nullptr);
    cpu::adam_step<T>(sizes[k], at, h.p.data(), grads[k].data(), h.m.data(), h.v.data(),
                      hp.amsgrad ? h.vmax.data() : nullptr);
    INFO("tensor ", k, " of ", sizes[k], " elements");
    check_equal("multi p vs cpu single", cpu_multi[k].p, h.p);
    check_equal("multi m vs cpu single", cpu_multi[k].m, h.m);
    check_equal("multi v vs cpu single", cpu_multi[k].v, h.v);
    check_equal("multi vmax vs cpu single", cpu_multi[k].vmax, h.vmax);
    check_equal("multi p", multi[k].p, s.p);
    check_equal("multi m", multi[k].m, s.m);
    check_equal("multi v", multi[k].v, s.v);
    check_equal("multi vmax", multi[k].vmax, s.vmax);
    check_ulps("multi p vs cpu", multi[k].p, h.p);
  }
}

TEST_CASE("adam_step_multi: many tensors in one launch equal one adam_step each") {
  for (const cpu::AdamParams& hp : {cpu::AdamParams{1e-3, 0.9, 0.999, 1e-8, 0, false, false, 1},
                                    cpu::AdamParams{1e-3, 0.9, 0.95, 1e-8, 0.05, true, false, 1},
                                    cpu::AdamParams{1e-2, 0.8, 0.99, 1e-6, 0.1, false, true, 1}}) {
    check_adam_multi<float>(hp);
    check_adam_multi<double>(hp);
  }
}

template <class T>
void check_unscale(int64_t bad_at, T bad) {
  INFO("bad_at ", bad_at, sizeof(T) == 4 ? " f32" : " f64");
  const int64_t n = 1000;
  auto g1 = cast<T>(uniform(n, 6, -1e3, 1e3));
  if (bad_at >= 0) g1[bad_at] = bad;
  auto g2 = g1;
  const bool cpu_found = cpu::unscale_grad<T>(n, g1.data(), T(1.0 / 1024));
  int32_t flag = 7;  // left alone when every value is finite
  cuda::unscale_grad<T>(n, g2.data(), T(1.0 / 1024), &flag, nullptr);
  CHECK(cpu_found == (bad_at >= 0));
  CHECK(flag == (bad_at >= 0 ? 1 : 7));
  for (int64_t i = 0; i < n; ++i)
    if (i != bad_at) REQUIRE(g2[i] == g1[i]);
}

TEST_CASE("unscale_grad: every value scaled, inf and NaN found wherever they are") {
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t at : {int64_t(-1), int64_t(0), int64_t(517), int64_t(999)}) {
    check_unscale<float>(at, float(inf));
    check_unscale<double>(at, -inf);
    check_unscale<float>(at, std::nanf(""));
  }
}

}  // namespace
