#include "engine/ops/loss.h"

#include "engine/ops/common.h"
#include "engine/ops/reduce.h"
#include "engine/ops/softmax.h"
#include "kernels/cpu/loss.h"
#include "kernels/cuda/loss.h"

namespace nd {

namespace {

using kernels::LossReduction;

LossReduction to_kernel(Reduction r) {
  switch (r) {
    case Reduction::None: return LossReduction::None;
    case Reduction::Sum: return LossReduction::Sum;
    case Reduction::Mean: break;
  }
  return LossReduction::Mean;
}

// The loss tensor: the per-element shape for None, 0-d otherwise.
Tensor loss_output(Reduction r, const Shape& per_element, TensorOptions options) {
  return empty(r == Reduction::None ? per_element : Shape{}, options);
}

template <class T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

void check_same_shape(const char* op, const Tensor& input, const Tensor& target) {
  ND_CHECK(target.sizes() == input.sizes(), op, ": expected target of the same shape as input ",
           shape_str(input.sizes()), ", found ", target.describe());
}

// ---- mse_loss ----

struct MseLossBackward : autograd::Node {
  autograd::SavedTensor input, target;
  Reduction reduction = Reduction::Mean;
  std::string name() const override { return "MseLossBackward"; }
  void release_saved_tensors() override {
    input.reset();
    target.reset();
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor x = input.unpack(*this), t = target.unpack(*this), g = grads[0].contiguous();
    Tensor dx = next_edges[0].fn ? empty_like(x) : Tensor();
    Tensor dt = next_edges[1].fn ? empty_like(t) : Tensor();
    ops::dispatch_floating("mse_loss backward", x, [&]<class T>() {
      const T *gp = g.data_ptr<T>(), *xp = x.data_ptr<T>(), *tp = t.data_ptr<T>();
      T *dxp = ptr_or_null<T>(dx), *dtp = ptr_or_null<T>(dt);
      const LossReduction r = to_kernel(reduction);
      ops::on_device(
          x, [&] { kernels::cpu::mse_loss_backward<T>(gp, xp, tp, x.numel(), r, dxp, dtp); },
          [&](auto stream) { kernels::cuda::mse_loss_backward<T>(gp, xp, tp, x.numel(), r, dxp, dtp, stream); });
    });
    return {dx, dt};
  }
};

// ---- binary_cross_entropy_with_logits ----

struct BinaryCrossEntropyWithLogitsBackward : autograd::Node {
  autograd::SavedTensor input, target, weight, pos_weight;
  Reduction reduction = Reduction::Mean;
  int64_t C = 1;
  std::string name() const override { return "BinaryCrossEntropyWithLogitsBackward"; }
  void release_saved_tensors() override {
    input.reset();
    target.reset();
    weight.reset();
    pos_weight.reset();
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor x = input.unpack(*this), t = target.unpack(*this), g = grads[0].contiguous();
    const Tensor w = weight.unpack(*this), pw = pos_weight.unpack(*this);
    Tensor dx = next_edges[0].fn ? empty_like(x) : Tensor();
    Tensor dt = next_edges[1].fn ? empty_like(t) : Tensor();
    ops::dispatch_floating("binary_cross_entropy_with_logits backward", x, [&]<class T>() {
      const T *gp = g.data_ptr<T>(), *xp = x.data_ptr<T>(), *tp = t.data_ptr<T>();
      const T *wp = ptr_or_null<T>(w), *pwp = ptr_or_null<T>(pw);
      T *dxp = ptr_or_null<T>(dx), *dtp = ptr_or_null<T>(dt);
      const LossReduction r = to_kernel(reduction);
      ops::on_device(
          x,
          [&] {
            kernels::cpu::binary_cross_entropy_with_logits_backward<T>(gp, xp, tp, wp, pwp, x.numel(), C, r, dxp,
                                                                       dtp);
          },
          [&](auto stream) {
            kernels::cuda::binary_cross_entropy_with_logits_backward<T>(gp, xp, tp, wp, pwp, x.numel(), C, r, dxp,
                                                                        dtp, stream);
          });
    });
    return {dx, dt};
  }
};

// ---- cross_entropy ----

// [N, C, d1, ...] is handled as rows of C logits: the class dim is moved last.
struct ClassRows {
  Shape perm;     // input -> [N, d1, ..., C]
  Shape inverse;  // back
  int64_t M = 0, C = 0;
};

ClassRows class_rows(const Tensor& input) {
  ClassRows r;
  const int64_t ndim = input.dim();
  const int64_t class_dim = ndim == 1 ? 0 : 1;
  r.C = input.size(class_dim);
  r.M = r.C == 0 ? 0 : input.numel() / r.C;
  for (int64_t i = 0; i < ndim; ++i)
    if (i != class_dim) r.perm.push_back(i);
  r.perm.push_back(class_dim);
  r.inverse.resize(ndim);
  for (int64_t i = 0; i < ndim; ++i) r.inverse[r.perm[i]] = i;
  return r;
}

struct CrossEntropyBackward : autograd::Node {
  autograd::SavedTensor logits, target, weight, lse;  // logits as [.., C] rows
  ClassRows rows;
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
  double label_smoothing = 0;
  std::string name() const override { return "CrossEntropyBackward"; }
  void release_saved_tensors() override {
    logits.reset();
    target.reset();
    weight.reset();
    lse.reset();
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor x = logits.unpack(*this), t = target.unpack(*this), w = weight.unpack(*this);
    const Tensor l = lse.unpack(*this), g = grads[0].contiguous();
    Tensor dx = empty_like(x);
    ops::dispatch_floating("cross_entropy backward", x, [&]<class T>() {
      const T *gp = g.data_ptr<T>(), *xp = x.data_ptr<T>(), *wp = ptr_or_null<T>(w), *lp = l.data_ptr<T>();
      const int64_t* tp = t.data_ptr<int64_t>();
      T* dxp = dx.data_ptr<T>();
      const LossReduction r = to_kernel(reduction);
      ops::on_device(
          x,
          [&] {
            kernels::cpu::cross_entropy_backward<T>(gp, xp, tp, wp, lp, rows.M, rows.C, ignore_index, label_smoothing,
                                                    r, dxp);
          },
          [&](auto stream) {
            kernels::cuda::cross_entropy_backward<T>(gp, xp, tp, wp, lp, rows.M, rows.C, ignore_index,
                                                     label_smoothing, r, dxp, stream);
          });
    });
    return {dx.permute(rows.inverse).contiguous(), Tensor()};
  }
};

}  // namespace

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction, autograd::CallSite) {
  const char* op = "mse_loss";
  ops::check_same_device_dtype(op, {input, target});
  check_same_shape(op, input, target);
  const Tensor x = input.detach().contiguous(), t = target.detach().contiguous();
  Tensor out = loss_output(reduction, x.sizes(), x.options());
  ops::dispatch_floating(op, x, [&]<class T>() {
    const T *xp = x.data_ptr<T>(), *tp = t.data_ptr<T>();
    T* outp = out.data_ptr<T>();
    const LossReduction r = to_kernel(reduction);
    ops::on_device(
        x, [&] { kernels::cpu::mse_loss_forward<T>(xp, tp, x.numel(), r, outp); },
        [&](auto stream) { kernels::cuda::mse_loss_forward<T>(xp, tp, x.numel(), r, outp, stream); });
  });
  autograd::record<MseLossBackward>({input, target}, {out}, [&](MseLossBackward& n) {
    n.input = autograd::SavedTensor(x);
    n.target = autograd::SavedTensor(t);
    n.reduction = reduction;
  });
  return out;
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target, const Tensor& weight,
                                        const Tensor& pos_weight, Reduction reduction, autograd::CallSite) {
  const char* op = "binary_cross_entropy_with_logits";
  ops::check_same_device_dtype(op, {input, target, weight, pos_weight});
  check_same_shape(op, input, target);
  for (const auto& [t, what] : {std::pair{weight, "weight"}, std::pair{pos_weight, "pos_weight"}}) {
    ND_CHECK(!t.defined() || !t.requires_grad(), op, ": gradients for ", what, " are not supported; found ",
             t.describe(), " that requires grad. Pass ", what, ".detach().");
  }
  const int64_t C = input.dim() == 0 ? 1 : input.size(-1);
  Tensor w, pw;
  if (weight.defined()) {
    ND_CHECK(ops::broadcast_shapes(op, weight.sizes(), input.sizes()) == input.sizes(), op,
             ": expected weight broadcastable to input ", shape_str(input.sizes()), ", found ", weight.describe());
    w = weight.detach().expand(input.sizes()).contiguous();
  }
  if (pos_weight.defined()) {
    ND_CHECK(pos_weight.numel() == C || pos_weight.numel() == 1, op, ": expected pos_weight with ", C,
             " elements (one per class, the last dim of input ", shape_str(input.sizes()), "), found ",
             pos_weight.describe());
    pw = pos_weight.detach().reshape({-1}).expand({C}).contiguous();
  }
  const Tensor x = input.detach().contiguous(), t = target.detach().contiguous();
  Tensor out = loss_output(reduction, x.sizes(), x.options());
  ops::dispatch_floating(op, x, [&]<class T>() {
    const T *xp = x.data_ptr<T>(), *tp = t.data_ptr<T>(), *wp = ptr_or_null<T>(w), *pwp = ptr_or_null<T>(pw);
    T* outp = out.data_ptr<T>();
    const LossReduction r = to_kernel(reduction);
    ops::on_device(
        x,
        [&] {
          kernels::cpu::binary_cross_entropy_with_logits_forward<T>(xp, tp, wp, pwp, x.numel(), C, r, outp);
        },
        [&](auto stream) {
          kernels::cuda::binary_cross_entropy_with_logits_forward<T>(xp, tp, wp, pwp, x.numel(), C, r, outp, stream);
        });
  });
  autograd::record<BinaryCrossEntropyWithLogitsBackward>(
      {input, target}, {out}, [&](BinaryCrossEntropyWithLogitsBackward& n) {
        n.input = autograd::SavedTensor(x);
        n.target = autograd::SavedTensor(t);
        n.weight = autograd::SavedTensor(w);
        n.pos_weight = autograd::SavedTensor(pw);
        n.reduction = reduction;
        n.C = C;
      });
  return out;
}

