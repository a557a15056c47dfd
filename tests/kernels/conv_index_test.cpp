// kernels/common/conv_index.h, the implicit-GEMM index math of the CUDA conv kernels, on
// the CPU: (1) the flattenings and dgrad's phases against brute-force enumeration;
// (2) every operand accessor of the three GEMM problems against a direct loop over all
// positions (the coordinate formula of kernels/cpu/conv.h written out again); (3) the
// problems summed the way implicit_gemm_kernel sums them (per group, per depth chunk in
// order, then chunks in order) against kernels/cpu/conv.h, with outputs poisoned by NaN
// so a position no store reaches fails; (4) conv_walk.h's walks (the CUDA kernels' gathers)
// and output walks (their stores) against the accessors, at 32- and 64-bit indices.
// Shapes: odd sizes, stride 2 and 3, dilation 2, padding, groups, 1x1, stride larger than
// the kernel, and conv_transpose2d's as_conv().
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/conv_index.h"
#include "kernels/common/conv_walk.h"
#include "kernels/cpu/conv.h"

namespace ci = nd::kernels::conv_index;
namespace cpu = nd::kernels::cpu;
using cpu::Conv2dShape;
using cpu::ConvTranspose2dShape;

namespace {

using Vec = std::vector<double>;

Vec random_vec(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = u(gen);
  return v;
}

Vec poisoned(int64_t n) { return Vec(static_cast<size_t>(n), std::numeric_limits<double>::quiet_NaN()); }

std::string describe(const Conv2dShape& s) {
  return "N" + std::to_string(s.N) + " " + std::to_string(s.C_in) + "->" + std::to_string(s.C_out) + " " +
         std::to_string(s.H) + "x" + std::to_string(s.W) + " k" + std::to_string(s.kH) + "x" + std::to_string(s.kW) +
         " s" + std::to_string(s.stride[0]) + "," + std::to_string(s.stride[1]) + " p" + std::to_string(s.padding[0]) +
         "," + std::to_string(s.padding[1]) + " d" + std::to_string(s.dilation[0]) + "," +
         std::to_string(s.dilation[1]) + " g" + std::to_string(s.groups);
}

// Every element equal up to rounding of a different summation order (f64), none NaN.
void check_same(const Vec& got, const Vec& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0, nan = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) ++nan;
    else if (std::fabs(got[i] - want[i]) > 1e-12 * (1 + std::fabs(want[i]))) ++bad;
  }
  CHECK_MESSAGE(nan == 0, what, ": ", nan, " element(s) never stored");
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " element(s) differ from kernels/cpu");
}

// implicit_gemm_kernel's arithmetic without the tiles: for every group and depth chunk,
// C[m, j] = sum over the chunk of a(g, m, k) * b(g, k, j) in k order, then store.
template <class Problem>
void run_gemm(const Problem& p, int64_t groups, ci::SplitK split) {
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t s = 0; s < split.splits; ++s) {
      const int64_t k0 = s * split.chunk, k1 = std::min(p.depth(), k0 + split.chunk);
      for (int64_t m = 0; m < p.rows(); ++m)
        for (int64_t j = 0; j < p.cols(); ++j) {
          double acc = 0;
          for (int64_t k = k0; k < k1; ++k) acc += p.a(g, m, k) * p.b(g, k, j);
          p.store(g, s, m, j, acc);
        }
    }
}

// dgrad as the CUDA launcher runs it: every phase GEMM (slice), each over its whole depth.
void run_dgrad(const ci::Geometry& q, const double* dy, const double* w, const double* bias, double* dx) {
  const ci::DgradGemm<double> dgrad = ci::dgrad_gemm(q, dy, w, bias, dx);
  REQUIRE(dgrad.slices() == q.stride_h * q.stride_w);
  for (int64_t s = 0; s < dgrad.slices(); ++s) {
    const ci::DgradGemm<double> p = dgrad.slice(s);
    REQUIRE(p.rows() <= dgrad.rows());  // the launch sizes its grid by slice 0
    run_gemm(p, q.groups, {1, std::max<int64_t>(1, p.depth())});
  }
}

