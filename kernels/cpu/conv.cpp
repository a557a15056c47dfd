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
// im2col reads a zero-padded copy of the chunk's input, so its loops carry no bounds
// checks; for narrow output maps (DCGAN's 7x7 and 14x14) a per-call offset table turns
// each kernel tap into one flat gather over all OH*OW pixels instead of OH short rows.
// col2im is the same walk with += into padded planes whose interior is copied to dx.
// Workspaces are thread_local and grow on demand, so the steady state does not allocate.
#include "kernels/cpu/conv.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cpu {
namespace {

// Columns per GEMM below which Eigen's efficiency drops (skinny products); more columns
// than this only add the cost of gathering/scattering y and dy (bench_cpu_ops, 1 and 2
// threads: 128 beat 1, 256 and 512 on the DCGAN and ResNet rows).
constexpr int64_t kTargetCols = 128;
// Output rows at least this wide are copied row by row; narrower maps use a gather table.
constexpr int64_t kWideRow = 32;

struct Geometry {
  int64_t Cg, Og, K, OH, OW, OHW, HW;  // K = Cg*kH*kW, the GEMM depth per group
  int64_t Hp, Wp;                      // input size after zero padding
  bool padded;
  bool direct;  // 1x1, stride 1, no padding: col_g is the input itself
  bool gather;  // narrow output rows: walk the offset table instead of rows
  // Where output pixel p = oh*OW + ow reads, relative to its tap's first element, in the
  // padded input: oh*stride_h*Wp + ow*stride_w. Used for narrow outputs, where looping
  // over rows of OW would cost more than the gather.
  std::vector<int32_t> offsets;
  explicit Geometry(const Conv2dShape& s)
      : Cg(s.C_in / s.groups), Og(s.C_out / s.groups), K(Cg * s.kH * s.kW), OH(s.out_h()),
        OW(s.out_w()), OHW(OH * OW), HW(s.H * s.W), Hp(s.H + 2 * s.padding[0]),
        Wp(s.W + 2 * s.padding[1]), padded(s.padding[0] > 0 || s.padding[1] > 0),
        direct(s.kH == 1 && s.kW == 1 && s.stride[0] == 1 && s.stride[1] == 1 && !padded),
        gather(OW < kWideRow && Hp * Wp < (int64_t(1) << 31)) {
    if (gather)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow)
          offsets.push_back(static_cast<int32_t>(oh * s.stride[0] * Wp + ow * s.stride[1]));
  }
};

template <class T>
T* workspace(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// The chunk's input (or input gradient) for one group as im2col/col2im address it.
template <class T>
struct Planes {
  T* data;
  int64_t sample_stride, channel_stride;  // row stride is Geometry::Wp
};

// x (sample n0, channel g*Cg) zero-padded into buf, so every tap of every output pixel
// is in bounds and the loops below need no bounds checks. Without padding, x itself.
template <class T>
Planes<const T> padded_input(const Conv2dShape& s, const Geometry& q, const T* x, int64_t nb, T* buf) {
  if (!q.padded) return {x, s.C_in * q.HW, q.HW};
  const int64_t plane = q.Hp * q.Wp, ph = s.padding[0], pw = s.padding[1];
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t c = 0; c < q.Cg; ++c) {
      const T* src = x + b * s.C_in * q.HW + c * q.HW;
      T* dst = buf + (b * q.Cg + c) * plane;
      std::fill(dst, dst + ph * q.Wp, T(0));
      for (int64_t ih = 0; ih < s.H; ++ih) {
        T* row = dst + (ih + ph) * q.Wp;
        std::fill(row, row + pw, T(0));
        std::copy(src + ih * s.W, src + (ih + 1) * s.W, row + pw);
        std::fill(row + pw + s.W, row + q.Wp, T(0));
      }
      std::fill(dst + (s.H + ph) * q.Wp, dst + plane, T(0));
    }
  return {buf, q.Cg * plane, plane};
}

// Element offset of tap (c, kh, kw) in a padded plane set.
int64_t tap_offset(const Conv2dShape& s, const Geometry& q, int64_t channel_stride, int64_t c,
                   int64_t kh, int64_t kw) {
  return c * channel_stride + kh * s.dilation[0] * q.Wp + kw * s.dilation[1];
}

