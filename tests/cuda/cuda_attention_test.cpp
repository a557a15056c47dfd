// CPU-vs-CUDA for the fused attention (kernels/cuda/attention.cu): every case runs
// nd::scaled_dot_product_attention forward and backward (through sum(out * w), random w)
// on both devices with the same values, in f32 and f64, and compares out, dq, dk, dv.
// The shapes cover the compiled head dims (32, 64, 128) and padded ones (8, 16, 24, 40, 72),
// lengths that do not divide the tiles, causal with Sq < Sk and Sq > Sk, masks broadcast
// by strides, a fully masked row, empty sequences and the MAE's shapes. GPU outputs come
// from NaN-poisoned allocations, so an element the kernels never write fails. The backward
// must also be bit-identical run to run.
// bf16 (the tensor-core kernels): at kernel level against the f32 CPU kernel on the same
// bf16-rounded inputs with the results rounded (out, lse, dq, dk, dv), and through the op
// under autocast against the CPU's autocast path (engine/ops/attention.cpp), both at bf16
// tolerance: the CUDA kernels also round P and dS to bf16 before the second products.
// Without a GPU every case reports "SKIPPED:".
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cuda/cuda_compare.h"
#include "engine/autocast.h"
#include "engine/nn/attention.h"
#include "engine/ops/attention.h"
#include "harness.h"
#include "kernels/common/float16.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/stream.h"

using namespace nd;
using namespace nd::testing::cuda_compare;

