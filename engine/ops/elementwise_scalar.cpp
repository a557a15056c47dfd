// Elementwise ops with a number operand (x * 2.0, 1 - x, pow(x, 3), add_(eps), fill_): the
// number goes to the kernel by value, one launch per op. Tensor-tensor ops: elementwise.cpp.
#include <cmath>

#include "engine/ops/common.h"
#include "engine/ops/copy.h"
#include "engine/ops/elementwise.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/elementwise.h"

namespace nd {

using kernels::cpu::BinaryOp;

namespace {

// a (op) s for a number s: ga = g (add, sub), g * s (mul), g / s (div); with the number
// first, s - a: ga = -g, and s / a: ga = -g * s / a^2 (a saved for this one only).
struct ScalarBackward : autograd::Node {
  BinaryOp op = BinaryOp::mul;
  double s = 1;
  bool scalar_first = false;
  std::string node_name;
  autograd::SavedTensor a;
  std::string name() const override { return node_name; }
  void release_saved_tensors() override { a.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    switch (op) {
      case BinaryOp::add: return {g[0]};
      case BinaryOp::sub: return {scalar_first ? -g[0] : g[0]};
      case BinaryOp::mul: return {s == 1 ? g[0] : g[0] * s};
      case BinaryOp::div: {
        if (!scalar_first) return {g[0] / s};
        const Tensor av = a.unpack(*this);
        return {-g[0] * s / (av * av)};
      }
      default: throw Error(node_name + ": no backward for this operation with a number operand");
    }
  }
};

// a ^ e for a number e: ga = g * e * a^(e-1), with e = 2 (a squared error) as g * a * 2 and
// e = 1 as g: no per-element pow in the backward, and nothing saved for the exponent.
struct PowScalarBackward : autograd::Node {
  autograd::SavedTensor a;
  double exponent = 0;
  std::string name() const override { return "PowBackward"; }
  void release_saved_tensors() override { a.reset(); }
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    if (exponent == 0) return {zeros_like(g[0])};
    if (exponent == 1) return {g[0]};
    const Tensor av = a.unpack(*this);
    if (exponent == 2) return {g[0] * av * 2.0};
    return {g[0] * pow(av, exponent - 1) * exponent};
  }
};

// a (op) s, or s (op) a when scalar_first: the number goes to the kernel by value (on a GPU
// one launch, where a scalar tensor would cost its fill as well).
void run_binary_scalar(const char* name, BinaryOp op, const Tensor& a, double s, bool scalar_first,
                       const Tensor& out) {
  ops::dispatch_floating(name, out, [&]<class T>() {
    const T v = static_cast<T>(s);
    const T* ap = a.data_ptr<T>();
    T* outp = out.data_ptr<T>();
    ops::on_device(
        out,
        [&] {
          kernels::cpu::binary_scalar<T>(op, out.dim(), out.sizes().data(), ap, a.strides().data(), v, scalar_first,
                                         outp, out.strides().data());
        },
        [&](auto stream) {
          kernels::cuda::binary_scalar<T>(op, out.dim(), out.sizes().data(), ap, a.strides().data(), v,
                                          scalar_first, outp, out.strides().data(), stream);
        });
  });
}

const char* scalar_node_name(BinaryOp op, bool scalar_first) {
  switch (op) {
    case BinaryOp::add: return "AddBackward";
    case BinaryOp::sub: return scalar_first ? "RsubBackward" : "SubBackward";
    case BinaryOp::div: return "DivBackward";
    default: return "MulBackward";
  }
}

// a (op) s, or s (op) a: add, sub, mul or div with a number, recorded for autograd.
Tensor scalar_forward(const char* name, BinaryOp op, const Tensor& a, double s, bool scalar_first = false) {
  Tensor out = empty(a.sizes(), a.options());
  run_binary_scalar(name, op, a, s, scalar_first, out);
  autograd::record<ScalarBackward>({a}, {out}, [&](ScalarBackward& n) {
    n.op = op;
    n.s = s;
    n.scalar_first = scalar_first;
    n.node_name = scalar_node_name(op, scalar_first);
    if (op == BinaryOp::div && scalar_first) n.a = autograd::SavedTensor(a);
  });
  return out;
}

// In place self = self (op) s for add, sub, mul or div with a number; none of their
// backwards needs the overwritten value.
const Tensor& scalar_inplace(const char* name, BinaryOp op, const Tensor& self, double s) {
  const bool history = autograd::any_requires_grad({self});
  ops::check_inplace(name, self, history);
  std::shared_ptr<autograd::Node> node;
  if (history)
    node = autograd::record<ScalarBackward>({self}, {}, [&](ScalarBackward& n) {
      n.op = op;
      n.s = s;
      n.node_name = scalar_node_name(op, false);
    });
  run_binary_scalar(name, op, self, s, false, self);
  ops::bump_version(self, name);
  if (node) autograd::detail::set_history(node, {self});
  return self;
}

}  // namespace

