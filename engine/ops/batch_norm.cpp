#include "engine/ops/batch_norm.h"

#include "engine/ops/common.h"
#include "kernels/cpu/batch_norm.h"
#include "kernels/cuda/batch_norm.h"

namespace nd {

namespace {

// Saves the statistics the forward used: the batch's mean and invstd (training) or
// running_mean and 1/sqrt(running_var + eps) (eval, where they are constants).
// What both batch norms' backward nodes save: the input, the weight, the statistics the
// forward normalised with, and the sizes of the [N, C, S] view of the input.
struct BatchNormNode : autograd::Node {
  autograd::SavedTensor input, weight, mean, invstd;
  int64_t N = 0, C = 0, S = 0;
  void release_saved_tensors() override {
    input.reset();
    weight.reset();
    mean.reset();
    invstd.reset();
  }
};

struct NativeBatchNormBackward : BatchNormNode {
  bool training = true;
  BatchNormActivation activation;
  autograd::SavedTensor output;  // the forward's y, when activation.on()
  std::string name() const override {
    switch (activation.kind) {
      case BatchNormActivation::Kind::relu: return "NativeBatchNormReluBackward";
      case BatchNormActivation::Kind::leaky_relu: return "NativeBatchNormLeakyReluBackward";
      case BatchNormActivation::Kind::none: break;
    }
    return "NativeBatchNormBackward";
  }
  void release_saved_tensors() override {
    BatchNormNode::release_saved_tensors();
    output.reset();
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor x = input.unpack(*this), w = weight.unpack(*this);
    const Tensor y = activation.on() ? output.unpack(*this).contiguous() : Tensor();
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
                                                 ptr(w), N, C, S, training, ptr(dx), ptr(dw), ptr(db), activation,
                                                 ptr(y));
          },
          [&](auto stream) {
            kernels::cuda::batch_norm_backward<T>(g.data_ptr<T>(), x.data_ptr<T>(), mu.data_ptr<T>(),
                                                  is.data_ptr<T>(), ptr(w), N, C, S, training, ptr(dx), ptr(dw),
                                                  ptr(db), stream, activation, ptr(y));
          });
    });
    return {dx, dw, db};
  }
};

void check_channel_vector(const Tensor& t, const char* what, int64_t C, const Tensor& input) {
  ND_CHECK(!t.defined() || (t.dim() == 1 && t.size(0) == C), "batch_norm: expected ", what, " of shape [", C,
           "] (the channel dim of input ", input.describe(), "), found ", t.describe());
}


// Backward of the synchronised training forward (training mode only: eval goes
// through nd::batch_norm). Saves the global mean/invstd and the global count.
struct SyncBatchNormBackward : BatchNormNode {
  AllReduceSum allreduce;  // null: this process alone
  double count = 0;     // values per channel over all ranks (what the CPU kernels use)
  Tensor device_count;  // the same on the GPU (f64 [1]): what the CUDA kernels read
  std::string name() const override { return "SyncBatchNormBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor x = input.unpack(*this), w = weight.unpack(*this);
    const Tensor mu = mean.unpack(*this), is = invstd.unpack(*this);
    const Tensor g = grads[0].contiguous();
    // [sum dy | sum dy*(x - mean)] over this rank's values, per channel, on x's device.
    const Tensor sums = empty({2 * C}, x.options().dtype(kFloat64));
    ops::dispatch_floating("SyncBatchNorm backward", x, [&]<class T>() {
      ops::on_device(
          x,
          [&] {
            kernels::cpu::batch_norm_backward_reduce<T>(g.data_ptr<T>(), x.data_ptr<T>(), mu.data_ptr<T>(), N, C, S,
                                                        sums.data_ptr<double>(), sums.data_ptr<double>() + C);
          },
          [&](auto stream) {
            kernels::cuda::batch_norm_backward_reduce<T>(g.data_ptr<T>(), x.data_ptr<T>(), mu.data_ptr<T>(), N, C,
                                                         S, sums.data_ptr<double>(), sums.data_ptr<double>() + C,
                                                         stream);
          });
    });
    Tensor dx, dw, db;
    {
      // grad_bias = sum dy, grad_weight = sum dy*(x - mean)*invstd: this rank's share,
      // from the local sums (the all-reduce below overwrites them).
      NoGradGuard no_grad;
      if (next_edges[1].fn) dw = (sums.narrow(0, C, C) * is.to(kFloat64)).to(x.dtype());
      if (next_edges[2].fn) db = sums.narrow(0, 0, C).clone().to(x.dtype());
    }
    if (!next_edges[0].fn) return {dx, dw, db};
    if (allreduce) allreduce(sums, "gradient sums");  // sums now hold the totals over all processes
    dx = empty_like(x);
    ops::dispatch_floating("SyncBatchNorm backward", x, [&]<class T>() {
      const T* wp = w.defined() ? w.data_ptr<T>() : nullptr;
      const double* total = sums.data_ptr<double>();
      ops::on_device(
          x,
          [&] {
            kernels::cpu::batch_norm_backward_elemt<T>(g.data_ptr<T>(), x.data_ptr<T>(), mu.data_ptr<T>(),
                                                       is.data_ptr<T>(), wp, total, total + C, count, N, C, S,
                                                       dx.data_ptr<T>());
          },
          [&](auto stream) {
            kernels::cuda::batch_norm_backward_elemt<T>(g.data_ptr<T>(), x.data_ptr<T>(), mu.data_ptr<T>(),
                                                        is.data_ptr<T>(), wp, total, total + C,
                                                        device_count.data_ptr<double>(), N, C, S,
                                                        dx.data_ptr<T>(), stream);
          });
    });
    return {dx, dw, db};
  }
};