namespace {

struct AttentionCase {
  std::string name;
  int64_t B, H, Sq, Sk, E, Ev;
  bool causal = false;
  // The attention mask, built on the CPU in f64 (or bool) for (B, H, Sq, Sk); none if empty.
  std::function<Tensor(const AttentionCase&)> mask = nullptr;
  bool three_d = false;  // [B, L, E] inputs (H must be 1)
};

struct Result {
  Tensor out, dq, dk, dv;
};

Shape shape_of(const AttentionCase& c, int64_t rows, int64_t width) {
  return c.three_d ? Shape{c.B, rows, width} : Shape{c.B, c.H, rows, width};
}

// One forward and backward on `device`; the seed fixes q, k, v and the output weights w.
// amp: the forward under an AutocastGuard of the device's type (operands amp_dtype), the
// backward outside it (the node remembers; backward_in_guard puts it inside too).
Result run(const AttentionCase& c, ScalarType dtype, Device device, uint64_t seed, bool amp = false,
           bool backward_in_guard = false, ScalarType amp_dtype = kBFloat16) {
  auto input = [&](const Shape& shape, uint64_t s) {
    return testing::random_input(shape, s, false, -2, 2).to(dtype).to(device).requires_grad_(true);
  };
  const Tensor q = input(shape_of(c, c.Sq, c.E), seed), k = input(shape_of(c, c.Sk, c.E), seed + 1),
               v = input(shape_of(c, c.Sk, c.Ev), seed + 2);
  Tensor mask;
  if (c.mask) {
    mask = c.mask(c);
    if (mask.dtype() != kBool) mask = mask.to(dtype);
    mask = mask.to(device);
  }
  Tensor out;
  {
    AutocastGuard guard(device.type, amp, amp_dtype);
    out = scaled_dot_product_attention(q, k, v, mask, 0.0, c.causal);
  }
  const Tensor w = testing::random_input(out.sizes(), seed + 3).to(dtype).to(device);
  AutocastGuard guard(device.type, amp && backward_in_guard);
  (out * w).sum().backward();
  return {out, q.grad(), k.grad(), v.grad()};
}

// Random additive mask [B, 1, Sq, Sk] (broadcast over heads) in [-1, 1) with about one
// element in five -inf.
Tensor mask_over_heads(const AttentionCase& c) {
  const std::vector<double> r = testing::to_vector(testing::random_input({c.B, 1, c.Sq, c.Sk}, 77, false, 0, 1));
  std::vector<double> m(r.size());
  for (size_t x = 0; x < r.size(); ++x) m[x] = r[x] < 0.2 ? -std::numeric_limits<double>::infinity() : 10 * r[x] - 6;
  return tensor(m, TensorOptions(kFloat64)).reshape({c.B, 1, c.Sq, c.Sk});
}

// Bool mask [Sq, Sk] broadcast over batch and heads: true = attend (about 70%).
Tensor bool_mask(const AttentionCase& c) {
  const Tensor r = testing::random_input({c.Sq, c.Sk}, 78, false, 0, 1);
  return gt(r, full({c.Sq, c.Sk}, 0.3, TensorOptions(kFloat64)));
}

// Additive mask [B, 1, Sq, Sk] of zeros except query row kMaskedRow of batch 0: all -inf.
constexpr int64_t kMaskedRow = 5;
constexpr const char* kMaskedRowCase = "a fully masked row";
Tensor masked_row(const AttentionCase& c) {
  std::vector<double> m(c.B * c.Sq * c.Sk, 0.0);
  for (int64_t j = 0; j < c.Sk; ++j) m[kMaskedRow * c.Sk + j] = -std::numeric_limits<double>::infinity();
  return tensor(m, TensorOptions(kFloat64)).reshape({c.B, 1, c.Sq, c.Sk});
}

const std::vector<AttentionCase>& cases() {
  static const std::vector<AttentionCase> all = {
      {"B=2 H=3 Sq=Sk=77 E=32", 2, 3, 77, 77, 32, 32},
      {"Sq=50 Sk=129 E=64", 2, 2, 50, 129, 64, 64},
      {"E=128", 1, 2, 70, 45, 128, 128},
      {"E=16 (padded to 32)", 2, 2, 33, 40, 16, 16},
      {"E=40 Ev=24 (padded to 64)", 2, 1, 37, 29, 40, 24},
      {"E=16 Ev=72 (padded to 128)", 1, 2, 20, 31, 16, 72},
      {"causal Sq < Sk", 2, 2, 40, 97, 32, 32, true},
      {"causal Sq > Sk", 2, 2, 97, 40, 32, 32, true},
      {"causal E=128 Sq=Sk=33", 1, 2, 33, 33, 128, 128, true},
      {"additive mask broadcast over heads", 2, 3, 45, 70, 32, 32, false, mask_over_heads},
      {"bool mask broadcast over batch and heads", 2, 2, 37, 52, 64, 64, false, bool_mask},
      {kMaskedRowCase, 2, 2, 19, 23, 32, 32, false, masked_row},
      {"3-D inputs [B, L, E]", 3, 1, 19, 23, 24, 24, false, nullptr, true},
      {"MAE small decoder (B=4 H=3 S=50 E=32)", 4, 3, 50, 50, 32, 32},
      {"MAE small encoder (B=4 H=6 S=13 E=32)", 4, 6, 13, 13, 32, 32},
      {"MAE tiny encoder (B=4 H=4 S=13 E=16)", 4, 4, 13, 13, 16, 16},
      {"MAE tiny decoder (B=4 H=4 S=50 E=8)", 4, 4, 50, 50, 8, 8},
      {"no keys (Sk = 0)", 1, 2, 5, 0, 16, 16},
      {"no queries (Sq = 0)", 1, 2, 0, 5, 16, 16},
  };
  return all;
}

void compare(const AttentionCase& c, ScalarType dtype, uint64_t seed) {
  CAPTURE(c.name);
  PoisonAllocations poison;
  // f32: both devices accumulate in f32 in different orders (the CPU's f32 results are
  // within 5e-7 of its f64 ones on these cases, so 2e-5 leaves a wide margin); f64: rounding.
  const double rel = dtype == kFloat32 ? 2e-5 : 1e-12;
  const std::string what = c.name + (dtype == kFloat32 ? " f32 " : " f64 ");
  const Result cpu = run(c, dtype, Device(kCPU), seed), gpu = run(c, dtype, kGpu, seed);
  check_matches(gpu.out, cpu.out, what + "out", rel);
  check_matches(gpu.dq, cpu.dq, what + "dq", rel);
  check_matches(gpu.dk, cpu.dk, what + "dk", rel);
  check_matches(gpu.dv, cpu.dv, what + "dv", rel);
}

std::vector<double> bits(const Tensor& t) { return testing::to_vector(t.cpu()); }

}  // namespace

TEST_CASE("cuda attention: forward and backward match the CPU (f32)") {
  if (skip_without_gpu()) return;
  uint64_t seed = 5000;
  for (const AttentionCase& c : cases()) compare(c, kFloat32, seed += 10);
}

