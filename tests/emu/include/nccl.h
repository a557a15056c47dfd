#pragma once
// Emulator stand-in for <nccl.h>: exactly the calls collectives/nccl_process_group.cpp makes,
// on the emulated devices (include/cuda_runtime.h), so the NCCL process group and DDP over it
// run in CI. The ranks of a communicator are host threads of this process (each with its own
// current device, usually its own: NANODDP_EMU_DEVICES), joined by the id ncclGetUniqueId made
// (ncclCommInitRank returns once every rank has called it). A collective runs when queued, as
// every emulated stream operation: each rank's call waits until every rank made its call of
// the same number, then computes its own result from all ranks' inputs, reduced in rank order
// (the same bits on every rank). At world size 1 it is a copy of the send buffer into the
// receive buffer. On a stream being captured (emu_graph.h) the collective, checked, becomes a
// node that each replay runs again: every rank replays its own graph, and the collectives pair
// up by their number as eager ones do.
// Checked as NCCL does or stricter: an id that ncclGetUniqueId did not make, a rank outside
// 0..nranks-1 (ncclInvalidArgument), a null or destroyed communicator, a root outside the
// ranks, a count or type out of range, buffers outside the communicator's device memory
// (cudaMalloc blocks of its device), a stream of another device, ncclGroupEnd without
// ncclGroupStart (ncclInvalidUsage); ranks whose calls of one number differ (call, count,
// type, op or root) all get ncclInvalidUsage (NCCL would hang or mix the data); ranks that do
// not all arrive within 60 s get ncclSystemError, with a line on stderr (NCCL would hang).
// Not emulated: asynchronous errors (ncclCommGetAsyncError always reports ncclSuccess),
// non-blocking communicators, ncclRedOpCreatePreMulSum, bf16 and f16 reductions over more
// than one rank (ncclInvalidArgument), overlap of a collective with the host or other streams.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>

#include "cuda_runtime.h"

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

namespace emu_nccl {
// The ranks of one id: where their calls meet.
struct Clique {
  int nranks = 1;
  std::mutex mutex;
  std::condition_variable cv;
  int joined = 0;
  struct Call {  // the calls of one number, one per rank
    std::string name;
    size_t count = 0;
    int type = 0, op = 0, root = 0;
    bool mismatch = false;
    std::vector<std::vector<unsigned char>> inputs;
    int arrived = 0, left = 0;
  };
  std::map<uint64_t, Call> calls;
};
}  // namespace emu_nccl

struct ncclComm {
  int device = 0;
  int rank = 0, nranks = 1;
  std::shared_ptr<emu_nccl::Clique> clique;
  uint64_t calls = 0;  // this rank's collectives so far: the next one's number
};
typedef ncclComm* ncclComm_t;

namespace emu_nccl {

constexpr char kIdMagic[] = "nanoddp emulated NCCL id";
constexpr auto kRendezvous = std::chrono::seconds(60);

struct State {
  std::mutex mutex;
  std::set<const ncclComm*> comms;
  std::map<std::string, std::shared_ptr<Clique>> forming;  // by id, until every rank joined
  long ids = 0;
  long collectives = 0;  // collectives run (tests check > 0)
};
inline State& state() {
  static State* s = new State();
  return *s;
}
inline thread_local int group_depth = 0;

inline ncclResult_t invalid(const char* call, const char* why) {
  std::fprintf(stderr, "EMU: %s: %s\n", call, why);
  return ncclInvalidArgument;
}
inline bool live(ncclComm_t comm) {
  std::lock_guard lock(state().mutex);
  return comm != nullptr && state().comms.count(comm) != 0;
}
inline size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
  }
  return 0;
}
inline long collectives() {
  std::lock_guard lock(state().mutex);
  return state().collectives;
}

