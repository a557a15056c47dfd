// kernels/cpu/conv: conv2d forward / dgrad / wgrad / bias grad and conv_transpose2d
// against direct loops written here (the 7-nested-loop definition), on random data with
// odd sizes over the stride / padding / dilation / groups / chunking cases that matter,
// plus hand-computed known values.
#include <doctest/doctest.h>
#include "omp_threads.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/conv.h"

namespace cpu = nd::kernels::cpu;
using cpu::Conv2dShape;
using cpu::ConvTranspose2dShape;

namespace {

template <class T>
std::vector<T> random_vec(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) x = T(u(gen));
  return v;
}

// The definition, accumulated in double. Calls f(n, co, oh, ow, ci, kh, kw, ih, iw) for
// every (output pixel, tap) pair that reads an in-bounds input pixel.
template <class F>
void for_each_tap(const Conv2dShape& s, F&& f) {
  const int64_t Cg = s.C_in / s.groups, Og = s.C_out / s.groups;
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t co = 0; co < s.C_out; ++co)
      for (int64_t oh = 0; oh < s.out_h(); ++oh)
        for (int64_t ow = 0; ow < s.out_w(); ++ow)
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t kh = 0; kh < s.kH; ++kh)
              for (int64_t kw = 0; kw < s.kW; ++kw) {
                const int64_t ih = oh * s.stride[0] - s.padding[0] + kh * s.dilation[0];
                const int64_t iw = ow * s.stride[1] - s.padding[1] + kw * s.dilation[1];
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                f(n, co, oh, ow, (co / Og) * Cg + c, c, kh, kw, ih, iw);
              }
}

struct Naive {
  std::vector<double> y, dx, dw, db;
};

// y = conv(x, w) + b; dx, dw, db for the upstream gradient dy.
template <class T>
Naive naive_conv(const Conv2dShape& s, const std::vector<T>& x, const std::vector<T>& w,
                 const std::vector<T>& b, const std::vector<T>& dy) {
  const int64_t OH = s.out_h(), OW = s.out_w(), Cg = s.C_in / s.groups;
  Naive r;
  r.y.assign(size_t(s.N * s.C_out * OH * OW), 0.0);
  r.dx.assign(x.size(), 0.0);
  r.dw.assign(w.size(), 0.0);
  r.db.assign(size_t(s.C_out), 0.0);
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t co = 0; co < s.C_out; ++co)
      for (int64_t p = 0; p < OH * OW; ++p) {
        const size_t yi = size_t((n * s.C_out + co) * OH * OW + p);
        r.y[yi] = b[size_t(co)];
        r.db[size_t(co)] += dy[yi];
      }
  for_each_tap(s, [&](int64_t n, int64_t co, int64_t oh, int64_t ow, int64_t ci, int64_t c,
                      int64_t kh, int64_t kw, int64_t ih, int64_t iw) {
    const size_t yi = size_t(((n * s.C_out + co) * OH + oh) * OW + ow);
    const size_t xi = size_t(((n * s.C_in + ci) * s.H + ih) * s.W + iw);
    const size_t wi = size_t(((co * Cg + c) * s.kH + kh) * s.kW + kw);
    r.y[yi] += double(w[wi]) * x[xi];
    r.dx[xi] += double(w[wi]) * dy[yi];
    r.dw[wi] += double(x[xi]) * dy[yi];
  });
  return r;
}

template <class T>
double max_err(const std::vector<T>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i) e = std::max(e, std::abs(double(got[i]) - want[i]));
  return e;
}

std::string describe(const Conv2dShape& s) {
  std::ostringstream os;
  os << "N=" << s.N << " C_in=" << s.C_in << " C_out=" << s.C_out << " HxW=" << s.H << "x" << s.W
     << " k=" << s.kH << "x" << s.kW << " stride=" << s.stride[0] << "," << s.stride[1]
     << " pad=" << s.padding[0] << "," << s.padding[1] << " dil=" << s.dilation[0] << ","
     << s.dilation[1] << " groups=" << s.groups;
  return os.str();
}

Conv2dShape shape(int64_t N, int64_t C_in, int64_t C_out, int64_t H, int64_t W, int64_t kH,
                  int64_t kW, std::array<int64_t, 2> stride, std::array<int64_t, 2> pad,
                  std::array<int64_t, 2> dil, int64_t groups) {
  return {N, C_in, H, W, C_out, kH, kW, stride, pad, dil, groups};
}

