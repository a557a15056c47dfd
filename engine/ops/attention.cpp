#include "engine/ops/attention.h"

#include <cmath>
#include <limits>

#include "engine/autocast.h"
#include "engine/ops/common.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"

namespace nd {

namespace {

struct Dims {
  int64_t B = 0, H = 1, L = 0, S = 0, E = 0, Ev = 0;
  bool heads = true;  // 4-D inputs; 3-D ones run with H = 1
};

// The additive mask in the kernel's broadcast-by-strides form; `storage` keeps the
// converted tensor alive.
struct MaskView {
  Tensor storage;
  Shape strides;  // [B, H, L, S] element strides, 0 on broadcast dims
};

// Under autocast (`autocast`), a floating mask is an operand like q, k, v and is rounded to
// its dtype `dtype16` (bf16 or f16; bool masks give 0 / -inf, exact in both): kept as that
// dtype for the CUDA kernel, as the rounded values in f32 for the CPU's.
MaskView prepare_mask(const Tensor& attn_mask, const Tensor& q, const Dims& d, bool autocast, ScalarType dtype16) {
  if (!attn_mask.defined()) return {};
  const char* op = "scaled_dot_product_attention";
  ND_CHECK(attn_mask.device() == q.device(), op, ": expected attn_mask on ", q.device().str(), ", found ",
           attn_mask.describe());
  ND_CHECK(!attn_mask.requires_grad(), op, ": gradients for attn_mask are not supported; found ",
           attn_mask.describe(), " that requires grad. Pass attn_mask.detach().");
  // Broadcast against the query's own layout ([B, H, L, S] or [B, L, S]), as PyTorch.
  const Shape full = d.heads ? Shape{d.B, d.H, d.L, d.S} : Shape{d.B, d.L, d.S};
  ND_CHECK(attn_mask.dim() <= static_cast<int64_t>(full.size()) &&
               ops::broadcast_shapes(op, attn_mask.sizes(), full) == full,
           op, ": expected attn_mask broadcastable to ", shape_str(full), ", found ", attn_mask.describe());
  Tensor additive;
  if (attn_mask.dtype() == kBool) {
    // true = attend: 0 where true, -inf where false; converted on the host (a CUDA mask
    // makes the round trip, once per forward).
    const Tensor keep = attn_mask.contiguous().cpu();
    additive = empty(keep.sizes(), TensorOptions(q.dtype()));
    ops::dispatch_floating(op, q, [&]<class T>() {
      const bool* src = keep.data_ptr<bool>();
      T* dst = additive.data_ptr<T>();
      for (int64_t i = 0; i < keep.numel(); ++i) dst[i] = src[i] ? T(0) : -std::numeric_limits<T>::infinity();
    });
    additive = additive.to(q.device());
  } else {
    ND_CHECK(attn_mask.dtype() == q.dtype(), op, ": expected a bool attn_mask or one of the query's dtype (",
             dtype_name(q.dtype()), "), found ", attn_mask.describe());
    additive = attn_mask.detach();
  }
  if (autocast) {
    NoGradGuard no_grad;
    additive = additive.to(dtype16);
    if (!q.is_cuda()) additive = additive.to(kFloat32);
  }
  Shape strides = ops::broadcast_strides(additive, full);
  if (!d.heads) strides.insert(strides.begin() + 1, 0);
  return {additive, strides};
}

// Operand layouts. The CPU kernel reads and writes any [B, H, S, X] whose rows are
// contiguous and do not overlap, so MultiheadAttention's heads ([B, S, H, X] viewed as
// [B, H, S, X]) go in without copies; out, dq, dk, dv then take that layout too (out like
// q, each gradient like its input), which makes the module's merge of the heads and the
// gradients' way back to [B, S, H * X] views. The CUDA kernels take dense operands.
bool rows_dense(const Tensor& t) { return t.stride(-1) == 1 && t.stride(-2) >= t.size(-1); }

Tensor kernel_operand(const Tensor& t) { return t.is_cuda() || !rows_dense(t) ? t.contiguous() : t; }

// An uninitialised tensor of `shape`: dense [B, H, S, X] on CUDA or when `like` is dense,
// otherwise [B, S, H, X] viewed as [B, H, S, X] (3-D shapes are always dense).
Tensor empty_operand(const Shape& shape, const Tensor& like) {
  if (shape.size() != 4 || like.is_cuda() || like.is_contiguous()) return empty(shape, like.options());
  return empty({shape[0], shape[2], shape[1], shape[3]}, like.options()).transpose(1, 2);
}

kernels::cpu::AttentionRows rows_of(const Tensor& t) {
  if (t.dim() == 4) return {t.stride(0), t.stride(1), t.stride(2)};
  return {t.stride(0), 0, t.stride(1)};
}

template <class T>
kernels::cpu::AttentionMask<T> kernel_mask(const MaskView& m) {
  if (!m.storage.defined()) return {};
  return {m.storage.data_ptr<T>(), m.strides[0], m.strides[1], m.strides[2], m.strides[3]};
}

// ---- autocast (engine/autocast.h) ---------------------------------------------------
// f32 attention under autocast for its device computes from bf16 operands (or f16 ones,
// when that is autocast's dtype: the same steps with f16 for bf16 below):
//   CUDA: q, k, v (and a floating mask) converted to bf16, the bf16 tensor-core kernels
//     (kernels/cuda/attention.h), out returned as f32. The backward converts dout to bf16,
//     runs the bf16 backward from the saved bf16 q, k, v, out and the f32 logsumexp and
//     returns f32 gradients.
//   CPU, the reference the CUDA path is tested against: q, k, v (and a floating mask)
//     rounded to bf16 values, the f32 CPU kernel, out rounded to bf16. The backward rounds
//     dout, runs the f32 CPU kernel on the rounded q, k, v, dout and the rounded out with
//     the f32 logsumexp, and rounds dq, dk, dv to bf16.
// Both devices thus round at the same points: the inputs q, k, v, mask, dout and the results
// out, dq, dk, dv; logsumexp (and the backward's delta) stay f32. The CUDA kernels also
// round P (forward and backward) and dS (backward) to bf16 before the second products
// (kernels/cuda/attention_tc_forward.cu, attention_tc_backward.cu) where the CPU keeps f32: the devices agree to bf16 precision,
// not bit for bit. The node remembers that its forward ran under autocast and runs its
// backward the same way wherever the backward is called (as mm's, engine/ops/matmul.cpp).

// What the forward under autocast keeps for the backward: bf16 (or f16) q, k, v, out; f32 lse.
struct AutocastSaved {
  Tensor q16, k16, v16, out16, lse;
};

// fn.template operator()<S>() with S = BFloat16 or Half, the C++ type of `dtype16`.
template <class Fn>
void dispatch16(ScalarType dtype16, Fn&& fn) {
  if (dtype16 == kFloat16)
    fn.template operator()<Half>();
  else
    fn.template operator()<BFloat16>();
}

// The forward under autocast (above); returns out as f32.
Tensor autocast_forward(const Tensor& query, const Tensor& key, const Tensor& value, const MaskView& mask,
                        const Dims& d, bool is_causal, double sc, const kernels::AttentionDropout& drop,
                        ScalarType dtype16, AutocastSaved& saved) {
  NoGradGuard no_grad;  // private copies; the graph records query, key, value
  saved.q16 = query.detach().to(dtype16);
  saved.k16 = key.detach().to(dtype16);
  saved.v16 = value.detach().to(dtype16);
  saved.lse = empty({d.B, d.H, d.L}, query.options());
  Shape out_shape = query.sizes();
  out_shape.back() = d.Ev;
  ops::on_device(
      query,
      [&] {
        const Tensor q = saved.q16.to(kFloat32), k = saved.k16.to(kFloat32), v = saved.v16.to(kFloat32);
        const Tensor out = empty(out_shape, query.options());
        kernels::cpu::scaled_dot_product_attention_forward<float>(
            q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), kernel_mask<float>(mask), d.B, d.H, d.L,
            d.S, d.E, d.Ev, is_causal, sc, drop, out.data_ptr<float>(), saved.lse.data_ptr<float>());
        saved.out16 = out.to(dtype16);
      },
      [&](auto stream) {
        saved.out16 = empty(out_shape, query.options().dtype(dtype16));
        dispatch16(dtype16, [&]<class S>() {
          kernels::cuda::scaled_dot_product_attention_forward(
              saved.q16.data_ptr<S>(), saved.k16.data_ptr<S>(), saved.v16.data_ptr<S>(), kernel_mask<S>(mask), d.B,
              d.H, d.L, d.S, d.E, d.Ev, is_causal, sc, drop, saved.out16.data_ptr<S>(), saved.lse.data_ptr<float>(),
              stream);
        });
      });
  return saved.out16.to(kFloat32);
}

// The backward under autocast (above): f32 dq, dk, dv.
std::vector<Tensor> autocast_backward(const Tensor& grad, const AutocastSaved& s, const MaskView& m, const Dims& d,
                                      bool is_causal, double scale, const kernels::AttentionDropout& drop) {
  NoGradGuard no_grad;
  const ScalarType dtype16 = s.q16.dtype();  // the forward's: bf16 or f16
  const Tensor g16 = grad.to(dtype16).contiguous();
  Tensor dq, dk, dv;
  ops::on_device(
      s.q16,
      [&] {
        auto f32 = [](const Tensor& t) { return t.to(kFloat32); };
        const Tensor g = f32(g16), q = f32(s.q16), k = f32(s.k16), v = f32(s.v16), out = f32(s.out16);
        dq = empty(q.sizes(), q.options());
        dk = empty(k.sizes(), k.options());
        dv = empty(v.sizes(), v.options());
        kernels::cpu::scaled_dot_product_attention_backward<float>(
            g.data_ptr<float>(), q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), kernel_mask<float>(m),
            out.data_ptr<float>(), s.lse.data_ptr<float>(), d.B, d.H, d.L, d.S, d.E, d.Ev, is_causal, scale, drop,
            dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr<float>());
        dq = dq.to(dtype16);
        dk = dk.to(dtype16);
        dv = dv.to(dtype16);
      },
      [&](auto stream) {
        dq = empty(s.q16.sizes(), s.q16.options());
        dk = empty(s.k16.sizes(), s.k16.options());
        dv = empty(s.v16.sizes(), s.v16.options());
        dispatch16(dtype16, [&]<class S>() {
          kernels::cuda::scaled_dot_product_attention_backward(
              g16.data_ptr<S>(), s.q16.data_ptr<S>(), s.k16.data_ptr<S>(), s.v16.data_ptr<S>(), kernel_mask<S>(m),
              s.out16.data_ptr<S>(), s.lse.data_ptr<float>(), d.B, d.H, d.L, d.S, d.E, d.Ev, is_causal, scale, drop,
              dq.data_ptr<S>(), dk.data_ptr<S>(), dv.data_ptr<S>(), stream);
        });
      });
  return {dq.to(kFloat32), dk.to(kFloat32), dv.to(kFloat32)};
}

