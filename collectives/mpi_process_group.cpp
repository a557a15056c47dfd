#include "collectives/mpi_process_group.h"

#include <mpi.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <thread>

#include "collectives/collective_check.h"
#include "collectives/mpi_calls.h"
#include "collectives/watchdog.h"
#include "engine/error.h"
#include "engine/ops/common.h"

namespace nd::dist {

namespace {
const Device kHost(kCPU);
}  // namespace

struct MpiProcessGroup::State {
  struct Task {
    std::shared_ptr<AsyncWork> work;
    std::function<void(const CollectiveInfo&)> body;
    CollectiveSignature signature;  // compared across ranks before the body runs (DETAIL)
    std::vector<int64_t> parts;     // allgather, reduce_scatter: the part size expected of each rank
  };

  MpiProcessGroup* owner = nullptr;  // keeps the record of issued collectives
  MPI_Comm comm = MPI_COMM_NULL;
  // The signatures' own communicator, so that the check never pairs with a collective.
  // Made whatever the debug level, so that ranks that disagree on it still agree on the
  // communicators they create.
  MPI_Comm check_comm = MPI_COMM_NULL;
  DebugLevel debug = DebugLevel::OFF;
  int rank = 0, size = 1, local_rank = 0;
  bool initialized_here = false;
  // The first failure of an MPI call on this group (worker thread only). MPI left the
  // ranks out of step (a peer may still wait for data), so later collectives are refused.
  std::string broken;

  std::mutex mutex;  // guards queue, stop, sequence
  std::condition_variable wake;
  std::deque<Task> queue;
  bool stop = false;
  uint64_t sequence = 0;
  std::promise<void> started;  // MPI is up (or failed to start)
  std::thread worker;
  std::unique_ptr<Watchdog> watchdog;

  void run() {
    this_thread_checks_mpi_errors();
    try {
      start_mpi();
      started.set_value();
    } catch (...) {
      started.set_exception(std::current_exception());
      return;
    }
    for (;;) {
      Task task;
      {
        std::unique_lock lock(mutex);
        wake.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) break;  // stop requested and everything issued has run
        task = std::move(queue.front());
        queue.pop_front();
      }
      std::exception_ptr error;
      try {
        execute(task);
      } catch (...) {
        error = std::current_exception();
      }
      task.body = nullptr;  // releases the tensors it captured
      task.work->mark_done(error);
    }
    MPI_Comm_free(&check_comm);
    MPI_Comm_free(&comm);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (initialized_here && !finalized) MPI_Finalize();
  }

  void execute(const Task& task) {
    const CollectiveInfo& info = task.work->info();
    if (!broken.empty())
      throw Error(nd::detail::str_cat(info.describe(), " was not run: an earlier collective of this group failed and "
                                      "left the ranks out of step; the group cannot be used any more. The failure: ",
                                      broken));
    std::string mismatch;
    try {
      if (debug == DebugLevel::DETAIL) mismatch = check_across_ranks(task);
      if (mismatch.empty()) task.body(info);
    } catch (const std::exception& e) {
      broken = e.what();
      throw;
    }
    // Every rank found the same mismatch and none ran the collective: the group is still in step.
    if (!mismatch.empty()) throw Error(mismatch);
  }

  std::string check_across_ranks(const Task& task) {
    const CollectiveInfo& info = task.work->info();
    std::vector<CollectiveSignature> all(size);
    MPI_Request request;
    const char* call = "MPI_Iallgather of the collectives' signatures (NANODDP_DISTRIBUTED_DEBUG=DETAIL)";
    check_mpi(MPI_Iallgather(&task.signature, 6, MPI_INT64_T, all.data(), 6, MPI_INT64_T, check_comm, &request), info,
              call);
    complete(request, info, call);
    return check_signatures(all, rank, info, task.parts);
  }

  void start_mpi() {
    int initialized = 0, provided = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      initialized_here = true;
    } else {
      MPI_Query_thread(&provided);
    }
    ND_CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI process group: MPI provides thread level ", provided,
             ", needs at least MPI_THREAD_SERIALIZED (collectives run on a worker thread); initialise MPI with "
             "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let nanoddp do it");
    install_world_error_handler();
    const auto check = [](int rc, const char* call) {
      ND_CHECK(rc == MPI_SUCCESS, "MPI process group: ", call, " failed: ", mpi_error_text(rc));
    };
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_dup(comm, &check_comm), "MPI_Comm_dup");
    check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
    check(MPI_Comm_size(comm, &size), "MPI_Comm_size");
    MPI_Comm local = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local), "MPI_Comm_split_type");
    check(MPI_Comm_rank(local, &local_rank), "MPI_Comm_rank");
    check(MPI_Comm_free(&local), "MPI_Comm_free");
  }

  // `root_or_op` and `parts` complete the collective's CollectiveSignature.
  std::shared_ptr<Work> enqueue(CollectiveInfo info, std::chrono::milliseconds timeout,
                                std::function<void(const CollectiveInfo&)> body, int64_t root_or_op = -1,
                                std::vector<int64_t> parts = {}) {
    std::shared_ptr<AsyncWork> work;
    {
      std::lock_guard lock(mutex);
      info.sequence = sequence++;
      owner->note_issued(info);
      const CollectiveSignature signature = make_signature(info, rank, root_or_op, parts);
      work = std::make_shared<AsyncWork>(std::move(info));
      queue.push_back({work, std::move(body), signature, std::move(parts)});
    }
    wake.notify_one();
    watchdog->watch(work, timeout);
    return work;
  }
};

