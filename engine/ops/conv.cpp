// conv2d and conv_transpose2d: argument checks (messages name the tensors and the
// rule), the kernel call, and ConvolutionBackward, which serves both (PyTorch's name).
// Gradients come straight from the kernels:
//   conv2d            dx = conv2d_backward_input(dy, w),  dw = conv2d_backward_weight(x, dy)
//   conv_transpose2d  dx = conv2d_forward-shaped adjoint, dw likewise (kernels/cpu/conv.h)
//   both              db[c] = sum_{n, h, w} dy[n, c, h, w]
// CPU tensors run kernels/cpu/conv.h, CUDA tensors its twin kernels/cuda/conv.h.
// input is saved only when weight needs a gradient and weight only when input does, so
// an in-place update of a tensor no gradient reads is not an error (as in PyTorch).
// Under autocast (engine/autocast.h) f32 convs take operands rounded to its dtype (bf16
// or f16) with f32 accumulation, forward and backward (dgrad, wgrad; the bias and its
// gradient stay f32): CUDA rounds as its kernels gather (ConvOperands::kBf16 / kF16,
// tensor cores), the CPU runs its f32 kernels on rounded copies, which gives the same
// products (bf16 x bf16 and f16 x f16 are exact in f32) and is the reference the CUDA path
// is tested against.
#include "engine/ops/conv.h"

#include <array>

#include "engine/autocast.h"
#include "engine/ops/common.h"
#include "kernels/cpu/conv.h"
#include "kernels/cuda/conv.h"

