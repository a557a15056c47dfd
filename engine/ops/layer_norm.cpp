#include "engine/ops/layer_norm.h"

#include "engine/ops/common.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cuda/layer_norm.h"

namespace nd {

namespace {

struct NativeLayerNormBackward : autograd::Node {
  autograd::SavedTensor input, mean, rstd, weight;
  Shape normalized_shape;
  int64_t M = 0, D = 0;
  std::string name() const override { return "NativeLayerNormBackward"; }
  void release_saved_tensors() override {
    input.reset();
    mean.reset();
    rstd.reset();
    weight.reset();
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor x = input.unpack(*this), mu = mean.unpack(*this), rs = rstd.unpack(*this);
    const Tensor w = weight.unpack(*this);
    const Tensor g = grads[0].contiguous();
    Tensor dx, dw, db;
    if (next_edges[0].fn) dx = empty_like(x);
    if (next_edges[1].fn) dw = empty(normalized_shape, x.options());
    if (next_edges[2].fn) db = empty(normalized_shape, x.options());
    ops::dispatch_floating("layer_norm backward", x, [&]<class T>() {
      auto ptr = [](const Tensor& t) { return t.defined() ? t.data_ptr<T>() : nullptr; };
      const T *gp = g.data_ptr<T>(), *xp = x.data_ptr<T>(), *mp = mu.data_ptr<T>(), *rp = rs.data_ptr<T>();
      ops::on_device(
          x, [&] { kernels::cpu::layer_norm_backward<T>(gp, xp, mp, rp, ptr(w), M, D, ptr(dx), ptr(dw), ptr(db)); },
          [&](auto stream) {
            kernels::cuda::layer_norm_backward<T>(gp, xp, mp, rp, ptr(w), M, D, ptr(dx), ptr(dw), ptr(db), stream);
          });
    });
    return {dx, dw, db};
  }
};

}  // namespace

Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  const char* op = "layer_norm";
  ops::check_same_device_dtype(op, {input, weight, bias});
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  ND_CHECK(k >= 1, op, ": expected normalized_shape to be at least 1-dimensional, found ",
           shape_str(normalized_shape));
  const Shape& in = input.sizes();
  const bool trailing_match =
      input.dim() >= k && Shape(in.end() - k, in.end()) == normalized_shape;
  ND_CHECK(trailing_match, op, ": given normalized_shape=", shape_str(normalized_shape),
           ", expected input with shape [*, ", shape_str(normalized_shape).substr(1), ", found ",
           input.describe());
  for (const auto& [t, what] : {std::pair{weight, "weight"}, std::pair{bias, "bias"}}) {
    ND_CHECK(!t.defined() || t.sizes() == normalized_shape, op, ": expected ", what,
             " of shape normalized_shape=", shape_str(normalized_shape), ", found ", t.describe());
  }
  ND_CHECK(eps >= 0, op, ": expected eps >= 0, found ", eps);
  const int64_t D = shape_numel(normalized_shape);
  const int64_t M = D == 0 ? 0 : input.numel() / D;

  const Tensor x = input.detach().contiguous();
  const Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
  const Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor y = empty_like(x);
  Tensor mean = empty({M}, x.options()), rstd = empty({M}, x.options());
  ops::dispatch_floating(op, x, [&]<class T>() {
    if (M == 0 || D == 0) return;
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data_ptr<T>() : nullptr; };
    const T* xp = x.data_ptr<T>();
    T *yp = y.data_ptr<T>(), *mp = mean.data_ptr<T>(), *rp = rstd.data_ptr<T>();
    ops::on_device(
        x, [&] { kernels::cpu::layer_norm_forward<T>(xp, ptr(w), ptr(b), M, D, eps, yp, mp, rp); },
        [&](auto stream) { kernels::cuda::layer_norm_forward<T>(xp, ptr(w), ptr(b), M, D, eps, yp, mp, rp, stream); });
  });
  autograd::record<NativeLayerNormBackward>({input, weight, bias}, {y}, [&](NativeLayerNormBackward& n) {
    n.input = autograd::SavedTensor(x);
    n.mean = autograd::SavedTensor(mean);
    n.rstd = autograd::SavedTensor(rstd);
    n.weight = autograd::SavedTensor(w);
    n.normalized_shape = normalized_shape;
    n.M = M;
    n.D = D;
  });
  return y;
}

}  // namespace nd