MpiProcessGroup::MpiProcessGroup() : state_(std::make_unique<State>()) {
  state_->owner = this;
  state_->debug = debug_level();
  if (state_->debug == DebugLevel::DETAIL) enable_optimizer_check();
  std::future<void> started = state_->started.get_future();
  state_->worker = std::thread([state = state_.get()] { state->run(); });
  try {
    started.get();
  } catch (...) {
    state_->worker.join();
    throw;
  }
  state_->watchdog = std::make_unique<Watchdog>(state_->rank);
}

MpiProcessGroup::~MpiProcessGroup() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_one();
  state_->worker.join();  // a collective stuck here is reported by the still running watchdog
}

int MpiProcessGroup::rank() const { return state_->rank; }
int MpiProcessGroup::size() const { return state_->size; }
int MpiProcessGroup::local_rank() const { return state_->local_rank; }

std::shared_ptr<Work> MpiProcessGroup::allreduce(const Tensor& tensor, const AllreduceOptions& options) {
  const char* op = "allreduce";
  detail::check_tensor(op, tensor, kHost, backend());
  detail::check_reducible(op, tensor);
  const int count = int_count(op, tensor.numel());
  ops::bump_version(tensor, op);
  const int world_size = size();
  return state_->enqueue(CollectiveInfo::of(op, tensor, options.bucket), timeout(),
                         [tensor, count, world_size, reduce = options.op, this](const CollectiveInfo& info) {
    const ScalarType t = tensor.dtype();
    if (is_16bit_float(t)) {
      // The bytes of a 16-bit all-reduce, the rounding of reducing f32 copies (once, at the
      // end): each rank sends every rank its share of the 16-bit words, reduces its own share in
      // f32 in rank order (reduce_16bit), and the rounded shares are gathered.
      const int me = state_->rank;
      std::vector<int> share(world_size), at(world_size), mine(world_size), from(world_size);
      for (int r = 0; r < world_size; ++r) {
        share[r] = count / world_size + (r < count % world_size ? 1 : 0);
        at[r] = r == 0 ? 0 : at[r - 1] + share[r - 1];
      }
      for (int r = 0; r < world_size; ++r) mine[r] = share[me], from[r] = r * share[me];
      std::vector<uint16_t> runs(static_cast<size_t>(share[me]) * world_size);
      const MPI_Datatype word = mpi_datatype(t);
      MPI_Request request;
      check_mpi(MPI_Ialltoallv(tensor.data_ptr(), share.data(), at.data(), word, runs.data(), mine.data(), from.data(),
                               word, state_->comm, &request),
                info, "MPI_Ialltoallv");
      complete(request, info, "MPI_Ialltoallv");
      reduce_16bit(runs.data(), world_size, share[me], t, reduce, static_cast<uint16_t*>(tensor.data_ptr()) + at[me]);
      check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, tensor.data_ptr(), share.data(), at.data(), word,
                                state_->comm, &request),
                info, "MPI_Iallgatherv");
      complete(request, info, "MPI_Iallgatherv");
      return;
    }
    MPI_Request request;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, tensor.data_ptr(), count, mpi_datatype(t), mpi_op(reduce), state_->comm,
                             &request),
              info, "MPI_Iallreduce");
    complete(request, info, "MPI_Iallreduce");
    if (reduce == ReduceOp::AVG) divide(tensor.data_ptr(), t, count, world_size);
  }, static_cast<int64_t>(options.op));
}

std::shared_ptr<Work> MpiProcessGroup::broadcast(const Tensor& tensor, int root) {
  const char* op = "broadcast";
  detail::check_tensor(op, tensor, kHost, backend());
  ND_CHECK(root >= 0 && root < size(), op, ": root ", root, " is not a rank of this world of size ", size());
  const int count = int_count(op, tensor.numel());
  ops::bump_version(tensor, op);
  return state_->enqueue(CollectiveInfo::of(op, tensor), timeout(), [tensor, count, root, this](const CollectiveInfo& info) {
    MPI_Request request;
    check_mpi(MPI_Ibcast(tensor.data_ptr(), count, mpi_datatype(tensor.dtype()), root, state_->comm, &request), info,
              "MPI_Ibcast");
    complete(request, info, "MPI_Ibcast");
  }, root);
}

