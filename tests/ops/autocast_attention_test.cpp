// scaled_dot_product_attention under autocast (engine/autocast.h) on the CPU: f32 attention
// inside an AutocastGuard(kCPU) computes from bf16 operands (engine/ops/attention.cpp says
// where it rounds). The expectation is built here by hand: q, k, v, mask and dout rounded
// to bf16 values, the f32 CPU kernel (kernels/cpu/attention.h) called directly, out rounded,
// the backward from the rounded out and the f32 logsumexp, dq, dk, dv rounded; the op must
// equal it bit for bit, with bf16 and with f16 as autocast's dtype. Also: the backward keeps the forward's precision outside the guard,
// f64 and autocast off are untouched, and the result is within bf16 precision of plain f32.
// The CUDA path is compared with this one in tests/cuda/cuda_attention_test.cpp.
#include <cmath>
#include <limits>
#include <vector>

#include "harness.h"
#include "kernels/cpu/attention.h"

using namespace nd;

namespace {

struct Case {
  const char* name;
  int64_t B, H, L, S, E, Ev;
  bool causal = false;
  int mask = 0;  // 0 none, 1 additive [B, 1, L, S] with -inf entries, 2 bool [L, S], 3 row 2 fully masked
  bool heads_inner = false;  // q, k, v as [B, L, H, X] viewed as [B, H, L, X] (MultiheadAttention's)
};

const Case kCases[] = {
    {"plain B=2 H=3 L=9 S=13 E=8", 2, 3, 9, 13, 8, 8},
    {"E=5 Ev=7", 1, 2, 11, 6, 5, 7},
    {"causal L > S", 2, 2, 12, 7, 8, 8, true},
    {"causal L < S", 1, 2, 6, 10, 4, 4, true},
    {"additive mask with -inf", 2, 2, 7, 9, 8, 8, false, 1},
    {"bool mask", 1, 3, 8, 8, 8, 8, false, 2},
    {"fully masked row", 2, 1, 6, 5, 4, 4, false, 3},
    {"heads-inner views", 2, 3, 10, 10, 4, 4, false, 0, true},
};

using testing::rounded;
using testing::to_floats;

// An f32 input of `shape` [B, H, rows, X] in [-2, 2); heads_inner: a [B, rows, H, X] tensor
// viewed as [B, H, rows, X].
Tensor input(const Case& c, int64_t rows, int64_t width, uint64_t seed) {
  if (!c.heads_inner) return testing::random_input({c.B, c.H, rows, width}, seed, false, -2, 2).to(kFloat32);
  return testing::random_input({c.B, rows, c.H, width}, seed, false, -2, 2).to(kFloat32).transpose(1, 2);
}

// The mask of case c, as passed to the op (f32 or bool), or undefined.
Tensor make_mask(const Case& c) {
  if (c.mask == 0) return {};
  const double inf = std::numeric_limits<double>::infinity();
  if (c.mask == 2) {
    return gt(testing::random_input({c.L, c.S}, 31, false, 0, 1), full({c.L, c.S}, 0.3, TensorOptions(kFloat64)));
  }
  std::vector<double> r = testing::to_vector(testing::random_input({c.B, 1, c.L, c.S}, 32, false, 0, 1));
  for (size_t x = 0; x < r.size(); ++x) {
    if (c.mask == 1) r[x] = r[x] < 0.2 ? -inf : 3 * r[x] - 1;  // values that bf16 rounds
    if (c.mask == 3) r[x] = (x / c.S) % c.L == 2 ? -inf : 0.0;
  }
  return tensor(r, TensorOptions(kFloat32)).reshape({c.B, 1, c.L, c.S});
}

// The mask as the kernel's dense [B, H, L, S] values, rounded to dt (bool: 0 / -inf).
std::vector<float> dense_mask(const Case& c, const Tensor& mask, ScalarType dt) {
  const std::vector<double> m = testing::to_vector(mask);
  const bool is_bool = mask.dtype() == kBool;  // [L, S]; the others are [B, 1, L, S]
  std::vector<float> out;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t ij = 0; ij < c.L * c.S; ++ij) {
        const double x = m[(is_bool ? 0 : b * c.L * c.S) + ij];
        out.push_back(is_bool ? (x != 0 ? 0.0f : -std::numeric_limits<float>::infinity()) : static_cast<float>(x));
      }
  return rounded(out, dt);
}

