#pragma once
// MpiProcessGroup: the MPI_COMM_WORLD of this job for CPU tensors (OpenMPI from Debian).
//
// Why one worker thread: every collective is queued and run, in issue order, by the
// group's own thread, so the caller goes on computing (DDP launches a bucket's
// all-reduce and continues backward) and ranks that issue the same sequence match
// without tags. That thread also initialises and finalises MPI and makes every MPI
// call, so MPI_THREAD_SERIALIZED is enough (we ask for MPI_THREAD_MULTIPLE; only the
// watchdog's MPI_Abort may come from another thread). MPI is finalised when the group
// is destroyed (at exit for dist::world()), after the queue has drained.
//
// bf16/f16 reductions run on f32 copies (MPI has no 16-bit float type); AVG is SUM
// followed by a division by the world size (truncating for integer dtypes, whose sum
// is taken in the tensor's own type). Errors are returned, not fatal (also those OpenMPI
// reports on MPI_COMM_WORLD: collectives/mpi_calls.h): Work::wait() rethrows them as
// nd::Error naming the collective, and the group refuses every later collective, since
// MPI left the ranks out of step. With NANODDP_DISTRIBUTED_DEBUG=DETAIL every collective
// is first compared across ranks (collectives/collective_check.h).
// Tests: tests/dist/collectives_test.cpp (at 1, 2 and 4 ranks under mpirun),
// collective_check_test.cpp, mpi_errors_test.cpp (fault cases, tests/CMakeLists.txt).
#include <memory>

#include "collectives/process_group.h"

namespace nd::dist {

class MpiProcessGroup : public ProcessGroup {
 public:
  // Initialises MPI unless the program already did (it must then have asked for at
  // least MPI_THREAD_SERIALIZED); works on a duplicate of MPI_COMM_WORLD.
  MpiProcessGroup();
  ~MpiProcessGroup() override;
  MpiProcessGroup(const MpiProcessGroup&) = delete;
  MpiProcessGroup& operator=(const MpiProcessGroup&) = delete;

  int rank() const override;
  int size() const override;
  std::string backend() const override { return "mpi"; }
  // Rank among the processes on this machine (MPI_COMM_TYPE_SHARED split).
  int local_rank() const;

  std::shared_ptr<Work> allreduce(const Tensor& tensor, const AllreduceOptions& options = {}) override;
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root = 0) override;
  std::shared_ptr<Work> allgather(const std::vector<Tensor>& outputs, const Tensor& input) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                       ReduceOp op = ReduceOp::SUM) override;
  std::shared_ptr<Work> barrier() override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// MPI_Abort(MPI_COMM_WORLD, code) when MPI is initialised and not finalised; else returns.
void mpi_abort_if_initialized(int code);

}  // namespace nd::dist