TEST_CASE("cuda attention: forward and backward match the CPU (f64)") {
  if (skip_without_gpu()) return;
  uint64_t seed = 6000;
  for (const AttentionCase& c : cases()) compare(c, kFloat64, seed += 10);
}

TEST_CASE("cuda attention: a fully masked row gives out = 0 and no gradient on the GPU") {
  if (skip_without_gpu()) return;
  const AttentionCase c{kMaskedRowCase, 2, 2, 19, 23, 32, 32, false, masked_row};
  for (ScalarType dtype : {kFloat32, kFloat64}) {
    const Result r = run(c, dtype, kGpu, 42);
    const std::vector<double> out = bits(r.out), dq = bits(r.dq);
    for (int64_t h = 0; h < c.H; ++h) {  // batch 0, query row kMaskedRow of every head
      for (int64_t e = 0; e < c.Ev; ++e) CHECK(out[(h * c.Sq + kMaskedRow) * c.Ev + e] == 0.0);
      for (int64_t e = 0; e < c.E; ++e) CHECK(dq[(h * c.Sq + kMaskedRow) * c.E + e] == 0.0);
    }
  }
}

TEST_CASE("cuda attention: the backward is bit-reproducible") {
  if (skip_without_gpu()) return;
  for (const AttentionCase& c : {cases()[1], cases()[7], cases()[9]}) {
    for (ScalarType dtype : {kFloat32, kFloat64}) {
      CAPTURE(c.name);
      const Result a = run(c, dtype, kGpu, 7), b = run(c, dtype, kGpu, 7);
      CHECK(bits(a.out) == bits(b.out));
      CHECK(bits(a.dq) == bits(b.dq));
      CHECK(bits(a.dk) == bits(b.dk));
      CHECK(bits(a.dv) == bits(b.dv));
    }
  }
}

TEST_CASE("cuda attention: head dims over 128 are an error naming the limit") {
  if (skip_without_gpu()) return;
  const Tensor q = testing::random_input({1, 1, 4, 160}, 1).to(kFloat32).to(kGpu);
  const Tensor v = testing::random_input({1, 1, 4, 8}, 2).to(kFloat32).to(kGpu);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, q, v), doctest::Contains("at most 128"), Error);
}

TEST_CASE("cuda attention: under autocast (bf16 or f16 tensor cores) matches the CPU's autocast path") {
  if (skip_without_gpu()) return;
  // Both round q, k, v, mask, dout and the results to bf16 at the same points; the GPU also
  // rounds P and dS before the second products, so the devices agree to bf16 precision
  // (each rounding <= 2^-9 relative; the CPU emulation of the kernels measured <= 3.2e-3
  // in this norm), not bit for bit: 1e-2, the bound. f16 rounds to 2^-12: 2e-3.
  uint64_t seed = 7000;
  for (const ScalarType dt : {kBFloat16, kFloat16}) {
    const double rel = dt == kFloat16 ? 2e-3 : 1e-2;
    for (size_t i = 0; i < cases().size(); ++i) {
      const AttentionCase& c = cases()[i];
      // Emulated, f16 takes every other case (tests/emu/attention_emu_test.cpp runs the f16
      // kernels on their own through head dims, tails, causality and masks).
      if (emulated() && dt == kFloat16 && i % 2) continue;
      CAPTURE(c.name);
      CAPTURE(dtype_name(dt));
      PoisonAllocations poison;
      const Result cpu = run(c, kFloat32, Device(kCPU), seed += 10, true, false, dt),
                   gpu = run(c, kFloat32, kGpu, seed, true, false, dt);
      CHECK(gpu.out.dtype() == kFloat32);
      check_matches(gpu.out, cpu.out, c.name + " amp out", rel);
      check_matches(gpu.dq, cpu.dq, c.name + " amp dq", rel);
      check_matches(gpu.dk, cpu.dk, c.name + " amp dk", rel);
      check_matches(gpu.dv, cpu.dv, c.name + " amp dv", rel);
      // Not the f32 path: out is rounded to the autocast dtype.
      CHECK(bits(gpu.out) == bits(gpu.out.to(dt).to(kFloat32)));
    }
  }
}

