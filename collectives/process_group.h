#pragma once
// Process groups: who talks to whom (docs/distributed.md).
//
// Why it looks like this: DDP must launch a bucket's all-reduce while backward
// goes on, so every collective is asynchronous and returns a Work. Collectives
// of one group run strictly in the order they were issued (one worker thread on
// the MPI backend, one communication stream on NCCL): ranks that issue the same
// sequence therefore match up without tags. Every collective carries a
// CollectiveInfo (op, sequence number, element count, dtype, bucket) that the
// watchdog prints when it is stuck. Each group also keeps a running record of what
// was issued on it (a count, a rolling hash of op, element count and dtype, and the
// last few CollectiveInfo): DDP's per-iteration fingerprint compares the record's
// part since its previous check across ranks, so ranks that diverged get an error
// naming what each one issued instead of a hang or garbage.
#include <array>
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
  // Elements of the tensor; for allgather and reduce_scatter (whose per-rank parts may
  // differ in size) of all ranks' parts together, so that it is the same on every rank.
  int64_t numel = 0;
  ScalarType dtype = kFloat32;
  int64_t bucket = -1;   // DDP bucket index, -1 when not a bucket
  // What the caller issued it for (CollectivePurpose at issue time), for this rank's
  // messages only: "bucket 3 of DDP model 'D'". Not compared across ranks.
  std::string purpose;
  std::string describe() const;  // "allreduce #12 (bucket 3 of DDP model 'D', 262144 x f32)"
  // The info of `op` on tensor t (undefined: no data, as a barrier's) for bucket `bucket`,
  // with this thread's current purpose; the group sets the sequence number when it issues it.
  static CollectiveInfo of(const char* op, const Tensor& t, int64_t bucket = -1);
};

// While one lives on a thread, the collectives that thread issues carry `purpose` in
// their CollectiveInfo, so a stuck one says what it was for ("the per-iteration check of
// DDP model 'D'", "SyncBatchNorm statistics of 'D.main.3'"). Nests; the innermost wins.
class CollectivePurpose {
 public:
  explicit CollectivePurpose(std::string purpose);
  ~CollectivePurpose();
  CollectivePurpose(const CollectivePurpose&) = delete;
  CollectivePurpose& operator=(const CollectivePurpose&) = delete;
  static const std::string& current();  // "" when none

 private:
  std::string previous_;
};

// Handle to an issued collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done; rethrows the collective's error (nd::Error naming it).
  virtual void wait() = 0;
  // For a collective on GPU tensors: the work queued afterwards on the engine's compute
  // stream of its device runs after the collective, and the host does not wait (NCCL:
  // the compute stream waits for the collective's event, as PyTorch's Work.wait() does).
  // A later failure surfaces through error(), wait() or the watchdog. Backends whose
  // collectives run on the host block as wait() does.
  virtual void wait_on_device() { wait(); }
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

// What a group has issued so far: cheap to keep (a few integer operations and one
// CollectiveInfo copy per collective) and to compare across ranks.
struct CollectiveRecord {
  static constexpr size_t kDepth = 4;  // how many of the last collectives are kept
  uint64_t count = 0;  // collectives issued on the group so far
  // Their payload: element count x element size, summed (what bench_ddp reports per step;
  // a ring all-reduce puts about 2 (W - 1) / W times this on each rank's wire).
  uint64_t bytes = 0;
  // Polynomial rolling hash over the issued collectives, in issue order:
  // hash = hash * kMultiplier + collective_hash(info) (mod 2^64), so that the part
  // issued after an earlier snapshot can be isolated (hash_since()).
  uint64_t hash = 0;
  std::array<CollectiveInfo, kDepth> last;  // last[i % kDepth]: the i-th collective issued (i < count)
  static constexpr uint64_t kMultiplier = 0x100000001B3ull;  // odd: multiplication is invertible mod 2^64
  // The hash of one collective: its op, element count and dtype (not the sequence
  // number or bucket, which the count and order already cover).
  static uint64_t collective_hash(const CollectiveInfo& info);
  // Appends one collective.
  void add(const CollectiveInfo& info);
  // The rolling hash of the collectives issued after `earlier` (a snapshot of this record).
  uint64_t hash_since(const CollectiveRecord& earlier) const;
  // The last min(n, kDepth) collectives issued after `earlier`, oldest first.
  std::vector<CollectiveInfo> last_since(const CollectiveRecord& earlier, size_t n) const;
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

  // A snapshot of what this group has issued so far. Kept by the MPI and NCCL backends; a backend
  // that does not call note_issued() reports an empty record (count 0) on every rank,
  // so cross-rank comparisons then see no difference.
  CollectiveRecord record() const;

 protected:
  // Backends call this once per collective, with its sequence number set, in issue
  // order (under the lock that assigns the sequence number).
  void note_issued(const CollectiveInfo& info);
  std::chrono::milliseconds timeout_{default_timeout()};

 private:
  mutable std::mutex record_mutex_;
  CollectiveRecord record_;

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
// A second MPI group over the same processes (its own duplicate of MPI_COMM_WORLD and
// worker thread) that carries only DDP's small control messages (layout check,
// per-iteration fingerprint, bucket order). Kept apart from the data groups so that a
// rank that issued an extra or different collective there cannot derail the check
// that is meant to catch it. world() itself when MPI does not provide
// MPI_THREAD_MULTIPLE (two worker threads call MPI) or without MPI.
std::shared_ptr<ProcessGroup> control_world();
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
