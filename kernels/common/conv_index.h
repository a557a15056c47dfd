#pragma once
// The index math of conv2d as an implicit GEMM: which element of x, dy or w sits at
// (row, depth) or (depth, column) of each pass's virtual GEMM operands, and where each
// result goes. The CUDA kernels (kernels/cuda/conv.cu) tile these GEMMs in shared memory
// and call nothing but the accessors below, so everything here that can be wrong except
// the tiling runs on the CPU in tests/kernels/conv_index_test.cpp.
//
// Per channel group g (one grid z-slice), with Cg = C_in/groups and Og = C_out/groups:
//   forward  y  [M = N*OH*OW, Og]        = X [M, Cg*kH*kW] * W_g^T       (X gathered from x)
//   dgrad    dx [M = N*H*W,   Cg]        = DY [M, Og*kH*kW] * W_g         (DY gathered from dy)
//   wgrad    dw [Og, Cg*kH*kW]           = DY_g^T [Og, N*OH*OW] * X       (X as in forward)
// Rows and depths are flattened row-major: a pixel row m = (n*Hs + h)*Ws + w, a tap
// k = (c*kH + kh)*kW + kw, so neighbouring rows read neighbouring pixels (coalesced).
// Compiles with and without nvcc (ND_HOST_DEVICE); all index arithmetic is int64_t.
#include <algorithm>
#include <cstdint>

#include "kernels/common/counter_rng.h"  // ND_HOST_DEVICE
#include "kernels/cpu/conv.h"            // Conv2dShape