struct ScaledDotProductAttentionBackward : autograd::Node {
  autograd::SavedTensor q, k, v, out, logsumexp, mask;
  Shape mask_strides;
  Dims d;
  bool is_causal = false;
  double scale = 1;
  kernels::AttentionDropout drop;  // the forward's: the backward recomputes its mask
  bool autocast = false;  // the forward ran under autocast: q, k, v, out are bf16 or f16 (above)
  std::string name() const override { return "ScaledDotProductAttentionBackward"; }
  void release_saved_tensors() override {
    q.reset();
    k.reset();
    v.reset();
    out.reset();
    logsumexp.reset();
    mask.reset();
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor qv = q.unpack(*this), kv = k.unpack(*this), vv = v.unpack(*this);
    const Tensor o = out.unpack(*this), lse = logsumexp.unpack(*this);
    const MaskView m{mask.unpack(*this), mask_strides};
    auto needed = [&](std::vector<Tensor> dqkv) {  // no gradient for an input that takes none
      for (size_t x = 0; x < dqkv.size(); ++x)
        if (!next_edges[x].fn) dqkv[x] = Tensor();
      return dqkv;
    };
    if (autocast) return needed(autocast_backward(grads[0], {qv, kv, vv, o, lse}, m, d, is_causal, scale, drop));
    const Tensor g = kernel_operand(grads[0]);
    Tensor dq = empty_operand(qv.sizes(), qv), dk = empty_operand(kv.sizes(), kv), dv = empty_operand(vv.sizes(), vv);
    const kernels::cpu::AttentionLayout layout{rows_of(qv), rows_of(kv), rows_of(vv), rows_of(o),
                                               rows_of(g),  rows_of(dq), rows_of(dk), rows_of(dv)};
    ops::dispatch_floating("scaled_dot_product_attention backward", qv, [&]<class T>() {
      const T *gp = g.data_ptr<T>(), *qp = qv.data_ptr<T>(), *kp = kv.data_ptr<T>(), *vp = vv.data_ptr<T>();
      const T *outp = o.data_ptr<T>(), *lp = lse.data_ptr<T>();
      ops::on_device(
          qv,
          [&] {
            kernels::cpu::scaled_dot_product_attention_backward<T>(gp, qp, kp, vp, kernel_mask<T>(m), outp, lp, layout,
                                                                   d.B, d.H, d.L, d.S, d.E, d.Ev, is_causal, scale,
                                                                   drop, dq.data_ptr<T>(), dk.data_ptr<T>(),
                                                                   dv.data_ptr<T>());
          },
          [&](auto stream) {
            kernels::cuda::scaled_dot_product_attention_backward<T>(
                gp, qp, kp, vp, kernel_mask<T>(m), outp, lp, d.B, d.H, d.L, d.S, d.E, d.Ev, is_causal, scale, drop,
                dq.data_ptr<T>(), dk.data_ptr<T>(), dv.data_ptr<T>(), stream);
          });
    });
    return needed({dq, dk, dv});
  }
};

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale) {
  const char* op = "scaled_dot_product_attention";
  ops::check_same_device_dtype(op, {query, key, value});
  ND_CHECK(query.dim() == 3 || query.dim() == 4, op, ": expected query of 3 or 4 dims ([B, H, L, E] or [B, L, E]), found ",
           query.describe());
  ND_CHECK(key.dim() == query.dim() && value.dim() == query.dim(), op,
           ": expected query, key and value with the same number of dims, found query ", query.describe(), ", key ",
           key.describe(), ", value ", value.describe());
  Dims d;
  d.heads = query.dim() == 4;
  d.B = query.size(0);
  d.H = d.heads ? query.size(1) : 1;
  d.L = query.size(-2);
  d.E = query.size(-1);
  d.S = key.size(-2);
  d.Ev = value.size(-1);
  for (int64_t i = 0; i < query.dim() - 2; ++i) {
    ND_CHECK(key.size(i) == query.size(i) && value.size(i) == query.size(i), op,
             ": expected query, key and value with the same batch and head dims, found query ", query.describe(),
             ", key ", key.describe(), ", value ", value.describe());
  }
  ND_CHECK(key.size(-1) == d.E, op, ": expected key's last dim to equal query's (", d.E, "), found key ",
           key.describe());
  ND_CHECK(value.size(-2) == d.S, op, ": expected value with as many rows as key (", d.S, "), found value ",
           value.describe());
  ND_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, op, ": expected dropout_p between 0 and 1, found ", dropout_p);
  ND_CHECK(!(is_causal && attn_mask.defined()), op,
           ": expected either attn_mask or is_causal, found both (as PyTorch, they may not be combined)");
  const int64_t max_head_dim = kernels::cuda::kAttentionMaxHeadDim;
  ND_CHECK(!query.is_cuda() || (d.E <= max_head_dim && d.Ev <= max_head_dim), op,
           ": the CUDA kernel takes head dims of at most ", max_head_dim, "; found query ", query.describe(),
           ", value ", value.describe(), ". Use more heads or the CPU.");
  const double sc = scale.value_or(d.E > 0 ? 1.0 / std::sqrt(static_cast<double>(d.E)) : 1.0);

  const bool amp = autocast_applies(query);
  const ScalarType dtype16 = autocast_dtype(query.device().type);
  const MaskView mask = prepare_mask(attn_mask, query, d, amp, dtype16);
  // Dropout draws one number per element of P [B, H, L, S] from the default generator
  // (as nd::dropout on the materialised weights would); the backward replays them.
  kernels::AttentionDropout drop;
  if (dropout_p > 0.0) {
    Generator& gen = default_generator();
    drop = {dropout_p, gen.seed, gen.offset};
    gen.offset += static_cast<uint64_t>(d.B * d.H * d.L * d.S);
  }
  // What the backward reads: the kernel operands and out (bf16 / f16 copies under autocast).
  Tensor out, q, k, v, saved_out, lse;
  if (amp) {
    AutocastSaved saved;
    out = autocast_forward(query, key, value, mask, d, is_causal, sc, drop, dtype16, saved);
    q = saved.q16, k = saved.k16, v = saved.v16, saved_out = saved.out16, lse = saved.lse;
  } else {
    q = kernel_operand(query.detach()), k = kernel_operand(key.detach()), v = kernel_operand(value.detach());
    Shape out_shape = query.sizes();
    out_shape.back() = d.Ev;
    out = saved_out = empty_operand(out_shape, q);
    lse = empty({d.B, d.H, d.L}, query.options());
    ops::dispatch_floating(op, query, [&]<class T>() {
      const T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
      ops::on_device(
          query,
          [&] {
            const kernels::cpu::AttentionLayout layout{rows_of(q), rows_of(k), rows_of(v), rows_of(out),
                                                       {}, {}, {}, {}};
            kernels::cpu::scaled_dot_product_attention_forward<T>(qp, kp, vp, kernel_mask<T>(mask), layout, d.B, d.H,
                                                                  d.L, d.S, d.E, d.Ev, is_causal, sc, drop,
                                                                  out.data_ptr<T>(), lse.data_ptr<T>());
          },
          [&](auto stream) {
            kernels::cuda::scaled_dot_product_attention_forward<T>(qp, kp, vp, kernel_mask<T>(mask), d.B, d.H, d.L,
                                                                   d.S, d.E, d.Ev, is_causal, sc, drop,
                                                                   out.data_ptr<T>(), lse.data_ptr<T>(), stream);
          });
    });
  }
  autograd::record<ScaledDotProductAttentionBackward>(
      {query, key, value}, {out}, [&](ScaledDotProductAttentionBackward& n) {
        n.q = autograd::SavedTensor(q);
        n.k = autograd::SavedTensor(k);
        n.v = autograd::SavedTensor(v);
        n.out = autograd::SavedTensor(saved_out);
        n.logsumexp = autograd::SavedTensor(lse);
        n.mask = autograd::SavedTensor(mask.storage);
        n.mask_strides = mask.strides;
        n.d = d;
        n.is_causal = is_causal;
        n.scale = sc;
        n.drop = drop;
        n.autocast = amp;
      });
  return out;
}

}  // namespace nd