struct Result {
  std::vector<float> out, dq, dk, dv;
};

// The expectation by hand (see the file comment), dt the autocast dtype.
Result expected(const Case& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                const Tensor& dout, ScalarType dt) {
  const std::vector<float> qr = rounded(to_floats(q), dt), kr = rounded(to_floats(k), dt), vr = rounded(to_floats(v), dt);
  const std::vector<float> dr = rounded(to_floats(dout), dt);
  std::vector<float> m;
  kernels::cpu::AttentionMask<float> km;
  if (mask.defined()) {
    m = dense_mask(c, mask, dt);
    km = {m.data(), c.H * c.L * c.S, c.L * c.S, c.S, 1};
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.E));
  std::vector<float> out(c.B * c.H * c.L * c.Ev), lse(c.B * c.H * c.L);
  kernels::cpu::scaled_dot_product_attention_forward<float>(qr.data(), kr.data(), vr.data(), km, c.B, c.H, c.L, c.S,
                                                            c.E, c.Ev, c.causal, scale, {}, out.data(), lse.data());
  out = rounded(out, dt);
  std::vector<float> dq(qr.size()), dk(kr.size()), dv(vr.size());
  kernels::cpu::scaled_dot_product_attention_backward<float>(dr.data(), qr.data(), kr.data(), vr.data(), km,
                                                             out.data(), lse.data(), c.B, c.H, c.L, c.S, c.E, c.Ev,
                                                             c.causal, scale, {}, dq.data(), dk.data(), dv.data());
  return {out, rounded(dq, dt), rounded(dk, dt), rounded(dv, dt)};
}

struct Run {
  Tensor out, dq, dk, dv;
};

// The op's forward under AutocastGuard(kCPU, forward_amp, amp_dtype), its backward through
// sum(out * dout) under AutocastGuard(kCPU, backward_amp).
Run run_op(const Case& c, ScalarType dtype, bool forward_amp, bool backward_amp, ScalarType amp_dtype = kBFloat16) {
  const Tensor q = input(c, c.L, c.E, 1).to(dtype).requires_grad_(true);
  const Tensor k = input(c, c.S, c.E, 2).to(dtype).requires_grad_(true);
  const Tensor v = input(c, c.S, c.Ev, 3).to(dtype).requires_grad_(true);
  const Tensor dout = testing::random_input({c.B, c.H, c.L, c.Ev}, 4, false, -1, 1).to(dtype);
  Tensor mask = make_mask(c);
  if (mask.defined() && mask.dtype() != kBool) mask = mask.to(dtype);
  Tensor out;
  {
    AutocastGuard amp(kCPU, forward_amp, amp_dtype);
    out = scaled_dot_product_attention(q, k, v, mask, 0.0, c.causal);
  }
  {
    AutocastGuard amp(kCPU, backward_amp);
    (out * dout).sum().backward();
  }
  return {out, q.grad(), k.grad(), v.grad()};
}

bool same_bits(const Tensor& a, const std::vector<float>& b) { return to_floats(a) == b; }
bool same_bits(const Tensor& a, const Tensor& b) { return testing::bitwise_equal(a, b); }

using testing::relative_error;

}  // namespace

