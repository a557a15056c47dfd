// The Reducer under a CUDA graph capture (ddp.h; docs/cuda_graphs.md, "DDP and NCCL"): a
// synchronised backward captured once its buckets are final, its bucket all-reduces recorded on
// NCCL's stream (forked from the capture by the process group's "ready" event, joined back by
// wait_on_device), and what a replay could not repeat refused by name before anything changes.
// A captured backward runs no host code on replay, so:
// - which parameters took part must be the last eager backward's (its all-reduced status is
//   the captured one's verdict on unused parameters: the host cannot read the device);
// - the per-iteration divergence check (a CPU all-reduce on the control group) is left out of
//   the captured backward; the next eager backward's check covers the collectives it issued.
#include <string>
#include <vector>

#include "collectives/ddp.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/copy.h"

namespace nd::dist {

bool Reducer::capturing() const {
  const Device& d = params_[0].device();
  return d.is_cuda() && kernels::cuda::capture_active() && kernels::cuda::capture_stream(d.index) != nullptr;
}

void Reducer::check_capturable() const {
  auto refuse = [&](bool bad, const std::string& why) {
    if (bad)
      kernels::cuda::refuse_during_capture(params_[0].device().index,
                                           "capture a backward of DDP model '" + name_ + "'", why);
  };
  refuse(!rebuilt_,
         "its gradient buckets are rebuilt at the end of its first synchronised backward, in the order the gradients "
         "became ready; run one eager synchronised backward before the capture");
  refuse(static_cast<bool>(comm_hook_), "its communication hook, " + comm_hook_description_ +
                                            ", runs on the host when each bucket is waited for; capture without a hook");
  refuse(shard_gradients_,
         "ZeRO stage 2 (a ZeroRedundancyOptimizer given this model) reads and re-slices its buckets on the host");
  refuse(options_.skip_nonfinite_steps(),
         "skip_nonfinite_steps reads the non-finite vote on the host at the end of backward; capture without it");
}

// The status slots' flags (1 where this rank reduced a gradient) come from a device copy of the
// last ones: uploaded only when they change, which a captured backward cannot do.
void Reducer::set_status_flags(const Tensor& status, const std::vector<double>& flags) {
  if (flags != flags_ || !flags_device_.defined() || flags_device_.dtype() != status.dtype() ||
      flags_device_.device() != status.device()) {
    if (capturing_ && flags_device_.defined()) {
      size_t i = 0;
      while (i + 1 < flags.size() && flags[i] == flags_[i]) ++i;
      kernels::cuda::refuse_during_capture(
          status.device().index, "capture a backward of DDP model '" + name_ + "'",
          "parameter '" + param_names_[i] + "' " + (flags[i] > 0 ? "got" : "did not get") +
              " a gradient in it but " + (flags_[i] > 0 ? "did" : "not") +
              " in the eager backward before; a replay reduces the gradients the captured backward produced, so it "
              "must use the parameters the eager warm-up used");
    }
    flags_ = flags;
    flags_device_ = tensor(flags, status.dtype()).to(status.device());
  }
  copy_data(status, flags_device_);
}

}  // namespace nd::dist