std::shared_ptr<Work> MpiProcessGroup::allgather(const std::vector<Tensor>& outputs, const Tensor& input) {
  const char* op = "allgather";
  detail::check_tensor(op, input, kHost, backend());
  detail::check_count(op, outputs.size(), size(), "output");
  std::vector<int> counts(size()), displs(size());
  int64_t total = 0;
  for (int r = 0; r < size(); ++r) {
    detail::check_tensor(op, outputs[r], kHost, backend());
    detail::check_same_dtype(op, input, outputs[r], "output");
    counts[r] = int_count(op, outputs[r].numel());
    displs[r] = int_count(op, total);
    total += outputs[r].numel();
  }
  int_count(op, total);
  ND_CHECK(outputs[rank()].numel() == input.numel(), op, ": outputs[", rank(), "] must hold this rank's input of ",
           input.numel(), " elements, found ", outputs[rank()].describe());
  for (const Tensor& o : outputs) ops::bump_version(o, op);
  CollectiveInfo info = CollectiveInfo::of(op, input);
  info.numel = total;  // all ranks' inputs together: the same on every rank (CollectiveInfo::numel)
  return state_->enqueue(std::move(info), timeout(),
                         [outputs, input, counts, displs, total, this](const CollectiveInfo& info) {
    const size_t esize = element_size(input.dtype());
    const MPI_Datatype dt = mpi_datatype(input.dtype());
    std::vector<char> gathered(total * esize);
    MPI_Request request;
    check_mpi(MPI_Iallgatherv(input.data_ptr(), static_cast<int>(input.numel()), dt, gathered.data(), counts.data(),
                              displs.data(), dt, state_->comm, &request),
              info, "MPI_Iallgatherv");
    complete(request, info, "MPI_Iallgatherv");
    for (size_t r = 0; r < outputs.size(); ++r)
      std::memcpy(outputs[r].data_ptr(), gathered.data() + displs[r] * esize, counts[r] * esize);
  }, -1, std::vector<int64_t>(counts.begin(), counts.end()));
}

std::shared_ptr<Work> MpiProcessGroup::reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                                      ReduceOp reduce) {
  const char* op = "reduce_scatter";
  detail::check_tensor(op, output, kHost, backend());
  detail::check_reducible(op, output);
  detail::check_count(op, inputs.size(), size(), "input");
  std::vector<int> counts(size());
  int64_t total = 0;
  for (int r = 0; r < size(); ++r) {
    detail::check_tensor(op, inputs[r], kHost, backend());
    detail::check_same_dtype(op, output, inputs[r], "input");
    counts[r] = int_count(op, inputs[r].numel());
    total += inputs[r].numel();
  }
  int_count(op, total);
  ND_CHECK(inputs[rank()].numel() == output.numel(), op, ": inputs[", rank(), "] must have the output's ",
           output.numel(), " elements, found ", inputs[rank()].describe());
  ops::bump_version(output, op);
  const int world_size = size();
  CollectiveInfo info = CollectiveInfo::of(op, output);
  info.numel = total;  // all inputs together: the same on every rank (CollectiveInfo::numel)
  return state_->enqueue(std::move(info), timeout(),
                         [output, inputs, counts, total, world_size, reduce, this](const CollectiveInfo& info) {
    const ScalarType t = output.dtype();
    // Send buffer: the inputs back to back, in the reduced type (f32 for 16-bit floats).
    const bool widened = is_16bit_float(t);
    const size_t esize = widened ? sizeof(float) : element_size(t);
    std::vector<char> send(total * esize), recv(output.numel() * esize);
    size_t at = 0;
    for (const Tensor& in : inputs) {
      if (widened) {
        std::vector<float> w = widen(in.data_ptr(), t, in.numel());
        std::memcpy(send.data() + at, w.data(), w.size() * esize);
      } else {
        std::memcpy(send.data() + at, in.data_ptr(), in.numel() * esize);
      }
      at += in.numel() * esize;
    }
    const MPI_Datatype dt = widened ? MPI_FLOAT : mpi_datatype(t);
    MPI_Request request;
    check_mpi(MPI_Ireduce_scatter(send.data(), recv.data(), counts.data(), dt, mpi_op(reduce), state_->comm, &request),
              info, "MPI_Ireduce_scatter");
    complete(request, info, "MPI_Ireduce_scatter");
    if (reduce == ReduceOp::AVG) divide(recv.data(), widened ? kFloat32 : t, output.numel(), world_size);
    if (widened) {
      std::vector<float> w(output.numel());
      std::memcpy(w.data(), recv.data(), recv.size());
      narrow_into(w, output.data_ptr(), t);
    } else {
      std::memcpy(output.data_ptr(), recv.data(), recv.size());
    }
  }, static_cast<int64_t>(reduce), std::vector<int64_t>(counts.begin(), counts.end()));
}

std::shared_ptr<Work> MpiProcessGroup::barrier() {
  return state_->enqueue(CollectiveInfo::of("barrier", Tensor()), timeout(), [this](const CollectiveInfo& info) {
    MPI_Request request;
    check_mpi(MPI_Ibarrier(state_->comm, &request), info, "MPI_Ibarrier");
    complete(request, info, "MPI_Ibarrier");
  });
}

void mpi_abort_if_initialized(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

}  // namespace nd::dist
