// kernels/cuda/attention.cu and attention_tc_{forward,backward}.cu in the emulator against
// kernels/cpu/attention.cpp: the f32 and f64 SIMT kernels and the bf16 and f16 tensor-core
// kernels (mma.sync/ldmatrix/cp.async), forward and backward,
// at the compiled head dims 32, 64, 128 and zero-padded ones (16, 40, 72), Sq and Sk off the
// 64- and 128-row tiles,
// causal (Sq < Sk and Sq > Sk), an additive mask broadcast over heads with -inf entries,
// a fully masked row, and dropout on the weights (the same generator state on both sides:
// a kernel that ignored it, or indexed the weights differently, differs by whole weights).
// The 16-bit kernels are compiled twice per head dim (kMaskDropout, attention_tc.cuh): every
// copy runs here, bf16 and f16: without mask and dropout at D = 32, 64, 128 (kE32, kE64 or
// kPadded, kE128Causal), with them at D = 32 (kMask, kMaskedRow, kDropout), 64
// (kDropoutCausal) and 128 (kMaskCausal128: mask and causality together); both copies are run
// twice and compared bit for bit (kCausalWide; kMask, kDropout).
//
// Tolerances, relative to the largest |value| of each output tensor (each element is a
// sum of at most n = Sk (out, dq) or Sq (dk, dv) terms, each a softmax weight times an
// operand, plus the E-long dot products inside the weights):
// - f32 / f64: the CPU and CUDA kernels add in different orders and exponentiate
//   differently shifted scores, so their results differ by O((n + E) u) of that largest
//   value; 4 (n + E) u is the bound used (u = 2^-24 or 2^-53).
// - bf16: the CPU reference is the f32 kernel on bf16-rounded operands with its outputs
//   rounded to bf16 (the engine's CPU autocast path). The CUDA kernel also rounds P and dS
//   to bf16 before the second products (engine/autocast.h's contract): relative 2^-9 per
//   weight, plus the outputs' own rounding (2^-9 on each side); 1e-2 (about 5 bf16 ulps of
//   the largest value) bounds these. lse is f32 in both: 1e-5 relative.
// - f16: the same with f16 (2^-12 per rounding): 2e-3, about 4 f16 ulps of the largest value.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "emu_cost.h"
#include "emu_test.h"
#include "engine/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"

namespace {

using namespace nd::kernels;
using namespace nd::emu_test;
using nd::BFloat16;

struct Case {
  const char* name;
  int64_t B, H, Sq, Sk, E, Ev;
  bool causal;
  int mask;  // 0 none, 1 random additive with -inf entries (broadcast over heads), 2 query row 5 fully masked
  double dropout = 0;  // dropout_p on the attention weights
  double scale_sign = 1;  // -1: scale = -1 / sqrt(E) (the forward's general copy)
};

// The case's dropout, one fixed generator state: both twins must drop the same weights.
AttentionDropout dropout_of(const Case& c) { return {c.dropout, 20261203, 977}; }

std::vector<float> make_mask(const Case& c) {
  if (c.mask == 0) return {};
  std::vector<float> m(c.B * c.Sq * c.Sk, 0.0f);
  const auto r = uniform(m.size(), 99, 0.0, 1.0);
  for (size_t i = 0; i < m.size(); ++i)
    m[i] = c.mask == 1 ? (r[i] < 0.2f ? -INFINITY : round_bf16(3 * r[i] - 1)) : 0.0f;
  if (c.mask == 2)
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t j = 0; j < c.Sk; ++j) m[(b * c.Sq + 5) * c.Sk + j] = -INFINITY;
  return m;
}
template <class T>
cpu::AttentionMask<T> mask_of(const Case& c, const std::vector<T>& m) {
  if (m.empty()) return {};
  return {m.data(), c.Sq * c.Sk, 0, c.Sk, 1};  // [B, 1, Sq, Sk]: broadcast over heads
}

