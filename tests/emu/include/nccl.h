#pragma once
// Emulator stand-in for <nccl.h>: exactly the calls collectives/nccl_process_group.cpp makes,
// for a world of ONE rank on the emulated devices (include/cuda_runtime.h), so the NCCL
// process group and DDP over it run in CI. At world size 1 every collective is a copy of
// the send buffer into the receive buffer (sum, avg, max, min and prod of one value are the
// value); it runs at once, like every emulated stream operation.
// Checked as NCCL does or stricter: an id that ncclGetUniqueId did not make, nranks != 1
// or rank != 0 (ncclInvalidArgument: more ranks would need other processes), a null or
// destroyed communicator, a root other than 0, a count or type out of range, buffers
// outside the communicator's device memory (cudaMalloc blocks of its device), a stream of
// another device, ncclGroupEnd without ncclGroupStart (ncclInvalidUsage).
// Not emulated: more than one rank, asynchronous errors (ncclCommGetAsyncError always
// reports ncclSuccess), non-blocking communicators, ncclRedOpCreatePreMulSum.
#include <cstring>

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

struct ncclComm {
  int device;
};
typedef ncclComm* ncclComm_t;

namespace emu_nccl {

constexpr char kIdMagic[] = "nanoddp emulated NCCL id";

struct State {
  std::mutex mutex;
  std::set<const ncclComm*> comms;
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

// One rank's collective: recv = send, after the checks.
inline ncclResult_t copy(const char* call, const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                         ncclComm_t comm, cudaStream_t stream) {
  if (!live(comm)) return invalid(call, "null or destroyed communicator");
  const size_t size = type_size(type);
  if (size == 0) return invalid(call, "unknown data type");
  if (root != 0) return invalid(call, "root is not a rank of this one-rank communicator");
  int device = 0;
  if (emu_rt::stream_device(stream, &device) != cudaSuccess) return ncclUnhandledCudaError;
  if (device != comm->device) return invalid(call, "stream of another device than the communicator's");
  if (count == 0) return ncclSuccess;
  const size_t n = count * size;
  if (send == nullptr || recv == nullptr) return invalid(call, "null buffer");
  if (emu_rt::check_device_range(call, send, n, comm->device) != cudaSuccess ||
      emu_rt::check_device_range(call, recv, n, comm->device) != cudaSuccess)
    return invalid(call, "buffer outside the communicator's device memory");
  if (send != recv) std::memmove(recv, send, n);
  std::lock_guard lock(state().mutex);
  ++state().collectives;
  return ncclSuccess;
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
  return ncclSuccess;
}
inline ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (comm == nullptr) return emu_nccl::invalid("ncclCommInitRank", "null communicator pointer");
  if (nranks != 1 || rank != 0) return emu_nccl::invalid("ncclCommInitRank", "only a world of one rank is emulated");
  if (std::memcmp(id.internal, emu_nccl::kIdMagic, sizeof(emu_nccl::kIdMagic)) != 0)
    return emu_nccl::invalid("ncclCommInitRank", "an id ncclGetUniqueId did not make");
  if (emu_rt::device_count() == 0) return ncclUnhandledCudaError;
  auto* c = new ncclComm{emu_rt::current_device};
  std::lock_guard lock(emu_nccl::state().mutex);
  emu_nccl::state().comms.insert(c);
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
  return emu_nccl::copy("ncclAllReduce", send, recv, count, type, 0, comm, stream);
}
inline ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
  return emu_nccl::copy("ncclBroadcast", send, recv, count, type, root, comm, stream);
}
inline ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               int root, ncclComm_t comm, cudaStream_t stream) {
  if (unsigned(op) > ncclAvg) return emu_nccl::invalid("ncclReduce", "unknown reduction");
  return emu_nccl::copy("ncclReduce", send, recv, count, type, root, comm, stream);
}