// Bumps the running statistics' versions (updated in place by the forward) and records
// the backward node NodeT with what both batch norms save; `more` fills the rest.
template <class NodeT, class More>
void record_batch_norm(const char* op, const Tensor& input, const Tensor& weight, const Tensor& bias,
                       const Tensor& running_mean, const Tensor& running_var, const Tensor& y, const Tensor& x,
                       const Tensor& w, const Tensor& mean, const Tensor& invstd, int64_t N, int64_t C, int64_t S,
                       More&& more) {
  if (running_mean.defined()) {
    ops::bump_version(running_mean, op);
    ops::bump_version(running_var, op);
  }
  autograd::record<NodeT>({input, weight, bias}, {y}, [&](NodeT& n) {
    n.input = autograd::SavedTensor(x);
    n.weight = autograd::SavedTensor(w);
    n.mean = autograd::SavedTensor(mean);
    n.invstd = autograd::SavedTensor(invstd);
    n.N = N;
    n.C = C;
    n.S = S;
    more(n);
  });
}

}  // namespace

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps,
                  BatchNormActivation activation) {
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
  ND_CHECK(activation.kind != BatchNormActivation::Kind::leaky_relu || activation.negative_slope >= 0, op,
           ": expected a LeakyReLU negative_slope >= 0 to apply in the same pass, found ",
           activation.negative_slope);
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
                                                         mean.data_ptr<T>(), invstd.data_ptr<T>(), activation);
          },
          [&](auto stream) {
            kernels::cuda::batch_norm_forward_training<T>(x.data_ptr<T>(), ptr(w), ptr(b), ptr(running_mean),
                                                          ptr(running_var), N, C, S, momentum, eps, y.data_ptr<T>(),
                                                          mean.data_ptr<T>(), invstd.data_ptr<T>(), stream, activation);
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
                                              ptr(b), N, C, S, y.data_ptr<T>(), activation);
          },
          [&](auto stream) {
            kernels::cuda::batch_norm_invstd<T>(var.data_ptr<T>(), C, eps, invstd.data_ptr<T>(), stream);
            kernels::cuda::batch_norm_apply<T>(x.data_ptr<T>(), mean.data_ptr<T>(), invstd.data_ptr<T>(), ptr(w),
                                               ptr(b), N, C, S, y.data_ptr<T>(), stream, activation);
          });
    }
  });
  record_batch_norm<NativeBatchNormBackward>(op, input, weight, bias, training ? running_mean : Tensor(),
                                             running_var, y, x, w, mean, invstd, N, C, S,
                                             [&](NativeBatchNormBackward& n) {
                                               n.training = training;
                                               n.activation = activation;
                                               if (activation.on()) n.output = autograd::SavedTensor(y);
                                             });
  return y;
}