// A fully masked query row 5: out = 0, lse = -inf and no gradient to q, on every head.
template <class O, class L, class G>
void check_masked_row(const Case& c, const std::vector<O>& out, const std::vector<L>& lse, const std::vector<G>& dq) {
  if (c.mask != 2) return;
  for (int64_t bh = 0; bh < c.B * c.H; ++bh) {
    const int64_t row = bh * c.Sq + 5;
    CHECK(double(lse[row]) == -INFINITY);
    for (int64_t x = 0; x < c.Ev; ++x) CHECK(double(out[row * c.Ev + x]) == 0.0);
    for (int64_t x = 0; x < c.E; ++x) CHECK(double(dq[row * c.E + x]) == 0.0);
  }
}

template <class T>
void check_exact(const Case& c) {
  INFO(std::string(c.name), sizeof(T) == 4 ? " f32" : " f64");
  const int64_t BH = c.B * c.H;
  const auto q = cast<T>(uniform(BH * c.Sq * c.E, 1, -2, 2)), k = cast<T>(uniform(BH * c.Sk * c.E, 2, -2, 2)),
             v = cast<T>(uniform(BH * c.Sk * c.Ev, 3, -2, 2)), dout = cast<T>(uniform(BH * c.Sq * c.Ev, 4, -2, 2));
  const auto maskv = cast<T>(make_mask(c));
  const auto mask = mask_of<T>(c, maskv);
  const double scale = 1.0 / std::sqrt(double(c.E));
  std::vector<T> o1(BH * c.Sq * c.Ev), l1(BH * c.Sq), dq1(q.size()), dk1(k.size()), dv1(v.size());
  auto o2 = nans<T>(o1.size()), l2 = nans<T>(l1.size()), dq2 = nans<T>(q.size()), dk2 = nans<T>(k.size()),
       dv2 = nans<T>(v.size());
  cpu::scaled_dot_product_attention_forward<T>(q.data(), k.data(), v.data(), mask, c.B, c.H, c.Sq, c.Sk, c.E, c.Ev,
                                               c.causal, scale, dropout_of(c), o1.data(), l1.data());
  cuda::scaled_dot_product_attention_forward<T>(q.data(), k.data(), v.data(), mask, c.B, c.H, c.Sq, c.Sk, c.E, c.Ev,
                                                c.causal, scale, dropout_of(c), o2.data(), l2.data(), nullptr);
  // Both backwards from the CPU's forward results: the gradients are compared, not the forward twice.
  cpu::scaled_dot_product_attention_backward<T>(dout.data(), q.data(), k.data(), v.data(), mask, o1.data(), l1.data(),
                                                c.B, c.H, c.Sq, c.Sk, c.E, c.Ev, c.causal, scale, dropout_of(c), dq1.data(),
                                                dk1.data(), dv1.data());
  cuda::scaled_dot_product_attention_backward<T>(dout.data(), q.data(), k.data(), v.data(), mask, o1.data(),
                                                 l1.data(), c.B, c.H, c.Sq, c.Sk, c.E, c.Ev, c.causal, scale, dropout_of(c),
                                                 dq2.data(), dk2.data(), dv2.data(), nullptr);
  const double u = sizeof(T) == 4 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53);
  const double rel = 4.0 * double(std::max(c.Sq, c.Sk) + std::max(c.E, c.Ev)) * u;
  check_rel("out", o2, o1, rel);
  check_rel("logsumexp", l2, l1, rel);
  check_rel("dq", dq2, dq1, rel);
  check_rel("dk", dk2, dk1, rel);
  check_rel("dv", dv2, dv1, rel);
  check_masked_row(c, o2, l2, dq2);
}