// A number as the exponent: a^2 is the product a * a (exact, no libm pow per element:
// the MAE's squared error), other exponents the pow kernel with the number by value.
Tensor pow(const Tensor& a, double exponent, autograd::CallSite) {
  Tensor out;
  if (exponent == 2) {
    NoGradGuard no_history;  // the product's own node would be a second, redundant one
    out = mul(a, a);
  } else {
    out = empty(a.sizes(), a.options());
    run_binary_scalar("pow", BinaryOp::pow, a, exponent, false, out);
  }
  autograd::record<PowScalarBackward>({a}, {out}, [&](PowScalarBackward& n) {
    n.exponent = exponent;
    if (exponent != 0 && exponent != 1) n.a = autograd::SavedTensor(a);
  });
  return out;
}

Tensor Tensor::add(double o) const { return scalar_forward("add", BinaryOp::add, *this, o); }
Tensor Tensor::sub(double o) const { return scalar_forward("sub", BinaryOp::sub, *this, o); }
Tensor Tensor::mul(double o) const { return scalar_forward("mul", BinaryOp::mul, *this, o); }
Tensor Tensor::div(double o) const { return scalar_forward("div", BinaryOp::div, *this, o); }
Tensor Tensor::pow(double e) const { return nd::pow(*this, e); }

const Tensor& Tensor::add_(double o) const {
  if (is_floating_point()) return scalar_inplace("add_", BinaryOp::add, *this, o);
  ND_CHECK(dtype() == kInt64 || dtype() == kInt32, "add_: expected a floating point, int64 or int32 tensor, found ",
           describe());
  ND_CHECK(std::isfinite(o) && o == std::trunc(o) && std::abs(o) < 9007199254740992.0,
           "add_: adding ", o, " to the integer tensor ", describe(), " (expected an integral value)");
  ND_CHECK(is_contiguous(), "add_: expected a contiguous integer tensor, found ", describe());
  ops::check_inplace("add_", *this, false);
  auto run = [&]<class T>() {
    const auto v = static_cast<T>(static_cast<int64_t>(o));
    ops::on_device(
        *this, [&] { kernels::cpu::add_constant<T>(numel(), v, data_ptr<T>()); },
        [&](auto stream) { kernels::cuda::add_constant<T>(numel(), v, data_ptr<T>(), stream); });
  };
  if (dtype() == kInt64)
    run.operator()<int64_t>();
  else
    run.operator()<int32_t>();
  ops::bump_version(*this, "add_");
  return *this;
}
const Tensor& Tensor::mul_(double o) const { return scalar_inplace("mul_", BinaryOp::mul, *this, o); }
const Tensor& Tensor::div_(double o) const { return scalar_inplace("div_", BinaryOp::div, *this, o); }

const Tensor& Tensor::fill_(double value) const {
  ops::check_inplace("fill_", *this, false);
  ND_CHECK(!autograd::any_requires_grad({*this}), "fill_ on ", describe(),
           ": overwriting a tensor that has gradient history is not supported; wrap it in NoGradGuard or use "
           "a new tensor (zeros_like, full_like)");
  fill_data(*this, value);
  ops::bump_version(*this, "fill_");
  return *this;
}
const Tensor& Tensor::zero_() const { return fill_(0); }

Tensor operator+(const Tensor& a, double b) { return a.add(b); }
Tensor operator-(const Tensor& a, double b) { return a.sub(b); }
Tensor operator*(const Tensor& a, double b) { return a.mul(b); }
Tensor operator/(const Tensor& a, double b) { return a.div(b); }
Tensor operator+(double a, const Tensor& b) { return b.add(a); }
Tensor operator-(double a, const Tensor& b) { return scalar_forward("rsub", BinaryOp::sub, b, a, true); }
Tensor operator*(double a, const Tensor& b) { return b.mul(a); }
Tensor operator/(double a, const Tensor& b) { return scalar_forward("div", BinaryOp::div, b, a, true); }

}  // namespace nd
