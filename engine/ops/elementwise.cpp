#include "engine/ops/elementwise.h"

#include <cmath>

#include "engine/ops/common.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/elementwise.h"

namespace nd {

using kernels::cpu::BinaryOp;
using kernels::cpu::CompareOp;
using kernels::cpu::UnaryOp;
using kernels::cpu::UnaryParams;

namespace {

// ---- backward nodes ----

// a + alpha*b (sub: alpha < 0): ga = g, gb = alpha * g, each summed back over broadcast dims.
struct AddBackward : autograd::Node {
  double alpha = 1;
  Shape a_shape, b_shape;
  std::string op = "AddBackward";
  std::string name() const override { return op; }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor ga, gb;
    if (next_edges[0].fn) ga = autograd::sum_to(g[0], a_shape);
    if (next_edges[1].fn) gb = autograd::sum_to(alpha == 1 ? g[0] : g[0] * alpha, b_shape);
    return {ga, gb};
  }
};

// a * b: ga = g * b, gb = g * a.
struct MulBackward : autograd::Node {
  autograd::SavedTensor a, b;
  std::string name() const override { return "MulBackward"; }
  void release_saved_tensors() override { a.reset(); b.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor av = a.unpack(*this), bv = b.unpack(*this), ga, gb;
    if (next_edges[0].fn) ga = autograd::sum_to(g[0] * bv, av.sizes());
    if (next_edges[1].fn) gb = autograd::sum_to(g[0] * av, bv.sizes());
    return {ga, gb};
  }
};

// a / b: ga = g / b, gb = -g * a / b^2.
struct DivBackward : autograd::Node {
  autograd::SavedTensor a, b;
  std::string name() const override { return "DivBackward"; }
  void release_saved_tensors() override { a.reset(); b.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor av = a.unpack(*this), bv = b.unpack(*this), ga, gb;
    if (next_edges[0].fn) ga = autograd::sum_to(g[0] / bv, av.sizes());
    if (next_edges[1].fn) gb = autograd::sum_to(-g[0] * av / (bv * bv), bv.sizes());
    return {ga, gb};
  }
};

// a ^ b: ga = g * b * a^(b-1), gb = g * a^b * ln(a) (0 where a == 0, as PyTorch).
struct PowBackward : autograd::Node {
  autograd::SavedTensor a, b, result;
  std::string name() const override { return "PowBackward"; }
  void release_saved_tensors() override { a.reset(); b.reset(); result.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor av = a.unpack(*this), bv = b.unpack(*this), ga, gb;
    if (next_edges[0].fn) ga = autograd::sum_to(g[0] * bv * pow(av, bv - 1.0), av.sizes());
    if (next_edges[1].fn) {
      Tensor r = result.unpack(*this);
      Tensor safe_log = log(av + eq(av, zeros_like(av)).to(av.dtype()));  // ln(1) = 0 where a == 0
      gb = autograd::sum_to(g[0] * r * safe_log, bv.sizes());
    }
    return {ga, gb};
  }
};

// maximum/minimum: the gradient goes to the selected input; ties split it evenly.
struct ExtremumBackward : autograd::Node {
  autograd::SavedTensor a, b;
  bool is_max = true;
  std::string name() const override { return is_max ? "MaximumBackward" : "MinimumBackward"; }
  void release_saved_tensors() override { a.reset(); b.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor av = a.unpack(*this), bv = b.unpack(*this);
    Tensor a_wins = (is_max ? gt(av, bv) : lt(av, bv)).to(g[0].dtype());
    Tensor tie = eq(av, bv).to(g[0].dtype()) * 0.5;
    Tensor wa = a_wins + tie;
    Tensor ga, gb;
    if (next_edges[0].fn) ga = autograd::sum_to(g[0] * wa, av.sizes());
    if (next_edges[1].fn) gb = autograd::sum_to(g[0] * (1.0 - wa), bv.sizes());
    return {ga, gb};
  }
};

// clamp(x, min, max) with tensor bounds, PyTorch's rule (torch 2.15, checked on every tie):
// min < max: x inside gets dy, below min or above max the bound does, and x equal to a
// bound splits dy with it (halves, as maximum / minimum); min == max: x equal to them gets
// all of dy, else the bound x is beyond; min > max: max gets dy (the result is max).
struct ClampTensorBackward : autograd::Node {
  autograd::SavedTensor x, min, max;
  std::string name() const override { return "ClampBackward"; }
  void release_saved_tensors() override { x.reset(); min.reset(); max.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    const Tensor xv = x.unpack(*this), lo = min.unpack(*this), hi = max.unpack(*this);
    const ScalarType t = g[0].dtype();
    const Tensor ordered = lt(lo, hi).to(t), pinned = eq(lo, hi).to(t), crossed = gt(lo, hi).to(t);
    const Tensor below = lt(xv, lo).to(t), at_min = eq(xv, lo).to(t), above = gt(xv, hi).to(t), at_max = eq(xv, hi).to(t);
    const Tensor inside = gt(xv, lo).to(t) * lt(xv, hi).to(t);
    Tensor gx, gmin, gmax;
    if (next_edges[0].fn)
      gx = autograd::sum_to(g[0] * (ordered * (inside + (at_min + at_max) * 0.5) + pinned * at_min), xv.sizes());
    if (next_edges[1].fn) gmin = autograd::sum_to(g[0] * (ordered * (below + at_min * 0.5) + pinned * below), lo.sizes());
    if (next_edges[2].fn)
      gmax = autograd::sum_to(g[0] * (ordered * (above + at_max * 0.5) + pinned * above + crossed), hi.sizes());
    return {gx, gmin, gmax};
  }
};

// y = op(x): dx = dy * op'(x) from the kernel's derivative table.
struct UnaryBackward : autograd::Node {
  UnaryOp op{};
  UnaryParams params;
  std::string node_name;
  autograd::SavedTensor x, y;
  std::string name() const override { return node_name; }
  void release_saved_tensors() override { x.reset(); y.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    Tensor xv = x.unpack(*this).contiguous(), yv = y.unpack(*this).contiguous(), gv = g[0].contiguous();
    Tensor dx = empty_like(xv);
    ops::dispatch_floating(node_name.c_str(), xv, [&]<class T>() {
      const T *xp = xv.data_ptr<T>(), *yp = yv.data_ptr<T>(), *gp = gv.data_ptr<T>();
      T* dxp = dx.data_ptr<T>();
      ops::on_device(
          xv, [&] { kernels::cpu::unary_backward<T>(op, params, xv.numel(), xp, yp, gp, dxp); },
          [&](auto stream) { kernels::cuda::unary_backward<T>(op, params, xv.numel(), xp, yp, gp, dxp, stream); });
    });
    return {dx};
  }
};

// ---- forward helpers ----

void run_binary(const char* name, BinaryOp op, double alpha, const Tensor& a, const Tensor& b, const Tensor& out) {
  const Shape as = ops::broadcast_strides(a, out.sizes()), bs = ops::broadcast_strides(b, out.sizes());
  ops::dispatch_floating(name, out, [&]<class T>() {
    const T *ap = a.data_ptr<T>(), *bp = b.data_ptr<T>();
    T* outp = out.data_ptr<T>();
    ops::on_device(
        out,
        [&] {
          kernels::cpu::binary<T>(op, static_cast<T>(alpha), out.dim(), out.sizes().data(), ap, as.data(), bp,
                                  bs.data(), outp, out.strides().data());
        },
        [&](auto stream) {
          kernels::cuda::binary<T>(op, static_cast<T>(alpha), out.dim(), out.sizes().data(), ap, as.data(), bp,
                                   bs.data(), outp, out.strides().data(), stream);
        });
  });
}

Tensor binary_forward(const char* name, BinaryOp op, const Tensor& a, const Tensor& b, double alpha = 1) {
  ops::check_same_device_dtype(name, {a, b});
  Tensor out = empty(ops::broadcast_shapes(name, a.sizes(), b.sizes()), a.options());
  run_binary(name, op, alpha, a, b, out);
  return out;
}

Tensor unary_forward(const char* name, const char* node_name, UnaryOp op, const Tensor& x, UnaryParams p = {}) {
  Tensor out = empty(x.sizes(), x.options());
  const Shape os = out.strides();
  ops::dispatch_floating(name, x, [&]<class T>() {
    ops::on_device(
        x,
        [&] {
          kernels::cpu::unary<T>(op, p, x.dim(), x.sizes().data(), x.data_ptr<T>(), x.strides().data(),
                                 out.data_ptr<T>(), os.data());
        },
        [&](auto stream) {
          kernels::cuda::unary<T>(op, p, x.dim(), x.sizes().data(), x.data_ptr<T>(), x.strides().data(),
                                  out.data_ptr<T>(), os.data(), stream);
        });
  });
  autograd::record<UnaryBackward>({x}, {out}, [&](UnaryBackward& n) {
    n.op = op;
    n.params = p;
    n.node_name = node_name;
    n.x = autograd::SavedTensor(x);
    n.y = autograd::SavedTensor(out);
  });
  return out;
}

Tensor compare_forward(const char* name, CompareOp op, const Tensor& a, const Tensor& b) {
  ops::check_same_device_dtype(name, {a, b});
  Tensor out = empty(ops::broadcast_shapes(name, a.sizes(), b.sizes()), TensorOptions(kBool).device(a.device()));
  const Shape as = ops::broadcast_strides(a, out.sizes()), bs = ops::broadcast_strides(b, out.sizes());
  dispatch_all(a.dtype(), [&]<class T>() {
    if constexpr (std::is_arithmetic_v<T>)
      ops::on_device(
          out,
          [&] {
            kernels::cpu::compare<T>(op, out.dim(), out.sizes().data(), a.data_ptr<T>(), as.data(), b.data_ptr<T>(),
                                     bs.data(), out.data_ptr<bool>());
          },
          [&](auto stream) {
            kernels::cuda::compare<T>(op, out.dim(), out.sizes().data(), a.data_ptr<T>(), as.data(),
                                      b.data_ptr<T>(), bs.data(), out.data_ptr<bool>(), stream);
          });
    else
      throw Error(std::string(name) + ": comparisons of " + dtype_name(a.dtype()) + " tensors are not supported");
  });
  return out;
}

Tensor scalar_like(double v, const Tensor& t) { return scalar_tensor(v, t.options()); }

// In-place binary update of self: self = self (op) alpha*other.
const Tensor& binary_inplace(const char* name, BinaryOp op, const Tensor& self, const Tensor& other, double alpha) {
  ops::check_same_device_dtype(name, {self, other});
  ND_CHECK(ops::broadcast_shapes(name, self.sizes(), other.sizes()) == self.sizes(), name, ": the result of shape ",
           shape_str(ops::broadcast_shapes(name, self.sizes(), other.sizes())), " does not fit in-place in ",
           self.describe());
  const bool history = autograd::any_requires_grad({self, other});
  ops::check_inplace(name, self, history);
  const bool additive = op == BinaryOp::add || op == BinaryOp::sub;
  ND_CHECK(!history || additive, name, " on ", self.describe(), " with tensors that require grad is not supported "
           "in place (its backward needs the overwritten value); use the out-of-place op");
  const Shape self_shape = self.sizes(), other_shape = other.sizes();
  Tensor old_self = self;
  std::shared_ptr<autograd::Node> node;
  if (history) {
    // Connect to the old history before self's grad_fn is replaced.
    node = autograd::record<AddBackward>({old_self, other}, {}, [&](AddBackward& n) {
      n.alpha = op == BinaryOp::sub ? -alpha : alpha;
      n.a_shape = self_shape;
      n.b_shape = other_shape;
      n.op = op == BinaryOp::sub ? "SubBackward" : "AddBackward";
    });
  }
  run_binary(name, op, alpha, self, other, self);
  ops::bump_version(self, name);
  if (node) autograd::detail::set_history(node, {self});
  return self;
}

}  // namespace