// A problem run as the CUDA launcher runs a split one: every slice, each chunk into a
// partial buffer chunk_stride = size apart, then the chunks added in order into p.*out.
template <class Problem>
Vec run_split(Problem p, double* Problem::*out, int64_t size, ci::SplitK split) {
  Vec partial = poisoned(split.splits * size), result(static_cast<size_t>(size));
  p.*out = partial.data();
  p.chunk_stride = size;
  for (int64_t s = 0; s < p.slices(); ++s) run_gemm(p.slice(s), p.q.groups, split);
  for (int64_t i = 0; i < size; ++i) {
    double acc = partial[i];
    for (int64_t c = 1; c < split.splits; ++c) acc += partial[c * size + i];
    result[i] = acc;
  }
  return result;
}

// conv2d_backward_weight as the CUDA launcher runs it: split-K into a partial buffer,
// then the chunks added in order.
Vec wgrad_split(const Conv2dShape& s, const Vec& x, const Vec& dy, ci::SplitK split) {
  const ci::WgradGemm<double> p{ci::geometry(s), x.data(), dy.data(), nullptr};
  return run_split(p, &ci::WgradGemm<double>::out, s.C_out * p.cols(), split);
}

const std::vector<Conv2dShape> kShapes = {
    {2, 3, 13, 13, 5, 3, 3, {2, 2}, {1, 1}, {2, 2}, 1},   // odd, stride 2, padding, dilation 2
    {2, 6, 11, 9, 9, 3, 3, {1, 1}, {1, 1}, {1, 1}, 3},    // groups 3
    {3, 1, 28, 28, 4, 4, 4, {2, 2}, {1, 1}, {1, 1}, 1},   // DCGAN's first layer, fewer channels
    {2, 4, 10, 7, 6, 2, 3, {3, 2}, {0, 2}, {1, 2}, 2},    // stride 3, non-square everything
    {2, 3, 5, 6, 4, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1},     // 1x1
    {1, 2, 9, 9, 3, 2, 2, {3, 3}, {0, 0}, {1, 1}, 1},     // stride > kernel: pixels no window reads
    {2, 4, 12, 11, 6, 3, 2, {3, 3}, {2, 1}, {2, 2}, 2},   // stride 3, dilation 2, groups 2
    {2, 20, 9, 9, 70, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},   // depth and columns past one 16/64 tile
    {1, 2, 5, 5, 2, 5, 5, {1, 1}, {0, 0}, {1, 1}, 2},     // 1x1 output
};

}  // namespace

TEST_CASE("conv_index: pixel_of and tap_of invert the row-major flattening") {
  for (int64_t Hs : {1, 3, 7})
    for (int64_t Ws : {1, 4, 13}) {
      int64_t m = 0;
      for (int64_t n = 0; n < 3; ++n)
        for (int64_t h = 0; h < Hs; ++h)
          for (int64_t w = 0; w < Ws; ++w, ++m) {
            const ci::Pixel p = ci::pixel_of(m, Hs, Ws);
            REQUIRE_MESSAGE((p.n == n && p.h == h && p.w == w), "pixel ", m, " of [3, ", Hs, ", ", Ws, "]");
            const ci::Tap t = ci::tap_of(m, Hs, Ws);  // [C = 3, kH = Hs, kW = Ws]
            REQUIRE_MESSAGE((t.c == n && t.kh == h && t.kw == w), "tap ", m, " of [3, ", Hs, ", ", Ws, "]");
          }
    }
}

