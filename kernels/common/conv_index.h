#pragma once
// The index math of conv2d as an implicit GEMM: which element of x, dy or w sits at
// (row, depth) or (depth, column) of each pass's virtual GEMM operands, and where each
// result goes. The CUDA kernels (kernels/cuda/conv.cu) tile these GEMMs in shared memory,
// gather through conv_walk.h's division-free walks (tested to visit exactly the accessors'
// elements below) and store through store(), so everything that can be wrong except the
// tiling runs on the CPU in tests/kernels/conv_index_test.cpp.
//
// Per channel group g (one grid z-slice), with Cg = C_in/groups and Og = C_out/groups:
//   forward  y  [M = N*OH*OW, Og]        = X [M, Cg*kH*kW] * W_g^T       (X gathered from x)
//   dgrad    dx [M = N*H*W,   Cg]        = DY [M, Og*kH*kW] * W_g         (DY gathered from dy),
//            run as stride_h*stride_w phase GEMMs without the structural zeros (DgradPhase)
//   wgrad    dw [Og, Cg*kH*kW]           = DY_g^T [Og, N*OH*OW] * X       (X as in forward)
// Rows and depths are flattened row-major: a pixel row m = (n*Hs + h)*Ws + w, a tap
// k = (c*kH + kh)*kW + kw, so neighbouring rows read neighbouring pixels (coalesced).
// Compiles with and without nvcc (ND_HOST_DEVICE); all index arithmetic is int64_t.
#include <algorithm>
#include <cstdint>

#include "kernels/common/host_device.h"
#include "kernels/common/conv_shape.h"

