#include "collectives/sync_batch_norm.h"

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/nn/container.h"
#include "engine/nn/init.h"
#include "engine/ops/batch_norm.h"
#include "engine/ops/common.h"
#include "kernels/cpu/batch_norm.h"

namespace nd::nn {

namespace {

// Backward of the synchronised training forward (training mode only: eval goes
// through nd::batch_norm). Saves the global mean/invstd and the global count.
struct SyncBatchNormBackward : autograd::Node {
  autograd::SavedTensor input, weight, mean, invstd;
  std::shared_ptr<dist::ProcessGroup> group;
  double count = 0;  // values per channel over all ranks
  int64_t N = 0, C = 0, S = 0;
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
    // [sum dy | sum dy*(x - mean)] over this rank's values, per channel.
    Tensor sums = zeros({2 * C}, kFloat64);
    double* local = sums.data_ptr<double>();
    Tensor dx, dw, db;
    ops::dispatch_floating("SyncBatchNorm backward", x, [&]<class T>() {
      kernels::cpu::batch_norm_backward_reduce<T>(g.data_ptr<T>(), x.data_ptr<T>(), mu.data_ptr<T>(), N, C, S,
                                                  local, local + C);
      // grad_bias = sum dy, grad_weight = sum dy*(x - mean)*invstd: this rank's share.
      if (next_edges[1].fn) {
        dw = empty({C}, x.options());
        for (int64_t c = 0; c < C; ++c)
          dw.data_ptr<T>()[c] = static_cast<T>(local[C + c] * static_cast<double>(is.data_ptr<T>()[c]));
      }
      if (next_edges[2].fn) {
        db = empty({C}, x.options());
        for (int64_t c = 0; c < C; ++c) db.data_ptr<T>()[c] = static_cast<T>(local[c]);
      }
      if (!next_edges[0].fn) return;
      group->allreduce(sums)->wait();  // sums now hold the totals over all ranks
      dx = empty_like(x);
      kernels::cpu::batch_norm_backward_elemt<T>(g.data_ptr<T>(), x.data_ptr<T>(), mu.data_ptr<T>(),
                                                 is.data_ptr<T>(), w.defined() ? w.data_ptr<T>() : nullptr, local,
                                                 local + C, count, N, C, S, dx.data_ptr<T>());
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
  ops::check_cpu(op, {input, running_mean, running_var, weight, bias});
  for (const Tensor& r : {running_mean, running_var})
    if (r.defined()) ops::check_inplace("SyncBatchNorm (running stats update)", r, false);
  const int64_t N = input.size(0), C = input.size(1);
  int64_t S = 1;
  for (int64_t d = 2; d < input.dim(); ++d) S *= input.size(d);

  const Tensor x = input.detach().contiguous();
  const Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
  const Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
  // [count | sum x | sum x^2] per channel: one all-reduce of 3*C doubles.
  Tensor stats = zeros({3 * C}, kFloat64);
  double* st = stats.data_ptr<double>();
  Tensor y = empty_like(x), mean = empty({C}, x.options()), invstd = empty({C}, x.options());
  ops::dispatch_floating(op, x, [&]<class T>() {
    for (int64_t c = 0; c < C; ++c) st[c] = static_cast<double>(N * S);
    kernels::cpu::batch_norm_channel_stats<T>(x.data_ptr<T>(), N, C, S, st + C, st + 2 * C);
  });
  group->allreduce(stats)->wait();
  const double count = st[0];
  ND_CHECK(count > 1, op, ": expected more than 1 value per channel over all ", group->size(),
           " rank(s) when training, got ", count, " (this rank's input ", input.describe(), ")");
  ops::dispatch_floating(op, x, [&]<class T>() {
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data_ptr<T>() : nullptr; };
    kernels::cpu::batch_norm_stats_to_mean_invstd<T>(st + C, st + 2 * C, count, C, eps, momentum,
                                                     mean.data_ptr<T>(), invstd.data_ptr<T>(), ptr(running_mean),
                                                     ptr(running_var));
    kernels::cpu::batch_norm_apply<T>(x.data_ptr<T>(), mean.data_ptr<T>(), invstd.data_ptr<T>(), ptr(w), ptr(b), N,
                                      C, S, y.data_ptr<T>());
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
    n.count = count;
    n.N = N;
    n.C = C;
    n.S = S;
  });
  return y;
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const BatchNormOptions& options_, std::shared_ptr<dist::ProcessGroup> group)
    : Module("SyncBatchNorm"), options(options_), process_group(std::move(group)) {
  const auto& o = options;
  ND_CHECK(o.num_features() > 0, "SyncBatchNorm: num_features must be positive, got ", o.num_features());
  ND_CHECK(o.eps() > 0, "SyncBatchNorm: eps must be positive, got ", o.eps());
  ND_CHECK(!o.momentum() || (*o.momentum() >= 0 && *o.momentum() <= 1),
           "SyncBatchNorm: momentum must be in [0, 1] (or nullopt for a cumulative average), got ", *o.momentum());
  if (o.affine()) {
    weight = register_parameter("weight", empty({o.num_features()}));
    bias = register_parameter("bias", empty({o.num_features()}));
  }
  if (o.track_running_stats()) {
    running_mean = register_buffer("running_mean", empty({o.num_features()}));
    running_var = register_buffer("running_var", empty({o.num_features()}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, kInt64));
  }
  reset_parameters();
}

SyncBatchNormImpl::SyncBatchNormImpl(const BatchNorm2dImpl& bn, std::shared_ptr<dist::ProcessGroup> group)
    : Module("SyncBatchNorm"), options(bn.options), process_group(std::move(group)) {
  weight = register_parameter("weight", bn.weight, bn.weight.defined() && bn.weight.requires_grad());
  bias = register_parameter("bias", bn.bias, bn.bias.defined() && bn.bias.requires_grad());
  running_mean = register_buffer("running_mean", bn.running_mean);
  running_var = register_buffer("running_var", bn.running_var);
  num_batches_tracked = register_buffer("num_batches_tracked", bn.num_batches_tracked);
  training_ = bn.is_training();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  init::zeros_(running_mean);
  init::ones_(running_var);
  NoGradGuard no_grad;
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (options.affine()) {
    init::ones_(weight);
    init::zeros_(bias);
  }
}

Tensor SyncBatchNormImpl::forward(const Tensor& input) {
  ND_CHECK(input.dim() >= 2, "SyncBatchNorm: expected input [N, C, *], got ", input.describe());
  ND_CHECK(input.size(1) == options.num_features(), "SyncBatchNorm: expected ", options.num_features(),
           " channels (num_features), got input ", input.describe());
  const bool track = options.track_running_stats();
  if (!is_training()) {  // never communicates
    return batch_norm(input, track ? running_mean : Tensor(), track ? running_var : Tensor(), weight, bias,
                      /*training=*/!track, 0.0, options.eps());
  }
  double factor = options.momentum().value_or(0.0);
  if (track) {
    NoGradGuard no_grad;
    const int64_t batches = num_batches_tracked.item<int64_t>() + 1;
    num_batches_tracked.fill_(static_cast<double>(batches));
    if (!options.momentum()) factor = 1.0 / static_cast<double>(batches);
  }
  return sync_batch_norm(input, track ? running_mean : Tensor(), track ? running_var : Tensor(), weight, bias,
                         factor, options.eps(), process_group ? process_group : dist::world());
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
