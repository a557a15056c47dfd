// conv2d on the CPU as im2col + GEMM, and conv_transpose2d as its adjoint.
//
// Why this shape: the three passes are one GEMM each per channel group over the
// "column" matrix col[(c, kh, kw), (n, oh, ow)] (the input patches):
//   forward  y_g  [C_out/g, cols]    = W_g [C_out/g, K_g] * col_g [K_g, cols]
//   dgrad    dcol [K_g, cols]        = W_g^T * dy_g,  then col2im adds dcol back into dx
//   wgrad    dW_g [C_out/g, K_g]    += dy_g [C_out/g, cols] * col_g^T
// with K_g = C_in/groups * kH * kW. GEMM efficiency needs enough columns, so samples are
// processed in chunks of nb samples with nb*OH*OW >= kTargetCols (small feature maps, as
// in DCGAN, would otherwise give skinny products); the chunk's dy/y are gathered into or
// scattered from a [C_out, nb*OH*OW] buffer. Chunks run in parallel over OpenMP threads
// with single-threaded GEMMs when there are enough of them; otherwise chunks run in order
// and Eigen threads each GEMM. wgrad gives each thread its own dW accumulator and sums
// them at the end (no atomics, deterministic for a fixed thread count).
// Workspaces are thread_local and grow on demand, so the steady state does not allocate.
#include "kernels/cpu/conv.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace nd::kernels::cpu {
namespace {

// Columns per GEMM below which Eigen's efficiency drops noticeably (bench_cpu_ops).
constexpr int64_t kTargetCols = 512;

struct Geometry {
  int64_t Cg, Og, K, OH, OW, OHW, HW;  // K = Cg*kH*kW, the GEMM depth per group
  bool direct;                         // 1x1, stride 1, no padding: col_g is the input itself
  explicit Geometry(const Conv2dShape& s)
      : Cg(s.C_in / s.groups), Og(s.C_out / s.groups), K(Cg * s.kH * s.kW), OH(s.out_h()),
        OW(s.out_w()), OHW(OH * OW), HW(s.H * s.W),
        direct(s.kH == 1 && s.kW == 1 && s.stride[0] == 1 && s.stride[1] == 1 &&
               s.padding[0] == 0 && s.padding[1] == 0) {}
};

template <class T>
T* workspace(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Valid output range [lo, hi) along one axis for kernel tap offset `off` = k*dil - pad:
// the input index o*stride + off must lie in [0, size).
struct Span { int64_t lo, hi; };
Span valid_span(int64_t off, int64_t stride, int64_t size, int64_t out) {
  int64_t lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
  int64_t hi = size - 1 - off >= 0 ? (size - 1 - off) / stride + 1 : 0;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
  return {lo, hi};
}

// col[(c*kH + kh)*kW + kw, s*OHW + oh*OW + ow] = x[n0 + s, g*Cg + c, ih, iw] (0 outside).
// x points at sample n0, channel g*Cg.
template <class T>
void im2col(const Conv2dShape& s, const Geometry& q, const T* x, int64_t nb, T* col) {
  const int64_t cols = nb * q.OHW, sw = s.stride[1];
  for (int64_t c = 0; c < q.Cg; ++c)
    for (int64_t kh = 0; kh < s.kH; ++kh)
      for (int64_t kw = 0; kw < s.kW; ++kw) {
        T* row = col + ((c * s.kH + kh) * s.kW + kw) * cols;
        const int64_t off_h = kh * s.dilation[0] - s.padding[0];
        const int64_t off_w = kw * s.dilation[1] - s.padding[1];
        const Span rows = valid_span(off_h, s.stride[0], s.H, q.OH);
        const Span span = valid_span(off_w, sw, s.W, q.OW);
        for (int64_t b = 0; b < nb; ++b) {
          const T* xc = x + b * s.C_in * q.HW + c * q.HW;
          T* out = row + b * q.OHW;
          std::fill(out, out + rows.lo * q.OW, T(0));
          for (int64_t oh = rows.lo; oh < rows.hi; ++oh) {
            T* o = out + oh * q.OW;
            const T* xr = xc + (oh * s.stride[0] + off_h) * s.W + off_w;
            std::fill(o, o + span.lo, T(0));
            if (sw == 1) {
              std::copy(xr + span.lo, xr + span.hi, o + span.lo);
            } else {
              for (int64_t ow = span.lo; ow < span.hi; ++ow) o[ow] = xr[ow * sw];
            }
            std::fill(o + span.hi, o + q.OW, T(0));
          }
          std::fill(out + rows.hi * q.OW, out + q.OHW, T(0));
        }
      }
}

// Adjoint of im2col: dx[n0 + s, g*Cg + c, ih, iw] += col[...]. dx points like x above.
template <class T>
void col2im(const Conv2dShape& s, const Geometry& q, const T* col, int64_t nb, T* dx) {
  const int64_t cols = nb * q.OHW, sw = s.stride[1];
  for (int64_t c = 0; c < q.Cg; ++c)
    for (int64_t kh = 0; kh < s.kH; ++kh)
      for (int64_t kw = 0; kw < s.kW; ++kw) {
        const T* row = col + ((c * s.kH + kh) * s.kW + kw) * cols;
        const int64_t off_h = kh * s.dilation[0] - s.padding[0];
        const int64_t off_w = kw * s.dilation[1] - s.padding[1];
        const Span rows = valid_span(off_h, s.stride[0], s.H, q.OH);
        const Span span = valid_span(off_w, sw, s.W, q.OW);
        for (int64_t b = 0; b < nb; ++b) {
          T* xc = dx + b * s.C_in * q.HW + c * q.HW;
          for (int64_t oh = rows.lo; oh < rows.hi; ++oh) {
            const T* o = row + b * q.OHW + oh * q.OW;
            T* xr = xc + (oh * s.stride[0] + off_h) * s.W + off_w;
            for (int64_t ow = span.lo; ow < span.hi; ++ow) xr[ow * sw] += o[ow];
          }
        }
      }
}

// Samples per chunk, and whether chunks go to threads (true) or Eigen threads each GEMM.
struct Plan { int64_t nb, chunks; bool parallel; };
Plan plan_chunks(int64_t N, int64_t OHW) {
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  int64_t nb = std::clamp<int64_t>((kTargetCols + OHW - 1) / OHW, 1, std::max<int64_t>(N, 1));
  if (threads > 1 && N >= threads) nb = std::min(nb, (N + threads - 1) / threads);
  const int64_t chunks = (N + nb - 1) / nb;
  return {nb, chunks, threads > 1 && chunks >= threads};
}

// body(n0, count) for every chunk; threads over chunks when plan.parallel.
template <class F>
void for_each_chunk(const Plan& p, int64_t N, F&& body) {
  if (p.parallel) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t c = 0; c < p.chunks; ++c) body(c * p.nb, std::min(p.nb, N - c * p.nb));
  } else {
    for (int64_t c = 0; c < p.chunks; ++c) body(c * p.nb, std::min(p.nb, N - c * p.nb));
  }
}

