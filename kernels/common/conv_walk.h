#pragma once
// The conv GEMMs' operands walked the way the CUDA kernels gather them: without a division
// per element. conv_index.h's accessors (the definition, tested against kernels/cpu) split
// every row, depth and column index into its digits -- a pixel row m into (n, h, w), a tap
// depth k into (c, kh, kw) -- with 64-bit divisions by runtime divisors, tens of
// instructions each. A kernel thread, though, keeps one index of its tile cells fixed and
// steps the other by a constant (conv.cu's gathers): so it splits each index once per tile
// (Radix::digits) and then advances the digits by the step's digits with carries
// (Radix::advance: adds and compares). The offsets are 32-bit where the tensors allow it
// (I = int32_t; fits_int32 is the host's check, else I = int64_t): digits and coordinates in
// I, offsets in I's unsigned twin, whose wrap-around is defined, so an index past the
// problem's end (edge tiles compute it and never load it) has no undefined overflow.
//
// Each pass's Walk (walk(problem), one per slice: dgrad's phases) names its three index
// axes as mixed radices and gives the address of A[m, k] and B[k, j] from their digits,
// nullptr where the accessor reads 0 (padding, a dgrad tap past the output's edge); its
// OutputWalk (output_walk(problem, split)) gives where C[m, j] is stored, from the row's
// digits. tests/kernels/conv_index_test.cpp checks that every walk visits exactly the
// accessors' elements, and every store lands where the accessor's store() puts it, at every
// shape class, for both index types.
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/common/conv_index.h"

