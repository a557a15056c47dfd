#pragma once
// Shared pieces of the CPU-vs-CUDA tests (tests/cuda/*_test.cpp): skip without a GPU,
// poisoned allocations, the relative-error comparison and a table runner that checks an
// op's forward output and every input gradient against the CPU reference.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "harness.h"
#include "kernels/cuda/allocator.h"
#include "kernels/cuda/runtime.h"

namespace nd::testing::cuda_compare {


using V = std::vector<Tensor>;
using Fn = std::function<Tensor(const V&)>;
inline const Device kGpu(kCUDA, 0);

// True when the suite runs against the CUDA emulator (tests/emu, nanoddp_emulib) instead of
// a GPU: every CUDA thread is an OS thread there, so a case may leave out sizes that only
// cost time (what they check is covered by smaller ones); never a check a GPU run makes.
inline constexpr bool emulated() {
#ifdef NANODDP_EMULATED
  return true;
#else
  return false;
#endif
}

inline bool skip_without_gpu() {
  if (cuda::is_available()) return false;
  MESSAGE("SKIPPED: no CUDA GPU here (" << kernels::cuda::unavailable_reason() << ")");
  return true;
}

// Poisons every CUDA allocation for as long as it lives.
struct PoisonAllocations {
  PoisonAllocations() { kernels::cuda::set_fill_on_allocate(true); }
  ~PoisonAllocations() { kernels::cuda::set_fill_on_allocate(false); }
};

// ||cuda - cpu|| / ||cpu|| (f64 sums), NaN never passes; elementwise equality for
// non-floating dtypes. f32 arithmetic lands far under 1e-4; the bound is 2e-5.
inline void check_matches(const Tensor& on_gpu, const Tensor& on_cpu, const std::string& what, double rel = 2e-5) {
  REQUIRE_MESSAGE(on_gpu.is_cuda(), what, ": expected a CUDA result, found ", on_gpu.describe());
  REQUIRE_MESSAGE(on_gpu.sizes() == on_cpu.sizes(), what, ": shape ", on_gpu.describe(), " vs ", on_cpu.describe());
  REQUIRE_MESSAGE(on_gpu.dtype() == on_cpu.dtype(), what, ": dtype ", on_gpu.describe(), " vs ", on_cpu.describe());
  const std::vector<double> a = testing::to_vector(on_gpu.cpu()), b = testing::to_vector(on_cpu);
  if (!on_cpu.is_floating_point()) {
    CHECK_MESSAGE(a == b, what, ": integer/bool results differ");
    return;
  }
  double diff = 0, norm = 0;
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) ++bad;
    if (std::isnan(a[i]) || std::isnan(b[i])) continue;
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " element(s) NaN on one device only (unwritten output?)");
  const double err = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
  CHECK_MESSAGE(err <= rel, what, ": relative error ", err, " exceeds ", rel);
}

// One row of the table: input shapes (odd sizes), value range, which inputs get a
// gradient, whether to also feed a non-contiguous (transposed) variant.
struct Case {
  std::string name;
  std::vector<Shape> shapes;
  Fn fn;
  double lo = -1, hi = 1;
  bool backward = true;
  double rel = 2e-5;  // relative-error bound (f32 default)
};

// Runs c on the CPU and on the GPU with the same f32 values; compares the output and,
// through sum(out * w) with a random w, every input's gradient.
inline void compare_case(const Case& c, bool non_contiguous, uint64_t seed) {
  CAPTURE(c.name);
  CAPTURE(non_contiguous);
  PoisonAllocations poison;
  // Non-contiguous: the same values with column-major strides on both devices.
  auto layout = [&](const Tensor& t) {
    NoGradGuard no_grad;
    return non_contiguous && t.dim() >= 2 ? t.transpose(-1, -2).contiguous().transpose(-1, -2) : t;
  };
  V cpu_in, gpu_in;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    const Tensor x = testing::random_input(c.shapes[i], seed + i, false, c.lo, c.hi).to(kFloat32);
    cpu_in.push_back(layout(x).detach().requires_grad_(c.backward));
    gpu_in.push_back(layout(x.to(kGpu)).detach().requires_grad_(c.backward));
  }
  const Tensor out_cpu = c.fn(cpu_in), out_gpu = c.fn(gpu_in);
  check_matches(out_gpu, out_cpu, c.name + " forward", c.rel);
  if (!c.backward || !out_cpu.is_floating_point()) return;
  const Tensor w = testing::random_input(out_cpu.sizes(), seed + 99).to(kFloat32);
  (out_cpu * w).sum().backward();
  (out_gpu * w.to(kGpu)).sum().backward();
  for (size_t i = 0; i < cpu_in.size(); ++i) {
    if (!cpu_in[i].grad().defined()) continue;
    REQUIRE_MESSAGE(gpu_in[i].grad().defined(), c.name, ": input ", i, " has a gradient on cpu only");
    check_matches(gpu_in[i].grad(), cpu_in[i].grad(), c.name + " grad of input " + std::to_string(i), c.rel);
  }
}

inline void run_table(const std::vector<Case>& cases) {
  uint64_t seed = 1000;
  for (const Case& c : cases) {
    compare_case(c, false, seed);
    compare_case(c, true, seed + 50);
    seed += 100;
  }
}

}  // namespace nd::testing::cuda_compare
