#pragma once
// Process groups: who talks to whom (DESIGN.md "Data parallel").
//
// Why it looks like this: DDP must launch a bucket's all-reduce while backward
// goes on, so every collective is asynchronous and returns a Work. Collectives
// of one group run strictly in the order they were issued (one worker thread on
// the MPI backend, one communication stream on NCCL): ranks that issue the same
// sequence therefore match up without tags. Every collective carries a
// CollectiveInfo (op, sequence number, element count, dtype, bucket) that the
// watchdog prints when it is stuck and the fingerprint check compares across
// ranks, so a hang or a mismatch names what each rank was doing.
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace nd::dist {

enum class ReduceOp { SUM, AVG, MAX, MIN };
const char* reduce_op_name(ReduceOp op);

// What a collective is, for watchdog messages and cross-rank consistency checks.
struct CollectiveInfo {
  std::string op;        // "allreduce", "broadcast", ...
  uint64_t sequence = 0; // position in this group's stream of collectives, from 0
  int64_t numel = 0;
  ScalarType dtype = kFloat32;
  int64_t bucket = -1;   // DDP bucket index, -1 when not a bucket
  std::string describe() const;  // "allreduce #12 (bucket 3, 262144 x f32)"
};

// Handle to an issued collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done; rethrows the collective's error (nd::Error naming it).
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
  // The failure, if the collective failed (null otherwise or while running).
  virtual std::exception_ptr error() = 0;
  const CollectiveInfo& info() const { return info_; }

 protected:
  CollectiveInfo info_;
};

// A Work that a backend completes from its own thread (the MPI worker). The backend
// keeps the tensors alive until the collective has run.
class AsyncWork : public Work {
 public:
  explicit AsyncWork(CollectiveInfo info);
  void wait() override;
  bool is_completed() override;
  std::exception_ptr error() override;
  // Called once by the backend; `error` is an nd::Error naming the collective, or null.
  void mark_done(std::exception_ptr error = nullptr);
  // How many threads of this process are blocked in wait() right now. A backend that
  // polls may spin while this is non-zero: the caller's core is idle.
  static int blocked_waiters();

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

struct AllreduceOptions {
  ReduceOp op = ReduceOp::SUM;
  int64_t bucket = -1;  // recorded in CollectiveInfo
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi", "nccl", "local"

  // In place: every rank's `tensor` becomes the reduction over ranks. requires the
  // same shape and dtype on every rank; tensor contiguous, and (MPI) on the CPU /
  // (NCCL) on this rank's GPU. The tensor must not be touched until wait().
  virtual std::shared_ptr<Work> allreduce(const Tensor& tensor, const AllreduceOptions& options = {}) = 0;
  // In place: every rank's tensor becomes root's.
  virtual std::shared_ptr<Work> broadcast(const Tensor& tensor, int root = 0) = 0;
  // outputs[r] receives rank r's input. Sizes may differ by rank (outputs[r] must be
  // sized as rank r's input).
  virtual std::shared_ptr<Work> allgather(const std::vector<Tensor>& outputs, const Tensor& input) = 0;
  // output = reduction over ranks of inputs[this rank]; inputs.size() == size().
  virtual std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                               ReduceOp op = ReduceOp::SUM) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;

  // A collective not completed within the timeout makes the watchdog print what this
  // rank waits in (CollectiveInfo::describe()) and abort the whole job.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 protected:
  std::chrono::milliseconds timeout_{default_timeout()};

 public:
  // 5 minutes, or NANODDP_COLLECTIVE_TIMEOUT_S from the environment.
  static std::chrono::milliseconds default_timeout();
};

// The world: MPI when built with it (a lone process is rank 0 of 1, no launcher
// needed), else a single-process group. Created on first use; reused after.
std::shared_ptr<ProcessGroup> world();
// The process group for CUDA tensors on this rank's GPU (NCCL; its unique id is
// broadcast over the MPI world). Throws nd::Error when built without NCCL or no GPU.
std::shared_ptr<ProcessGroup> nccl_world();
// The group that DDP and SyncBatchNorm use by default for tensors on `device`: world() for
// the CPU, nccl_world() for a GPU; null for a GPU in a world of one process, where there
// is nothing to communicate (and no NCCL is needed).
std::shared_ptr<ProcessGroup> default_group(const Device& device);
// This rank's index among the ranks on its machine (MPI's shared-memory split): the GPU to use.
int local_rank();
inline int get_rank() { return world()->rank(); }
inline int get_world_size() { return world()->size(); }

// Ends every process of the job: MPI_Abort(MPI_COMM_WORLD) when MPI is running, else
// std::abort(). The watchdog's last resort.
[[noreturn]] void abort_job(int exit_code = 1);

// Argument checks shared by the backends; each throws an nd::Error naming the collective.
namespace detail {
// Defined, contiguous, on `device` ("use dist::nccl_world()" hints for the wrong device).
void check_tensor(const char* op, const Tensor& t, const Device& device, const std::string& backend);
// Reductions: a dtype the backends reduce (not bool).
void check_reducible(const char* op, const Tensor& t);
// Same dtype as `first`.
void check_same_dtype(const char* op, const Tensor& first, const Tensor& t, const char* what);
// `count` tensors are needed, one per rank.
void check_count(const char* op, size_t count, int world_size, const char* what);
}  // namespace detail

}  // namespace nd::dist
