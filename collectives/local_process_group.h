#pragma once
// LocalProcessGroup: world size 1 without MPI (built with NANODDP_MPI=OFF or MPI not
// found). Every collective is the identity on this one rank (SUM, AVG, MAX and MIN of
// a single value are the value), checks its arguments like the real backends, and
// returns an already completed Work, so code written for N ranks runs unchanged. Its
// tensors live on the CPU, or on the device it is made for (DDP's communication hooks in
// a world of one GPU process).
#include "collectives/process_group.h"

namespace nd::dist {

class LocalProcessGroup : public ProcessGroup {
 public:
  explicit LocalProcessGroup(Device device = Device(kCPU)) : device_(device) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }

  std::shared_ptr<Work> allreduce(const Tensor& tensor, const AllreduceOptions& options = {}) override;
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root = 0) override;
  std::shared_ptr<Work> allgather(const std::vector<Tensor>& outputs, const Tensor& input) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                       ReduceOp op = ReduceOp::SUM) override;
  std::shared_ptr<Work> barrier() override;

 private:
  std::shared_ptr<Work> done(const char* op, const Tensor& t, int64_t bucket = -1);
  Device device_;
  uint64_t sequence_ = 0;
};

}  // namespace nd::dist