// col[(c*kH + kh)*kW + kw, b*OHW + oh*OW + ow] = xp[b, c, oh*sh + kh*dh, ow*sw + kw*dw]
// (xp: the padded input of the chunk's nb samples, one group).
template <class T>
void im2col(const Conv2dShape& s, const Geometry& q, Planes<const T> xp, int64_t nb, T* col) {
  const int64_t cols = nb * q.OHW, sh = s.stride[0], sw = s.stride[1];
  const int32_t* off = q.offsets.data();
  for (int64_t c = 0; c < q.Cg; ++c)
    for (int64_t kh = 0; kh < s.kH; ++kh)
      for (int64_t kw = 0; kw < s.kW; ++kw) {
        T* row = col + ((c * s.kH + kh) * s.kW + kw) * cols;
        const int64_t tap = tap_offset(s, q, xp.channel_stride, c, kh, kw);
        for (int64_t b = 0; b < nb; ++b) {
          const T* x = xp.data + b * xp.sample_stride + tap;
          T* o = row + b * q.OHW;
          if (q.gather) {
            for (int64_t p = 0; p < q.OHW; ++p) o[p] = x[off[p]];
          } else {
            for (int64_t oh = 0; oh < q.OH; ++oh) {
              const T* xr = x + oh * sh * q.Wp;
              T* orow = o + oh * q.OW;
              for (int64_t ow = 0; ow < q.OW; ++ow) orow[ow] = xr[ow * sw];
            }
          }
        }
      }
}

// Adjoint of im2col: dxp[b, c, oh*sh + kh*dh, ow*sw + kw*dw] += col[...]. Within one tap
// no two output pixels hit the same input pixel, so each row is a conflict-free scatter.
template <class T>
void col2im(const Conv2dShape& s, const Geometry& q, const T* col, int64_t nb, Planes<T> dxp) {
  const int64_t cols = nb * q.OHW, sh = s.stride[0], sw = s.stride[1];
  const int32_t* off = q.offsets.data();
  for (int64_t c = 0; c < q.Cg; ++c)
    for (int64_t kh = 0; kh < s.kH; ++kh)
      for (int64_t kw = 0; kw < s.kW; ++kw) {
        const T* row = col + ((c * s.kH + kh) * s.kW + kw) * cols;
        const int64_t tap = tap_offset(s, q, dxp.channel_stride, c, kh, kw);
        for (int64_t b = 0; b < nb; ++b) {
          T* x = dxp.data + b * dxp.sample_stride + tap;
          const T* o = row + b * q.OHW;
          if (q.gather) {
            for (int64_t p = 0; p < q.OHW; ++p) x[off[p]] += o[p];
          } else {
            for (int64_t oh = 0; oh < q.OH; ++oh) {
              T* xr = x + oh * sh * q.Wp;
              const T* orow = o + oh * q.OW;
              for (int64_t ow = 0; ow < q.OW; ++ow) xr[ow * sw] += orow[ow];
            }
          }
        }
      }
}