// S = BFloat16 or Half: the 16-bit kernels with that operand type.
template <class S>
void check_half(const Case& c, bool twice = false) {
  constexpr bool f16 = std::is_same_v<S, nd::Half>;
  INFO(std::string(c.name), f16 ? " f16" : " bf16");
  const auto r16 = [](std::vector<float> x) { return f16 ? rounded_f16(std::move(x)) : rounded_bf16(std::move(x)); };
  const auto to16 = [](const std::vector<float>& x) { return std::vector<S>(x.begin(), x.end()); };
  const auto to32 = [](const std::vector<S>& x) { return std::vector<float>(x.begin(), x.end()); };
  const double rel = f16 ? 2e-3 : 1e-2;
  const int64_t BH = c.B * c.H;
  const auto q = r16(uniform(BH * c.Sq * c.E, 1, -2, 2)), k = r16(uniform(BH * c.Sk * c.E, 2, -2, 2)),
             v = r16(uniform(BH * c.Sk * c.Ev, 3, -2, 2)),
             dout = r16(uniform(BH * c.Sq * c.Ev, 4, -2, 2));
  const auto maskf = make_mask(c);
  const auto maskb = to16(maskf);
  const double scale = c.scale_sign / std::sqrt(double(c.E));
  // The reference: the f32 CPU kernel on the rounded operands, outputs rounded to S.
  std::vector<float> o1(BH * c.Sq * c.Ev), l1(BH * c.Sq), dq1(q.size()), dk1(k.size()), dv1(v.size());
  cpu::scaled_dot_product_attention_forward<float>(q.data(), k.data(), v.data(), mask_of(c, maskf), c.B, c.H, c.Sq,
                                                   c.Sk, c.E, c.Ev, c.causal, scale, dropout_of(c), o1.data(), l1.data());
  o1 = r16(o1);
  cpu::scaled_dot_product_attention_backward<float>(dout.data(), q.data(), k.data(), v.data(), mask_of(c, maskf),
                                                    o1.data(), l1.data(), c.B, c.H, c.Sq, c.Sk, c.E, c.Ev, c.causal,
                                                    scale, dropout_of(c), dq1.data(), dk1.data(), dv1.data());
  const auto qb = to16(q), kb = to16(k), vb = to16(v), db = to16(dout);
  auto run = [&](std::vector<S>& o2, std::vector<float>& l2, std::vector<S>& dq2,
                 std::vector<S>& dk2, std::vector<S>& dv2) {
    o2 = to16(nans<float>(o1.size())), l2 = nans<float>(l1.size()), dq2 = to16(nans<float>(q.size())),
    dk2 = to16(nans<float>(k.size())), dv2 = to16(nans<float>(v.size()));
    cuda::scaled_dot_product_attention_forward(qb.data(), kb.data(), vb.data(), mask_of(c, maskb), c.B, c.H, c.Sq,
                                               c.Sk, c.E, c.Ev, c.causal, scale, dropout_of(c), o2.data(), l2.data(), nullptr);
    cuda::scaled_dot_product_attention_backward(db.data(), qb.data(), kb.data(), vb.data(), mask_of(c, maskb),
                                                o2.data(), l2.data(), c.B, c.H, c.Sq, c.Sk, c.E, c.Ev, c.causal,
                                                scale, dropout_of(c), dq2.data(), dk2.data(), dv2.data(), nullptr);
  };
  std::vector<S> o2, dq2, dk2, dv2;
  std::vector<float> l2;
  run(o2, l2, dq2, dk2, dv2);
  check_rel("out", to32(o2), o1, rel);
  check_rel("logsumexp", l2, l1, 1e-5);
  check_rel("dq", to32(dq2), r16(dq1), rel);
  check_rel("dk", to32(dk2), r16(dk1), rel);
  check_rel("dv", to32(dv2), r16(dv1), rel);
  check_masked_row(c, to32(o2), l2, to32(dq2));
  if (!twice) return;
  std::vector<S> o3, dq3, dk3, dv3;
  std::vector<float> l3;
  run(o3, l3, dq3, dk3, dv3);
  auto same = [](const auto& a, const auto& b) { return std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0; };
  CHECK_MESSAGE(same(o2, o3), "out not bit-reproducible");
  CHECK_MESSAGE(same(l2, l3), "logsumexp not bit-reproducible");
  CHECK_MESSAGE((same(dq2, dq3) && same(dk2, dk3) && same(dv2, dv3)), "gradients not bit-reproducible");
}