// dy of samples [n0, n0+nb) as one [C_out, nb*OHW] matrix: a view when nb == 1, else a copy.
template <class T>
const T* gather_output_grad(const Conv2dShape& s, const Geometry& q, const T* dy, int64_t n0,
                            int64_t nb, T* buf) {
  const T* src = dy + n0 * s.C_out * q.OHW;
  if (nb == 1) return src;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t co = 0; co < s.C_out; ++co)
      std::memcpy(buf + co * nb * q.OHW + b * q.OHW, src + (b * s.C_out + co) * q.OHW,
                  sizeof(T) * q.OHW);
  return buf;
}

template <class T>
void add_bias(int64_t N, int64_t C, int64_t HW, const T* bias, T* y) {
#pragma omp parallel for if (N * C * HW > (1 << 16) && !omp_in_parallel())
  for (int64_t nc = 0; nc < N * C; ++nc) {
    T* p = y + nc * HW;
    const T b = bias[nc % C];
    for (int64_t i = 0; i < HW; ++i) p[i] += b;
  }
}

}  // namespace

template <class T>
void conv2d_forward(const Conv2dShape& s, const T* input, const T* weight, const T* bias, T* output) {
  const Geometry q(s);
  const Plan p = plan_chunks(s.N, q.OHW);
  for_each_chunk(p, s.N, [&](int64_t n0, int64_t nb) {
    const int64_t cols = nb * q.OHW;
    const bool need_col = !(q.direct && nb == 1);
    T* ws = workspace<T>((need_col ? q.K * cols : 0) + (nb > 1 ? s.C_out * cols : 0));
    T* col = ws;
    T* y = nb > 1 ? ws + (need_col ? q.K * cols : 0) : output + n0 * s.C_out * q.OHW;
    const T* x = input + n0 * s.C_in * q.HW;
    for (int64_t g = 0; g < s.groups; ++g) {
      const T* xg = x + g * q.Cg * q.HW;
      if (need_col) im2col(s, q, xg, nb, col);
      gemm<T>(false, false, q.Og, cols, q.K, T(1), weight + g * q.Og * q.K, q.K,
              need_col ? col : xg, cols, T(0), y + g * q.Og * cols, cols);
    }
    if (nb > 1) {  // scatter [C_out, nb*OHW] back to [nb, C_out, OHW], adding the bias
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t co = 0; co < s.C_out; ++co) {
          const T* src = y + co * cols + b * q.OHW;
          T* dst = output + ((n0 + b) * s.C_out + co) * q.OHW;
          const T bv = bias ? bias[co] : T(0);
          for (int64_t i = 0; i < q.OHW; ++i) dst[i] = src[i] + bv;
        }
    } else if (bias) {
      add_bias(int64_t(1), s.C_out, q.OHW, bias, y);
    }
  });
}