// ---- functional forms ----
Tensor add(const Tensor& a, const Tensor& b, double alpha, autograd::CallSite) {
  Tensor out = binary_forward("add", BinaryOp::add, a, b, alpha);
  autograd::record<AddBackward>({a, b}, {out}, [&](AddBackward& n) {
    n.alpha = alpha;
    n.a_shape = a.sizes();
    n.b_shape = b.sizes();
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha, autograd::CallSite) {
  Tensor out = binary_forward("sub", BinaryOp::sub, a, b, alpha);
  autograd::record<AddBackward>({a, b}, {out}, [&](AddBackward& n) {
    n.alpha = -alpha;
    n.a_shape = a.sizes();
    n.b_shape = b.sizes();
    n.op = "SubBackward";
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b, autograd::CallSite) {
  Tensor out = binary_forward("mul", BinaryOp::mul, a, b);
  autograd::record<MulBackward>({a, b}, {out}, [&](MulBackward& n) {
    n.a = autograd::SavedTensor(a);
    n.b = autograd::SavedTensor(b);
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b, autograd::CallSite) {
  Tensor out = binary_forward("div", BinaryOp::div, a, b);
  autograd::record<DivBackward>({a, b}, {out}, [&](DivBackward& n) {
    n.a = autograd::SavedTensor(a);
    n.b = autograd::SavedTensor(b);
  });
  return out;
}

Tensor pow(const Tensor& a, const Tensor& exponent, autograd::CallSite) {
  Tensor out = binary_forward("pow", BinaryOp::pow, a, exponent);
  autograd::record<PowBackward>({a, exponent}, {out}, [&](PowBackward& n) {
    n.a = autograd::SavedTensor(a);
    n.b = autograd::SavedTensor(exponent);
    n.result = autograd::SavedTensor(out);
  });
  return out;
}
Tensor maximum(const Tensor& a, const Tensor& b, autograd::CallSite) {
  Tensor out = binary_forward("maximum", BinaryOp::maximum, a, b);
  autograd::record<ExtremumBackward>({a, b}, {out}, [&](ExtremumBackward& n) {
    n.a = autograd::SavedTensor(a);
    n.b = autograd::SavedTensor(b);
  });
  return out;
}

Tensor minimum(const Tensor& a, const Tensor& b, autograd::CallSite) {
  Tensor out = binary_forward("minimum", BinaryOp::minimum, a, b);
  autograd::record<ExtremumBackward>({a, b}, {out}, [&](ExtremumBackward& n) {
    n.a = autograd::SavedTensor(a);
    n.b = autograd::SavedTensor(b);
    n.is_max = false;
  });
  return out;
}

Tensor neg(const Tensor& x, autograd::CallSite) { return unary_forward("neg", "NegBackward", UnaryOp::neg, x); }
Tensor exp(const Tensor& x, autograd::CallSite) { return unary_forward("exp", "ExpBackward", UnaryOp::exp, x); }
Tensor log(const Tensor& x, autograd::CallSite) { return unary_forward("log", "LogBackward", UnaryOp::log, x); }
Tensor sqrt(const Tensor& x, autograd::CallSite) { return unary_forward("sqrt", "SqrtBackward", UnaryOp::sqrt, x); }
Tensor rsqrt(const Tensor& x, autograd::CallSite) { return unary_forward("rsqrt", "RsqrtBackward", UnaryOp::rsqrt, x); }
Tensor abs(const Tensor& x, autograd::CallSite) { return unary_forward("abs", "AbsBackward", UnaryOp::abs, x); }
Tensor clamp(const Tensor& x, const Tensor& min, const Tensor& max, autograd::CallSite) {
  ND_CHECK(min.defined() || max.defined(), "clamp: expected at least one of min and max, found neither");
  if (!max.defined()) return maximum(x, min);  // one bound: PyTorch's gradient is maximum's / minimum's
  if (!min.defined()) return minimum(x, max);
  const Tensor out = binary_forward("clamp", BinaryOp::minimum, binary_forward("clamp", BinaryOp::maximum, x, min), max);
  autograd::record<ClampTensorBackward>({x, min, max}, {out}, [&](ClampTensorBackward& n) {
    n.x = autograd::SavedTensor(x);
    n.min = autograd::SavedTensor(min);
    n.max = autograd::SavedTensor(max);
  });
  return out;
}
Tensor sign(const Tensor& x, autograd::CallSite) { return unary_forward("sign", "SignBackward", UnaryOp::sign, x); }
Tensor tanh(const Tensor& x, autograd::CallSite) { return unary_forward("tanh", "TanhBackward", UnaryOp::tanh, x); }
Tensor sigmoid(const Tensor& x, autograd::CallSite) {
  return unary_forward("sigmoid", "SigmoidBackward", UnaryOp::sigmoid, x);
}
Tensor relu(const Tensor& x, autograd::CallSite) { return unary_forward("relu", "ReluBackward", UnaryOp::relu, x); }
Tensor leaky_relu(const Tensor& x, double negative_slope, autograd::CallSite) {
  return unary_forward("leaky_relu", "LeakyReluBackward", UnaryOp::leaky_relu, x, {negative_slope, 0});
}
Tensor gelu(const Tensor& x, const std::string& approximate, autograd::CallSite) {
  ND_CHECK(approximate == "none" || approximate == "tanh", "gelu: approximate must be 'none' or 'tanh', found '",
           approximate, "'");
  return unary_forward("gelu", "GeluBackward", approximate == "none" ? UnaryOp::gelu : UnaryOp::gelu_tanh, x);
}
Tensor clamp(const Tensor& x, double min, double max, autograd::CallSite) {
  ND_CHECK(min <= max, "clamp: expected min <= max, found min=", min, ", max=", max);
  return unary_forward("clamp", "ClampBackward", UnaryOp::clamp, x, {min, max});
}

Tensor eq(const Tensor& a, const Tensor& b) { return compare_forward("eq", CompareOp::eq, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare_forward("gt", CompareOp::gt, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare_forward("lt", CompareOp::lt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare_forward("ge", CompareOp::ge, a, b); }

// ---- members and operators ----
Tensor Tensor::add(const Tensor& o, double alpha) const { return nd::add(*this, o, alpha); }
Tensor Tensor::sub(const Tensor& o, double alpha) const { return nd::sub(*this, o, alpha); }
Tensor Tensor::mul(const Tensor& o) const { return nd::mul(*this, o); }
Tensor Tensor::div(const Tensor& o) const { return nd::div(*this, o); }
Tensor Tensor::pow(const Tensor& e) const { return nd::pow(*this, e); }
Tensor Tensor::neg() const { return nd::neg(*this); }
Tensor Tensor::exp() const { return nd::exp(*this); }
Tensor Tensor::log() const { return nd::log(*this); }
Tensor Tensor::sqrt() const { return nd::sqrt(*this); }
Tensor Tensor::rsqrt() const { return nd::rsqrt(*this); }
Tensor Tensor::abs() const { return nd::abs(*this); }
Tensor Tensor::tanh() const { return nd::tanh(*this); }
Tensor Tensor::sigmoid() const { return nd::sigmoid(*this); }
Tensor Tensor::relu() const { return nd::relu(*this); }
Tensor Tensor::clamp(double min, double max) const { return nd::clamp(*this, min, max); }
Tensor Tensor::maximum(const Tensor& o) const { return nd::maximum(*this, o); }
Tensor Tensor::minimum(const Tensor& o) const { return nd::minimum(*this, o); }
Tensor Tensor::eq(const Tensor& o) const { return nd::eq(*this, o); }
Tensor Tensor::gt(double o) const { return nd::gt(*this, scalar_like(o, *this)); }
Tensor Tensor::lt(double o) const { return nd::lt(*this, scalar_like(o, *this)); }

const Tensor& Tensor::add_(const Tensor& o, double alpha) const {
  return binary_inplace("add_", BinaryOp::add, *this, o, alpha);
}
const Tensor& Tensor::sub_(const Tensor& o, double alpha) const {
  return binary_inplace("sub_", BinaryOp::sub, *this, o, alpha);
}
const Tensor& Tensor::mul_(const Tensor& o) const { return binary_inplace("mul_", BinaryOp::mul, *this, o, 1); }
const Tensor& Tensor::div_(const Tensor& o) const { return binary_inplace("div_", BinaryOp::div, *this, o, 1); }
const Tensor& Tensor::addcmul_(const Tensor& a, const Tensor& b, double value) const {
  return binary_inplace("addcmul_", BinaryOp::add, *this, nd::mul(a, b), value);
}
const Tensor& Tensor::addcdiv_(const Tensor& a, const Tensor& b, double value) const {
  return binary_inplace("addcdiv_", BinaryOp::add, *this, nd::div(a, b), value);
}

const Tensor& Tensor::clamp_(double min, double max) const {
  ND_CHECK(!autograd::any_requires_grad({*this}), "clamp_ on ", describe(),
           " records no gradient history; use clamp() or wrap it in NoGradGuard");
  ops::check_inplace("clamp_", *this, false);
  const UnaryParams p{min, max};
  ops::dispatch_floating("clamp_", *this, [&]<class T>() {
    T* x = data_ptr<T>();
    ops::on_device(
        *this,
        [&] {
          kernels::cpu::unary<T>(UnaryOp::clamp, p, dim(), sizes().data(), x, strides().data(), x, strides().data());
        },
        [&](auto stream) {
          kernels::cuda::unary<T>(UnaryOp::clamp, p, dim(), sizes().data(), x, strides().data(), x, strides().data(),
                                  stream);
        });
  });
  ops::bump_version(*this, "clamp_");
  return *this;
}


Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }

}  // namespace nd