TEST_CASE("conv_index: dgrad_phase lists exactly the taps that reach each input coordinate of its phase") {
  for (int64_t stride = 1; stride <= 3; ++stride)
    for (int64_t pad = 0; pad <= 2; ++pad)
      for (int64_t dil = 1; dil <= 3; ++dil)
        for (int64_t kernel = 1; kernel <= 5; ++kernel)
          for (int64_t size = 1; size <= 8; ++size) {
            int64_t rows = 0;
            for (int64_t phase = 0; phase < stride; ++phase) {
              const ci::DgradPhase d = ci::dgrad_phase(phase, size, kernel, stride, pad, dil);
              INFO("stride ", stride, " pad ", pad, " dil ", dil, " kernel ", kernel, " size ", size, " phase ", phase);
              rows += d.rows;
              for (int64_t r = 0; r < d.rows; ++r) {
                const int64_t i = d.first + r * stride;
                REQUIRE(i < size);
                REQUIRE(i % stride == phase);
                std::vector<int64_t> want;  // brute force: (t, o) with o*stride - pad + t*dil == i
                for (int64_t t = 0; t < kernel; ++t)
                  if ((i + pad - t * dil) % stride == 0) want.push_back(t);
                REQUIRE(d.taps == int64_t(want.size()));
                for (int64_t a = 0; a < d.taps; ++a) {
                  const int64_t t = d.first_tap + a * d.tap_step, o = r + d.base - a * d.out_step;
                  REQUIRE(t == want[size_t(a)]);
                  REQUIRE(ci::input_coord(o, t, stride, pad, dil) == i);
                }
              }
            }
            REQUIRE(rows == size);  // the phases partition the input coordinates
          }
}

TEST_CASE("conv_index: every operand accessor reads the element the convolution formula names") {
  for (const Conv2dShape& s : kShapes) {
    CAPTURE(describe(s));
    const ci::Geometry q = ci::geometry(s);
    const int64_t OH = s.out_h(), OW = s.out_w(), Cg = s.C_in / s.groups, Og = s.C_out / s.groups;
    const Vec x = random_vec(s.N * s.C_in * s.H * s.W, 1), w = random_vec(s.C_out * Cg * s.kH * s.kW, 2);
    const Vec dy = random_vec(s.N * s.C_out * OH * OW, 3);
    const ci::ForwardGemm<double> fwd{q, x.data(), w.data(), nullptr, nullptr};
    const ci::WgradGemm<double> wgrad{q, x.data(), dy.data(), nullptr};
    REQUIRE(fwd.depth() == Cg * s.kH * s.kW);
    REQUIRE(wgrad.depth() == s.N * OH * OW);
    for (int64_t g = 0; g < s.groups; ++g)
      for (int64_t n = 0; n < s.N; ++n)
        for (int64_t kh = 0; kh < s.kH; ++kh)
          for (int64_t kw = 0; kw < s.kW; ++kw) {
            // forward's A and wgrad's B: x at the tap, 0 in the padding.
            for (int64_t oh = 0; oh < OH; ++oh)
              for (int64_t ow = 0; ow < OW; ++ow)
                for (int64_t c = 0; c < Cg; ++c) {
                  const int64_t ih = oh * s.stride[0] - s.padding[0] + kh * s.dilation[0];
                  const int64_t iw = ow * s.stride[1] - s.padding[1] + kw * s.dilation[1];
                  const bool inside = ih >= 0 && ih < s.H && iw >= 0 && iw < s.W;
                  const double want = inside ? x[((n * s.C_in + g * Cg + c) * s.H + ih) * s.W + iw] : 0.0;
                  const int64_t m = (n * OH + oh) * OW + ow, k = (c * s.kH + kh) * s.kW + kw;
                  REQUIRE(fwd.a(g, m, k) == want);
                  REQUIRE(wgrad.b(g, m, k) == want);
                }
          }
    // dgrad's operands, phase by phase: A is dy at the output pixel whose window puts the
    // phase's tap (kh, kw) on the row's input pixel (ih, iw), else 0; B is w at that tap.
    for (int64_t phase_h = 0; phase_h < s.stride[0]; ++phase_h)
      for (int64_t phase_w = 0; phase_w < s.stride[1]; ++phase_w) {
        const auto dgrad = ci::dgrad_gemm<double>(q, dy.data(), w.data(), nullptr, nullptr)
                               .slice(phase_h * s.stride[1] + phase_w);
        REQUIRE((dgrad.ph.first == phase_h && dgrad.pw.first == phase_w));
        const ci::DgradPhase &ph = dgrad.ph, &pw = dgrad.pw;
        REQUIRE(dgrad.depth() == Og * ph.taps * pw.taps);
        for (int64_t g = 0; g < s.groups; ++g)
          for (int64_t m = 0; m < dgrad.rows(); ++m)
            for (int64_t k = 0; k < dgrad.depth(); ++k) {
              const int64_t n = m / (ph.rows * pw.rows), ih = ph.first + m / pw.rows % ph.rows * s.stride[0],
                            iw = pw.first + m % pw.rows * s.stride[1];
              const int64_t o = k / (ph.taps * pw.taps), kh = ph.first_tap + k / pw.taps % ph.taps * ph.tap_step,
                            kw = pw.first_tap + k % pw.taps * pw.tap_step;
              double want = 0;
              for (int64_t oh = 0; oh < OH; ++oh)
                for (int64_t ow = 0; ow < OW; ++ow)
                  if (oh * s.stride[0] - s.padding[0] + kh * s.dilation[0] == ih &&
                      ow * s.stride[1] - s.padding[1] + kw * s.dilation[1] == iw)
                    want = dy[((n * s.C_out + g * Og + o) * OH + oh) * OW + ow];
              REQUIRE(dgrad.a(g, m, k) == want);
              for (int64_t c = 0; c < Cg; ++c)
                REQUIRE(dgrad.b(g, k, c) == w[(((g * Og + o) * Cg + c) * s.kH + kh) * s.kW + kw]);
            }
      }
    // The weight operands and wgrad's A: w[co, c, kh, kw] and dy[n, co, oh, ow] directly.
    for (int64_t g = 0; g < s.groups; ++g)
      for (int64_t o = 0; o < Og; ++o)
        for (int64_t c = 0; c < Cg; ++c)
          for (int64_t t = 0; t < s.kH * s.kW; ++t) {
            const double want = w[((g * Og + o) * Cg + c) * s.kH * s.kW + t];
            REQUIRE(fwd.b(g, c * s.kH * s.kW + t, o) == want);
          }
    for (int64_t g = 0; g < s.groups; ++g)
      for (int64_t o = 0; o < Og; ++o)
        for (int64_t k = 0; k < s.N * OH * OW; ++k)
          REQUIRE(wgrad.a(g, o, k) == dy[((k / (OH * OW)) * s.C_out + g * Og + o) * OH * OW + k % (OH * OW)]);
  }
}