template <class T>
void reduce_as(int op, const std::vector<std::vector<unsigned char>>& inputs, size_t count, void* out) {
  std::vector<T> acc(count);
  std::memcpy(acc.data(), inputs[0].data(), count * sizeof(T));
  for (size_t r = 1; r < inputs.size(); ++r) {
    const T* in = reinterpret_cast<const T*>(inputs[r].data());
    for (size_t i = 0; i < count; ++i) {
      switch (op) {
        case ncclSum:
        case ncclAvg: acc[i] = T(acc[i] + in[i]); break;
        case ncclProd: acc[i] = T(acc[i] * in[i]); break;
        case ncclMax: acc[i] = std::max(acc[i], in[i]); break;
        case ncclMin: acc[i] = std::min(acc[i], in[i]); break;
      }
    }
  }
  if (op == ncclAvg)
    for (T& v : acc) v = T(v / T(inputs.size()));
  std::memcpy(out, acc.data(), count * sizeof(T));
}
// The reduction of every rank's input, in rank order, into `out`.
inline void reduce_into(ncclDataType_t type, int op, const std::vector<std::vector<unsigned char>>& inputs,
                        size_t count, void* out) {
  switch (type) {
    case ncclInt8: return reduce_as<int8_t>(op, inputs, count, out);
    case ncclUint8: return reduce_as<uint8_t>(op, inputs, count, out);
    case ncclInt32: return reduce_as<int32_t>(op, inputs, count, out);
    case ncclUint32: return reduce_as<uint32_t>(op, inputs, count, out);
    case ncclInt64: return reduce_as<int64_t>(op, inputs, count, out);
    case ncclUint64: return reduce_as<uint64_t>(op, inputs, count, out);
    case ncclFloat32: return reduce_as<float>(op, inputs, count, out);
    case ncclFloat64: return reduce_as<double>(op, inputs, count, out);
    case ncclFloat16:
    case ncclBfloat16: return;  // refused at the call (see the header)
  }
}

// The collective itself, the checks done: at world size 1 a copy; else this rank's call meets
// the other ranks' of the same number and computes this rank's result.
inline ncclResult_t run(const char* call, const void* send, void* recv, size_t count, ncclDataType_t type, int op,
                        int root, ncclComm_t comm) {
  const size_t n = count * type_size(type);
  const bool reduces = std::strcmp(call, "ncclBroadcast") != 0;
  if (comm->nranks == 1) {
    if (send != recv) std::memmove(recv, send, n);
  } else {
    Clique& c = *comm->clique;
    std::unique_lock lock(c.mutex);
    Clique::Call& k = c.calls[comm->calls++];
    if (k.arrived == 0) {
      k.name = call, k.count = count, k.type = type, k.op = op, k.root = root;
      k.inputs.resize(comm->nranks);
    } else if (k.name != call || k.count != count || k.type != type || (reduces && k.op != op) || k.root != root) {
      k.mismatch = true;
    }
    k.inputs[comm->rank].assign(static_cast<const unsigned char*>(send), static_cast<const unsigned char*>(send) + n);
    ++k.arrived;
    c.cv.notify_all();
    if (!c.cv.wait_for(lock, kRendezvous, [&] { return k.arrived == comm->nranks; })) {
      std::fprintf(stderr, "EMU: %s: %d of %d ranks arrived at collective #%llu within 60 s\n", call, k.arrived,
                   comm->nranks, static_cast<unsigned long long>(comm->calls - 1));
      return ncclSystemError;
    }
    const bool mismatch = k.mismatch;
    if (!mismatch) {
      if (!reduces)
        std::memcpy(recv, k.inputs[root].data(), n);
      else if (std::strcmp(call, "ncclAllReduce") == 0 || comm->rank == root)
        reduce_into(type, op, k.inputs, count, recv);
    }
    if (++k.left == comm->nranks) c.calls.erase(comm->calls - 1);
    if (mismatch) {
      std::fprintf(stderr, "EMU: %s: the ranks' calls of this number differ\n", call);
      return ncclInvalidUsage;
    }
  }
  std::lock_guard lock(state().mutex);
  ++state().collectives;
  return ncclSuccess;
}

// One rank's collective, checked; on a stream being captured it becomes a node of the graph.
inline ncclResult_t collective(const char* call, const void* send, void* recv, size_t count, ncclDataType_t type,
                               int op, int root, ncclComm_t comm, cudaStream_t stream) {
  if (!live(comm)) return invalid(call, "null or destroyed communicator");
  const size_t size = type_size(type);
  if (size == 0) return invalid(call, "unknown data type");
  if (root < 0 || root >= comm->nranks) return invalid(call, "root is not a rank of the communicator");
  if (comm->nranks > 1 && (type == ncclFloat16 || type == ncclBfloat16) && std::strcmp(call, "ncclBroadcast") != 0)
    return invalid(call, "16-bit reductions over several ranks are not emulated");
  int device = 0;
  if (emu_rt::stream_device(stream, &device) != cudaSuccess) return ncclUnhandledCudaError;
  if (device != comm->device) return invalid(call, "stream of another device than the communicator's");
  if (count == 0) return ncclSuccess;
  const size_t n = count * size;
  if (send == nullptr || recv == nullptr) return invalid(call, "null buffer");
  if (emu_rt::check_device_range(call, send, n, comm->device) != cudaSuccess ||
      emu_rt::check_device_range(call, recv, n, comm->device) != cudaSuccess)
    return invalid(call, "buffer outside the communicator's device memory");
  cudaError_t status = cudaSuccess;
  if (emu_rt::captured_call(stream, call, [=] { run(call, send, recv, count, type, op, root, comm); }, &status))
    return status == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
  return run(call, send, recv, count, type, op, root, comm);
}

}  // namespace emu_nccl

