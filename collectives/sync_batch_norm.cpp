#include "collectives/sync_batch_norm.h"

#include <algorithm>

#include "engine/error.h"
#include "engine/nn/container.h"
#include "engine/ops/batch_norm.h"

namespace nd::nn {

namespace {

// The group a training forward all-reduces over: the module's, else the default one for
// the input's device (null, no communication, for a GPU in a world of one rank).
std::shared_ptr<dist::ProcessGroup> group_for(const std::shared_ptr<dist::ProcessGroup>& chosen, const Tensor& input) {
  return chosen ? chosen : dist::default_group(input.device());
}

// The op's all-reduce over `group` (null: none). On a GPU the kernels queued next wait for
// it, and the host does not. The watchdog names it by `layer`: "SyncBatchNorm statistics of
// 'D.main.3'".
AllReduceSum allreduce_over(const std::shared_ptr<dist::ProcessGroup>& group, const std::string& layer) {
  if (!group) return nullptr;
  return [group, layer](const Tensor& t, const char* what) {
    dist::CollectivePurpose purpose(std::string("SyncBatchNorm ") + what + (layer.empty() ? "" : " of '" + layer + "'"));
    const std::shared_ptr<dist::Work> work = group->allreduce(t);
    if (t.is_cuda())
      work->wait_on_device();
    else
      work->wait();
  };
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
  // The layer's name from its tensors' ('D.main.3.weight' -> 'D.main.3'), when they have one.
  const std::string& tensor_name = weight.defined() ? weight.name() : running_mean.defined() ? running_mean.name() : "";
  const std::string layer = tensor_name.substr(0, std::min(tensor_name.size(), tensor_name.rfind('.')));
  return sync_batch_norm(input, track ? running_mean : Tensor(), track ? running_var : Tensor(), weight, bias,
                         momentum, options.eps(), allreduce_over(group, layer), group ? group->size() : 1);
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