const Case kE32{"B=2 H=2 Sq=Sk=77 E=32", 2, 2, 77, 77, 32, 32, false, 0};
const Case kE64{"Sq=50 Sk=129 E=64", 1, 1, 50, 129, 64, 64, false, 0};
const Case kE128Causal{"causal E=128 Sq=70 Sk=45", 1, 1, 70, 45, 128, 128, true, 0};
const Case kPadded{"E=40 Ev=24 (padded to 64)", 1, 1, 37, 29, 40, 24, false, 0};
const Case kPadded128{"E=16 Ev=72 (padded to 128)", 1, 1, 20, 31, 16, 72, false, 0};
const Case kUnaligned{"E=20 Ev=36 (rows not 16-byte aligned)", 1, 1, 30, 33, 20, 36, false, 0};
const Case kTwoQueryTiles{"causal Sq=136 Sk=140: two 128-row query tiles", 1, 1, 136, 140, 32, 32, true, 0};
const Case kCausalWide{"causal Sq=40 < Sk=97", 1, 1, 40, 97, 32, 32, true, 0};
const Case kMask{"additive mask over heads, -inf entries", 2, 2, 45, 70, 32, 32, false, 1};
const Case kMaskedRow{"fully masked query row", 1, 2, 19, 23, 32, 32, false, 2};
const Case kDropout{"dropout 0.3, mask, two heads", 2, 2, 45, 70, 32, 32, false, 1, 0.3};
const Case kDropoutCausal{"dropout 0.5, causal, tails", 1, 1, 70, 45, 64, 40, true, 0, 0.5};
const Case kMaskCausal128{"additive mask, causal, E=128 Ev=100, Sq=70 Sk=80", 1, 2, 70, 80, 128, 100, true, 1};
const Case kFull128{"E=128 Sq=40 Sk=100: a full 64-key tile, then a partial one", 1, 1, 40, 100, 128, 128, false, 0};
const Case kNegativeScale{"scale -1/sqrt(E), E=64 Sq=45 Sk=70", 1, 2, 45, 70, 64, 64, false, 0, 0, -1};

TEST_CASE("attention f32 SIMT kernels: head dims 32/64/128 and padded, tails, causal, masks") {
  for (const Case& c : {kE32, kE64, kE128Causal, kPadded, kPadded128, kCausalWide, kMask, kMaskedRow})
    check_exact<float>(c);
}

TEST_CASE("attention f64 SIMT kernels") {
  for (const Case& c : {kE64, kE128Causal, kPadded, kMaskedRow}) check_exact<double>(c);
}

TEST_CASE("attention bf16 tensor-core kernels: head dims 32/64/128 and padded, tails, causal, two query tiles") {
  for (const Case& c : {kE32, kE64, kE128Causal, kPadded, kPadded128, kUnaligned, kTwoQueryTiles})
    check_half<BFloat16>(c);
  check_half<BFloat16>(kCausalWide, true);  // the copy without mask and dropout, bit-reproducible
}

// The forward's full-tile copy of its loop body (every row of a warp seeing all 64 keys, E = Ev
// = D) runs in kE32, kE64, kTwoQueryTiles, kMask, kDropout and here at D = 128; a scale <= 0
// takes the general copy (the maximum of the raw dot products is the scores' only for scale > 0).
TEST_CASE("attention bf16 tensor-core kernels: a full tile at head dim 128, a negative scale") {
  check_half<BFloat16>(kFull128, true);
  check_half<BFloat16>(kNegativeScale, true);
  check_half<nd::Half>(kNegativeScale);
}