namespace nd::kernels::conv_index {

// Conv2dShape as plain integers a kernel can take by value.
struct Geometry {
  int64_t N, C_in, H, W, C_out, kH, kW, OH, OW;
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  int64_t groups, Cg, Og;  // Cg = C_in/groups, Og = C_out/groups
};

inline Geometry geometry(const cpu::Conv2dShape& s) {
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

// dgrad's inverse of input_coord: the output coordinate o < out_size with
// input_coord(o, t) == i, or -1 when there is none (i + pad - t*dil negative or not a
// multiple of stride, or o past the output: rows the floor in OH dropped).
ND_HOST_DEVICE int64_t output_coord(int64_t i, int64_t t, int64_t stride, int64_t pad, int64_t dil,
                                    int64_t out_size) {
  const int64_t num = i + pad - t * dil;
  if (num < 0 || num % stride != 0) return -1;
  const int64_t o = num / stride;
  return o < out_size ? o : -1;
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
// covers (wgrad's split-K); forward and dgrad run one chunk.

// y[n, g*Og + j, oh, ow] = bias + sum_{k = (c, kh, kw)} X[m = (n, oh, ow), k] * w[g*Og + j, k].
template <class T>
struct ForwardGemm {
  Geometry q;
  const T *x, *w, *bias;  // bias may be nullptr
  T* y;
  ND_HOST_DEVICE int64_t rows() const { return q.N * q.OH * q.OW; }
  ND_HOST_DEVICE int64_t cols() const { return q.Og; }
  ND_HOST_DEVICE int64_t depth() const { return q.Cg * q.kH * q.kW; }
  ND_HOST_DEVICE T a(int64_t g, int64_t m, int64_t k) const { return gather_input(q, x, g, m, k); }
  ND_HOST_DEVICE T b(int64_t g, int64_t k, int64_t j) const { return w[(g * q.Og + j) * depth() + k]; }
  ND_HOST_DEVICE void store(int64_t g, int64_t /*split*/, int64_t m, int64_t j, T v) const {
    store_pixel(y, bias, q.C_out, q.OH, q.OW, m, g * q.Og + j, v);
  }
};

// dx[n, g*Cg + j, ih, iw] = bias + sum_{k = (o, kh, kw)} dy[n, g*Og + o, oh, ow] * w[g*Og + o, j, kh, kw]
// over the taps whose output pixel (oh, ow) exists (output_coord >= 0 in both dims).
// The bias is conv_transpose2d's (its forward is this pass); conv2d's dgrad passes nullptr.
template <class T>
struct DgradGemm {
  Geometry q;
  const T *dy, *w, *bias;  // bias may be nullptr
  T* dx;
  ND_HOST_DEVICE int64_t rows() const { return q.N * q.H * q.W; }
  ND_HOST_DEVICE int64_t cols() const { return q.Cg; }
  ND_HOST_DEVICE int64_t depth() const { return q.Og * q.kH * q.kW; }
  ND_HOST_DEVICE T a(int64_t g, int64_t m, int64_t k) const {
    const Pixel p = pixel_of(m, q.H, q.W);
    const Tap t = tap_of(k, q.kH, q.kW);  // t.c: the output channel within the group
    const int64_t oh = output_coord(p.h, t.kh, q.stride_h, q.pad_h, q.dil_h, q.OH);
    const int64_t ow = output_coord(p.w, t.kw, q.stride_w, q.pad_w, q.dil_w, q.OW);
    if (oh < 0 || ow < 0) return T(0);
    return dy[((p.n * q.C_out + g * q.Og + t.c) * q.OH + oh) * q.OW + ow];
  }
  ND_HOST_DEVICE T b(int64_t g, int64_t k, int64_t j) const {
    const int64_t taps = q.kH * q.kW, o = k / taps;
    return w[((g * q.Og + o) * q.Cg + j) * taps + k % taps];
  }
  ND_HOST_DEVICE void store(int64_t g, int64_t /*split*/, int64_t m, int64_t j, T v) const {
    store_pixel(dx, bias, q.C_in, q.H, q.W, m, g * q.Cg + j, v);
  }
};

// dw[g*Og + m, j = (c, kh, kw)] = sum_{k = (n, oh, ow)} dy[n, g*Og + m, oh, ow] * X[k, j].
// With split-K, chunk s of the depth goes to out + s*C_out*Cg*kH*kW (a partial buffer
// summed in chunk order afterwards); with one chunk, out is dw itself.
template <class T>
struct WgradGemm {
  Geometry q;
  const T *x, *dy;
  T* out;
  ND_HOST_DEVICE int64_t rows() const { return q.Og; }
  ND_HOST_DEVICE int64_t cols() const { return q.Cg * q.kH * q.kW; }
  ND_HOST_DEVICE int64_t depth() const { return q.N * q.OH * q.OW; }
  ND_HOST_DEVICE T a(int64_t g, int64_t m, int64_t k) const {
    const int64_t ohw = q.OH * q.OW, n = k / ohw;
    return dy[(n * q.C_out + g * q.Og + m) * ohw + k % ohw];
  }
  ND_HOST_DEVICE T b(int64_t g, int64_t k, int64_t j) const { return gather_input(q, x, g, k, j); }
  ND_HOST_DEVICE void store(int64_t g, int64_t split, int64_t m, int64_t j, T v) const {
    out[split * q.C_out * cols() + (g * q.Og + m) * cols() + j] = v;
  }
};

// How wgrad's depth (N*OH*OW, often thousands against few output tiles) is cut into
// chunks of whole k-tiles: enough chunks that tiles*splits comes near target_blocks, each
// at least min_chunk long (the last may be shorter). Depends on the shape only, so the
// summation order -- and the result -- is the same on every run.
struct SplitK {
  int64_t splits, chunk;  // chunk s covers depth [s*chunk, min((s+1)*chunk, depth))
};
// requires: tiles, tile_k, min_chunk >= 1. Host only.
inline SplitK split_depth(int64_t depth, int64_t tiles, int64_t tile_k, int64_t min_chunk, int64_t target_blocks) {
  const int64_t by_blocks = (target_blocks + tiles - 1) / tiles;
  const int64_t by_depth = depth / min_chunk;
  const int64_t wanted = std::max<int64_t>(1, std::min(by_blocks, by_depth));
  const int64_t per = (depth + wanted - 1) / wanted;
  const int64_t chunk = std::max<int64_t>(1, (per + tile_k - 1) / tile_k) * tile_k;
  return {std::max<int64_t>(1, (depth + chunk - 1) / chunk), chunk};
}

}  // namespace nd::kernels::conv_index