// The cases that matter: batch 1 and many (chunks of several samples when OH*OW is
// small, chunks on threads), 1x1 (the no-im2col path), stride > kernel (untouched
// pixels), padding up to the kernel size, dilation, groups and depthwise, non-square,
// narrow (gather table) and wide (row loop) output maps.
std::vector<Conv2dShape> cases() {
  return {
      shape(1, 3, 5, 7, 9, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1),
      shape(3, 2, 4, 5, 6, 3, 2, {2, 1}, {0, 1}, {1, 1}, 1),
      shape(5, 1, 3, 28, 28, 4, 4, {2, 2}, {1, 1}, {1, 1}, 1),    // DCGAN first D layer
      shape(2, 4, 6, 7, 7, 4, 4, {2, 2}, {1, 1}, {1, 1}, 2),      // groups
      shape(3, 6, 6, 9, 8, 3, 3, {1, 2}, {2, 1}, {2, 1}, 6),      // depthwise + dilation
      shape(1, 5, 7, 6, 5, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1),      // 1x1 direct, batch 1
      shape(4, 6, 9, 6, 5, 1, 1, {1, 1}, {0, 0}, {1, 1}, 3),      // 1x1 grouped, chunked
      shape(2, 3, 2, 11, 10, 2, 2, {3, 3}, {0, 0}, {1, 1}, 1),    // stride > kernel
      shape(3, 2, 3, 5, 5, 3, 3, {1, 1}, {3, 2}, {2, 2}, 1),      // big padding + dilation
      shape(7, 3, 4, 4, 3, 2, 3, {1, 1}, {1, 2}, {1, 2}, 1),      // many samples, tiny maps
      shape(2, 8, 16, 17, 15, 5, 5, {2, 3}, {2, 2}, {1, 1}, 2),
      shape(1, 2, 2, 9, 9, 3, 3, {2, 2}, {0, 0}, {3, 3}, 1),      // dilation 3, no padding
      shape(2, 2, 3, 9, 70, 3, 3, {1, 2}, {1, 1}, {1, 1}, 1),     // wide rows (OW >= 32), stride 2
      shape(1, 2, 2, 4, 40, 3, 3, {1, 1}, {0, 2}, {1, 2}, 2),     // wide rows, dilation, groups
  };
}

template <class T>
void check_conv(const Conv2dShape& s, double tol, uint32_t seed) {
  CAPTURE(describe(s));
  const int64_t OHW = s.out_h() * s.out_w();
  auto x = random_vec<T>(size_t(s.N * s.C_in * s.H * s.W), seed);
  auto w = random_vec<T>(size_t(s.C_out * (s.C_in / s.groups) * s.kH * s.kW), seed + 1);
  auto b = random_vec<T>(size_t(s.C_out), seed + 2);
  auto dy = random_vec<T>(size_t(s.N * s.C_out * OHW), seed + 3);
  const Naive ref = naive_conv(s, x, w, b, dy);
  // Outputs start as NaN: every element must be written, none accumulated into.
  const T nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> y(dy.size(), nan), dx(x.size(), nan), dw(w.size(), nan), db(b.size(), nan);
  cpu::conv2d_forward(s, x.data(), w.data(), b.data(), y.data());
  cpu::conv2d_backward_input(s, dy.data(), w.data(), dx.data());
  cpu::conv2d_backward_weight(s, x.data(), dy.data(), dw.data());
  cpu::conv2d_backward_bias(s.N, s.C_out, OHW, dy.data(), db.data());
  CHECK(max_err(y, ref.y) <= tol);
  CHECK(max_err(dx, ref.dx) <= tol);
  CHECK(max_err(dw, ref.dw) <= tol * s.N);
  CHECK(max_err(db, ref.db) <= tol * s.N);
  // No bias: y - b.
  std::vector<T> y0(dy.size(), nan);
  cpu::conv2d_forward(s, x.data(), w.data(), static_cast<const T*>(nullptr), y0.data());
  for (size_t i = 0; i < y0.size(); ++i) REQUIRE(std::abs(double(y0[i]) + b[i / OHW % s.C_out] - ref.y[i]) <= tol);
}

// conv_transpose2d directly from its definition: every input pixel scatters
// x[n, ci, ih, iw] * w[ci, co, kh, kw] to y[n, g*Og + co, ih*s - p + kh*d, iw*s - p + kw*d].
template <class T>
std::vector<double> naive_conv_transpose(const ConvTranspose2dShape& s, const std::vector<T>& x,
                                         const std::vector<T>& w, const std::vector<T>& b) {
  const int64_t OH = s.out_h(), OW = s.out_w(), Cg = s.C_in / s.groups, Og = s.C_out / s.groups;
  std::vector<double> y(size_t(s.N * s.C_out * OH * OW));
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t co = 0; co < s.C_out; ++co)
      for (int64_t p = 0; p < OH * OW; ++p) y[size_t((n * s.C_out + co) * OH * OW + p)] = b[size_t(co)];
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t ci = 0; ci < s.C_in; ++ci)
      for (int64_t ih = 0; ih < s.H; ++ih)
        for (int64_t iw = 0; iw < s.W; ++iw)
          for (int64_t c = 0; c < Og; ++c)
            for (int64_t kh = 0; kh < s.kH; ++kh)
              for (int64_t kw = 0; kw < s.kW; ++kw) {
                const int64_t oh = ih * s.stride[0] - s.padding[0] + kh * s.dilation[0];
                const int64_t ow = iw * s.stride[1] - s.padding[1] + kw * s.dilation[1];
                if (oh < 0 || oh >= OH || ow < 0 || ow >= OW) continue;
                const int64_t co = (ci / Cg) * Og + c;
                y[size_t(((n * s.C_out + co) * OH + oh) * OW + ow)] +=
                    double(x[size_t(((n * s.C_in + ci) * s.H + ih) * s.W + iw)]) *
                    w[size_t(((ci * Og + c) * s.kH + kh) * s.kW + kw)];
              }
  return y;
}

}  // namespace