TEST_CASE("conv_index: the three conv2d GEMMs equal kernels/cpu, split-K included") {
  for (const Conv2dShape& s : kShapes) {
    CAPTURE(describe(s));
    const ci::Geometry q = ci::geometry(s);
    const int64_t OH = s.out_h(), OW = s.out_w(), Cg = s.C_in / s.groups;
    const Vec x = random_vec(s.N * s.C_in * s.H * s.W, 4), w = random_vec(s.C_out * Cg * s.kH * s.kW, 5);
    const Vec b = random_vec(s.C_out, 6), dy = random_vec(s.N * s.C_out * OH * OW, 7);

    Vec y = poisoned(s.N * s.C_out * OH * OW), y_ref(y.size());
    const ci::ForwardGemm<double> fwd{q, x.data(), w.data(), b.data(), y.data()};
    run_gemm(fwd, s.groups, {1, fwd.depth()});
    cpu::conv2d_forward(s, x.data(), w.data(), b.data(), y_ref.data());
    check_same(y, y_ref, "forward with bias");

    Vec dx = poisoned(s.N * s.C_in * s.H * s.W), dx_ref(dx.size());
    run_dgrad(q, dy.data(), w.data(), nullptr, dx.data());
    cpu::conv2d_backward_input(s, dy.data(), w.data(), dx_ref.data());
    check_same(dx, dx_ref, "dgrad");

    Vec dw_ref(w.size());
    cpu::conv2d_backward_weight(s, x.data(), dy.data(), dw_ref.data());
    const int64_t depth = s.N * OH * OW;
    check_same(wgrad_split(s, x, dy, {1, depth}), dw_ref, "wgrad, one chunk");
    const ci::SplitK split = ci::split_depth(depth, 1, 16, 16, 64);  // small chunks: several of them
    CAPTURE(split.splits);
    if (depth >= 32) CHECK(split.splits > 1);
    check_same(wgrad_split(s, x, dy, split), dw_ref, "wgrad, split-K");

    // Forward and dgrad split into depth chunks of 16 (the bias in chunk 0 only).
    const ci::ForwardGemm<double> fwd_split{q, x.data(), w.data(), b.data(), nullptr};
    check_same(run_split(fwd_split, &ci::ForwardGemm<double>::y, int64_t(y.size()),
                         ci::split_depth(fwd_split.depth(), 1, 16, 16, 64)),
               y_ref, "forward with bias, split-K");
    const auto dgrad_split = ci::dgrad_gemm<double>(q, dy.data(), w.data(), nullptr, nullptr);
    int64_t dgrad_depth = 0;
    for (int64_t k = 0; k < dgrad_split.slices(); ++k) dgrad_depth = std::max(dgrad_depth, dgrad_split.slice(k).depth());
    check_same(run_split(dgrad_split, &ci::DgradGemm<double>::dx, int64_t(dx.size()),
                         ci::split_depth(dgrad_depth, 1, 16, 16, 64)),
               dx_ref, "dgrad, split-K");
  }
}