namespace nd {
namespace {

using kernels::cpu::Conv2dShape;
using kernels::cpu::ConvTranspose2dShape;
using kernels::cuda::ConvOperands;
using Pair = std::array<int64_t, 2>;

// The precision of a conv's products on input t: exact, or autocast's dtype.
ConvOperands operands_for(const Tensor& t) {
  if (!autocast_applies(t)) return ConvOperands::kExact;
  return autocast_dtype(t.device().type) == kFloat16 ? ConvOperands::kF16 : ConvOperands::kBf16;
}

// Under autocast, the operand a CPU kernel reads: the f32 values rounded to bf16 or f16
// (the CUDA kernels round as they gather, so they take `t` itself). Otherwise `t`.
Tensor cpu_operand(const Tensor& t, ConvOperands operands) {
  if (operands == ConvOperands::kExact || t.is_cuda()) return t;
  NoGradGuard no_grad;  // a private copy for the kernel
  return t.to(operands == ConvOperands::kF16 ? kFloat16 : kBFloat16).to(kFloat32).contiguous();
}

// One value for both spatial dims, or {h, w}; each at least `min`.
Pair to_pair(const char* op, const char* arg, const std::vector<int64_t>& v, int64_t min) {
  ND_CHECK(v.size() == 1 || v.size() == 2, op, ": expected ", arg, " as one value or two ({h, w}), found ", v.size(),
           " values");
  const Pair p{v[0], v.size() == 2 ? v[1] : v[0]};
  ND_CHECK(p[0] >= min && p[1] >= min, op, ": expected ", arg, " >= ", min, ", found (", p[0], ", ", p[1], ")");
  return p;
}

std::string pair_str(const Pair& p) { return std::to_string(p[0]) + "x" + std::to_string(p[1]); }

// Checks shared by both ops: ranks, dtype/device, groups, bias; unbatched input gains N = 1.
Tensor check_common(const char* op, const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t groups,
                    const char* weight_layout) {
  ND_CHECK(input.dim() == 3 || input.dim() == 4, op, ": expected a 3-D (unbatched [C_in, H, W]) or 4-D ([N, C_in, H, W]) "
           "input, found ", input.describe());
  ops::check_dim(op, weight, 4, weight_layout);
  ops::check_same_device_dtype(op, {input, weight, bias});
  ND_CHECK(groups >= 1, op, ": expected groups >= 1, found ", groups);
  ND_CHECK(weight.size(2) >= 1 && weight.size(3) >= 1, op, ": expected a kernel of at least 1x1, found weight ",
           weight.describe());
  return input.dim() == 3 ? input.unsqueeze(0) : input;
}

void check_bias(const char* op, const Tensor& bias, int64_t C_out) {
  if (!bias.defined()) return;
  ND_CHECK(bias.dim() == 1 && bias.size(0) == C_out, op, ": expected bias of shape [", C_out,
           "] (one value per output channel), found ", bias.describe());
}

struct ConvolutionBackward : autograd::Node {
  bool transposed = false;
  Conv2dShape conv;              // when !transposed
  ConvTranspose2dShape tconv;    // when transposed
  int64_t C_out = 0, out_hw = 0;
  ConvOperands operands = ConvOperands::kExact;  // the forward's: dgrad and wgrad take the same
  autograd::SavedTensor input, weight;
  std::string name() const override { return "ConvolutionBackward"; }
  void release_saved_tensors() override { input.reset(); weight.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor dy_exact = g[0].contiguous();           // what the bias gradient sums
    const Tensor dy = cpu_operand(dy_exact, operands);  // the operand of dx's and dw's products
    Tensor dx, dw, db;
    if (next_edges[0].fn) {
      const Tensor w = cpu_operand(weight.unpack(*this).contiguous(), operands);
      dx = empty(transposed ? Shape{tconv.N, tconv.C_in, tconv.H, tconv.W} : Shape{conv.N, conv.C_in, conv.H, conv.W},
                 dy.options());
      ops::dispatch_floating("ConvolutionBackward", dy, [&]<class T>() {
        const T *dyp = dy.data_ptr<T>(), *wp = w.data_ptr<T>();
        T* dxp = dx.data_ptr<T>();
        ops::on_device(
            dy,
            [&] {
              if (transposed)
                kernels::cpu::conv_transpose2d_backward_input<T>(tconv, dyp, wp, dxp);
              else
                kernels::cpu::conv2d_backward_input<T>(conv, dyp, wp, dxp);
            },
            [&](auto stream) {
              if (transposed)
                kernels::cuda::conv_transpose2d_backward_input<T>(tconv, dyp, wp, dxp, stream, operands);
              else
                kernels::cuda::conv2d_backward_input<T>(conv, dyp, wp, dxp, stream, operands);
            });
      });
    }
    if (next_edges[1].fn) {
      const Tensor x = cpu_operand(input.unpack(*this).contiguous(), operands);
      const Shape ws = transposed ? Shape{tconv.C_in, tconv.C_out / tconv.groups, tconv.kH, tconv.kW}
                                  : Shape{conv.C_out, conv.C_in / conv.groups, conv.kH, conv.kW};
      dw = empty(ws, dy.options());
      ops::dispatch_floating("ConvolutionBackward", dy, [&]<class T>() {
        const T *xp = x.data_ptr<T>(), *dyp = dy.data_ptr<T>();
        T* dwp = dw.data_ptr<T>();
        ops::on_device(
            dy,
            [&] {
              if (transposed)
                kernels::cpu::conv_transpose2d_backward_weight<T>(tconv, xp, dyp, dwp);
              else
                kernels::cpu::conv2d_backward_weight<T>(conv, xp, dyp, dwp);
            },
            [&](auto stream) {
              if (transposed)
                kernels::cuda::conv_transpose2d_backward_weight<T>(tconv, xp, dyp, dwp, stream, operands);
              else
                kernels::cuda::conv2d_backward_weight<T>(conv, xp, dyp, dwp, stream, operands);
            });
      });
    }
    if (next_edges.size() > 2 && next_edges[2].fn) {
      db = empty({C_out}, dy.options());
      ops::dispatch_floating("ConvolutionBackward", dy, [&]<class T>() {
        const int64_t N = dy.size(0);
        ops::on_device(
            dy_exact,
            [&] { kernels::cpu::conv2d_backward_bias<T>(N, C_out, out_hw, dy_exact.data_ptr<T>(), db.data_ptr<T>()); },
            [&](auto stream) {
              kernels::cuda::conv2d_backward_bias<T>(N, C_out, out_hw, dy_exact.data_ptr<T>(), db.data_ptr<T>(),
                                                     stream);
            });
      });
    }
    return {dx, dw, db};
  }
};

// Records the node for output (4-D) computed from input4 (the 4-D view of input).
void record_backward(const Tensor& input4, const Tensor& weight, const Tensor& bias, const Tensor& output,
                     bool transposed, const Conv2dShape& conv, const ConvTranspose2dShape& tconv) {
  autograd::record<ConvolutionBackward>({input4, weight, bias}, {output}, [&](ConvolutionBackward& n) {
    n.transposed = transposed;
    n.conv = conv;
    n.tconv = tconv;
    n.C_out = output.size(1);
    n.out_hw = output.size(2) * output.size(3);
    n.operands = operands_for(input4);
    if (n.next_edges[1].fn) n.input = autograd::SavedTensor(input4);
    if (n.next_edges[0].fn) n.weight = autograd::SavedTensor(weight);
  });
}

}  // namespace

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const std::vector<int64_t>& stride,
              const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, int64_t groups) {
  const char* op = "conv2d";
  const Tensor x4 = check_common(op, input, weight, bias, groups, "weight [C_out, C_in/groups, kH, kW]");
  Conv2dShape s{x4.size(0), x4.size(1), x4.size(2), x4.size(3), weight.size(0), weight.size(2), weight.size(3),
                to_pair(op, "stride", stride, 1), to_pair(op, "padding", padding, 0),
                to_pair(op, "dilation", dilation, 1), groups};
  ND_CHECK(s.C_out % groups == 0, op, ": expected weight's output channels (size(0) = ", s.C_out,
           ") to be divisible by groups=", groups, ", found weight ", weight.describe());
  ND_CHECK(weight.size(1) * groups == s.C_in, op, ": given groups=", groups, " and weight ", weight.describe(),
           ", expected input with ", weight.size(1) * groups, " channels (weight.size(1) * groups), found ", s.C_in,
           " channels in ", input.describe());
  check_bias(op, bias, s.C_out);
  const Pair extent{s.dilation[0] * (s.kH - 1) + 1, s.dilation[1] * (s.kW - 1) + 1};
  const Pair padded{s.H + 2 * s.padding[0], s.W + 2 * s.padding[1]};
  ND_CHECK(padded[0] >= extent[0] && padded[1] >= extent[1], op, ": the kernel (", pair_str({s.kH, s.kW}),
           ", dilation ", pair_str(s.dilation), ", so extent ", pair_str(extent),
           ") is larger than the padded input (", pair_str(padded), ", padding ", pair_str(s.padding), ") of ",
           input.describe(), "; expected a padded input at least as large as the kernel extent");

  Tensor out = empty({s.N, s.C_out, s.out_h(), s.out_w()}, input.options());
  {
    NoGradGuard no_grad;  // contiguous copies for the kernel; the graph records the inputs themselves
    const ConvOperands operands = operands_for(input);
    const Tensor x = cpu_operand(x4.contiguous(), operands), w = cpu_operand(weight.contiguous(), operands);
    const Tensor b = bias.defined() ? bias.contiguous() : bias;
    ops::dispatch_floating(op, input, [&]<class T>() {
      const T *xp = x.data_ptr<T>(), *wp = w.data_ptr<T>(), *bp = b.defined() ? b.data_ptr<T>() : nullptr;
      T* yp = out.data_ptr<T>();
      ops::on_device(
          out, [&] { kernels::cpu::conv2d_forward<T>(s, xp, wp, bp, yp); },
          [&](auto stream) { kernels::cuda::conv2d_forward<T>(s, xp, wp, bp, yp, stream, operands); });
    });
  }
  record_backward(x4, weight, bias, out, false, s, {});
  return input.dim() == 3 ? out.squeeze(0) : out;
}

Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                        const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                        const std::vector<int64_t>& output_padding, int64_t groups,
                        const std::vector<int64_t>& dilation) {
  const char* op = "conv_transpose2d";
  const Tensor x4 = check_common(op, input, weight, bias, groups, "weight [C_in, C_out/groups, kH, kW]");
  ConvTranspose2dShape s{x4.size(0), x4.size(1), x4.size(2), x4.size(3), weight.size(1) * groups, weight.size(2),
                         weight.size(3)};
  s.stride = to_pair(op, "stride", stride, 1);
  s.padding = to_pair(op, "padding", padding, 0);
  s.output_padding = to_pair(op, "output_padding", output_padding, 0);
  s.dilation = to_pair(op, "dilation", dilation, 1);
  s.groups = groups;
  ND_CHECK(weight.size(0) == s.C_in, op, ": weight ", weight.describe(), " has layout [C_in, C_out/groups, kH, kW], ",
           "so expected input with ", weight.size(0), " channels, found ", s.C_in, " channels in ", input.describe());
  ND_CHECK(s.C_in % groups == 0, op, ": expected input channels (", s.C_in, ") to be divisible by groups=", groups,
           ", found ", input.describe());
  for (int d = 0; d < 2; ++d)
    ND_CHECK(s.output_padding[d] < s.stride[d] || s.output_padding[d] < s.dilation[d], op,
             ": output_padding must be smaller than either stride or dilation, found output_padding ",
             pair_str(s.output_padding), ", stride ", pair_str(s.stride), ", dilation ", pair_str(s.dilation));
  check_bias(op, bias, s.C_out);
  ND_CHECK(s.out_h() >= 1 && s.out_w() >= 1, op, ": the output size ", s.out_h(), "x", s.out_w(),
           " computed for input ", input.describe(), " is too small; expected at least 1x1 ((H - 1)*stride - "
           "2*padding + dilation*(kH - 1) + output_padding + 1)");

  Tensor out = empty({s.N, s.C_out, s.out_h(), s.out_w()}, input.options());
  {
    NoGradGuard no_grad;
    const ConvOperands operands = operands_for(input);
    const Tensor x = cpu_operand(x4.contiguous(), operands), w = cpu_operand(weight.contiguous(), operands);
    const Tensor b = bias.defined() ? bias.contiguous() : bias;
    ops::dispatch_floating(op, input, [&]<class T>() {
      const T *xp = x.data_ptr<T>(), *wp = w.data_ptr<T>(), *bp = b.defined() ? b.data_ptr<T>() : nullptr;
      T* yp = out.data_ptr<T>();
      ops::on_device(
          out, [&] { kernels::cpu::conv_transpose2d_forward<T>(s, xp, wp, bp, yp); },
          [&](auto stream) {
            kernels::cuda::conv_transpose2d_forward<T>(s, xp, wp, bp, yp, stream, operands);
          });
    });
  }
  record_backward(x4, weight, bias, out, true, {}, s);
  return input.dim() == 3 ? out.squeeze(0) : out;
}

}  // namespace nd