TEST_CASE("conv2d known values: 3x3 image 1..9, 2x2 ones kernel") {
  // y = sums of the 2x2 windows of [[1,2,3],[4,5,6],[7,8,9]] plus bias 0.5.
  const double x[] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[] = {1, 1, 1, 1}, b[] = {0.5};
  const Conv2dShape s{1, 1, 3, 3, 1, 2, 2};
  double y[4];
  cpu::conv2d_forward(s, x, w, b, y);
  CHECK(y[0] == 12.5);
  CHECK(y[1] == 16.5);
  CHECK(y[2] == 24.5);
  CHECK(y[3] == 28.5);
  // dy = ones: dx counts the windows covering each pixel; dw[kh,kw] = sum of the 2x2 sub-image.
  const double dy[] = {1, 1, 1, 1};
  double dx[9], dw[4], db[1];
  cpu::conv2d_backward_input(s, dy, w, dx);
  cpu::conv2d_backward_weight(s, x, dy, dw);
  cpu::conv2d_backward_bias<double>(1, 1, 4, dy, db);
  const double dx_expect[] = {1, 2, 1, 2, 4, 2, 1, 2, 1};
  for (int i = 0; i < 9; ++i) CHECK(dx[i] == dx_expect[i]);
  CHECK(dw[0] == 1 + 2 + 4 + 5);
  CHECK(dw[1] == 2 + 3 + 5 + 6);
  CHECK(dw[2] == 4 + 5 + 7 + 8);
  CHECK(dw[3] == 5 + 6 + 8 + 9);
  CHECK(db[0] == 4);
}

TEST_CASE("conv_transpose2d known values: stride 2 with a 2x2 ones kernel repeats pixels") {
  // [[1,2],[3,4]] -> each pixel becomes a 2x2 block; output_padding 1 adds a bias-only row/col.
  const double x[] = {1, 2, 3, 4}, w[] = {1, 1, 1, 1}, b[] = {0};
  ConvTranspose2dShape s{1, 1, 2, 2, 1, 2, 2};
  s.stride = {2, 2};
  s.output_padding = {1, 1};
  REQUIRE(s.out_h() == 5);
  double y[25];
  cpu::conv_transpose2d_forward(s, x, w, b, y);
  const double expect[] = {1, 1, 2, 2, 0, 1, 1, 2, 2, 0, 3, 3, 4, 4, 0, 3, 3, 4, 4, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < 25; ++i) CHECK(y[i] == expect[i]);
}

TEST_CASE("conv2d forward, dgrad, wgrad, bias grad match the direct loops (f64)") {
  uint32_t seed = 10;
  for (const auto& s : cases()) check_conv<double>(s, 1e-12, seed += 10);
}

TEST_CASE("conv2d matches the direct loops (f32)") {
  uint32_t seed = 500;
  for (const auto& s : cases()) check_conv<float>(s, 2e-5, seed += 10);
}

TEST_CASE("conv2d with enough samples to run chunks on threads (f32, ResNet-like block)") {
  check_conv<float>(shape(6, 16, 16, 12, 12, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1), 5e-5, 900);
  check_conv<float>(shape(9, 8, 12, 14, 14, 4, 4, {2, 2}, {1, 1}, {1, 1}, 1), 5e-5, 910);
}