TEST_CASE("autocast attention: out and gradients equal the f32 CPU kernel on bf16- or f16-rounded operands, rounded") {
  for (const ScalarType dt : {kBFloat16, kFloat16}) {
    for (const Case& c : kCases) {
      CAPTURE(c.name);
      CAPTURE(dtype_name(dt));
      const Run r = run_op(c, kFloat32, true, true, dt);
      const Result e = expected(c, input(c, c.L, c.E, 1), input(c, c.S, c.E, 2), input(c, c.S, c.Ev, 3), make_mask(c),
                                testing::random_input({c.B, c.H, c.L, c.Ev}, 4, false, -1, 1).to(kFloat32), dt);
      CHECK(r.out.dtype() == kFloat32);
      CHECK(r.dq.dtype() == kFloat32);
      CHECK(r.out.sizes() == Shape{c.B, c.H, c.L, c.Ev});
      CHECK(r.dq.sizes() == Shape{c.B, c.H, c.L, c.E});
      CHECK(same_bits(r.out, e.out));
      CHECK(same_bits(r.dq, e.dq));
      CHECK(same_bits(r.dk, e.dk));
      CHECK(same_bits(r.dv, e.dv));
    }
  }
}

TEST_CASE("autocast attention: a fully masked row gives out = 0 and no gradient") {
  const Case& c = kCases[6];
  const Run r = run_op(c, kFloat32, true, true);
  const std::vector<double> out = testing::to_vector(r.out), dq = testing::to_vector(r.dq);
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t e = 0; e < c.Ev; ++e) CHECK(out[(b * c.L + 2) * c.Ev + e] == 0.0);
    for (int64_t e = 0; e < c.E; ++e) CHECK(dq[(b * c.L + 2) * c.E + e] == 0.0);
  }
}

TEST_CASE("autocast attention: the backward keeps the forward's precision, wherever it runs") {
  const Case& c = kCases[4];
  const Run both = run_op(c, kFloat32, true, true);
  const Run forward_only = run_op(c, kFloat32, true, false);  // backward outside the guard: still bf16
  CHECK(same_bits(forward_only.dq, both.dq));
  CHECK(same_bits(forward_only.dk, both.dk));
  CHECK(same_bits(forward_only.dv, both.dv));
  const Run plain = run_op(c, kFloat32, false, false);
  const Run backward_only = run_op(c, kFloat32, false, true);  // f32 forward: f32 backward inside a guard
  CHECK(same_bits(backward_only.out, plain.out));
  CHECK(same_bits(backward_only.dq, plain.dq));
  CHECK(same_bits(backward_only.dk, plain.dk));
  CHECK(same_bits(backward_only.dv, plain.dv));
  CHECK_FALSE(same_bits(both.dq, plain.dq));
}

TEST_CASE("autocast attention: f64, autocast off and another device's guard leave it exact") {
  for (const Case& c : {kCases[0], kCases[4]}) {
    CAPTURE(c.name);
    const Run f64_plain = run_op(c, kFloat64, false, false), f64_amp = run_op(c, kFloat64, true, true);
    CHECK(same_bits(f64_amp.out, f64_plain.out));
    CHECK(same_bits(f64_amp.dq, f64_plain.dq));
    CHECK(same_bits(f64_amp.dk, f64_plain.dk));
    CHECK(same_bits(f64_amp.dv, f64_plain.dv));
    const Run plain = run_op(c, kFloat32, false, false);
    Run cuda_guard;
    {
      AutocastGuard cuda_only(kCUDA);  // does not reach CPU tensors
      cuda_guard = run_op(c, kFloat32, false, false);
    }
    CHECK(same_bits(cuda_guard.out, plain.out));
    CHECK(same_bits(cuda_guard.dq, plain.dq));
    CHECK(same_bits(cuda_guard.dv, plain.dv));
  }
}

TEST_CASE("autocast attention: within bf16 precision of f32 attention") {
  // Each rounding (inputs, out, gradients) is at most 2^-9 relative; the softmax adds no
  // amplification on these well-conditioned inputs. Different from f32 (> 1e-4), within 1e-2.
  for (const Case& c : {kCases[0], kCases[2], kCases[4], kCases[7]}) {
    CAPTURE(c.name);
    const Run amp = run_op(c, kFloat32, true, true), plain = run_op(c, kFloat32, false, false);
    for (const auto& [a, p] : {std::pair{amp.out, plain.out}, std::pair{amp.dq, plain.dq},
                               std::pair{amp.dk, plain.dk}, std::pair{amp.dv, plain.dv}}) {
      const double err = relative_error(a, p);
      CHECK(err > 1e-4);
      CHECK(err < 1e-2);
    }
  }
}

