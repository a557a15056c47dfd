// CPU-vs-CUDA for the fused attention (kernels/cuda/attention.cu): every case runs
// nd::scaled_dot_product_attention forward and backward (through sum(out * w), random w)
// on both devices with the same values, in f32 and f64, and compares out, dq, dk, dv.
// The shapes cover the compiled head dims (32, 64, 128) and padded ones (8, 16, 24, 40, 72),
// lengths that do not divide the tiles, causal with Sq < Sk and Sq > Sk, masks broadcast
// by strides, a fully masked row, empty sequences and the MAE's shapes. GPU outputs come
// from NaN-poisoned allocations, so an element the kernels never write fails. The backward
// must also be bit-identical run to run. The bf16 kernels (kernel level only) are checked
// against the f32 CPU op on the same bf16-rounded values. Without a GPU every case reports
// "SKIPPED:".
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cuda/cuda_compare.h"
#include "engine/ops/attention.h"
#include "harness.h"
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
Result run(const AttentionCase& c, ScalarType dtype, Device device, uint64_t seed) {
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
  const Tensor out = scaled_dot_product_attention(q, k, v, mask, 0.0, c.causal);
  const Tensor w = testing::random_input(out.sizes(), seed + 3).to(dtype).to(device);
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

// Kernel level: calls kernels::cuda directly, which CUDA builds alone contain.
#ifdef NANODDP_WITH_CUDA

TEST_CASE("cuda attention: bf16 kernels (f32 arithmetic) match the f32 CPU op on bf16 values") {
  if (skip_without_gpu()) return;
  for (const AttentionCase& c : {cases()[1], cases()[4], cases()[7]}) {
    CAPTURE(c.name);
    PoisonAllocations poison;
    // Values representable in bf16, as f32 on the CPU (with gradients) and bf16 on the GPU.
    auto input = [&](int64_t rows, int64_t width, uint64_t seed) {
      return testing::random_input(shape_of(c, rows, width), seed, false, -2, 2).to(kBFloat16).to(kFloat32);
    };
    const Tensor q = input(c.Sq, c.E, 1).requires_grad_(true), k = input(c.Sk, c.E, 2).requires_grad_(true),
                 v = input(c.Sk, c.Ev, 3).requires_grad_(true), dout = input(c.Sq, c.Ev, 4);
    const Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, c.causal);
    (out * dout).sum().backward();

    auto on_gpu = [](const Tensor& t) { return t.detach().to(kBFloat16).to(kGpu); };
    const Tensor qg = on_gpu(q), kg = on_gpu(k), vg = on_gpu(v), dg = on_gpu(dout);
    const Tensor out_g = empty_like(dg), lse_g = empty({c.B, c.H, c.Sq}, TensorOptions(kFloat32).device(kGpu));
    const Tensor dq_g = empty_like(qg), dk_g = empty_like(kg), dv_g = empty_like(vg);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.E));
    const cudaStream_t stream = kernels::cuda::use_device(0);
    kernels::cuda::scaled_dot_product_attention_forward(
        qg.data_ptr<BFloat16>(), kg.data_ptr<BFloat16>(), vg.data_ptr<BFloat16>(), {}, c.B, c.H, c.Sq, c.Sk, c.E,
        c.Ev, c.causal, scale, out_g.data_ptr<BFloat16>(), lse_g.data_ptr<float>(), stream);
    kernels::cuda::scaled_dot_product_attention_backward(
        dg.data_ptr<BFloat16>(), qg.data_ptr<BFloat16>(), kg.data_ptr<BFloat16>(), vg.data_ptr<BFloat16>(), {},
        out_g.data_ptr<BFloat16>(), lse_g.data_ptr<float>(), c.B, c.H, c.Sq, c.Sk, c.E, c.Ev, c.causal, scale,
        dq_g.data_ptr<BFloat16>(), dk_g.data_ptr<BFloat16>(), dv_g.data_ptr<BFloat16>(), stream);
    // bf16 rounds each result once (relative 2^-9); the backward also reads the rounded out.
    const double rel = 1e-2;
    check_matches(out_g.to(kFloat32), out, c.name + " bf16 out", rel);
    check_matches(dq_g.to(kFloat32), q.grad(), c.name + " bf16 dq", rel);
    check_matches(dk_g.to(kFloat32), k.grad(), c.name + " bf16 dk", rel);
    check_matches(dv_g.to(kFloat32), v.grad(), c.name + " bf16 dv", rel);
  }
}

#endif  // NANODDP_WITH_CUDA
