#include "collectives/nccl_process_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "collectives/watchdog.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/common.h"

namespace nd::dist {

namespace {

void check_cuda(cudaError_t rc, const std::string& what) {
  if (rc != cudaSuccess) cudaGetLastError();  // not left for the next kernel launch's check
  ND_CHECK(rc == cudaSuccess, what, ": CUDA error: ", cudaGetErrorString(rc));
}
void check_nccl(ncclResult_t rc, const std::string& what) {
  ND_CHECK(rc == ncclSuccess, what, ": NCCL error: ", ncclGetErrorString(rc));
}

// bool travels as bytes (broadcast, allgather); reductions refuse it before we get here.
ncclDataType_t nccl_datatype(ScalarType t) {
  switch (t) {
    case kFloat32: return ncclFloat32;
    case kFloat64: return ncclFloat64;
    case kBFloat16: return ncclBfloat16;
    case kFloat16: return ncclFloat16;
    case kInt64: return ncclInt64;
    case kInt32: return ncclInt32;
    case kUInt8:
    case kBool: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return ncclSum;
    case ReduceOp::AVG: return ncclAvg;
    case ReduceOp::MAX: return ncclMax;
    case ReduceOp::MIN: return ncclMin;
  }
  return ncclSum;
}

// The collective (issued while a CUDA graph captures its device) is only being recorded.
bool recording(int device) {
  return kernels::cuda::capture_active() && kernels::cuda::capture_stream(device) != nullptr;
}

// Completed when the event recorded after the collective on the communication stream is. One
// issued during a CUDA graph capture is part of the graph: wait_on_device() joins the capture
// to it, a host wait is refused, and once the capture ended it counts as completed (each
// replay runs it, and the watchdog watches the replays: State::issue).
class NcclWork : public Work {
 public:
  NcclWork(CollectiveInfo info, int device, ncclComm_t comm, cudaEvent_t done, std::vector<Tensor> tensors)
      : device_(device), comm_(comm), done_(done), tensors_(std::move(tensors)) {
    info_ = std::move(info);
  }
  // A Work dropped before it finished must not hand its tensors back to the caching
  // allocator while NCCL still reads or writes them.
  ~NcclWork() override {
    if (!finished_ && cudaEventSynchronize(done_) != cudaSuccess) cudaGetLastError();
    cudaEventDestroy(done_);
  }
  bool is_completed() override {
    std::lock_guard lock(mutex_);
    return poll();
  }
  std::exception_ptr error() override {
    std::lock_guard lock(mutex_);
    poll();
    return error_;
  }
  void wait() override {
    {
      std::lock_guard lock(mutex_);
      if (!poll() && in_capture_)
        kernels::cuda::refuse_during_capture(
            device_, "wait on the host for " + info_.describe(),
            "the collective is only being recorded; wait_on_device() makes the captured work wait for it");
    }
    for (;;) {
      {
        std::lock_guard lock(mutex_);
        if (poll()) break;
      }
      std::this_thread::yield();
    }
    if (error_) std::rethrow_exception(error_);
  }
  // The tensors stay alive until the collective finished (the watchdog holds this Work
  // until then), and the caching allocator reuses their blocks only for work queued on
  // the compute stream, which now comes after the collective.
  void wait_on_device() override {
    std::lock_guard lock(mutex_);
    if (poll()) {
      if (error_) std::rethrow_exception(error_);
      return;
    }
    check_cuda(cudaStreamWaitEvent(nd::cuda::current_stream(Device(kCUDA, device_)), done_, 0), info_.describe());
  }

 private:
  // requires: mutex_ held. True once finished (successfully or not).
  bool poll() {
    if (finished_) return true;
    const cudaError_t rc = cudaEventQuery(done_);
    if (rc != cudaSuccess) cudaGetLastError();  // not this thread's next launch's error (kernels/cuda check())
    if (rc == cudaErrorCapturedEvent) {
      in_capture_ = true;
      if (recording(device_)) return false;
    } else if (rc == cudaErrorNotReady) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async == ncclSuccess || async == ncclInProgress) return false;
      error_ = std::make_exception_ptr(
          Error(info_.describe() + " failed: NCCL asynchronous error: " + ncclGetErrorString(async)));
    } else if (rc != cudaSuccess) {
      error_ = std::make_exception_ptr(Error(info_.describe() + " failed: CUDA error: " + cudaGetErrorString(rc)));
    }
    finished_ = true;
    tensors_.clear();
    return true;
  }

  std::mutex mutex_;
  int device_;
  ncclComm_t comm_;
  cudaEvent_t done_;
  std::vector<Tensor> tensors_;  // alive until the collective finished
  bool finished_ = false;
  bool in_capture_ = false;  // recorded in a CUDA graph capture
  std::exception_ptr error_;
};

}  // namespace

struct NcclProcessGroup::State {
  int rank = 0, size = 1, device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  Tensor barrier_scratch;  // one f32 on the device, all-reduced by barrier()
  std::mutex mutex;        // issue order = sequence order
  uint64_t sequence = 0;
  std::shared_ptr<Watchdog> watchdog;
  NcclProcessGroup* owner = nullptr;  // keeps the record of issued collectives (DDP's check)