TEST_CASE("conv_index: conv_transpose2d through as_conv() equals kernels/cpu") {
  const std::vector<ConvTranspose2dShape> shapes = {
      {2, 8, 7, 7, 4, 4, 4, {2, 2}, {1, 1}, {0, 0}, {1, 1}, 1},  // DCGAN generator layer, fewer channels
      {2, 4, 7, 5, 6, 4, 3, {2, 2}, {1, 0}, {1, 1}, {1, 1}, 2},  // output_padding 1, groups 2
      {1, 3, 4, 4, 2, 3, 3, {3, 3}, {0, 1}, {1, 2}, {2, 2}, 1},  // stride 3, dilation 2
  };
  for (const ConvTranspose2dShape& t : shapes) {
    const Conv2dShape s = t.as_conv();
    CAPTURE(describe(s));
    const ci::Geometry q = ci::geometry(s);
    const int64_t OH = t.out_h(), OW = t.out_w();
    const Vec x = random_vec(t.N * t.C_in * t.H * t.W, 8);
    const Vec w = random_vec(t.C_in * (t.C_out / t.groups) * t.kH * t.kW, 9);
    const Vec b = random_vec(t.C_out, 10), dy = random_vec(t.N * t.C_out * OH * OW, 11);

    Vec y = poisoned(t.N * t.C_out * OH * OW), y_ref(y.size());  // forward = dgrad of s, with the bias
    run_dgrad(q, x.data(), w.data(), b.data(), y.data());
    cpu::conv_transpose2d_forward(t, x.data(), w.data(), b.data(), y_ref.data());
    check_same(y, y_ref, "conv_transpose2d forward");

    Vec dx = poisoned(x.size()), dx_ref(x.size());  // dgrad = forward of s, no bias
    const ci::ForwardGemm<double> dgrad{q, dy.data(), w.data(), nullptr, dx.data()};
    run_gemm(dgrad, s.groups, {1, dgrad.depth()});
    cpu::conv_transpose2d_backward_input(t, dy.data(), w.data(), dx_ref.data());
    check_same(dx, dx_ref, "conv_transpose2d dgrad");

    Vec dw_ref(w.size());  // wgrad = wgrad of s with x and dy swapped
    cpu::conv_transpose2d_backward_weight(t, x.data(), dy.data(), dw_ref.data());
    check_same(wgrad_split(s, dy, x, ci::split_depth(t.N * t.H * t.W, 1, 16, 16, 64)), dw_ref,
               "conv_transpose2d wgrad, split-K");
  }
}

namespace {

// The depth the busiest of kSplitSms SMs works through: ceil(blocks / SMs) chunks.
int64_t share(int64_t tiles, const ci::SplitK& k) {
  return (tiles * k.splits + ci::kSplitSms - 1) / ci::kSplitSms * k.chunk;
}

}  // namespace