TEST_CASE("conv_transpose2d forward and backward match the definition and its adjoints (f64)") {
  struct Case { ConvTranspose2dShape s; };
  std::vector<ConvTranspose2dShape> tcases;
  auto add = [&](int64_t N, int64_t C_in, int64_t C_out, int64_t H, int64_t W, int64_t k,
                 int64_t stride, int64_t pad, int64_t out_pad, int64_t dil, int64_t groups) {
    ConvTranspose2dShape s{N, C_in, H, W, C_out, k, k};
    s.stride = {stride, stride};
    s.padding = {pad, pad};
    s.output_padding = {out_pad, out_pad};
    s.dilation = {dil, dil};
    s.groups = groups;
    tcases.push_back(s);
  };
  add(3, 5, 4, 7, 7, 4, 2, 1, 0, 1, 1);   // DCGAN generator 7 -> 14
  add(1, 4, 6, 5, 6, 3, 2, 1, 1, 1, 2);   // output_padding, groups
  add(2, 3, 2, 4, 3, 3, 1, 0, 0, 2, 1);   // dilation
  add(2, 2, 3, 3, 3, 2, 3, 0, 2, 1, 1);   // stride > kernel, output_padding 2 (< stride)
  add(4, 6, 6, 2, 2, 3, 2, 2, 1, 1, 3);   // padding larger than the input, groups
  uint32_t seed = 2000;
  for (const auto& s : tcases) {
    CAPTURE(describe(s.as_conv()));
    const int64_t OHW = s.out_h() * s.out_w();
    auto x = random_vec<double>(size_t(s.N * s.C_in * s.H * s.W), seed += 10);
    auto w = random_vec<double>(size_t(s.C_in * (s.C_out / s.groups) * s.kH * s.kW), seed + 1);
    auto b = random_vec<double>(size_t(s.C_out), seed + 2);
    auto dy = random_vec<double>(size_t(s.N * s.C_out * OHW), seed + 3);
    std::vector<double> y(dy.size()), dx(x.size()), dw(w.size());
    cpu::conv_transpose2d_forward(s, x.data(), w.data(), b.data(), y.data());
    CHECK(max_err(y, naive_conv_transpose(s, x, w, b)) <= 1e-12);
    // Backward by the adjoint identities, each checked against the direct loop:
    // <dy, T(x)> = <T^*(dy), x> where T is linear in x (and in w).
    cpu::conv_transpose2d_backward_input(s, dy.data(), w.data(), dx.data());
    cpu::conv_transpose2d_backward_weight(s, x.data(), dy.data(), dw.data());
    const std::vector<double> zero_b(b.size(), 0.0);
    const auto Tx = naive_conv_transpose(s, x, w, zero_b);
    double lhs = 0, rhs_x = 0, rhs_w = 0;
    for (size_t i = 0; i < dy.size(); ++i) lhs += dy[i] * Tx[i];
    for (size_t i = 0; i < x.size(); ++i) rhs_x += dx[i] * x[i];
    for (size_t i = 0; i < w.size(); ++i) rhs_w += dw[i] * w[i];
    CHECK(rhs_x == doctest::Approx(lhs).epsilon(1e-10));
    CHECK(rhs_w == doctest::Approx(lhs).epsilon(1e-10));
    // And element-wise: dx[i] = <dy, T(e_i)>, checked on a few input positions.
    for (size_t i = 0; i < x.size(); i += std::max<size_t>(1, x.size() / 7)) {
      std::vector<double> e(x.size(), 0.0);
      e[i] = 1.0;
      const auto Te = naive_conv_transpose(s, e, w, zero_b);
      double d = 0;
      for (size_t j = 0; j < dy.size(); ++j) d += dy[j] * Te[j];
      CHECK(dx[i] == doctest::Approx(d).epsilon(1e-10));
    }
    for (size_t i = 0; i < w.size(); i += std::max<size_t>(1, w.size() / 7)) {
      std::vector<double> e(w.size(), 0.0);
      e[i] = 1.0;
      const auto Te = naive_conv_transpose(s, x, e, zero_b);
      double d = 0;
      for (size_t j = 0; j < dy.size(); ++j) d += dy[j] * Te[j];
      CHECK(dw[i] == doctest::Approx(d).epsilon(1e-10));
    }
  }
}

TEST_CASE("conv2d wgrad: the same result bit for bit on every run with several threads") {
  // Per-thread partial sums are added in a fixed order only if every thread gets the
  // same chunks every run; a dynamic schedule made resumed training drift in the last bits.
  const nd::testing::OmpThreads scoped(3);
  cpu::Conv2dShape s;
  s.N = 48, s.C_in = 8, s.H = 14, s.W = 14, s.C_out = 16, s.kH = 3, s.kW = 3, s.padding = {1, 1};
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(s.N * s.C_in * s.H * s.W), dy(s.N * s.C_out * s.out_h() * s.out_w());
  for (auto& v : x) v = u(gen);
  for (auto& v : dy) v = u(gen);
  std::vector<float> first(s.C_out * s.C_in * s.kH * s.kW), again(first.size());
  cpu::conv2d_backward_weight(s, x.data(), dy.data(), first.data());
  for (int run = 0; run < 20; ++run) {
    cpu::conv2d_backward_weight(s, x.data(), dy.data(), again.data());
    CHECK(std::equal(first.begin(), first.end(), again.begin()));
  }
}
