#include "engine/ops/batch_norm.h"

#include "engine/ops/common.h"
#include "kernels/cpu/batch_norm.h"
#include "kernels/cuda/batch_norm.h"

namespace nd {

namespace {

// Saves the statistics the forward used: the batch's mean and invstd (training) or
// running_mean and 1/sqrt(running_var + eps) (eval, where they are constants).
struct NativeBatchNormBackward : autograd::Node {
  autograd::SavedTensor input, weight, mean, invstd;
  int64_t N = 0, C = 0, S = 0;
  bool training = true;
  std::string name() const override { return "NativeBatchNormBackward"; }
  void release_saved_tensors() override {
    input.reset();
    weight.reset();
    mean.reset();
    invstd.reset();
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor x = input.unpack(*this), w = weight.unpack(*this);
    const Tensor mu = mean.unpack(*this).contiguous(), is = invstd.unpack(*this);
    const Tensor g = grads[0].contiguous();
    Tensor dx, dw, db;
    if (next_edges[0].fn) dx = empty_like(x);
    if (next_edges[1].fn) dw = empty({C}, x.options());
    if (next_edges[2].fn) db = empty({C}, x.options());
    ops::dispatch_floating("batch_norm backward", x, [&]<class T>() {
      auto ptr = [](const Tensor& t) { return t.defined() ? t.data_ptr<T>() : nullptr; };
      ops::on_device(
          x,
          [&] {
            kernels::cpu::batch_norm_backward<T>(g.data_ptr<T>(), x.data_ptr<T>(), mu.data_ptr<T>(), is.data_ptr<T>(),
                                                 ptr(w), N, C, S, training, ptr(dx), ptr(dw), ptr(db));
          },
          [&](auto stream) {
            kernels::cuda::batch_norm_backward<T>(g.data_ptr<T>(), x.data_ptr<T>(), mu.data_ptr<T>(),
                                                  is.data_ptr<T>(), ptr(w), N, C, S, training, ptr(dx), ptr(dw),
                                                  ptr(db), stream);
          });
    });
    return {dx, dw, db};
  }
};

void check_channel_vector(const Tensor& t, const char* what, int64_t C, const Tensor& input) {
  ND_CHECK(!t.defined() || (t.dim() == 1 && t.size(0) == C), "batch_norm: expected ", what, " of shape [", C,
           "] (the channel dim of input ", input.describe(), "), found ", t.describe());
}

}  // namespace

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps) {
  const char* op = "batch_norm";
  ops::check_same_device_dtype(op, {input, running_mean, running_var, weight, bias});
  ND_CHECK(input.dim() >= 2, op, ": expected input of at least 2 dims ([N, C, *]), found ", input.describe());
  const int64_t N = input.size(0), C = input.size(1);
  const int64_t S = C == 0 || N == 0 ? 0 : input.numel() / (N * C);
  check_channel_vector(running_mean, "running_mean", C, input);
  check_channel_vector(running_var, "running_var", C, input);
  check_channel_vector(weight, "weight", C, input);
  check_channel_vector(bias, "bias", C, input);
  ND_CHECK(running_mean.defined() == running_var.defined(), op,
           ": expected running_mean and running_var both defined or both undefined, found ",
           running_mean.defined() ? "only running_mean" : "only running_var");
  ND_CHECK(training || running_mean.defined(), op,
           ": running_mean and running_var must be defined in evaluation mode (training=false)");
  ND_CHECK(eps >= 0, op, ": expected eps >= 0, found ", eps);
  if (training) {
    ND_CHECK(N * S > 1, op, ": expected more than 1 value per channel when training, got input ",
             input.describe());
  }
  for (const Tensor& r : {running_mean, running_var}) {
    if (!r.defined() || !training) continue;
    ND_CHECK(r.is_contiguous(), op, ": expected a contiguous running statistic to update in place, found ",
             r.describe());
    ops::check_inplace("batch_norm (running stats update)", r, false);
  }

  const Tensor x = input.detach().contiguous();
  const Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
  const Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor y = empty_like(x);
  Tensor mean, invstd;
  ops::dispatch_floating(op, x, [&]<class T>() {
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data_ptr<T>() : nullptr; };
    if (training) {
      mean = empty({C}, x.options());
      invstd = empty({C}, x.options());
      ops::on_device(
          x,
          [&] {
            kernels::cpu::batch_norm_forward_training<T>(x.data_ptr<T>(), ptr(w), ptr(b), ptr(running_mean),
                                                         ptr(running_var), N, C, S, momentum, eps, y.data_ptr<T>(),
                                                         mean.data_ptr<T>(), invstd.data_ptr<T>());
          },
          [&](auto stream) {
            kernels::cuda::batch_norm_forward_training<T>(x.data_ptr<T>(), ptr(w), ptr(b), ptr(running_mean),
                                                          ptr(running_var), N, C, S, momentum, eps, y.data_ptr<T>(),
                                                          mean.data_ptr<T>(), invstd.data_ptr<T>(), stream);
          });
    } else {
      mean = running_mean.detach().contiguous();
      const Tensor var = running_var.detach().contiguous();
      invstd = empty({C}, x.options());
      ops::on_device(
          x,
          [&] {
            kernels::cpu::batch_norm_invstd<T>(var.data_ptr<T>(), C, eps, invstd.data_ptr<T>());
            kernels::cpu::batch_norm_apply<T>(x.data_ptr<T>(), mean.data_ptr<T>(), invstd.data_ptr<T>(), ptr(w),
                                              ptr(b), N, C, S, y.data_ptr<T>());
          },
          [&](auto stream) {
            kernels::cuda::batch_norm_invstd<T>(var.data_ptr<T>(), C, eps, invstd.data_ptr<T>(), stream);
            kernels::cuda::batch_norm_apply<T>(x.data_ptr<T>(), mean.data_ptr<T>(), invstd.data_ptr<T>(), ptr(w),
                                               ptr(b), N, C, S, y.data_ptr<T>(), stream);
          });
    }
  });
  if (training && running_mean.defined()) {
    ops::bump_version(running_mean, op);
    ops::bump_version(running_var, op);
  }
  autograd::record<NativeBatchNormBackward>({input, weight, bias}, {y}, [&](NativeBatchNormBackward& n) {
    n.input = autograd::SavedTensor(x);
    n.weight = autograd::SavedTensor(w);
    n.mean = autograd::SavedTensor(mean);
    n.invstd = autograd::SavedTensor(invstd);
    n.N = N;
    n.C = C;
    n.S = S;
    n.training = training;
  });
  return y;
}

}  // namespace nd