TEST_CASE("autocast attention: MultiheadAttention runs its attention in bf16 under the guard") {
  // The module's q, k, v projections return f32 under autocast, so its attention takes the
  // autocast path too: the whole forward equals the module's pieces with the attention
  // computed on rounded q, k, v and rounded out.
  manual_seed(21);
  nn::MultiheadAttention mha(nn::MultiheadAttentionOptions(8, 2).batch_first(true));
  const Tensor x = testing::random_input({2, 5, 8}, 22).to(kFloat32);
  Tensor under, heads_amp, heads_exact;
  {
    AutocastGuard amp(kCPU);
    under = mha->forward(x);
  }
  const Tensor plain = mha->forward(x);
  const double err = relative_error(under, plain);
  CHECK(err > 1e-4);
  CHECK(err < 1e-2);
  // The attention alone, on the module's own f32 projections: rounded under the guard.
  {
    NoGradGuard no_grad;
    AutocastGuard amp(kCPU);
    const Tensor w = mha->in_proj_weight, b = mha->in_proj_bias;
    const Tensor qkv = nn::functional::linear(x, w, b);  // [2, 5, 24], bf16 products
    auto head = [&](int64_t block) { return qkv.narrow(2, 8 * block, 8).reshape({2, 5, 2, 4}).transpose(1, 2); };
    heads_amp = scaled_dot_product_attention(head(0), head(1), head(2));
    AutocastGuard off(kCPU, false);
    heads_exact = scaled_dot_product_attention(head(0), head(1), head(2));
  }
  CHECK(same_bits(heads_amp, heads_amp.to(kBFloat16).to(kFloat32)));  // out is bf16-rounded
  CHECK_FALSE(same_bits(heads_exact, heads_exact.to(kBFloat16).to(kFloat32)));
}

TEST_CASE("autocast attention: bad inputs are still errors naming what was expected") {
  AutocastGuard amp(kCPU);
  const Tensor q = testing::random_input({1, 1, 3, 4}, 1).to(kFloat32);
  const Tensor f64_mask = testing::random_input({3, 3}, 2);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, q, q, f64_mask), doctest::Contains("attn_mask"), Error);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, q, q, {}, 1.5),
                       doctest::Contains("expected dropout_p between 0 and 1, found 1.5"), Error);
}

TEST_CASE("autocast attention: dropout drops the weights the f32 path drops for the same seed") {
  // The CPU autocast path is the f32 kernel on bf16-rounded operands with its output rounded
  // (top of this file): with equal generator states both drop the same weights, so the
  // results agree to the output's rounding.
  const Tensor q = testing::random_input({2, 2, 5, 8}, 4).to(kFloat32);
  const Tensor k = testing::random_input({2, 2, 7, 8}, 5).to(kFloat32);
  manual_seed(9);
  Tensor amp_out;
  {
    AutocastGuard amp(kCPU);
    amp_out = scaled_dot_product_attention(q, k, k, {}, 0.5);
  }
  manual_seed(9);
  const Tensor kb = k.to(kBFloat16).to(kFloat32);
  const Tensor ref = scaled_dot_product_attention(q.to(kBFloat16).to(kFloat32), kb, kb, {}, 0.5);
  testing::check_close(amp_out, ref.to(kBFloat16).to(kFloat32), 1e-6, 0, "autocast dropout");
  manual_seed(10);  // another draw drops other weights
  CHECK(testing::to_vector(scaled_dot_product_attention(q.to(kBFloat16).to(kFloat32), kb, kb, {}, 0.5)) !=
        testing::to_vector(ref));
}