template <class T>
void conv2d_backward_input(const Conv2dShape& s, const T* grad_output, const T* weight, T* grad_input) {
  const Geometry q(s);
  const Plan p = plan_chunks(s.N, q.OHW);
  for_each_chunk(p, s.N, [&](int64_t n0, int64_t nb) {
    const int64_t cols = nb * q.OHW;
    const bool direct = q.direct && nb == 1;  // dcol is dx itself: write it directly
    T* ws = workspace<T>((direct ? 0 : q.K * cols) + (nb > 1 ? s.C_out * cols : 0));
    T* dcol = ws;
    const T* dy = gather_output_grad(s, q, grad_output, n0, nb, ws + (direct ? 0 : q.K * cols));
    T* dx = grad_input + n0 * s.C_in * q.HW;
    if (!direct) std::fill(dx, dx + nb * s.C_in * q.HW, T(0));
    for (int64_t g = 0; g < s.groups; ++g) {
      T* dxg = dx + g * q.Cg * q.HW;
      gemm<T>(true, false, q.K, cols, q.Og, T(1), weight + g * q.Og * q.K, q.K,
              dy + g * q.Og * cols, cols, T(0), direct ? dxg : dcol, cols);
      if (!direct) col2im(s, q, dcol, nb, dxg);
    }
  });
}