TEST_CASE("cuda attention: under autocast the backward keeps bf16 outside the guard and is bit-reproducible") {
  if (skip_without_gpu()) return;
  for (const AttentionCase& c : {cases()[1], cases()[7], cases()[9]}) {
    CAPTURE(c.name);
    const Result outside = run(c, kFloat32, kGpu, 9, true, false), inside = run(c, kFloat32, kGpu, 9, true, true);
    CHECK(bits(outside.out) == bits(inside.out));
    CHECK(bits(outside.dq) == bits(inside.dq));
    CHECK(bits(outside.dk) == bits(inside.dk));
    CHECK(bits(outside.dv) == bits(inside.dv));
    const Result exact = run(c, kFloat32, kGpu, 9);
    CHECK(bits(outside.dq) != bits(exact.dq));
  }
}

TEST_CASE("cuda attention: MultiheadAttention under autocast on CUDA matches the CPU's autocast run") {
  if (skip_without_gpu()) return;
  manual_seed(31);
  nn::MultiheadAttention mha(nn::MultiheadAttentionOptions(64, 2).batch_first(true));
  const Tensor x = testing::random_input({3, 50, 64}, 32).to(kFloat32);
  Tensor cpu_out, gpu_out;
  {
    AutocastGuard amp(kCPU);
    cpu_out = mha->forward(x);
  }
  mha->to(kGpu);
  {
    AutocastGuard amp(kCUDA);
    const Tensor xg = x.to(kGpu);
    gpu_out = mha->forward(xg);
  }
  check_matches(gpu_out, cpu_out, "MultiheadAttention amp out", 1e-2);
}

// Kernel level: calls kernels::cuda directly, which CUDA builds alone contain.
#ifdef NANODDP_WITH_CUDA

namespace {

Tensor from_floats(const std::vector<float>& x, const Shape& shape) {
  return tensor(std::vector<double>(x.begin(), x.end()), TensorOptions(kFloat32)).reshape(shape);
}
using testing::bf16_rounded;
using testing::to_floats;

}  // namespace

