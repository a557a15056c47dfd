#pragma once
// SyncBatchNorm: BatchNorm2d whose training statistics span every rank of a process
// group, so N ranks on N shards normalise exactly like one process on the whole batch
// (docs/traps.md, trap 5).
//
// Why this scheme: forward all-reduces, per channel,
// (count, sum x, sum x^2) in f64 -- ONE all-reduce of 3*C values, O(C) whatever the
// world size, exact for unequal per-rank batches (PyTorch all-gathers O(world x C)).
// Backward all-reduces sum(dy) and sum(dy * (x - mean)) (one all-reduce of 2*C) and
// applies the elementwise input gradient with the global count. Weight and bias
// gradients stay local to the rank (DDP averages them like any other parameter).
// Running statistics get the same global update on every rank; eval uses them and
// never communicates. Tests: tests/dist/sync_batch_norm_test.cpp (1, 2, 4 ranks),
// tests/cuda/cuda_batch_norm_test.cpp (CUDA, one rank).
#include <memory>

#include "collectives/process_group.h"
#include "engine/nn/batch_norm.h"
#include "engine/nn/module.h"

namespace nd::nn {

// Options, parameter and buffer names are BatchNorm2d's (weight, bias, running_mean,
// running_var, num_batches_tracked), so checkpoints move between the two.
// CPU and CUDA inputs: the statistics travel on the input's device, through
// `process_group` when set, else dist::world() (CPU) or dist::nccl_world() (CUDA; in a
// world of one rank no collective runs, the sums of one rank being the totals).
class SyncBatchNormImpl : public BatchNormBase {
 public:
  explicit SyncBatchNormImpl(const BatchNormOptions& options,
                             std::shared_ptr<dist::ProcessGroup> process_group = nullptr)
      : BatchNormBase("SyncBatchNorm", options), process_group(std::move(process_group)) {}
  explicit SyncBatchNormImpl(int64_t num_features) : SyncBatchNormImpl(BatchNormOptions(num_features)) {}
  // Takes over `bn`'s options, training flag and tensors (the same Tensor handles, so
  // optimizers and names stay valid).
  explicit SyncBatchNormImpl(const BatchNorm2dImpl& bn, std::shared_ptr<dist::ProcessGroup> process_group = nullptr)
      : BatchNormBase("SyncBatchNorm", bn), process_group(std::move(process_group)) {}
  // input [N, C, *]; N may be 0 on some ranks in training as long as the world has
  // more than one value per channel.
  Tensor forward(const Tensor& input) override;

  std::shared_ptr<dist::ProcessGroup> process_group;  // null: by the input's device (above)
};
ND_MODULE(SyncBatchNorm);

// Replaces every BatchNorm2d in the tree under `module` by a SyncBatchNorm holding the
// same tensors, and returns the module (or the new SyncBatchNorm when `module` itself is
// a BatchNorm2d), like torch.nn.SyncBatchNorm.convert_sync_batchnorm. Names, state_dict
// keys and optimizers stay valid. Warns when a BatchNorm2d is also held outside the
// tree (a holder member that its parent's forward calls directly keeps running the
// unsynchronised layer): such modules should build SyncBatchNorm themselves.
std::shared_ptr<Module> convert_sync_batchnorm(std::shared_ptr<Module> module,
                                               std::shared_ptr<dist::ProcessGroup> process_group = nullptr);

}  // namespace nd::nn
