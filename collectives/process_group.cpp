#include "collectives/process_group.h"

#include <atomic>
#include <cstdlib>
#include <sstream>

#include "collectives/local_process_group.h"
#include "engine/error.h"
#ifdef NANODDP_WITH_MPI
#include "collectives/mpi_process_group.h"
#endif
#ifdef NANODDP_WITH_NCCL
#include "collectives/nccl_process_group.h"
#endif

namespace nd::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::MIN: return "MIN";
  }
  return "?";
}

std::string CollectiveInfo::describe() const {
  std::ostringstream os;
  os << op << " #" << sequence;
  if (op == "barrier") return os.str();
  os << " (";
  if (bucket >= 0) os << "bucket " << bucket << ", ";
  os << numel << " x " << dtype_name(dtype) << ")";
  return os.str();
}

AsyncWork::AsyncWork(CollectiveInfo info) { info_ = std::move(info); }

namespace {
std::atomic<int> g_blocked_waiters{0};
}

int AsyncWork::blocked_waiters() { return g_blocked_waiters.load(std::memory_order_relaxed); }

void AsyncWork::wait() {
  std::unique_lock lock(mutex_);
  if (!done_) {
    g_blocked_waiters.fetch_add(1, std::memory_order_relaxed);
    done_cv_.wait(lock, [&] { return done_; });
    g_blocked_waiters.fetch_sub(1, std::memory_order_relaxed);
  }
  if (error_) std::rethrow_exception(error_);
}

bool AsyncWork::is_completed() {
  std::lock_guard lock(mutex_);
  return done_;
}

std::exception_ptr AsyncWork::error() {
  std::lock_guard lock(mutex_);
  return error_;
}

void AsyncWork::mark_done(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  done_cv_.notify_all();
}

std::chrono::milliseconds ProcessGroup::default_timeout() {
  const char* env = std::getenv("NANODDP_COLLECTIVE_TIMEOUT_S");
  if (!env || !*env) return std::chrono::minutes(5);
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  ND_CHECK(end != env && *end == '\0' && seconds > 0, "NANODDP_COLLECTIVE_TIMEOUT_S: expected a positive number of "
           "seconds, found '", env, "'");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

std::shared_ptr<ProcessGroup> world() {
#ifdef NANODDP_WITH_MPI
  static const std::shared_ptr<ProcessGroup> group = std::make_shared<MpiProcessGroup>();
#else
  static const std::shared_ptr<ProcessGroup> group = std::make_shared<LocalProcessGroup>();
#endif
  return group;
}

std::shared_ptr<ProcessGroup> nccl_world() {
#ifdef NANODDP_WITH_NCCL
  static const std::shared_ptr<ProcessGroup> group = NcclProcessGroup::create(world(), local_rank());
  return group;
#else
  throw Error("dist::nccl_world(): nanoddp was built without NCCL (needs a CUDA build with nccl.h and libnccl "
              "found at configure time); use dist::world() with CPU tensors");
#endif
}

std::shared_ptr<ProcessGroup> default_group(const Device& device) {
  if (device.is_cpu()) return world();
  return world()->size() == 1 ? nullptr : nccl_world();
}

int local_rank() {
#ifdef NANODDP_WITH_MPI
  return static_cast<MpiProcessGroup&>(*world()).local_rank();
#else
  return 0;
#endif
}

void abort_job(int exit_code) {
#ifdef NANODDP_WITH_MPI
  mpi_abort_if_initialized(exit_code);
#endif
  (void)exit_code;
  std::abort();
}

namespace detail {

void check_tensor(const char* op, const Tensor& t, const Device& device, const std::string& backend) {
  ND_CHECK(t.defined(), op, ": expected a defined tensor, found an undefined one");
  if (t.device() != device) {
    const char* hint = device.is_cpu() ? " (CUDA tensors go through dist::nccl_world())"
                                       : " (CPU tensors go through dist::world())";
    throw Error(nd::detail::str_cat(op, ": the ", backend, " process group expects tensors on ", device.str(),
                                ", found ", t.describe(), hint));
  }
  ND_CHECK(t.is_contiguous(), op, ": expected a contiguous tensor, found ", t.describe(),
           " with strides ", shape_str(t.strides()), "; pass t.contiguous() and copy the result back after wait()");
}

void check_reducible(const char* op, const Tensor& t) {
  ND_CHECK(t.dtype() != kBool, op, ": bool tensors cannot be reduced, found ", t.describe(),
           "; convert to u8 (MAX = any, MIN = all)");
}

void check_same_dtype(const char* op, const Tensor& first, const Tensor& t, const char* what) {
  ND_CHECK(t.dtype() == first.dtype(), op, ": expected every ", what, " to be ", dtype_name(first.dtype()),
           " like ", first.describe(), ", found ", t.describe());
}

void check_count(const char* op, size_t count, int world_size, const char* what) {
  ND_CHECK(count == static_cast<size_t>(world_size), op, ": expected one ", what, " per rank (", world_size,
           "), found ", count);
}

}  // namespace detail
}  // namespace nd::dist