namespace {
// Class-probability targets, composed of differentiable ops (so the target gets a gradient
// too, as in PyTorch, and the CUDA path is log_softmax's): with t' = (1 - eps) t + eps / C,
//   l = -sum_c w_c t'_c log_softmax(x)_c,
// and Mean divides by the number of samples, not by the weights (PyTorch's rule for
// probabilities).
Tensor cross_entropy_with_probabilities(const char* op, const Tensor& input, const Tensor& target,
                                        const Tensor& weight, Reduction reduction, int64_t ignore_index,
                                        double label_smoothing) {
  ops::check_same_device_dtype(op, {input, target});
  ND_CHECK(target.sizes() == input.sizes(), op, ": expected class-probability target of input's shape ",
           shape_str(input.sizes()), ", found ", target.describe());
  ND_CHECK(ignore_index == -100, op, ": ignore_index is not supported for class-probability targets (found ",
           ignore_index, "); give the ignored samples all-zero probabilities instead");
  const int64_t class_dim = input.dim() == 1 ? 0 : 1, C = input.size(class_dim);
  Tensor t = label_smoothing > 0 ? target * (1.0 - label_smoothing) + label_smoothing / double(C) : target;
  Tensor per_class = log_softmax(input, class_dim) * t;
  if (weight.defined()) {
    Shape along_classes(input.dim() - class_dim, 1);  // [C, 1, ...]: broadcasts over d1, ...
    along_classes[0] = C;
    per_class = per_class * weight.reshape(along_classes);
  }
  Tensor l = -sum(per_class, {class_dim});
  if (reduction == Reduction::None) return l;
  return reduction == Reduction::Sum ? sum(l) : sum(l) / double(l.numel());  // 0 / 0 = NaN with no samples
}
}  // namespace