inline const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return emu_nccl::invalid("ncclGetUniqueId", "null id");
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, emu_nccl::kIdMagic, sizeof(emu_nccl::kIdMagic));
  std::lock_guard lock(emu_nccl::state().mutex);
  const long number = ++emu_nccl::state().ids;  // each id its own clique
  std::memcpy(id->internal + sizeof(emu_nccl::kIdMagic), &number, sizeof(number));
  return ncclSuccess;
}
// Returns once all `nranks` ranks called it with this id (ncclSystemError after 60 s).
inline ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  using namespace emu_nccl;
  if (comm == nullptr) return invalid("ncclCommInitRank", "null communicator pointer");
  if (nranks < 1 || rank < 0 || rank >= nranks) return invalid("ncclCommInitRank", "rank outside 0..nranks-1");
  if (std::memcmp(id.internal, kIdMagic, sizeof(kIdMagic)) != 0)
    return invalid("ncclCommInitRank", "an id ncclGetUniqueId did not make");
  if (emu_rt::device_count() == 0) return ncclUnhandledCudaError;
  auto* c = new ncclComm();
  c->device = emu_rt::current_device;
  c->rank = rank;
  c->nranks = nranks;
  std::shared_ptr<Clique> clique;
  const std::string key(id.internal, sizeof(id.internal));
  {
    std::lock_guard lock(state().mutex);
    std::shared_ptr<Clique>& forming = state().forming[key];
    if (forming == nullptr) {
      forming = std::make_shared<Clique>();
      forming->nranks = nranks;
    }
    clique = forming;
  }
  if (clique->nranks != nranks) {
    delete c;
    return invalid("ncclCommInitRank", "ranks of one id given different nranks");
  }
  {
    std::unique_lock lock(clique->mutex);
    ++clique->joined;
    clique->cv.notify_all();
    if (!clique->cv.wait_for(lock, kRendezvous, [&] { return clique->joined == nranks; })) {
      std::fprintf(stderr, "EMU: ncclCommInitRank: %d of %d ranks joined within 60 s\n", clique->joined, nranks);
      delete c;
      return ncclSystemError;
    }
  }
  {
    std::lock_guard lock(state().mutex);
    auto it = state().forming.find(key);
    if (it != state().forming.end() && it->second == clique) state().forming.erase(it);
  }
  c->clique = std::move(clique);
  std::lock_guard lock(state().mutex);
  state().comms.insert(c);
  *comm = c;
  return ncclSuccess;
}
inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  std::lock_guard lock(emu_nccl::state().mutex);
  if (comm == nullptr || !emu_nccl::state().comms.erase(comm)) return ncclInvalidArgument;
  delete comm;
  return ncclSuccess;
}
inline ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }
inline ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async) {
  if (async == nullptr || !emu_nccl::live(comm)) return ncclInvalidArgument;
  *async = ncclSuccess;
  return ncclSuccess;
}
inline ncclResult_t ncclGroupStart() {
  ++emu_nccl::group_depth;
  return ncclSuccess;
}
inline ncclResult_t ncclGroupEnd() {
  if (emu_nccl::group_depth == 0) return ncclInvalidUsage;
  --emu_nccl::group_depth;
  return ncclSuccess;
}
inline ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                  ncclComm_t comm, cudaStream_t stream) {
  if (unsigned(op) > ncclAvg) return emu_nccl::invalid("ncclAllReduce", "unknown reduction");
  return emu_nccl::collective("ncclAllReduce", send, recv, count, type, op, 0, comm, stream);
}
inline ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
  return emu_nccl::collective("ncclBroadcast", send, recv, count, type, 0, root, comm, stream);
}
inline ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               int root, ncclComm_t comm, cudaStream_t stream) {
  if (unsigned(op) > ncclAvg) return emu_nccl::invalid("ncclReduce", "unknown reduction");
  return emu_nccl::collective("ncclReduce", send, recv, count, type, op, root, comm, stream);
}