// Copies the interior of the padded gradient planes back into dx (sample n0, channel g*Cg).
template <class T>
void unpad_into(const Conv2dShape& s, const Geometry& q, const T* padded, int64_t nb, T* dx) {
  const int64_t plane = q.Hp * q.Wp;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t c = 0; c < q.Cg; ++c) {
      const T* src = padded + (b * q.Cg + c) * plane + s.padding[0] * q.Wp + s.padding[1];
      T* dst = dx + b * s.C_in * q.HW + c * q.HW;
      for (int64_t ih = 0; ih < s.H; ++ih) std::copy(src + ih * q.Wp, src + ih * q.Wp + s.W, dst + ih * s.W);
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

// body(n0, count) for every chunk; threads over chunks when plan.parallel. With
// fixed_assignment, each thread gets the same chunks in the same order on every run
// (static schedule), so per-thread partial sums -- and the result -- are reproducible.
template <class F>
void for_each_chunk(const Plan& p, int64_t N, F&& body, bool fixed_assignment = false) {
  if (p.parallel && fixed_assignment) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < p.chunks; ++c) body(c * p.nb, std::min(p.nb, N - c * p.nb));
  } else if (p.parallel) {
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

// One thread's scratch for a chunk of nb samples: col [K, cols] (when im2col is needed),
// the gathered [C_out, cols] matrix of y or dy (when nb > 1), and one group's padded planes.
template <class T>
struct Scratch {
  T *col, *mat, *pad;
  Scratch(const Conv2dShape& s, const Geometry& q, int64_t nb, bool need_col) {
    const int64_t cols = nb * q.OHW;
    const int64_t n_col = need_col ? q.K * cols : 0, n_mat = nb > 1 ? s.C_out * cols : 0;
    const int64_t n_pad = need_col && q.padded ? nb * q.Cg * q.Hp * q.Wp : 0;
    col = workspace<T>(static_cast<size_t>(n_col + n_mat + n_pad));
    mat = col + n_col;
    pad = mat + n_mat;
  }
};

}  // namespace

template <class T>
void conv2d_forward(const Conv2dShape& s, const T* input, const T* weight, const T* bias, T* output) {
  const Geometry q(s);
  const Plan p = plan_chunks(s.N, q.OHW);
  for_each_chunk(p, s.N, [&](int64_t n0, int64_t nb) {
    const int64_t cols = nb * q.OHW;
    const bool need_col = !(q.direct && nb == 1);
    const Scratch<T> w(s, q, nb, need_col);
    T* y = nb > 1 ? w.mat : output + n0 * s.C_out * q.OHW;
    const T* x = input + n0 * s.C_in * q.HW;
    for (int64_t g = 0; g < s.groups; ++g) {
      const T* xg = x + g * q.Cg * q.HW;
      if (need_col) im2col(s, q, padded_input(s, q, xg, nb, w.pad), nb, w.col);
      gemm<T>(false, false, q.Og, cols, q.K, T(1), weight + g * q.Og * q.K, q.K,
              need_col ? w.col : xg, cols, T(0), y + g * q.Og * cols, cols);
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
    const Scratch<T> w(s, q, nb, !direct);
    const T* dy = gather_output_grad(s, q, grad_output, n0, nb, w.mat);
    T* dx = grad_input + n0 * s.C_in * q.HW;
    if (!direct && !q.padded) std::fill(dx, dx + nb * s.C_in * q.HW, T(0));
    for (int64_t g = 0; g < s.groups; ++g) {
      T* dxg = dx + g * q.Cg * q.HW;
      gemm<T>(true, false, q.K, cols, q.Og, T(1), weight + g * q.Og * q.K, q.K,
              dy + g * q.Og * cols, cols, T(0), direct ? dxg : w.col, cols);
      if (direct) continue;
      if (q.padded) {  // accumulate into zeroed padded planes, then keep their interior
        const int64_t plane = q.Hp * q.Wp;
        std::fill(w.pad, w.pad + nb * q.Cg * plane, T(0));
        col2im(s, q, w.col, nb, Planes<T>{w.pad, q.Cg * plane, plane});
        unpad_into(s, q, w.pad, nb, dxg);
      } else {
        col2im(s, q, w.col, nb, Planes<T>{dxg, s.C_in * q.HW, q.HW});
      }
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
    const Scratch<T> w(s, q, nb, need_col);
    const T* dy = gather_output_grad(s, q, grad_output, n0, nb, w.mat);
    const T* x = input + n0 * s.C_in * q.HW;
    for (int64_t g = 0; g < s.groups; ++g) {
      const T* xg = x + g * q.Cg * q.HW;
      if (need_col) im2col(s, q, padded_input(s, q, xg, nb, w.pad), nb, w.col);
      gemm<T>(false, true, q.Og, q.K, cols, T(1), dy + g * q.Og * cols, cols,
              need_col ? w.col : xg, cols, T(1), dw + g * q.Og * q.K, q.K);
    }
  }, /*fixed_assignment=*/true);
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
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE_CONV)
#undef ND_INSTANTIATE_CONV

}  // namespace nd::kernels::cpu