  // Orders the collective after the work queued so far on the engine's compute stream
  // (kernels/cuda/stream.h), runs `launch` on the communication stream, and returns a
  // Work completed by an event after it. During a CUDA graph capture of the device the
  // compute stream is the capture's, so the event forks the communication stream into the
  // capture (wait_on_device joins it back); such a Work is not watched, but every replay of
  // the graph is: one Work completed by an event recorded after the replay, named after the
  // first collective the graph holds for this group.
  std::shared_ptr<Work> issue(CollectiveInfo info, std::vector<Tensor> tensors, std::chrono::milliseconds timeout,
                              const std::function<ncclResult_t()>& launch) {
    std::shared_ptr<Work> work;
    {
      std::lock_guard lock(mutex);
      info.sequence = sequence++;
      owner->note_issued(info);
      const std::string what = info.describe();
      check_cuda(cudaSetDevice(device), what);
      cudaEvent_t ready = nullptr, done = nullptr;
      check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), what);
      check_cuda(cudaEventRecord(ready, nd::cuda::current_stream(Device(kCUDA, device))), what);
      check_cuda(cudaStreamWaitEvent(stream, ready, 0), what);
      cudaEventDestroy(ready);  // released once the recorded work completes
      check_nccl(launch(), what);
      check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), what);
      check_cuda(cudaEventRecord(done, stream), what);
      if (recording(device)) watch_replays(info, timeout);
      work = std::make_shared<NcclWork>(std::move(info), device, comm, done, std::move(tensors));
    }
    if (!recording(device)) watchdog->watch(work, timeout);
    return work;
  }

  // The collectives this group issued into the graph being captured, which each of its
  // replays watches as one: alive while the graph holds its on_replay callback.
  struct Replayed {
    cudaStream_t capture = nullptr;
    CollectiveInfo first;
    size_t count = 0;
  };
  std::weak_ptr<Replayed> replayed;

  void watch_replays(const CollectiveInfo& info, std::chrono::milliseconds timeout) {
    const cudaStream_t capture = kernels::cuda::capture_stream(device);
    if (auto r = replayed.lock(); r && r->capture == capture) {
      ++r->count;
      return;
    }
    auto r = std::make_shared<Replayed>(Replayed{capture, info, 1});
    replayed = r;
    std::weak_ptr<Watchdog> weak = watchdog;
    kernels::cuda::on_replay(device, [weak, r, timeout, device = device, comm = comm](cudaStream_t stream) {
      const std::shared_ptr<Watchdog> w = weak.lock();
      if (!w) return;
      CollectiveInfo named = r->first;
      const std::string what = !named.purpose.empty() ? named.purpose + ", "
                               : named.bucket >= 0    ? "bucket " + std::to_string(named.bucket) + ", "
                                                      : std::string();
      named.purpose = what + "the first of " + std::to_string(r->count) + " collective(s) in a CUDA graph replay";
      const std::string description = named.describe();
      cudaEvent_t done = nullptr;
      check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), description);
      check_cuda(cudaEventRecord(done, stream), description);
      w->watch(std::make_shared<NcclWork>(std::move(named), device, comm, done, std::vector<Tensor>{}), timeout);
    });
  }
};

std::shared_ptr<NcclProcessGroup> NcclProcessGroup::create(const std::shared_ptr<ProcessGroup>& bootstrap,
                                                           int local_rank) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    throw Error("dist::nccl_world(): no CUDA device is available on rank " + std::to_string(bootstrap->rank()));
  auto state = std::make_unique<State>();
  state->rank = bootstrap->rank();
  state->size = bootstrap->size();
  state->device = local_rank % count;
  check_cuda(cudaSetDevice(state->device), "nccl_world");

  ncclUniqueId id;
  if (state->rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  Tensor id_bytes = empty({static_cast<int64_t>(sizeof(id))}, kUInt8);
  std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
  bootstrap->broadcast(id_bytes, 0)->wait();
  std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));
  check_nccl(ncclCommInitRank(&state->comm, state->size, id, state->rank), "ncclCommInitRank");
  state->stream = nd::cuda::comm_stream(Device(kCUDA, state->device));
  state->barrier_scratch = empty({1}, TensorOptions(kFloat32).device(Device(kCUDA, state->device)));
  check_cuda(cudaMemset(state->barrier_scratch.data_ptr(), 0, sizeof(float)), "nccl_world: barrier scratch");
  ncclComm_t comm = state->comm;
  state->watchdog = std::make_shared<Watchdog>(state->rank, [comm](const std::string& message) {
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
    ncclCommAbort(comm);  // unblocks the GPU before the job goes down
    abort_job(1);
  });
  return std::shared_ptr<NcclProcessGroup>(new NcclProcessGroup(std::move(state)));
}

NcclProcessGroup::NcclProcessGroup(std::unique_ptr<State> state) : state_(std::move(state)) { state_->owner = this; }