namespace nd::kernels::conv_index {

// An index as the digits of a mixed radix: index = (hi*r1 + mid)*r2 + lo with 0 <= mid < r1
// and 0 <= lo < r2; hi is unbounded (a pixel's sample n, a tap's channel c).
template <class I>
struct Digits {
  I hi, mid, lo;
};

template <class I>
struct Radix {
  I r1, r2;  // >= 1
  ND_HOST_DEVICE Digits<I> digits(I index) const {
    const I q = index / r2;
    return {q / r1, q % r1, index % r2};
  }
  // d += step, digit by digit with carries: each digit sum is below twice its radix, so one
  // subtraction normalises it. requires: d and step are digits() of non-negative indices.
  ND_HOST_DEVICE void advance(Digits<I>& d, const Digits<I>& step) const {
    d.lo += step.lo;
    const I carry_lo = d.lo >= r2 ? 1 : 0;
    d.lo -= carry_lo * r2;
    d.mid += step.mid + carry_lo;
    const I carry_mid = d.mid >= r1 ? 1 : 0;
    d.mid -= carry_mid * r1;
    d.hi += step.hi + carry_mid;
  }
};

// A radix of a linear axis (one digit: hi), and of two trailing dimensions sized a x b; a
// size 0 (a dgrad phase without taps, whose depth is 0 and never walked) counts as 1.
template <class I>
ND_HOST_DEVICE Radix<I> linear_radix() {
  return {1, 1};
}
template <class I>
ND_HOST_DEVICE Radix<I> radix_of(int64_t a, int64_t b) {
  return {static_cast<I>(a > 0 ? a : 1), static_cast<I>(b > 0 ? b : 1)};
}

// x[n, c0 + c, ih, iw] with ih = h*stride_h - pad_h + kh*dil_h (iw alike), nullptr in the
// padding: forward's A and wgrad's B, for pixel digits (n, h, w) and tap digits (c, kh, kw).
template <class T, class I>
struct InputPatch {
  using U = std::make_unsigned_t<I>;
  const T* x;
  I C_in, H, W, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  ND_HOST_DEVICE const T* at(I c0, const Digits<I>& pixel, const Digits<I>& tap) const {
    const I ih = pixel.mid * stride_h - pad_h + tap.mid * dil_h;
    const I iw = pixel.lo * stride_w - pad_w + tap.lo * dil_w;
    if (ih < 0 || ih >= H || iw < 0 || iw >= W) return nullptr;
    return x + ((U(pixel.hi) * U(C_in) + U(c0) + U(tap.hi)) * U(H) + U(ih)) * U(W) + U(iw);
  }
};

template <class T, class I>
ND_HOST_DEVICE InputPatch<T, I> input_patch(const Geometry& q, const T* x) {
  return {x, I(q.C_in), I(q.H), I(q.W), I(q.stride_h), I(q.stride_w), I(q.pad_h), I(q.pad_w), I(q.dil_h), I(q.dil_w)};
}

// ForwardGemm: rows (n, oh, ow), depth (c, kh, kw), columns linear.
template <class T, class I>
struct ForwardWalk {
  using U = std::make_unsigned_t<I>;
  Radix<I> rows, depth, cols;
  InputPatch<T, I> x;
  const T* w;
  I Cg, Og, kH, kW;
  ND_HOST_DEVICE const T* a(I g, const Digits<I>& m, const Digits<I>& k) const { return x.at(g * Cg, m, k); }
  ND_HOST_DEVICE const T* b(I g, const Digits<I>& k, const Digits<I>& j) const {
    return w + (U(g * Og + j.hi) * U(Cg) + U(k.hi)) * U(kH * kW) + U(k.mid * kW + k.lo);
  }
};

// DgradGemm's phase: rows (n, r, c) of the phase's pixels, depth (o, a, b): output channel
// and the phase's taps, columns linear (input channels); conv_index.h DgradGemm::a and ::b.
template <class T, class I>
struct DgradWalk {
  using U = std::make_unsigned_t<I>;
  Radix<I> rows, depth, cols;
  const T *dy, *w;
  I C_out, OH, OW, Cg, Og, kH, kW;
  I base_h, base_w, out_step_h, out_step_w, first_tap_h, first_tap_w, tap_step_h, tap_step_w;
  ND_HOST_DEVICE const T* a(I g, const Digits<I>& m, const Digits<I>& k) const {
    const I oh = m.mid + base_h - k.mid * out_step_h, ow = m.lo + base_w - k.lo * out_step_w;
    if (oh < 0 || oh >= OH || ow < 0 || ow >= OW) return nullptr;
    return dy + ((U(m.hi) * U(C_out) + U(g * Og) + U(k.hi)) * U(OH) + U(oh)) * U(OW) + U(ow);
  }
  ND_HOST_DEVICE const T* b(I g, const Digits<I>& k, const Digits<I>& j) const {
    const I kh = first_tap_h + k.mid * tap_step_h, kw = first_tap_w + k.lo * tap_step_w;
    return w + ((U(g * Og) + U(k.hi)) * U(Cg) + U(j.hi)) * U(kH * kW) + U(kh * kW + kw);
  }
};

// WgradGemm: rows linear (output channels), depth (n, oh, ow), columns (c, kh, kw).
template <class T, class I>
struct WgradWalk {
  using U = std::make_unsigned_t<I>;
  Radix<I> rows, depth, cols;
  InputPatch<T, I> x;
  const T* dy;
  I C_out, OH, OW, Cg, Og;
  ND_HOST_DEVICE const T* a(I g, const Digits<I>& m, const Digits<I>& k) const {
    return dy + ((U(k.hi) * U(C_out) + U(g * Og + m.hi)) * U(OH) + U(k.mid)) * U(OW) + U(k.lo);
  }
  ND_HOST_DEVICE const T* b(I g, const Digits<I>& k, const Digits<I>& j) const { return x.at(g * Cg, k, j); }
};

template <class I, class T>
ND_HOST_DEVICE ForwardWalk<T, I> walk(const ForwardGemm<T>& p) {
  const Geometry& q = p.q;
  return {radix_of<I>(q.OH, q.OW), radix_of<I>(q.kH, q.kW), linear_radix<I>(), input_patch<T, I>(q, p.x), p.w,
          I(q.Cg), I(q.Og), I(q.kH), I(q.kW)};
}

template <class I, class T>
ND_HOST_DEVICE DgradWalk<T, I> walk(const DgradGemm<T>& p) {
  const Geometry& q = p.q;
  return {radix_of<I>(p.ph.rows, p.pw.rows), radix_of<I>(p.ph.taps, p.pw.taps), linear_radix<I>(), p.dy, p.w,
          I(q.C_out), I(q.OH), I(q.OW), I(q.Cg), I(q.Og), I(q.kH), I(q.kW),
          I(p.ph.base), I(p.pw.base), I(p.ph.out_step), I(p.pw.out_step),
          I(p.ph.first_tap), I(p.pw.first_tap), I(p.ph.tap_step), I(p.pw.tap_step)};
}

template <class I, class T>
ND_HOST_DEVICE WgradWalk<T, I> walk(const WgradGemm<T>& p) {
  const Geometry& q = p.q;
  return {linear_radix<I>(), radix_of<I>(q.OH, q.OW), radix_of<I>(q.kH, q.kW), input_patch<T, I>(q, p.x), p.dy,
          I(q.C_out), I(q.OH), I(q.OW), I(q.Cg), I(q.Og)};
}

// Where a pass's result C_g[m, j] goes, without a division per stored element (the
// accessors' store() splits m with two 64-bit divisions each time). A storing thread keeps
// one index of its cells fixed and steps the other, as the gathers do: a row m is split into
// digits once (rows.digits) and stepped with rows.advance, a column j is linear. Then
//   C_g[m, j] -> out[row(m) + col(g, j)],
//   row(n, h, w) = n*sample + (first_h + h*step_h)*Ws + first_w + w*step_w,
//   col(g, j) = (g*group_cols + j)*col_stride,  plus bias[g*group_cols + j] where bias is set,
// with out the chunk's output (split-K: the tensor itself, or chunk `split` of the partial
// buffer) and bias only in chunk 0. Forward and dgrad rows are pixels (n, h, w) of an
// [N, C, Hs, Ws] map (dgrad's a phase's: first + h*stride), a column a channel at
// Hs*Ws apart; wgrad's rows are linear (output channels, Cg*kH*kW apart) and its column
// index g*Og*cols + j is the flat position in dw's row. Offsets in I's unsigned twin (an
// edge tile's row past the end computes a wrapped offset and stores nothing).
template <class T, class I>
struct OutputWalk {
  using U = std::make_unsigned_t<I>;
  Radix<I> rows;
  T* out;
  const T* bias;  // nullptr: no bias (wgrad, conv2d's dgrad, chunks past 0)
  I sample, Ws, first_h, first_w, step_h, step_w, group_cols, col_stride;
  ND_HOST_DEVICE U row(const Digits<I>& m) const {
    return U(m.hi) * U(sample) + U(first_h + m.mid * step_h) * U(Ws) + U(first_w + m.lo * step_w);
  }
  ND_HOST_DEVICE void store(U row_offset, I g, I j, T v) const {
    const I c = g * group_cols + j;
    out[row_offset + U(c) * U(col_stride)] = bias ? v + bias[c] : v;
  }
};

template <class I, class T>
ND_HOST_DEVICE OutputWalk<T, I> output_walk(const ForwardGemm<T>& p, int64_t split) {
  const Geometry& q = p.q;
  return {radix_of<I>(q.OH, q.OW), p.y + split * p.chunk_stride, split == 0 ? p.bias : nullptr,
          I(q.C_out * q.OH * q.OW), I(q.OW), 0, 0, 1, 1, I(q.Og), I(q.OH * q.OW)};
}

template <class I, class T>
ND_HOST_DEVICE OutputWalk<T, I> output_walk(const DgradGemm<T>& p, int64_t split) {
  const Geometry& q = p.q;
  return {radix_of<I>(p.ph.rows, p.pw.rows), p.dx + split * p.chunk_stride, split == 0 ? p.bias : nullptr,
          I(q.C_in * q.H * q.W), I(q.W), I(p.ph.first), I(p.pw.first), I(q.stride_h), I(q.stride_w),
          I(q.Cg), I(q.H * q.W)};
}

template <class I, class T>
ND_HOST_DEVICE OutputWalk<T, I> output_walk(const WgradGemm<T>& p, int64_t split) {
  return {linear_radix<I>(), p.out + split * p.chunk_stride, nullptr, I(p.cols()), 0, 0, 0, 0, 0,
          I(p.q.Og * p.cols()), 1};
}

// Whether int32_t walks are exact for conv q: every tensor's elements, every GEMM index
// (with a tile's overhang past the end: `margin`) and every coordinate a walk forms fit in
// int32_t. Host only.
inline bool fits_int32(const Geometry& q, int64_t margin) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  const int64_t sizes[] = {
      q.N * q.C_in * q.H * q.W, q.N * q.C_out * q.OH * q.OW, q.C_out * q.Cg * q.kH * q.kW,  // x, y / dy, w
      q.N * q.H * q.W + margin, q.N * q.OH * q.OW + margin,                                 // pixel rows
      q.Cg * q.kH * q.kW + margin, q.Og * q.kH * q.kW + margin,                             // depths
      (q.OH + q.H) * (q.stride_h + 1) + q.pad_h + q.kH * q.dil_h,                          // coordinates
      (q.OW + q.W) * (q.stride_w + 1) + q.pad_w + q.kW * q.dil_w};
  for (const int64_t s : sizes)
    if (s > kMax) return false;
  return true;
}

}  // namespace nd::kernels::conv_index
