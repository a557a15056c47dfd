#pragma once
// NcclProcessGroup: collectives on CUDA tensors of this rank's GPU (CUDA builds with
// NCCL only; dist::nccl_world() creates it).
//
// Why it looks like this: one communicator per process, its ncclUniqueId made by rank 0
// and broadcast over a CPU process group (dist::world(): MPI, or a lone process). Every
// collective runs on the group's communication stream, which first waits (an event) for
// the work already queued on the default stream, where the engine computes; a bucket's
// all-reduce therefore sees finished gradients and overlaps with later compute. wait()
// blocks the host until the collective finished (stronger than PyTorch, which only
// orders streams) and rethrows NCCL's asynchronous errors as nd::Error. Allgather and
// reduce_scatter are grouped broadcasts / reduces, so per-rank sizes may differ.
// Kept minimal: no stream pools, no coalescing. Checked on a GPU machine, not in CI.
#include <memory>

#include "collectives/process_group.h"

namespace nd::dist {

class NcclProcessGroup : public ProcessGroup {
 public:
  // Collective over `bootstrap`: every rank calls it. Uses GPU local_rank % device count.
  static std::shared_ptr<NcclProcessGroup> create(const std::shared_ptr<ProcessGroup>& bootstrap, int local_rank);
  ~NcclProcessGroup() override;
  NcclProcessGroup(const NcclProcessGroup&) = delete;
  NcclProcessGroup& operator=(const NcclProcessGroup&) = delete;

  int rank() const override;
  int size() const override;
  std::string backend() const override { return "nccl"; }
  int device() const;  // the CUDA ordinal this rank uses

  std::shared_ptr<Work> allreduce(const Tensor& tensor, const AllreduceOptions& options = {}) override;
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root = 0) override;
  std::shared_ptr<Work> allgather(const std::vector<Tensor>& outputs, const Tensor& input) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                       ReduceOp op = ReduceOp::SUM) override;
  std::shared_ptr<Work> barrier() override;

  struct State;

 private:
  explicit NcclProcessGroup(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace nd::dist