TEST_CASE("conv_index: split_depth takes whole-tile chunks, the least busiest-SM share, fixed by the shape") {
  for (int64_t depth : {1, 15, 16, 17, 255, 256, 257, 3136, 100000})
    for (int64_t tiles : {1, 3, 8, 600})
      for (int64_t min_chunk : {16, 256}) {
        const ci::SplitK k = ci::split_depth(depth, tiles, 16, min_chunk, 512);
        CAPTURE(depth);
        CAPTURE(tiles);
        CAPTURE(min_chunk);
        REQUIRE(k.splits >= 1);
        CHECK(k.chunk % 16 == 0);
        CHECK((k.splits - 1) * k.chunk < depth);  // no empty chunk
        CHECK(k.splits * k.chunk >= depth);       // nothing left over
        if (k.splits > 1) CHECK(k.chunk >= min_chunk);
        if (tiles >= 512) CHECK(k.splits == 1);   // enough blocks without splitting
        const ci::SplitK again = ci::split_depth(depth, tiles, 16, min_chunk, 512);
        CHECK((again.splits == k.splits && again.chunk == k.chunk));
        // No worse a busiest-SM share than the cut into the most chunks allowed (the rule before).
        const int64_t most = std::max<int64_t>(1, std::min((512 + tiles - 1) / tiles, depth / min_chunk));
        const int64_t most_chunk = std::max<int64_t>(1, ((depth + most - 1) / most + 15) / 16) * 16;
        const int64_t most_splits = std::max<int64_t>(1, (depth + most_chunk - 1) / most_chunk);
        CHECK(share(tiles, k) <= share(tiles, {most_splits, most_chunk}));
      }
  CHECK(ci::split_depth(3136, 8, 16, 256, 512).splits == 12);  // DCGAN D layer 2 at batch 64: 7x7 maps
  // conv_narrow.cu's wgrad of D.main.0 at batch 64 (4 tiles, 12544 pixels, stages of 32,
  // chunks >= 256): 33 chunks, 132 blocks, where the most allowed (49) made 196, two waves.
  const ci::SplitK narrow = ci::split_depth(12544, 4, 32, 256, 512);
  CHECK((narrow.splits == 33 && narrow.chunk == 384));
  // D.main.2's wgrad at batch 64 in bf16 (32 tiles, depth 3136): 4 chunks of 800, 128 blocks,
  // where 11 chunks of 288 made 352 blocks, a busiest SM of 3 blocks (864 deep).
  const ci::SplitK wide = ci::split_depth(3136, 32, 32, 128, 512);
  CHECK((wide.splits == 4 && wide.chunk == 800));
}

TEST_CASE("conv_index: fill_sms cuts finer until the blocks cover the SMs or a chunk is one k-tile") {
  for (int64_t depth : {0, 1, 15, 16, 17, 64, 255, 512, 3136, 100000})
    for (int64_t tiles : {1, 3, 49, 98, 132, 600})
      for (int64_t tile_k : {16, 32}) {
        CAPTURE(depth);
        CAPTURE(tiles);
        CAPTURE(tile_k);
        const ci::SplitK cut = ci::split_depth(depth, tiles, tile_k, 128, 512);
        const ci::SplitK k = ci::fill_sms(cut, depth, tiles, tile_k);
        REQUIRE(k.splits >= cut.splits);
        CHECK(k.chunk % tile_k == 0);
        CHECK(k.splits * k.chunk >= std::max<int64_t>(depth, 1));  // nothing left over
        if (k.splits > 1) CHECK((k.splits - 1) * k.chunk < depth);  // no empty chunk
        if (tiles * cut.splits >= ci::kSplitSms) CHECK((k.splits == cut.splits && k.chunk == cut.chunk));
        // Stopped only where the SMs are covered or no finer cut exists.
        const bool covered = tiles * k.splits >= ci::kSplitSms;
        CHECK((covered || k.chunk == tile_k));
      }
  // train_gan's D.main.2 forward at batch 64 in bf16 (49 tiles, depth 512): split_depth's 2
  // chunks of 256 (98 blocks) -> 3 chunks of 192 (147 blocks).
  const ci::SplitK d2 = ci::split_depth(512, 49, 32, 128, 512);
  CHECK((d2.splits == 2 && d2.chunk == 256));
  const ci::SplitK filled = ci::fill_sms(d2, 512, 49, 32);
  CHECK((filled.splits == 3 && filled.chunk == 192));
  // G.main.0's wgrad there (49 tiles, depth 64): one chunk -> 2 of 32 (98 blocks: one k-tile each).
  const ci::SplitK g0 = ci::fill_sms(ci::split_depth(64, 49, 32, 128, 512), 64, 49, 32);
  CHECK((g0.splits == 2 && g0.chunk == 32));
}