TEST_CASE("cuda attention: bf16 tensor-core kernels match the f32 CPU kernel on bf16 values") {
  if (skip_without_gpu()) return;
  // Every head dim (compiled and padded), odd lengths, causal both ways, an additive bf16
  // mask with -inf entries, a fully masked row, empty sequences. The CPU reference is
  // kernels::cpu in f32 on the same bf16 values, out rounded to bf16 and fed to its backward
  // (what the engine's CPU autocast path computes), results rounded. Tolerance 1e-2 (above).
  for (const AttentionCase& c : cases()) {
    if (c.mask && c.name != std::string(kMaskedRowCase) && c.name.find("additive") == std::string::npos) continue;
    CAPTURE(c.name);
    PoisonAllocations poison;
    const int64_t BH = c.B * c.H;
    auto input = [&](int64_t rows, int64_t width, uint64_t seed) {
      return bf16_rounded(to_floats(testing::random_input({BH * rows * width}, seed, false, -2, 2)));
    };
    const std::vector<float> q = input(c.Sq, c.E, 1), k = input(c.Sk, c.E, 2), v = input(c.Sk, c.Ev, 3),
                             dout = input(c.Sq, c.Ev, 4);
    std::vector<float> mask;
    kernels::cpu::AttentionMask<float> cpu_mask;
    Tensor mask_gpu;
    kernels::cuda::AttentionMask<BFloat16> gpu_mask;
    if (c.mask) {  // [B, 1, Sq, Sk]
      mask = bf16_rounded(to_floats(c.mask(c).to(kFloat32)));
      cpu_mask = {mask.data(), c.Sq * c.Sk, 0, c.Sk, 1};
      mask_gpu = from_floats(mask, {int64_t(mask.size())}).to(kBFloat16).to(kGpu);
      gpu_mask = {mask_gpu.data_ptr<BFloat16>(), c.Sq * c.Sk, 0, c.Sk, 1};
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.E));
    std::vector<float> out(BH * c.Sq * c.Ev), lse(BH * c.Sq), dq(q.size()), dk(k.size()), dv(v.size());
    kernels::cpu::scaled_dot_product_attention_forward<float>(q.data(), k.data(), v.data(), cpu_mask, c.B, c.H, c.Sq,
                                                              c.Sk, c.E, c.Ev, c.causal, scale, {}, out.data(),
                                                              lse.data());
    out = bf16_rounded(out);
    kernels::cpu::scaled_dot_product_attention_backward<float>(dout.data(), q.data(), k.data(), v.data(), cpu_mask,
                                                               out.data(), lse.data(), c.B, c.H, c.Sq, c.Sk, c.E,
                                                               c.Ev, c.causal, scale, {}, dq.data(), dk.data(),
                                                               dv.data());

    auto on_gpu = [](const std::vector<float>& x) {
      return from_floats(x, {int64_t(x.size())}).to(kBFloat16).to(kGpu);
    };
    const Tensor qg = on_gpu(q), kg = on_gpu(k), vg = on_gpu(v), dg = on_gpu(dout);
    auto run_gpu = [&] {
      const Tensor out_g = empty_like(dg), lse_g = empty({BH * c.Sq}, TensorOptions(kFloat32).device(kGpu));
      const Tensor dq_g = empty_like(qg), dk_g = empty_like(kg), dv_g = empty_like(vg);
      const cudaStream_t stream = kernels::cuda::use_device(0);
      kernels::cuda::scaled_dot_product_attention_forward(
          qg.data_ptr<BFloat16>(), kg.data_ptr<BFloat16>(), vg.data_ptr<BFloat16>(), gpu_mask, c.B, c.H, c.Sq, c.Sk,
          c.E, c.Ev, c.causal, scale, {}, out_g.data_ptr<BFloat16>(), lse_g.data_ptr<float>(), stream);
      kernels::cuda::scaled_dot_product_attention_backward(
          dg.data_ptr<BFloat16>(), qg.data_ptr<BFloat16>(), kg.data_ptr<BFloat16>(), vg.data_ptr<BFloat16>(),
          gpu_mask, out_g.data_ptr<BFloat16>(), lse_g.data_ptr<float>(), c.B, c.H, c.Sq, c.Sk, c.E, c.Ev, c.causal,
          scale, {}, dq_g.data_ptr<BFloat16>(), dk_g.data_ptr<BFloat16>(), dv_g.data_ptr<BFloat16>(), stream);
      return std::vector<Tensor>{out_g.to(kFloat32), lse_g, dq_g.to(kFloat32), dk_g.to(kFloat32), dv_g.to(kFloat32)};
    };
    const std::vector<Tensor> a = run_gpu();
    check_matches(a[0], from_floats(out, {int64_t(out.size())}), c.name + " bf16 out", 1e-2);
    check_matches(a[2], from_floats(bf16_rounded(dq), {int64_t(dq.size())}), c.name + " bf16 dq", 1e-2);
    check_matches(a[3], from_floats(bf16_rounded(dk), {int64_t(dk.size())}), c.name + " bf16 dk", 1e-2);
    check_matches(a[4], from_floats(bf16_rounded(dv), {int64_t(dv.size())}), c.name + " bf16 dv", 1e-2);
    // lse is f32 from f32 scores of exact bf16 products: close to the CPU's; -inf where a row
    // sees no key (the masked row, Sk = 0) on both.
    const std::vector<float> lse_g = to_floats(a[1]);
    for (size_t x = 0; x < lse.size(); ++x) {
      CAPTURE(x);
      if (std::isinf(lse[x])) CHECK(lse_g[x] == lse[x]);
      else CHECK(std::abs(lse_g[x] - lse[x]) <= 1e-4 * (1 + std::abs(lse[x])));
    }
    if (c.name == std::string(kMaskedRowCase)) {  // batch 0, row kMaskedRow of every head: out = 0, dq = 0
      const std::vector<float> o = to_floats(a[0]), g = to_floats(a[2]);
      for (int64_t h = 0; h < c.H; ++h) {
        for (int64_t e = 0; e < c.Ev; ++e) CHECK(o[(h * c.Sq + kMaskedRow) * c.Ev + e] == 0.0f);
        for (int64_t e = 0; e < c.E; ++e) CHECK(g[(h * c.Sq + kMaskedRow) * c.E + e] == 0.0f);
      }
    }
    const std::vector<Tensor> b = run_gpu();  // bit-reproducible
    for (size_t x = 0; x < a.size(); ++x) CHECK(bits(a[x]) == bits(b[x]));
  }
}

#endif  // NANODDP_WITH_CUDA