// The forward writes out through its shared memory in 16-byte stores where Ev % 8 == 0 and out
// is 16-byte aligned: every 32-byte sector of out and lse is written by one warp instruction,
// once (2-byte stores of a lane's columns wrote each sector of out 4 times, 8 rows a warp
// instruction). Counted by the cost model, which sees each store.
TEST_CASE("attention bf16 forward: out in 16-byte stores, each sector written once") {
  const int64_t Sq = 128, Sk = 64, D = 64;
  const auto q = uniform(Sq * D, 1, -2, 2), k = uniform(Sk * D, 2, -2, 2), v = uniform(Sk * D, 3, -2, 2);
  const std::vector<BFloat16> qb(q.begin(), q.end()), kb(k.begin(), k.end()), vb(v.begin(), v.end());
  // out and lse start on a sector, as cudaMalloc's blocks do (a vector's 16 bytes would add one).
  std::vector<BFloat16> out_buffer(static_cast<size_t>(Sq * D + 16));
  std::vector<float> lse_buffer(static_cast<size_t>(Sq + 8));
  const auto on_sector = [](auto* p) {
    return reinterpret_cast<decltype(p)>((reinterpret_cast<uintptr_t>(p) + 31) / 32 * 32);
  };
  BFloat16* out = on_sector(out_buffer.data());
  float* lse = on_sector(lse_buffer.data());
  emu_cost::clear();
  emu_cost::set_enabled(true);
  cuda::scaled_dot_product_attention_forward(qb.data(), kb.data(), vb.data(), {}, 1, 1, Sq, Sk, D, D, false, 0.125, {},
                                             out, lse, nullptr);
  emu_cost::set_enabled(false);
  REQUIRE(emu_cost::launches().size() == 1);
  const auto& c = emu_cost::launches()[0];
  CHECK(c.kernel == "tc_forward_kernel<BFloat16, 64, false>");
  CHECK(c.unique_write_sectors == (Sq * D * 2 + Sq * 4) / 32);
  CHECK(c.write_sectors == c.unique_write_sectors);
}

TEST_CASE("attention bf16 tensor-core kernels: additive mask, a fully masked row, bit-reproducible") {
  check_half<BFloat16>(kMask, true);
  check_half<BFloat16>(kMaskedRow);
}

TEST_CASE("attention 16-bit tensor-core kernels: additive mask and causal at head dim 128") {
  check_half<BFloat16>(kMaskCausal128);
  check_half<nd::Half>(kMaskCausal128);
}

TEST_CASE("attention f16 tensor-core kernels: head dims 32/64/128, causal, mask, a fully masked row, bit-reproducible") {
  for (const Case& c : {kE32, kE128Causal, kPadded}) check_half<nd::Half>(c);
  check_half<nd::Half>(kMask, true);
  check_half<nd::Half>(kMaskedRow);
}

TEST_CASE("attention dropout: the SIMT and tensor-core kernels drop the CPU's weights, forward and backward") {
  for (const Case& c : {kDropout, kDropoutCausal}) {
    check_exact<float>(c);
    check_exact<double>(c);
    check_half<BFloat16>(c, true);
    check_half<nd::Half>(c);
  }
}

// The tensor-core kernels' request for more than 48 KiB of shared memory is a property of the
// kernel on a device: asked for at its first launch, not at every one (it was, three driver
// calls per forward and backward).
TEST_CASE("attention tensor-core kernels ask for their shared memory once per kernel and device") {
  const Case c{"Sq=Sk=16 E=32", 1, 1, 16, 16, 32, 32, false, 0};
  const long before = emu_rt::stats().func_attributes;
  check_half<BFloat16>(c);  // forward, dk/dv, dq: at most three requests (none if an earlier case ran them)
  const long first = emu_rt::stats().func_attributes - before;
  CHECK(first <= 3);
  for (int i = 0; i < 3; ++i) check_half<BFloat16>(c);
  CHECK(emu_rt::stats().func_attributes - before == first);
}

TEST_CASE("attention head dims over 128 are an nd::Error") {
  std::vector<float> x(2 * 129, 0.0f), lse(2);
  CHECK_THROWS_WITH_AS(cuda::scaled_dot_product_attention_forward<float>(x.data(), x.data(), x.data(), {}, 1, 1, 2, 2,
                                                                         129, 129, false, 1.0, {}, x.data(), lse.data(),
                                                                         nullptr),
                       doctest::Contains("expected head dims E and Ev of at most 128, found E = 129"), nd::Error);
}

}  // namespace