namespace {

template <class I>
bool same_digits(const ci::Digits<I>& a, const ci::Digits<I>& b) {
  return a.hi == b.hi && a.mid == b.mid && a.lo == b.lo;
}

// conv_walk.h's walk of one problem (slice) against its accessors: (a) each axis walked from
// any first index by the kernels' steps (2, 4, 32) and others (1, 3, 16: carries into both
// digits at once) past its end equals the digits split directly; (b) for every cell, the
// address the walk gives holds the accessor's value and lies inside its tensor, and nullptr
// stands exactly where the accessor reads 0 (the operands hold no 0).
template <class I, class Problem>
void check_walk(const Problem& p, int64_t groups, const Vec& a_src, const Vec& b_src) {
  const auto wk = ci::walk<I>(p);
  const std::pair<ci::Radix<I>, int64_t> axes[] = {{wk.rows, p.rows()}, {wk.depth, p.depth()}, {wk.cols, p.cols()}};
  for (const auto& [radix, size] : axes)
    for (const I step : {1, 2, 3, 4, 16, 32})
      for (I first = 0; first < std::min<I>(I(size), 40); ++first) {
        ci::Digits<I> d = radix.digits(first);
        const ci::Digits<I> by = radix.digits(step);
        for (I index = first; index < I(size) + 2 * step; index += step, radix.advance(d, by))
          REQUIRE_MESSAGE(same_digits(d, radix.digits(index)), "index ", index, " walked from ", first, " by ", step);
      }
  const auto check_cell = [](const double* got, double want, const Vec& src) {
    if (want == 0.0) return got == nullptr;
    return got != nullptr && got >= src.data() && got < src.data() + src.size() && *got == want;
  };
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t k = 0; k < p.depth(); ++k) {
      const ci::Digits<I> kd = wk.depth.digits(I(k));
      for (int64_t m = 0; m < p.rows(); ++m)
        REQUIRE_MESSAGE(check_cell(wk.a(I(g), wk.rows.digits(I(m)), kd), p.a(g, m, k), a_src), "A ", m, ", ", k);
      for (int64_t j = 0; j < p.cols(); ++j)
        REQUIRE_MESSAGE(check_cell(wk.b(I(g), kd, wk.cols.digits(I(j))), p.b(g, k, j), b_src), "B ", k, ", ", j);
    }
}

// conv_walk.h's OutputWalk against the accessors' store(): every cell of every group and of
// two depth chunks stored both ways, each with its own value (and a bias where the pass has
// one), into buffers poisoned with NaN with a poisoned margin of a whole output on each side:
// they must agree bit for bit, margins included, so every store lands where store() puts it.
// Rows are walked as conv.cu's threads walk them: from each first row below 16, on by 16.
template <class I, class Problem>
void check_output_walk(Problem p, double* Problem::*out, int64_t size, int64_t groups) {
  Vec want = poisoned(4 * size), got = poisoned(4 * size);
  p.chunk_stride = size;
  const auto value = [&](int64_t split, int64_t g, int64_t m, int64_t j) {
    return double(((split * groups + g) * p.rows() + m) * p.cols() + j + 1);
  };
  for (int64_t split = 0; split < 2; ++split)
    for (int64_t g = 0; g < groups; ++g) {
      p.*out = want.data() + size;
      for (int64_t m = 0; m < p.rows(); ++m)
        for (int64_t j = 0; j < p.cols(); ++j) p.store(g, split, m, j, value(split, g, m, j));
      p.*out = got.data() + size;
      const auto walk = ci::output_walk<I>(p, split);
      const ci::Digits<I> by = walk.rows.digits(16);
      for (int64_t first = 0; first < 16; ++first) {
        ci::Digits<I> d = walk.rows.digits(I(first));
        for (int64_t m = first; m < p.rows(); m += 16, walk.rows.advance(d, by)) {
          const auto row = walk.row(d);
          for (int64_t j = 0; j < p.cols(); ++j) walk.store(row, I(g), I(j), value(split, g, m, j));
        }
      }
    }
  for (size_t i = 0; i < want.size(); ++i)
    REQUIRE_MESSAGE((want[i] == got[i] || (std::isnan(want[i]) && std::isnan(got[i]))), "element ", i,
                    " of the buffer (outputs from ", size, "): ", got[i], " stored, ", want[i], " wanted");
}

