#include "collectives/process_group.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <sstream>

#include "collectives/local_process_group.h"
#include "engine/error.h"
#ifdef NANODDP_WITH_MPI
#include <mpi.h>

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

namespace {
thread_local std::string current_purpose;
}  // namespace

CollectivePurpose::CollectivePurpose(std::string purpose) : previous_(std::move(current_purpose)) {
  current_purpose = std::move(purpose);
}
CollectivePurpose::~CollectivePurpose() { current_purpose = std::move(previous_); }
const std::string& CollectivePurpose::current() { return current_purpose; }

CollectiveInfo CollectiveInfo::of(const char* op, const Tensor& t, int64_t bucket) {
  CollectiveInfo info;
  info.op = op;
  if (t.defined()) {
    info.numel = t.numel();
    info.dtype = t.dtype();
  }
  info.bucket = bucket;
  info.purpose = CollectivePurpose::current();
  return info;
}

std::string CollectiveInfo::describe() const {
  std::ostringstream os;
  os << op << " #" << sequence;
  if (op == "barrier") return purpose.empty() ? os.str() : os.str() + " (" + purpose + ")";
  os << " (";
  if (!purpose.empty())
    os << purpose << ", ";
  else if (bucket >= 0)
    os << "bucket " << bucket << ", ";
  os << numel << " x " << dtype_name(dtype) << ")";
  return os.str();
}

uint64_t CollectiveRecord::collective_hash(const CollectiveInfo& info) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a over the op name, then the sizes
  for (char c : info.op) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;
  h = (h ^ static_cast<uint64_t>(info.numel)) * 0x9E3779B97F4A7C15ull;
  h = (h ^ static_cast<uint64_t>(info.dtype)) * 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

void CollectiveRecord::add(const CollectiveInfo& info) {
  hash = hash * kMultiplier + collective_hash(info);
  last[count % kDepth] = info;
  ++count;
  bytes += static_cast<uint64_t>(info.numel) * element_size(info.dtype);
}

uint64_t CollectiveRecord::hash_since(const CollectiveRecord& earlier) const {
  // hash = earlier.hash * M^k + (the hash of the k later collectives alone).
  uint64_t power = 1, base = kMultiplier;
  for (uint64_t k = count - earlier.count; k; k >>= 1, base *= base)
    if (k & 1) power *= base;
  return hash - earlier.hash * power;
}

std::vector<CollectiveInfo> CollectiveRecord::last_since(const CollectiveRecord& earlier, size_t n) const {
  const uint64_t since = count - earlier.count;
  const uint64_t take = std::min<uint64_t>({n, kDepth, since});
  std::vector<CollectiveInfo> out;
  for (uint64_t i = count - take; i < count; ++i) out.push_back(last[i % kDepth]);
  return out;
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

CollectiveRecord ProcessGroup::record() const {
  std::lock_guard lock(record_mutex_);
  return record_;
}

void ProcessGroup::note_issued(const CollectiveInfo& info) {
  std::lock_guard lock(record_mutex_);
  record_.add(info);
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

std::shared_ptr<ProcessGroup> control_world() {
#ifdef NANODDP_WITH_MPI
  static const std::shared_ptr<ProcessGroup> group = []() -> std::shared_ptr<ProcessGroup> {
    // world() first: MPI is up, and the world group (which finalises MPI) outlives this one.
    std::shared_ptr<ProcessGroup> w = world();
    int provided = 0;
    MPI_Query_thread(&provided);
    if (w->size() == 1 || provided < MPI_THREAD_MULTIPLE) return w;
    auto control = std::make_shared<MpiProcessGroup>();
    control->set_timeout(w->timeout());
    return control;
  }();
  return group;
#else
  return world();
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