namespace nd::kernels::conv_index {

// Conv2dShape as plain integers a kernel can take by value.
struct Geometry {
  int64_t N, C_in, H, W, C_out, kH, kW, OH, OW;
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  int64_t groups, Cg, Og;  // Cg = C_in/groups, Og = C_out/groups
};

inline Geometry geometry(const Conv2dShape& s) {
  Geometry q{};
  q.N = s.N, q.C_in = s.C_in, q.H = s.H, q.W = s.W;
  q.C_out = s.C_out, q.kH = s.kH, q.kW = s.kW, q.OH = s.out_h(), q.OW = s.out_w();
  q.stride_h = s.stride[0], q.stride_w = s.stride[1], q.pad_h = s.padding[0], q.pad_w = s.padding[1];
  q.dil_h = s.dilation[0], q.dil_w = s.dilation[1];
  q.groups = s.groups, q.Cg = s.C_in / s.groups, q.Og = s.C_out / s.groups;
  return q;
}

struct Pixel {
  int64_t n, h, w;
};
// Row m of the pixels of an [N, Hs, Ws] map: m = (n*Hs + h)*Ws + w.
ND_HOST_DEVICE Pixel pixel_of(int64_t m, int64_t Hs, int64_t Ws) {
  const int64_t nh = m / Ws;
  return {nh / Hs, nh % Hs, m % Ws};
}

struct Tap {
  int64_t c, kh, kw;  // c: a channel within the group
};
// Depth k of the taps of a [C, kH, kW] filter: k = (c*kH + kh)*kW + kw.
ND_HOST_DEVICE Tap tap_of(int64_t k, int64_t kH, int64_t kW) {
  const int64_t ck = k / kW;
  return {ck / kH, ck % kH, k % kW};
}

// The input coordinate output coordinate o reads through kernel tap t: o*stride - pad + t*dil.
ND_HOST_DEVICE int64_t input_coord(int64_t o, int64_t t, int64_t stride, int64_t pad, int64_t dil) {
  return o * stride - pad + t * dil;
}

ND_HOST_DEVICE bool in_range(int64_t i, int64_t size) { return i >= 0 && i < size; }

// dgrad along one spatial dimension, split by phase. With stride s, input coordinate i
// receives a gradient through tap t only when s divides i + pad - t*dil, so the taps that
// reach i depend on i mod s alone: for i = phase + r*s they are t*dil = phase + pad (mod s),
// i.e. t = first_tap + a*tap_step (tap_step = s / gcd(s, dil)), and tap a reads output
// coordinate o = (i + pad - t*dil) / s = r + base - a*out_step (out_step = tap_step*dil/s).
// A dense GEMM per phase over exactly those taps multiplies no structural zero; the full
// dgrad GEMM over all kH*kW taps would multiply (1 - 1/s) of them per dimension.
struct DgradPhase {
  int64_t first, rows;               // i = first + r*stride, r < rows
  int64_t first_tap, taps, tap_step;  // t = first_tap + a*tap_step, a < taps (taps may be 0)
  int64_t base, out_step;             // o = r + base - a*out_step, in [0, out_size) or padding
};
// requires: 0 <= phase < stride, size, kernel >= 0, dil >= 1. A loop over the kernel's
// taps: a kernel calls it once per phase it works on, never per element.
ND_HOST_DEVICE DgradPhase dgrad_phase(int64_t phase, int64_t size, int64_t kernel, int64_t stride, int64_t pad,
                                      int64_t dil) {
  DgradPhase d{};
  d.first = phase;
  d.rows = phase < size ? (size - phase + stride - 1) / stride : 0;
  int64_t gcd = stride;  // gcd(stride, dil), Euclid
  for (int64_t b = dil; b != 0;) {
    const int64_t r = gcd % b;
    gcd = b, b = r;
  }
  d.tap_step = stride / gcd;
  d.out_step = d.tap_step * dil / stride;
  for (int64_t t = 0; t < kernel; ++t)
    if (((phase + pad - t * dil) % stride + stride) % stride == 0) {
      if (d.taps++ == 0) d.first_tap = t;
    }
  d.base = (phase + pad - d.first_tap * dil) / stride;  // exact when taps > 0
  return d;
}

// x[n, g*Cg + tap.c, ih, iw] for output pixel row m and tap depth k, 0 in the padding:
// the gathered X of forward (A[m, k]) and wgrad (B[m, k]).
template <class T>
ND_HOST_DEVICE T gather_input(const Geometry& q, const T* x, int64_t g, int64_t m, int64_t k) {
  const Pixel p = pixel_of(m, q.OH, q.OW);
  const Tap t = tap_of(k, q.kH, q.kW);
  const int64_t ih = input_coord(p.h, t.kh, q.stride_h, q.pad_h, q.dil_h);
  const int64_t iw = input_coord(p.w, t.kw, q.stride_w, q.pad_w, q.dil_w);
  if (!in_range(ih, q.H) || !in_range(iw, q.W)) return T(0);
  return x[((p.n * q.C_in + g * q.Cg + t.c) * q.H + ih) * q.W + iw];
}

// out[n, c, h, w] = v (+ bias[c] when bias is given), for pixel row m of an [N, C, Hs, Ws] map.
template <class T>
ND_HOST_DEVICE void store_pixel(T* out, const T* bias, int64_t C, int64_t Hs, int64_t Ws, int64_t m, int64_t c, T v) {
  const Pixel p = pixel_of(m, Hs, Ws);
  out[((p.n * C + c) * Hs + p.h) * Ws + p.w] = bias ? v + bias[c] : v;
}

// The three passes as GEMM problems C_g[rows, cols] = sum_k a(g, m, k) * b(g, k, j),
// stored by store(g, split, m, j, value). `split` is the depth chunk a partial sum
// covers (split-K): chunk s goes to the output pointer + s*chunk_stride (a partial buffer
// summed in chunk order afterwards; the bias, if any, only into chunk 0); with one chunk,
// chunk_stride is 0 and the output is the tensor itself. A problem may be a set of
// independent GEMMs (dgrad's phases): slices() of them, slice(s) the s-th, whose rows()
// is at most slice(0)'s; forward and wgrad are one slice, themselves.

// y[n, g*Og + j, oh, ow] = bias + sum_{k = (c, kh, kw)} X[m = (n, oh, ow), k] * w[g*Og + j, k].
template <class T>
struct ForwardGemm {
  Geometry q;
  const T *x, *w, *bias;  // bias may be nullptr
  T* y;
  int64_t chunk_stride = 0;
  ND_HOST_DEVICE int64_t rows() const { return q.N * q.OH * q.OW; }
  ND_HOST_DEVICE int64_t cols() const { return q.Og; }
  ND_HOST_DEVICE int64_t depth() const { return q.Cg * q.kH * q.kW; }
  ND_HOST_DEVICE int64_t slices() const { return 1; }
  ND_HOST_DEVICE const ForwardGemm& slice(int64_t /*s*/) const { return *this; }
  ND_HOST_DEVICE T a(int64_t g, int64_t m, int64_t k) const { return gather_input(q, x, g, m, k); }
  ND_HOST_DEVICE T b(int64_t g, int64_t k, int64_t j) const { return w[(g * q.Og + j) * depth() + k]; }
  ND_HOST_DEVICE void store(int64_t g, int64_t split, int64_t m, int64_t j, T v) const {
    store_pixel(y + split * chunk_stride, split == 0 ? bias : nullptr, q.C_out, q.OH, q.OW, m, g * q.Og + j, v);
  }
};

// One phase (ph, pw) of dgrad: the input pixels (n, ph.first + r*stride_h, pw.first + c*stride_w)
// as rows m = (n*ph.rows + r)*pw.rows + c, the output channels and the taps that reach them
// as depth k = (o*ph.taps + a)*pw.taps + b (DgradPhase):
// dx[n, g*Cg + j, ih, iw] = bias + sum_{k = (o, a, b)} dy[n, g*Og + o, oh, ow] * w[g*Og + o, j, kh, kw]
// with dy read as 0 where (oh, ow) falls outside the output (padding, or rows the floor in
// OH dropped). Every input pixel is a row of exactly one phase: slice(s) is phase
// (s / stride_w, s % stride_w), dgrad_gemm builds phase (0, 0), the one with the most rows.
// The bias is conv_transpose2d's (its forward is this pass); conv2d's dgrad passes nullptr.
template <class T>
struct DgradGemm {
  Geometry q;
  DgradPhase ph, pw;
  const T *dy, *w, *bias;  // bias may be nullptr
  T* dx;
  int64_t chunk_stride = 0;
  ND_HOST_DEVICE int64_t rows() const { return q.N * ph.rows * pw.rows; }
  ND_HOST_DEVICE int64_t cols() const { return q.Cg; }
  ND_HOST_DEVICE int64_t depth() const { return q.Og * ph.taps * pw.taps; }
  ND_HOST_DEVICE int64_t slices() const { return q.stride_h * q.stride_w; }
  ND_HOST_DEVICE DgradGemm slice(int64_t s) const {
    DgradGemm p = *this;
    p.ph = dgrad_phase(s / q.stride_w, q.H, q.kH, q.stride_h, q.pad_h, q.dil_h);
    p.pw = dgrad_phase(s % q.stride_w, q.W, q.kW, q.stride_w, q.pad_w, q.dil_w);
    return p;
  }
  ND_HOST_DEVICE T a(int64_t g, int64_t m, int64_t k) const {
    const Pixel p = pixel_of(m, ph.rows, pw.rows);
    const Tap t = tap_of(k, ph.taps, pw.taps);  // t.c: the output channel within the group
    const int64_t oh = p.h + ph.base - t.kh * ph.out_step, ow = p.w + pw.base - t.kw * pw.out_step;
    if (!in_range(oh, q.OH) || !in_range(ow, q.OW)) return T(0);
    return dy[((p.n * q.C_out + g * q.Og + t.c) * q.OH + oh) * q.OW + ow];
  }
  ND_HOST_DEVICE T b(int64_t g, int64_t k, int64_t j) const {
    const Tap t = tap_of(k, ph.taps, pw.taps);
    const int64_t kh = ph.first_tap + t.kh * ph.tap_step, kw = pw.first_tap + t.kw * pw.tap_step;
    return w[(((g * q.Og + t.c) * q.Cg + j) * q.kH + kh) * q.kW + kw];
  }
  ND_HOST_DEVICE void store(int64_t g, int64_t split, int64_t m, int64_t j, T v) const {
    const Pixel p = pixel_of(m, ph.rows, pw.rows);
    const int64_t c = g * q.Cg + j, ih = ph.first + p.h * q.stride_h, iw = pw.first + p.w * q.stride_w;
    dx[split * chunk_stride + ((p.n * q.C_in + c) * q.H + ih) * q.W + iw] = bias && split == 0 ? v + bias[c] : v;
  }
};

// dgrad as its phase (0, 0); slice(s) gives every phase.
template <class T>
DgradGemm<T> dgrad_gemm(const Geometry& q, const T* dy, const T* w, const T* bias, T* dx) {
  return DgradGemm<T>{q, {}, {}, dy, w, bias, dx, 0}.slice(0);
}

// dw[g*Og + m, j = (c, kh, kw)] = sum_{k = (n, oh, ow)} dy[n, g*Og + m, oh, ow] * X[k, j].
template <class T>
struct WgradGemm {
  Geometry q;
  const T *x, *dy;
  T* out;
  int64_t chunk_stride = 0;
  ND_HOST_DEVICE int64_t rows() const { return q.Og; }
  ND_HOST_DEVICE int64_t cols() const { return q.Cg * q.kH * q.kW; }
  ND_HOST_DEVICE int64_t depth() const { return q.N * q.OH * q.OW; }
  ND_HOST_DEVICE int64_t slices() const { return 1; }
  ND_HOST_DEVICE const WgradGemm& slice(int64_t /*s*/) const { return *this; }
  ND_HOST_DEVICE T a(int64_t g, int64_t m, int64_t k) const {
    const int64_t ohw = q.OH * q.OW, n = k / ohw;
    return dy[(n * q.C_out + g * q.Og + m) * ohw + k % ohw];
  }
  ND_HOST_DEVICE T b(int64_t g, int64_t k, int64_t j) const { return gather_input(q, x, g, k, j); }
  ND_HOST_DEVICE void store(int64_t g, int64_t split, int64_t m, int64_t j, T v) const {
    out[split * chunk_stride + (g * q.Og + m) * cols() + j] = v;
  }
};

// How a long depth against few output tiles (wgrad's N*OH*OW; forward's and dgrad's
// C*kH*kW on a small batch) is cut into chunks of whole k-tiles. The tiles x chunks run as
// blocks dealt over kSplitSms SMs, so a pass takes about its busiest SM's share of the depth:
// ceil(tiles*splits / kSplitSms) blocks of `chunk` each. Of the cuts into at most
// ceil(target_blocks / tiles) chunks, none shorter than min_chunk (but the last), split_depth
// takes the one with the least such share, and the fewest chunks among equals (every chunk
// writes partial results that are read back). Taking the most chunks allowed instead left a
// part wave: 96 blocks for 132 SMs where 132 fit (bench/RESULTS.md "convfill"). The cut
// depends on the shape only (kSplitSms is a constant, not the device's count), so the
// summation order -- and the result -- is the same on every run and every device.
struct SplitK {
  int64_t splits, chunk;  // chunk s covers depth [s*chunk, min((s+1)*chunk, depth))
};
constexpr int64_t kSplitSms = 132;  // an H200's (and an H100 SXM's) SMs
// depth cut into about `wanted` chunks of whole k-tiles: the chunk rounded up to tile_k,
// then as many chunks as that takes (fewer than wanted where the rounding covers more).
// requires: wanted, tile_k >= 1. Host only.
inline SplitK cut_into(int64_t depth, int64_t wanted, int64_t tile_k) {
  const int64_t per = (depth + wanted - 1) / wanted;
  const int64_t chunk = std::max<int64_t>(1, (per + tile_k - 1) / tile_k) * tile_k;
  return {std::max<int64_t>(1, (depth + chunk - 1) / chunk), chunk};
}
// requires: tiles, tile_k, min_chunk >= 1. Host only.
inline SplitK split_depth(int64_t depth, int64_t tiles, int64_t tile_k, int64_t min_chunk, int64_t target_blocks) {
  const int64_t by_blocks = (target_blocks + tiles - 1) / tiles;
  const int64_t most = std::max<int64_t>(1, std::min(by_blocks, depth / min_chunk));
  SplitK best{1, 0};
  int64_t best_share = -1;
  for (int64_t wanted = 1; wanted <= most; ++wanted) {
    const SplitK cut = cut_into(depth, wanted, tile_k);
    const int64_t share = (tiles * cut.splits + kSplitSms - 1) / kSplitSms * cut.chunk;
    if (best_share < 0 || share < best_share) best = cut, best_share = share;
  }
  return best;
}

// The cut `cut` (split_depth's) made finer until its blocks cover kSplitSms SMs, or its
// chunks are one k-tile: each time the fewest more chunks that cut_into gives. conv.cu's
// ConvSplit::kFillSms asks: where the busiest-SM measure
// ties (D.main.2's forward at batch 64: 49 tiles x 2 chunks of 256 = 98 blocks against 196
// of 128 or 392 of 64), does filling every SM, at more partial results to write and sum, pay? The cost model cannot say (it has no latency term).
// requires: tiles, tile_k >= 1; cut from split_depth(depth, tiles, tile_k, ...). Host only.
inline SplitK fill_sms(SplitK cut, int64_t depth, int64_t tiles, int64_t tile_k) {
  for (int64_t wanted = cut.splits + 1; tiles * cut.splits < kSplitSms && cut.chunk > tile_k; ++wanted) {
    const SplitK finer = cut_into(depth, wanted, tile_k);
    if (finer.splits > cut.splits) cut = finer;
  }
  return cut;
}

}  // namespace nd::kernels::conv_index