template <class T>
void conv2d_backward_weight(const Conv2dShape& s, const T* input, const T* grad_output, T* grad_weight) {
  const Geometry q(s);
  const int64_t wsize = s.C_out * q.K;
  std::fill(grad_weight, grad_weight + wsize, T(0));
  if (s.N == 0) return;
  const Plan p = plan_chunks(s.N, q.OHW);
  // Per-thread partial sums of dW when chunks run on threads; slot 0 is grad_weight itself.
  const int slots = p.parallel ? omp_get_max_threads() : 1;
  std::vector<T> partial(size_t(slots - 1) * wsize, T(0));
  for_each_chunk(p, s.N, [&](int64_t n0, int64_t nb) {
    const int64_t cols = nb * q.OHW;
    const int t = p.parallel ? omp_get_thread_num() : 0;
    T* dw = t == 0 ? grad_weight : partial.data() + (t - 1) * wsize;
    const bool need_col = !(q.direct && nb == 1);
    T* ws = workspace<T>((need_col ? q.K * cols : 0) + (nb > 1 ? s.C_out * cols : 0));
    T* col = ws;
    const T* dy = gather_output_grad(s, q, grad_output, n0, nb, ws + (need_col ? q.K * cols : 0));
    const T* x = input + n0 * s.C_in * q.HW;
    for (int64_t g = 0; g < s.groups; ++g) {
      const T* xg = x + g * q.Cg * q.HW;
      if (need_col) im2col(s, q, xg, nb, col);
      gemm<T>(false, true, q.Og, q.K, cols, T(1), dy + g * q.Og * cols, cols,
              need_col ? col : xg, cols, T(1), dw + g * q.Og * q.K, q.K);
    }
  });
  for (int t = 1; t < slots; ++t) {
    const T* src = partial.data() + (t - 1) * wsize;
    for (int64_t i = 0; i < wsize; ++i) grad_weight[i] += src[i];
  }
}

template <class T>
void conv2d_backward_bias(int64_t N, int64_t C, int64_t HW, const T* grad_output, T* grad_bias) {
#pragma omp parallel for if (N * C * HW > (1 << 16) && !omp_in_parallel())
  for (int64_t c = 0; c < C; ++c) {
    T acc = T(0);
    for (int64_t n = 0; n < N; ++n) {
      const T* p = grad_output + (n * C + c) * HW;
      for (int64_t i = 0; i < HW; ++i) acc += p[i];
    }
    grad_bias[c] = acc;
  }
}

template <class T>
void conv_transpose2d_forward(const ConvTranspose2dShape& s, const T* input, const T* weight,
                              const T* bias, T* output) {
  conv2d_backward_input(s.as_conv(), input, weight, output);
  if (bias) add_bias(s.N, s.C_out, s.out_h() * s.out_w(), bias, output);
}

template <class T>
void conv_transpose2d_backward_input(const ConvTranspose2dShape& s, const T* grad_output,
                                     const T* weight, T* grad_input) {
  conv2d_forward(s.as_conv(), grad_output, weight, static_cast<const T*>(nullptr), grad_input);
}

template <class T>
void conv_transpose2d_backward_weight(const ConvTranspose2dShape& s, const T* input,
                                      const T* grad_output, T* grad_weight) {
  conv2d_backward_weight(s.as_conv(), grad_output, input, grad_weight);
}

#define ND_INSTANTIATE_CONV(T)                                                                   \
  template void conv2d_forward<T>(const Conv2dShape&, const T*, const T*, const T*, T*);         \
  template void conv2d_backward_input<T>(const Conv2dShape&, const T*, const T*, T*);            \
  template void conv2d_backward_weight<T>(const Conv2dShape&, const T*, const T*, T*);           \
  template void conv2d_backward_bias<T>(int64_t, int64_t, int64_t, const T*, T*);                \
  template void conv_transpose2d_forward<T>(const ConvTranspose2dShape&, const T*, const T*,     \
                                            const T*, T*);                                       \
  template void conv_transpose2d_backward_input<T>(const ConvTranspose2dShape&, const T*,        \
                                                   const T*, T*);                                \
  template void conv_transpose2d_backward_weight<T>(const ConvTranspose2dShape&, const T*,       \
                                                    const T*, T*);
ND_INSTANTIATE_CONV(float)
ND_INSTANTIATE_CONV(double)
#undef ND_INSTANTIATE_CONV

}  // namespace nd::kernels::cpu