Tensor cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight, Reduction reduction,
                     int64_t ignore_index, double label_smoothing, autograd::CallSite) {
  const char* op = "cross_entropy";
  ops::check_same_device_dtype(op, {input, weight});
  ND_CHECK(input.dim() >= 1, op, ": expected input of at least 1 dim ([C], [N, C] or [N, C, d1, ...]), found ",
           input.describe());
  ND_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
           ": expected label_smoothing in [0, 1], found ", label_smoothing);
  const int64_t classes = input.size(input.dim() == 1 ? 0 : 1);
  ND_CHECK(!weight.defined() || (weight.dim() == 1 && weight.size(0) == classes), op, ": expected weight of shape [",
           classes, "] (one per class), found ", weight.describe());
  ND_CHECK(!weight.defined() || !weight.requires_grad(), op, ": gradients for weight are not supported; found ",
           weight.describe(), " that requires grad. Pass weight.detach().");
  if (is_floating_point(target.dtype()))
    return cross_entropy_with_probabilities(op, input, target, weight, reduction, ignore_index, label_smoothing);
  ND_CHECK(target.dtype() == kInt64, op, ": expected target of int64 class indices or of class probabilities (",
           dtype_name(input.dtype()), ", input's shape), found ", target.describe());
  ND_CHECK(target.device() == input.device(), op, ": expected target on ", input.device().str(), ", found ",
           target.describe());
  Shape expected_target = input.sizes();
  expected_target.erase(expected_target.begin() + (input.dim() == 1 ? 0 : 1));
  ND_CHECK(target.sizes() == expected_target, op, ": expected target of shape ", shape_str(expected_target),
           " for input ", input.describe(), " (the class dim removed), found ", target.describe());
  const ClassRows rows = class_rows(input);

  const Tensor x = input.detach().permute(rows.perm).contiguous();
  const Tensor t = target.detach().contiguous();
  const Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
  Tensor out = loss_output(reduction, t.sizes(), x.options());
  Tensor lse = empty({rows.M}, x.options());
  ops::dispatch_floating(op, x, [&]<class T>() {
    const T *xp = x.data_ptr<T>(), *wp = ptr_or_null<T>(w);
    const int64_t* tp = t.data_ptr<int64_t>();
    T *outp = out.data_ptr<T>(), *lp = lse.data_ptr<T>();
    const LossReduction r = to_kernel(reduction);
    int64_t bad = -1;
    ops::on_device(
        x,
        [&] {
          bad = kernels::cpu::cross_entropy_forward<T>(xp, tp, wp, rows.M, rows.C, ignore_index, label_smoothing, r,
                                                       outp, lp);
        },
        [&](auto stream) {
          bad = kernels::cuda::cross_entropy_forward<T>(xp, tp, wp, rows.M, rows.C, ignore_index, label_smoothing, r,
                                                        outp, lp, stream);
        });
    // t is contiguous; on CUDA its values are read back only to report the bad one.
    ND_CHECK(bad < 0, op, ": target ", bad >= 0 ? t.cpu().data_ptr<int64_t>()[bad] : 0,
             " is out of bounds; expected class indices in [0, ", rows.C, ") or ignore_index ", ignore_index,
             ", found it at flat position ", bad, " of target ", target.describe());
  });
  autograd::record<CrossEntropyBackward>({input, target}, {out}, [&](CrossEntropyBackward& n) {
    n.logits = autograd::SavedTensor(x);
    n.target = autograd::SavedTensor(t);
    n.weight = autograd::SavedTensor(w);
    n.lse = autograd::SavedTensor(lse);
    n.rows = rows;
    n.reduction = reduction;
    n.ignore_index = ignore_index;
    n.label_smoothing = label_smoothing;
  });
  return out;
}

}  // namespace nd