Tensor sync_batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, double momentum, double eps,
                       const AllReduceSum& allreduce, int world_size) {
  const char* op = "SyncBatchNorm";
  ops::check_same_device_dtype(op, {input, running_mean, running_var, weight, bias});
  for (const Tensor& r : {running_mean, running_var})
    if (r.defined()) ops::check_inplace("SyncBatchNorm (running stats update)", r, false);
  const int64_t N = input.size(0), C = input.size(1);
  int64_t S = 1;
  for (int64_t d = 2; d < input.dim(); ++d) S *= input.size(d);

  const Tensor x = input.detach().contiguous();
  const Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
  const Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
  // [count | sum x | sum x^2] per channel on x's device: one all-reduce of 3*C doubles.
  const Tensor stats = full({3 * C}, static_cast<double>(N * S), x.options().dtype(kFloat64));
  double* st = stats.data_ptr<double>();
  ops::dispatch_floating(op, x, [&]<class T>() {
    ops::on_device(
        x, [&] { kernels::cpu::batch_norm_channel_stats<T>(x.data_ptr<T>(), N, C, S, st + C, st + 2 * C); },
        [&](auto stream) {
          kernels::cuda::batch_norm_channel_stats<T>(x.data_ptr<T>(), N, C, S, st + C, st + 2 * C, stream);
        });
  });
  if (allreduce) allreduce(stats, "statistics");
  // stats[0] is now the total count, on x's device, where the CUDA kernels read it. The
  // host reads it back only where it needs it: for the CPU kernels, and for the check when
  // this rank's own N*S does not settle it (a rank's count is a part of the total, so when
  // it is more than 1 the total is too; on a GPU the host then does not wait).
  const double local_count = static_cast<double>(N * S);
  const bool alone = !allreduce || world_size == 1;
  const bool read_count = !alone && (!x.is_cuda() || local_count <= 1);
  const double count = read_count ? stats.narrow(0, 0, 1).item<double>() : local_count;  // the total, or <= it
  ND_CHECK(count > 1, op, ": expected more than 1 value per channel over all ", alone ? 1 : world_size,
           " rank(s) when training, got ", count, " (this rank's input ", input.describe(), ")");
  Tensor y = empty_like(x), mean = empty({C}, x.options()), invstd = empty({C}, x.options());
  ops::dispatch_floating(op, x, [&]<class T>() {
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data_ptr<T>() : nullptr; };
    ops::on_device(
        x,
        [&] {
          kernels::cpu::batch_norm_stats_to_mean_invstd<T>(st + C, st + 2 * C, count, C, eps, momentum,
                                                           mean.data_ptr<T>(), invstd.data_ptr<T>(),
                                                           ptr(running_mean), ptr(running_var));
          kernels::cpu::batch_norm_apply<T>(x.data_ptr<T>(), mean.data_ptr<T>(), invstd.data_ptr<T>(), ptr(w),
                                            ptr(b), N, C, S, y.data_ptr<T>());
        },
        [&](auto stream) {
          kernels::cuda::batch_norm_stats_to_mean_invstd<T>(st + C, st + 2 * C, st, C, eps, momentum,
                                                            mean.data_ptr<T>(), invstd.data_ptr<T>(),
                                                            ptr(running_mean), ptr(running_var), stream);
          kernels::cuda::batch_norm_apply<T>(x.data_ptr<T>(), mean.data_ptr<T>(), invstd.data_ptr<T>(), ptr(w),
                                             ptr(b), N, C, S, y.data_ptr<T>(), stream);
        });
  });
  record_batch_norm<SyncBatchNormBackward>(op, input, weight, bias, running_mean, running_var, y, x, w, mean,
                                           invstd, N, C, S, [&](SyncBatchNormBackward& n) {
                                             n.allreduce = allreduce;
                                             n.count = count;
                                             if (x.is_cuda()) n.device_count = stats.narrow(0, 0, 1);
                                           });
  return y;
}

}  // namespace nd
