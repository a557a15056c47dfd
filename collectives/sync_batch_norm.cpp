#include "collectives/sync_batch_norm.h"

#include <algorithm>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/nn/container.h"
#include "engine/ops/common.h"
#include "kernels/cpu/batch_norm.h"
#include "kernels/cuda/batch_norm.h"

namespace nd::nn {

namespace {

// The group a training forward all-reduces over: the module's, else the default one for
// the input's device (null, no communication, for a GPU in a world of one rank).
std::shared_ptr<dist::ProcessGroup> group_for(const std::shared_ptr<dist::ProcessGroup>& chosen, const Tensor& input) {
  return chosen ? chosen : dist::default_group(input.device());
}

// Sums `t` (f64, on the input's device) over the group's ranks in place. On a GPU the
// kernels queued next wait for it, and the host does not. `what` and `layer` name it for
// the watchdog: "SyncBatchNorm statistics of 'D.main.3'".
void allreduce(const std::shared_ptr<dist::ProcessGroup>& group, const Tensor& t, const char* what,
               const std::string& layer) {
  if (!group) return;
  dist::CollectivePurpose purpose(std::string("SyncBatchNorm ") + what + (layer.empty() ? "" : " of '" + layer + "'"));
  const std::shared_ptr<dist::Work> work = group->allreduce(t);
  if (t.is_cuda())
    work->wait_on_device();
  else
    work->wait();
}

// Backward of the synchronised training forward (training mode only: eval goes
// through nd::batch_norm). Saves the global mean/invstd and the global count.
struct SyncBatchNormBackward : autograd::Node {
  autograd::SavedTensor input, weight, mean, invstd;
  std::shared_ptr<dist::ProcessGroup> group;  // null: this rank alone
  double count = 0;     // values per channel over all ranks (what the CPU kernels use)
  Tensor device_count;  // the same on the GPU (f64 [1]): what the CUDA kernels read
  int64_t N = 0, C = 0, S = 0;
  std::string layer;  // for the watchdog: 'D.main.3'
  std::string name() const override { return "SyncBatchNormBackward"; }
  void release_saved_tensors() override {
    input.reset();
    weight.reset();
    mean.reset();
    invstd.reset();
  }
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
    allreduce(group, sums, "gradient sums", layer);  // sums now hold the totals over all ranks
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

// Training forward with statistics over every rank of `group`; updates running stats.
Tensor sync_batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, double momentum, double eps,
                       const std::shared_ptr<dist::ProcessGroup>& group) {
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
  // The layer's name from its tensors' ('D.main.3.weight' -> 'D.main.3'), when they have one.
  const std::string& tensor_name = weight.defined() ? weight.name() : running_mean.defined() ? running_mean.name() : "";
  const std::string layer = tensor_name.substr(0, std::min(tensor_name.size(), tensor_name.rfind('.')));
  allreduce(group, stats, "statistics", layer);
  // stats[0] is now the total count, on x's device, where the CUDA kernels read it. The
  // host reads it back only where it needs it: for the CPU kernels, and for the check when
  // this rank's own N*S does not settle it (a rank's count is a part of the total, so when
  // it is more than 1 the total is too; on a GPU the host then does not wait).
  const double local_count = static_cast<double>(N * S);
  const bool alone = !group || group->size() == 1;
  const bool read_count = !alone && (!x.is_cuda() || local_count <= 1);
  const double count = read_count ? stats.narrow(0, 0, 1).item<double>() : local_count;  // the total, or <= it
  ND_CHECK(count > 1, op, ": expected more than 1 value per channel over all ", group ? group->size() : 1,
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
  if (running_mean.defined()) {
    ops::bump_version(running_mean, op);
    ops::bump_version(running_var, op);
  }
  autograd::record<SyncBatchNormBackward>({input, weight, bias}, {y}, [&](SyncBatchNormBackward& n) {
    n.input = autograd::SavedTensor(x);
    n.weight = autograd::SavedTensor(w);
    n.mean = autograd::SavedTensor(mean);
    n.invstd = autograd::SavedTensor(invstd);
    n.group = group;
    n.layer = layer;
    n.count = count;
    if (x.is_cuda()) n.device_count = stats.narrow(0, 0, 1);
    n.N = N;
    n.C = C;
    n.S = S;
  });
  return y;
}

}  // namespace

Tensor SyncBatchNormImpl::forward(const Tensor& input) {
  ND_CHECK(input.dim() >= 2, "SyncBatchNorm: expected input [N, C, *], got ", input.describe());
  ND_CHECK(input.size(1) == options.num_features(), "SyncBatchNorm: expected ", options.num_features(),
           " channels (num_features), got input ", input.describe());
  if (!is_training()) return batch_norm_local(input, 0.0);  // never communicates
  const bool track = options.track_running_stats();
  const double momentum = next_momentum();
  const auto group = group_for(process_group, input);
  return sync_batch_norm(input, track ? running_mean : Tensor(), track ? running_var : Tensor(), weight, bias,
                         momentum, options.eps(), group);
}

std::shared_ptr<Module> convert_sync_batchnorm(std::shared_ptr<Module> module,
                                               std::shared_ptr<dist::ProcessGroup> process_group) {
  ND_CHECK(module != nullptr, "convert_sync_batchnorm: module is null");
  if (auto bn = std::dynamic_pointer_cast<BatchNorm2dImpl>(module))
    return std::make_shared<SyncBatchNormImpl>(*bn, process_group);
  struct Swap {
    std::string path, name;
    std::shared_ptr<Module> parent;
    std::shared_ptr<BatchNorm2dImpl> bn;
  };
  std::vector<Swap> swaps;
  for (const auto& [path, parent] : module->named_modules())
    for (const auto& [name, child] : parent->named_children())
      if (auto bn = std::dynamic_pointer_cast<BatchNorm2dImpl>(child))
        swaps.push_back({path.empty() ? name : path + "." + name, name, parent, std::move(bn)});
  for (Swap& s : swaps) {
    auto sync = std::make_shared<SyncBatchNormImpl>(*s.bn, process_group);
    s.parent->replace_module(s.name, sync);  // containers update their positional list too
    // Left: our handle, plus any the tree does not know about (a holder member whose
    // owner's forward would keep calling the unsynchronised layer).
    if (s.bn.use_count() > 1) {
      warn("convert_sync_batchnorm: BatchNorm2d '" + s.path + "' is also held outside the module tree (a holder "
           "member or variable); a forward that calls it through that handle still runs the unsynchronised "
           "BatchNorm2d. Build the module with nn::SyncBatchNorm, or keep the layer in a Sequential/ModuleList.");
    }
  }
  return module;
}

}  // namespace nd::nn