NcclProcessGroup::~NcclProcessGroup() {
  cudaSetDevice(state_->device);
  cudaStreamSynchronize(state_->stream);
  state_->watchdog.reset();
  state_->barrier_scratch = Tensor();
  ncclCommDestroy(state_->comm);  // the communication stream belongs to kernels/cuda/stream
}

int NcclProcessGroup::rank() const { return state_->rank; }
int NcclProcessGroup::size() const { return state_->size; }
int NcclProcessGroup::device() const { return state_->device; }

std::shared_ptr<Work> NcclProcessGroup::allreduce(const Tensor& tensor, const AllreduceOptions& options) {
  const char* op = "allreduce";
  const Device dev(kCUDA, device());
  detail::check_tensor(op, tensor, dev, backend());
  detail::check_reducible(op, tensor);
  ops::bump_version(tensor, op);
  ncclComm_t comm = state_->comm;
  cudaStream_t stream = state_->stream;
  return state_->issue(CollectiveInfo::of(op, tensor, options.bucket), {tensor}, timeout(), [&] {
    return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), nccl_datatype(tensor.dtype()),
                         nccl_op(options.op), comm, stream);
  });
}

std::shared_ptr<Work> NcclProcessGroup::broadcast(const Tensor& tensor, int root) {
  const char* op = "broadcast";
  detail::check_tensor(op, tensor, Device(kCUDA, device()), backend());
  ND_CHECK(root >= 0 && root < size(), op, ": root ", root, " is not a rank of this world of size ", size());
  ops::bump_version(tensor, op);
  return state_->issue(CollectiveInfo::of(op, tensor), {tensor}, timeout(), [&] {
    return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), nccl_datatype(tensor.dtype()), root,
                         state_->comm, state_->stream);
  });
}

std::shared_ptr<Work> NcclProcessGroup::allgather(const std::vector<Tensor>& outputs, const Tensor& input) {
  const char* op = "allgather";
  const Device dev(kCUDA, device());
  detail::check_tensor(op, input, dev, backend());
  detail::check_count(op, outputs.size(), size(), "output");
  for (const Tensor& o : outputs) {
    detail::check_tensor(op, o, dev, backend());
    detail::check_same_dtype(op, input, o, "output");
  }
  ND_CHECK(outputs[rank()].numel() == input.numel(), op, ": outputs[", rank(), "] must hold this rank's input of ",
           input.numel(), " elements, found ", outputs[rank()].describe());
  for (const Tensor& o : outputs) ops::bump_version(o, op);
  std::vector<Tensor> keep(outputs);
  keep.push_back(input);
  // Rank r broadcasts its input into everyone's outputs[r]: sizes may differ by rank.
  return state_->issue(CollectiveInfo::of(op, input), std::move(keep), timeout(), [&] {
    ncclGroupStart();
    for (int r = 0; r < size(); ++r) {
      const void* send = r == rank() ? input.data_ptr() : outputs[r].data_ptr();
      ncclBroadcast(send, outputs[r].data_ptr(), outputs[r].numel(), nccl_datatype(input.dtype()), r, state_->comm,
                    state_->stream);
    }
    return ncclGroupEnd();
  });
}

std::shared_ptr<Work> NcclProcessGroup::reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                                       ReduceOp reduce) {
  const char* op = "reduce_scatter";
  const Device dev(kCUDA, device());
  detail::check_tensor(op, output, dev, backend());
  detail::check_reducible(op, output);
  detail::check_count(op, inputs.size(), size(), "input");
  for (const Tensor& in : inputs) {
    detail::check_tensor(op, in, dev, backend());
    detail::check_same_dtype(op, output, in, "input");
  }
  ND_CHECK(inputs[rank()].numel() == output.numel(), op, ": inputs[", rank(), "] must have the output's ",
           output.numel(), " elements, found ", inputs[rank()].describe());
  ops::bump_version(output, op);
  std::vector<Tensor> keep(inputs);
  keep.push_back(output);
  // Chunk r is reduced onto rank r (the other ranks ignore recvbuff; given a valid one anyway).
  return state_->issue(CollectiveInfo::of(op, output), std::move(keep), timeout(), [&] {
    ncclGroupStart();
    for (int r = 0; r < size(); ++r)
      ncclReduce(inputs[r].data_ptr(), r == rank() ? output.data_ptr() : inputs[r].data_ptr(), inputs[r].numel(),
                 nccl_datatype(output.dtype()), nccl_op(reduce), r, state_->comm, state_->stream);
    return ncclGroupEnd();
  });
}

std::shared_ptr<Work> NcclProcessGroup::barrier() {
  const Tensor scratch = state_->barrier_scratch;
  return state_->issue(CollectiveInfo::of("barrier", Tensor()), {scratch}, timeout(), [&] {
    return ncclAllReduce(scratch.data_ptr(), scratch.data_ptr(), 1, ncclFloat32, ncclSum, state_->comm,
                         state_->stream);
  });
}

}  // namespace nd::dist