template <class I>
void check_walks(const Conv2dShape& s) {
  CAPTURE(describe(s));
  const ci::Geometry q = ci::geometry(s);
  const Vec x = random_vec(s.N * s.C_in * s.H * s.W, 12), w = random_vec(s.C_out * q.Cg * s.kH * s.kW, 13);
  const Vec dy = random_vec(s.N * s.C_out * q.OH * q.OW, 14);
  check_walk<I>(ci::ForwardGemm<double>{q, x.data(), w.data(), nullptr, nullptr}, s.groups, x, w);
  check_walk<I>(ci::WgradGemm<double>{q, x.data(), dy.data(), nullptr}, s.groups, dy, x);
  const auto dgrad = ci::dgrad_gemm<double>(q, dy.data(), w.data(), nullptr, nullptr);
  for (int64_t slice = 0; slice < dgrad.slices(); ++slice) check_walk<I>(dgrad.slice(slice), s.groups, dy, w);
  const Vec bias_out = random_vec(s.C_out, 15), bias_in = random_vec(s.C_in, 16);
  check_output_walk<I>(ci::ForwardGemm<double>{q, x.data(), w.data(), bias_out.data(), nullptr},
                       &ci::ForwardGemm<double>::y, s.N * s.C_out * q.OH * q.OW, s.groups);
  const ci::WgradGemm<double> wgrad{q, x.data(), dy.data(), nullptr};
  check_output_walk<I>(wgrad, &ci::WgradGemm<double>::out, s.C_out * wgrad.cols(), s.groups);
  const auto dgrad_bias = ci::dgrad_gemm<double>(q, dy.data(), w.data(), bias_in.data(), nullptr);
  for (int64_t slice = 0; slice < dgrad.slices(); ++slice)
    check_output_walk<I>(dgrad_bias.slice(slice), &ci::DgradGemm<double>::dx, s.N * s.C_in * s.H * s.W, s.groups);
}

}  // namespace

TEST_CASE("conv_index: the walks of conv_walk.h visit exactly the accessors' elements and stores (int32 and int64)") {
  std::vector<Conv2dShape> shapes = kShapes;
  for (const ConvTranspose2dShape& t : {ConvTranspose2dShape{2, 4, 7, 5, 6, 4, 3, {2, 2}, {1, 0}, {1, 1}, {1, 1}, 2},
                                        ConvTranspose2dShape{1, 3, 4, 4, 2, 3, 3, {3, 3}, {0, 1}, {1, 2}, {2, 2}, 1}})
    shapes.push_back(t.as_conv());  // output_padding, conv_transpose2d's geometry
  for (const Conv2dShape& s : shapes) {
    check_walks<int32_t>(s);
    check_walks<int64_t>(s);
  }
}

TEST_CASE("conv_index: fits_int32 holds while every tensor, index and coordinate fits in int32_t") {
  Conv2dShape s{2, 64, 56, 56, 128, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1};
  CHECK(ci::fits_int32(ci::geometry(s), 128));
  s.N = 8192;  // x: 8192 * 64 * 56^2 = 1.6e9 elements fit; y: 8192 * 128 * 56^2 = 3.3e9 do not
  CHECK_FALSE(ci::fits_int32(ci::geometry(s), 128));
  s = {1, 1, 46340, 46340, 1, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1};  // 2147395600 elements: 88047 below the limit
  CHECK(ci::fits_int32(ci::geometry(s), 0));
  CHECK_FALSE(ci::fits_int32(ci::geometry(s), 88048));  // the rows' overhang past the end does not fit
  s = {1, 1, 8, 8, 1, 1, 1, {int64_t(1) << 30, 1}, {0, 0}, {1, 1}, 1};  // coordinates h * stride overflow
  CHECK_FALSE(ci::fits_int32(ci::geometry(s), 128));
}
