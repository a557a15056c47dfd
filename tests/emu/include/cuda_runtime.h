#pragma once
// Emulator stand-in for <cuda_runtime.h>: exactly the runtime calls nanoddp makes
// (kernels/cuda/*.cu and *.cpp, collectives/nccl_process_group.cpp), on host memory, at
// once. See emu_core.h for the kernels and tests/emu/README.md for what this can and cannot
// see.
//
// - Devices: NANODDP_EMU_DEVICES (read once; default 1, 0 = no device) H100-like devices,
//   132 SMs, 227 KiB of opt-in shared memory. The current device is per host thread.
// - Memory: cudaMalloc/cudaHostAlloc are aligned host allocations (256 bytes), cudaMalloc's
//   filled with 0xff bytes (NaN: device memory starts uninitialised), each recorded with its
//   device; calls are counted (emu_rt::stats) and a per-device limit
//   (emu_rt::set_device_memory_limit) makes cudaMalloc fail with cudaErrorMemoryAllocation.
// - Streams and events: everything runs when it is queued, so an event is complete once
//   recorded and synchronisation never waits, unless a test holds events
//   (emu_rt::set_hold_events): then an event recorded meanwhile reports cudaErrorNotReady
//   to cudaEventQuery until cudaEventSynchronize waits for it or emu_rt::complete_events()
//   lets the "GPU" catch up, so code that must wait for a copy can be seen waiting, or not.
//   emu_rt::fault_launch makes a launch fault as a kernel that reads out of bounds does
//   (reported later, by a synchronize or after the next launch); emu_rt::record_trace keeps
//   the stream of every copy, launch and event record or wait, so that the order the host
//   asks for can be checked where nothing here can race.
//   What is checked is what CUDA rejects: a
//   destroyed or unknown stream/event (cudaErrorInvalidResourceHandle), an event recorded
//   on a stream of another device, a kernel launched on a stream of a device that is not
//   current (cudaErrorInvalidResourceHandle at the next cudaGetLastError, kernel not run).
// - Pointer checks (emu_rt::check_pointers, on unless the per-kernel tests turn them off:
//   they pass plain host memory as device memory): a copy's or memset's device range must
//   lie inside one cudaMalloc block (of the named device for cudaMemcpyPeerAsync), its host
//   side outside every one; otherwise cudaErrorInvalidValue, with a line on stderr. CUDA
//   itself would often accept a wrong direction through unified addressing, or crash.
// - Errors return the code and set the thread's last error (cudaGetLastError clears it).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "emu_core.h"

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureMerge = 902,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorCapturedEvent = 907,
  cudaErrorStreamCaptureWrongThread = 908,
};
typedef cudaError cudaError_t;

struct CUstream_st {
  int device;
};
typedef CUstream_st* cudaStream_t;
struct CUevent_st {
  int device;
  bool pending = false;   // recorded while emu_rt::set_hold_events(true), not yet completed
  bool recorded = false;  // ever recorded (before that it stands for no work at all)
  bool captured = false;  // last recorded on a stream being captured (emu_graph.h)
  uint64_t capture = 0;   // captured: the capture's id; frontier: the nodes it stands for
  std::vector<size_t> frontier;
};
typedef CUevent_st* cudaEvent_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2;
constexpr unsigned cudaEventWaitDefault = 0, cudaEventWaitExternal = 1;
constexpr unsigned cudaHostAllocDefault = 0, cudaHostAllocPortable = 1;
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2
};

namespace emu_rt {

constexpr int kMaxDynamicSharedBytes = 232448;  // 227 KiB

struct Stats {
  long mallocs = 0, frees = 0, host_allocs = 0, host_frees = 0;
  long memcpys = 0, memsets = 0, event_records = 0, event_waits = 0, stream_waits = 0;
  long host_waits = 0;  // the host blocked on the device: stream, device or event synchronize
  long func_attributes = 0;  // cudaFuncSetAttribute calls
  long graph_launches = 0;   // cudaGraphLaunch calls
};

// One operation on a stream, as record_trace keeps them: a copy or memset (kernel empty, dst
// its device destination), a kernel launch (its name as written at the launch), an event
// recorded on a stream or waited for by one (event set).
struct TraceEntry {
  const CUstream_st* stream;
  std::string kernel;
  const void* dst = nullptr;
  const CUevent_st* event = nullptr;
  bool event_wait = false;
};

struct Block {
  size_t size = 0;
  int device = -1;  // -1: pinned host memory
};

// Stream capture (emu_graph.h): an operation queued on a stream being captured becomes a node
// of the capture's graph, its arguments copied, instead of running; cudaGraphLaunch runs the
// nodes in order (the order they were queued in, which every dependency respects).
struct GraphNode {
  // kHost: a library call that runs on the host in the emulator (an NCCL collective, nccl.h)
  enum Kind { kKernel, kCopy, kMemset, kEventRecord, kHost } kind = kKernel;
  std::string name;  // the kernel, as written at its launch (kHost: the call)
  dim3 grid, block;
  size_t smem = 0;
  std::function<void()> kernel;  // the kernel with its arguments copied at the launch (kHost: the call)
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  int value = 0;
  CUevent_st* event = nullptr;
  std::vector<size_t> deps;  // the nodes it waits for: its stream's previous one, joined events'
};
// One capture sequence: its origin stream (where it began and must end) and every stream
// forked into it through an event, each with its frontier (the nodes its next node depends on).
struct Capture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  bool invalidated = false;
  std::vector<GraphNode> nodes;
  uint64_t id = 0;
  const CUstream_st* origin = nullptr;
  std::map<const CUstream_st*, std::vector<size_t>> frontier;
};

struct State {
  std::mutex mutex;
  std::map<const char*, Block> blocks;  // by base address
  std::set<const CUstream_st*> streams;
  std::set<const CUevent_st*> events;
  std::vector<size_t> used, limit;
  Stats stats;
  bool hold_events = false;
  std::string fault_kernel;                  // fault_launch's kernel (a part of its name), or empty
  cudaError_t fault = cudaSuccess;           // what it faults with
  cudaError_t pending_fault = cudaSuccess;   // a fault not yet reported
  bool trace = false;                        // record_trace: the stream of each copy and launch
  std::vector<TraceEntry> traced;
  // Streams being captured, each to its capture (a fork shares its origin's).
  std::map<const CUstream_st*, std::shared_ptr<Capture>> captures;
  uint64_t next_capture = 1;
};
inline State& state() {
  static State* s = new State();  // never destroyed: freed from static destructors too
  return *s;
}

inline bool check_pointers = true;
inline constexpr size_t kRedZone = 256;  // around each cudaMalloc block
inline thread_local int current_device = 0;
inline thread_local cudaError_t last_error = cudaSuccess;
inline thread_local cudaStreamCaptureMode thread_capture_mode = cudaStreamCaptureModeGlobal;

inline int device_count() {
  static const int n = [] {
    const char* env = std::getenv("NANODDP_EMU_DEVICES");
    if (env == nullptr || *env == '\0') return 1;
    const int v = std::atoi(env);
    if (v < 0 || v > 16) emu_die("NANODDP_EMU_DEVICES must be 0..16");
    return v;
  }();
  return n;
}

inline cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}
inline cudaError_t reject(cudaError_t e, const char* call, const char* why, const void* p, size_t n) {
  std::fprintf(stderr, "EMU: %s: %s (pointer %p, %zu bytes)\n", call, why, p, n);
  return fail(e);
}

inline Stats stats() {
  std::lock_guard lock(state().mutex);
  return state().stats;
}
// Bytes currently held by cudaMalloc on `device`, and a limit past which cudaMalloc fails
// (SIZE_MAX: none, the default).
inline size_t device_bytes_in_use(int device) {
  std::lock_guard lock(state().mutex);
  return size_t(device) < state().used.size() ? state().used[device] : 0;
}
inline void set_device_memory_limit(int device, size_t bytes) {
  std::lock_guard lock(state().mutex);
  State& s = state();
  if (s.limit.size() <= size_t(device)) s.limit.resize(device + 1, SIZE_MAX);
  s.limit[device] = bytes;
}

// The block holding [p, p + n), or null. Caller holds the mutex.
inline const Block* find_block(const void* p, size_t n) {
  State& s = state();
  const char* c = static_cast<const char*>(p);
  auto it = s.blocks.upper_bound(c);
  if (it == s.blocks.begin()) return nullptr;
  --it;
  if (c < it->first || c + n > it->first + it->second.size) return nullptr;
  return &it->second;
}
inline bool overlaps_device_block(const void* p, size_t n) {
  State& s = state();
  const char* c = static_cast<const char*>(p);
  auto it = s.blocks.lower_bound(c + n);  // first block starting at or after the end
  while (it != s.blocks.begin()) {
    --it;
    if (it->first + it->second.size <= c) return false;
    if (it->second.device >= 0) return true;
  }
  return false;
}
// The device range [p, p + n) lies inside one cudaMalloc block (of `device` unless -1).
inline cudaError_t check_device_range(const char* call, const void* p, size_t n, int device = -1) {
  if (!check_pointers) return cudaSuccess;
  std::lock_guard lock(state().mutex);
  const Block* b = find_block(p, n);
  if (b == nullptr || b->device < 0) return reject(cudaErrorInvalidValue, call, "device range outside every cudaMalloc block", p, n);
  if (device >= 0 && b->device != device)
    return reject(cudaErrorInvalidValue, call, "device memory of another device", p, n);
  return cudaSuccess;
}
inline cudaError_t check_host_range(const char* call, const void* p, size_t n) {
  if (!check_pointers) return cudaSuccess;
  std::lock_guard lock(state().mutex);
  if (overlaps_device_block(p, n)) return reject(cudaErrorInvalidValue, call, "host range overlaps device memory", p, n);
  return cudaSuccess;
}
// A stream is the null (legacy default) stream or one created and not destroyed; its device.
inline cudaError_t stream_device(cudaStream_t stream, int* device) {
  if (stream == nullptr) {
    *device = current_device;
    return cudaSuccess;
  }
  std::lock_guard lock(state().mutex);
  if (!state().streams.count(stream)) return fail(cudaErrorInvalidResourceHandle);
  *device = stream->device;
  return cudaSuccess;
}
inline cudaError_t check_event(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard lock(state().mutex);
  return state().events.count(event) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
// While held, events recorded stay pending (see the header comment).
inline void set_hold_events(bool hold) {
  std::lock_guard lock(state().mutex);
  state().hold_events = hold;
}
// Every pending event completes, as when the GPU has run all queued work.
inline void complete_events() {
  std::lock_guard lock(state().mutex);
  for (const CUevent_st* e : state().events) const_cast<CUevent_st*>(e)->pending = false;
}

// The next launch of a kernel whose name (as written at the launch) contains `kernel` faults
// with `error`, as a kernel that reads out of bounds does on a GPU: it does not run, its
// launch succeeds, and the fault is reported later, by the next synchronising call (stream,
// device or event synchronize) or, failing that, as the last error after the next launch
// (which the engine then blames). Reported once (on a GPU it stays: the context is lost).
inline void fault_launch(const char* kernel, cudaError_t error = cudaErrorIllegalAddress) {
  std::lock_guard lock(state().mutex);
  state().fault_kernel = kernel;
  state().fault = error;
}
// A pending fault, once: what a synchronising call returns. Caller holds the mutex.
inline cudaError_t take_fault() {
  const cudaError_t e = state().pending_fault;
  state().pending_fault = cudaSuccess;
  return e;
}

// While on, every copy, memset, launch and event record or wait is kept, in order, with its
// stream (trace(); clear_trace() empties it). Streams are synchronous here, so work queued
// on two streams cannot be seen racing; the trace shows which stream each piece went to and
// which events order them.
inline void record_trace(bool on) {
  std::lock_guard lock(state().mutex);
  state().trace = on;
}
inline std::vector<TraceEntry> trace() {
  std::lock_guard lock(state().mutex);
  return state().traced;
}
inline void clear_trace() {
  std::lock_guard lock(state().mutex);
  state().traced.clear();
}
// Caller holds the mutex.
inline void traced(TraceEntry e) {
  if (state().trace) state().traced.push_back(std::move(e));
}

// The capture of `stream`, or null. Caller holds the mutex.
inline Capture* capture_of(const CUstream_st* stream) {
  if (stream == nullptr) return nullptr;
  auto it = state().captures.find(stream);
  return it == state().captures.end() ? nullptr : it->second.get();
}
// A "potentially unsafe" call (cudaMalloc, cudaFree, cudaDeviceSynchronize) on this thread
// while a capture forbids it (CUDA's rule: this thread's mode is not relaxed, and a capture
// begun not relaxed by this thread, or begun global by any thread when this thread's mode is
// global): every such capture is invalidated and the call fails with
// cudaErrorStreamCaptureUnsupported. Caller holds the mutex.
inline bool unsafe_call_refused() {
  if (thread_capture_mode == cudaStreamCaptureModeRelaxed) return false;
  bool refused = false;
  for (auto& [stream, c] : state().captures) {
    if (c->mode == cudaStreamCaptureModeRelaxed) continue;
    if (c->thread == std::this_thread::get_id() ||
        (thread_capture_mode == cudaStreamCaptureModeGlobal && c->mode == cudaStreamCaptureModeGlobal)) {
      c->invalidated = true;
      refused = true;
    }
  }
  if (refused) last_error = cudaErrorStreamCaptureUnsupported;
  return refused;
}
// An operation on `stream`: when it is being captured, `node` joins the graph (or, the capture
// being invalidated, the call fails) and the caller returns *status without running it.
// Caller holds the mutex.
inline bool captured(const CUstream_st* stream, GraphNode node, cudaError_t* status) {
  Capture* c = capture_of(stream);
  if (c == nullptr) return false;
  if (c->invalidated) {
    *status = last_error = cudaErrorStreamCaptureInvalidated;
    return true;
  }
  std::vector<size_t>& frontier = c->frontier[stream];
  node.deps = frontier;
  frontier.assign(1, c->nodes.size());
  c->nodes.push_back(std::move(node));
  *status = cudaSuccess;
  return true;
}
// A host-side library call (nccl.h's collectives) queued on `stream`: when the stream is being
// captured, `call` becomes a node that each replay runs, and the caller returns *status.
inline bool captured_call(const CUstream_st* stream, const char* name, std::function<void()> call, cudaError_t* status) {
  std::lock_guard lock(state().mutex);
  GraphNode node;
  node.kind = GraphNode::kHost;
  node.name = name;
  node.kernel = std::move(call);
  return captured(stream, std::move(node), status);
}

}  // namespace emu_rt

// emu_launch's first hook (emu_core.h, found by argument-dependent lookup): on a stream being
// captured, the launch (its arguments copied) becomes a node of the graph and does not run.
template <class F>
bool emu_launch_captured(cudaStream_t stream, dim3 grid, dim3 block, size_t smem, const char* name, const F& kernel) {
  using namespace emu_rt;
  std::lock_guard lock(state().mutex);
  if (state().captures.empty() || capture_of(stream) == nullptr) return false;
  if (stream->device != current_device) {
    last_error = cudaErrorInvalidResourceHandle;
    return true;
  }
  GraphNode node{GraphNode::kKernel, name, grid, block, smem, std::function<void()>(kernel), nullptr, nullptr, 0, 0, nullptr, {}};
  cudaError_t status = cudaSuccess;
  return captured(stream, std::move(node), &status);
}

// emu_launch's second hook: a kernel runs only on
// a stream of the current device, as on CUDA; otherwise the launch records the error. A fault
// pending from an earlier launch (emu_rt::fault_launch) becomes the last error here; a
// launch that fault_launch names does not run and leaves its fault pending.
inline bool emu_launch_allowed(cudaStream_t stream, const char* name) {
  using namespace emu_rt;
  int device = 0;
  if (stream_device(stream, &device) != cudaSuccess) return false;
  if (device != current_device) {
    fail(cudaErrorInvalidResourceHandle);
    return false;
  }
  std::lock_guard lock(state().mutex);
  State& s = state();
  traced({stream, name});
  if (s.pending_fault != cudaSuccess) last_error = take_fault();
  if (!s.fault_kernel.empty() && std::strstr(name, s.fault_kernel.c_str()) != nullptr) {
    s.pending_fault = s.fault;
    s.fault_kernel.clear();
    return false;
  }
  return true;
}

// ---- errors ---------------------------------------------------------------------------------
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = emu_rt::last_error;
  emu_rt::last_error = cudaSuccess;
  return e;
}
inline cudaError_t cudaPeekAtLastError() { return emu_rt::last_error; }
inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
  }
  return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
  }
  return "unknown error";
}

// ---- devices ----------------------------------------------------------------------------------
inline cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return emu_rt::fail(cudaErrorInvalidValue);
  *count = emu_rt::device_count();
  return *count == 0 ? emu_rt::fail(cudaErrorNoDevice) : cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device) {
  if (emu_rt::device_count() == 0) return emu_rt::fail(cudaErrorNoDevice);
  if (device < 0 || device >= emu_rt::device_count()) return emu_rt::fail(cudaErrorInvalidDevice);
  emu_rt::current_device = device;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return emu_rt::fail(cudaErrorInvalidValue);
  *device = emu_rt::current_device;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return emu_rt::fail(cudaErrorInvalidValue);
  if (device < 0 || device >= std::max(emu_rt::device_count(), 1)) return emu_rt::fail(cudaErrorInvalidDevice);
  *value = attr == cudaDevAttrMultiProcessorCount ? 132 : emu_rt::kMaxDynamicSharedBytes;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
  std::lock_guard lock(emu_rt::state().mutex);
  if (emu_rt::unsafe_call_refused()) return cudaErrorStreamCaptureUnsupported;
  ++emu_rt::state().stats.host_waits;
  if (cudaError_t e = emu_rt::take_fault(); e != cudaSuccess) return emu_rt::fail(e);
  return cudaSuccess;
}
template <class K>
cudaError_t cudaFuncSetAttribute(K, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize && (value < 0 || value > emu_rt::kMaxDynamicSharedBytes))
    return emu_rt::fail(cudaErrorInvalidValue);
  std::lock_guard lock(emu_rt::state().mutex);
  ++emu_rt::state().stats.func_attributes;
  return cudaSuccess;
}

// ---- memory -------------------------------------------------------------------------------------
inline cudaError_t cudaMalloc(void** ptr, size_t size) {
  using namespace emu_rt;
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  if (size == 0) return cudaSuccess;
  const int device = current_device;
  std::lock_guard lock(state().mutex);
  State& s = state();
  if (unsafe_call_refused()) return cudaErrorStreamCaptureUnsupported;
  if (s.used.size() <= size_t(device)) s.used.resize(device + 1, 0);
  if (s.limit.size() <= size_t(device)) s.limit.resize(device + 1, SIZE_MAX);
  if (size > s.limit[device] - std::min(s.limit[device], s.used[device])) return fail(cudaErrorMemoryAllocation);
  // 256-byte red zones on either side, which the sanitizer watches (emu_sanitizer.h).
  auto* raw = static_cast<unsigned char*>(std::aligned_alloc(256, 2 * kRedZone + (size + 255) / 256 * 256));
  if (raw == nullptr) return fail(cudaErrorMemoryAllocation);
  void* p = raw + kRedZone;
  std::memset(p, 0xff, size);
  emu_san::track(p, size, "cudaMalloc block", /*uninitialised=*/false, kRedZone);
  s.blocks[static_cast<const char*>(p)] = Block{size, device};
  s.used[device] += size;
  ++s.stats.mallocs;
  *ptr = p;
  return cudaSuccess;
}
template <class T>
cudaError_t cudaMalloc(T** ptr, size_t size) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), size);
}
inline cudaError_t cudaFree(void* ptr) {
  using namespace emu_rt;
  if (ptr == nullptr) return cudaSuccess;
  std::lock_guard lock(state().mutex);
  State& s = state();
  if (unsafe_call_refused()) return cudaErrorStreamCaptureUnsupported;
  auto it = s.blocks.find(static_cast<const char*>(ptr));
  if (it == s.blocks.end() || it->second.device < 0) return fail(cudaErrorInvalidValue);
  s.used[it->second.device] -= it->second.size;
  s.blocks.erase(it);
  ++s.stats.frees;
  emu_san::untrack(ptr);
  std::free(static_cast<unsigned char*>(ptr) - kRedZone);
  return cudaSuccess;
}
inline cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned flags) {
  using namespace emu_rt;
  if (ptr == nullptr || flags > 15) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = std::aligned_alloc(256, (size + 255) / 256 * 256);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  std::lock_guard lock(state().mutex);
  state().blocks[static_cast<const char*>(p)] = Block{size, -1};
  ++state().stats.host_allocs;
  *ptr = p;
  return cudaSuccess;
}
inline cudaError_t cudaFreeHost(void* ptr) {
  using namespace emu_rt;
  if (ptr == nullptr) return cudaSuccess;
  std::lock_guard lock(state().mutex);
  auto it = state().blocks.find(static_cast<const char*>(ptr));
  if (it == state().blocks.end() || it->second.device >= 0) return fail(cudaErrorInvalidValue);
  state().blocks.erase(it);
  ++state().stats.host_frees;
  std::free(ptr);
  return cudaSuccess;
}

inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream = nullptr) {
  using namespace emu_rt;
  int device = 0;
  if (cudaError_t e = stream_device(stream, &device); e != cudaSuccess) return e;
  if (n == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr || unsigned(kind) > cudaMemcpyDefault) return fail(cudaErrorInvalidValue);
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind != cudaMemcpyDefault) {
    cudaError_t e = dst_device ? check_device_range("cudaMemcpyAsync (dst)", dst, n)
                               : check_host_range("cudaMemcpyAsync (dst)", dst, n);
    if (e == cudaSuccess)
      e = src_device ? check_device_range("cudaMemcpyAsync (src)", src, n)
                     : check_host_range("cudaMemcpyAsync (src)", src, n);
    if (e != cudaSuccess) return e;
  }
  std::lock_guard lock(state().mutex);
  if (Capture* c = capture_of(stream); c != nullptr && !c->invalidated && (dst_device != src_device || kind == cudaMemcpyDefault)) {
    // A graph's copy between host and device reads or writes pinned memory: pageable memory
    // would need the copy to synchronise, which a graph cannot.
    const void* host = kind == cudaMemcpyDeviceToHost ? dst : src;
    const Block* b = find_block(host, n);
    if (kind == cudaMemcpyDefault || b == nullptr || b->device >= 0) {
      c->invalidated = true;
      return fail(cudaErrorStreamCaptureUnsupported);
    }
  }
  if (cudaError_t status = cudaSuccess; captured(stream, {GraphNode::kCopy, "", {}, {}, 0, {}, dst, src, n, 0, nullptr, {}}, &status)) return status;
  std::memmove(dst, src, n);
  emu_san::host_wrote(dst, n);
  ++state().stats.memcpys;
  traced({stream, "", dst});
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device, size_t n,
                                       cudaStream_t stream = nullptr) {
  using namespace emu_rt;
  int device = 0;
  if (cudaError_t e = stream_device(stream, &device); e != cudaSuccess) return e;
  if (dst_device < 0 || dst_device >= device_count() || src_device < 0 || src_device >= device_count())
    return fail(cudaErrorInvalidDevice);
  if (n == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  if (cudaError_t e = check_device_range("cudaMemcpyPeerAsync (dst)", dst, n, dst_device); e != cudaSuccess) return e;
  if (cudaError_t e = check_device_range("cudaMemcpyPeerAsync (src)", src, n, src_device); e != cudaSuccess) return e;
  std::lock_guard lock(state().mutex);
  if (cudaError_t status = cudaSuccess; captured(stream, {GraphNode::kCopy, "", {}, {}, 0, {}, dst, src, n, 0, nullptr, {}}, &status)) return status;
  std::memmove(dst, src, n);
  ++state().stats.memcpys;
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t stream = nullptr) {
  using namespace emu_rt;
  int device = 0;
  if (cudaError_t e = stream_device(stream, &device); e != cudaSuccess) return e;
  if (n == 0) return cudaSuccess;
  if (p == nullptr) return fail(cudaErrorInvalidValue);
  if (cudaError_t e = check_device_range("cudaMemsetAsync", p, n); e != cudaSuccess) return e;
  std::lock_guard lock(state().mutex);
  if (cudaError_t status = cudaSuccess; captured(stream, {GraphNode::kMemset, "", {}, {}, 0, {}, p, nullptr, n, value, nullptr, {}}, &status))
    return status;
  std::memset(p, value, n);
  emu_san::host_wrote(p, n);
  ++state().stats.memsets;
  traced({stream, "", p});
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int value, size_t n) { return cudaMemsetAsync(p, value, n, nullptr); }

// ---- streams and events (synchronous) ---------------------------------------------------------------
namespace emu_rt {
// A new stream or event of the current device, registered so that later calls can check it.
template <class H>
cudaError_t create_handle(H** out, bool valid_flags, std::set<const H*>& registry) {
  if (out == nullptr || !valid_flags) return fail(cudaErrorInvalidValue);
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  auto* h = new H();
  h->device = current_device;
  std::lock_guard lock(state().mutex);
  registry.insert(h);
  *out = h;
  return cudaSuccess;
}
template <class H>
cudaError_t destroy_handle(H* h, std::set<const H*>& registry) {
  std::lock_guard lock(state().mutex);
  if (h == nullptr || !registry.erase(h)) return fail(cudaErrorInvalidResourceHandle);
  delete h;
  return cudaSuccess;
}
}  // namespace emu_rt

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  return emu_rt::create_handle(stream, flags <= cudaStreamNonBlocking, emu_rt::state().streams);
}
inline cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }
inline cudaError_t cudaStreamDestroy(cudaStream_t stream) { return emu_rt::destroy_handle(stream, emu_rt::state().streams); }
inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  int device = 0;
  if (cudaError_t e = emu_rt::stream_device(stream, &device); e != cudaSuccess) return e;
  std::lock_guard lock(emu_rt::state().mutex);
  if (emu_rt::Capture* c = emu_rt::capture_of(stream); c != nullptr) {  // the host cannot wait for a graph being made
    if (c->invalidated) return emu_rt::fail(cudaErrorStreamCaptureInvalidated);
    c->invalidated = true;
    return emu_rt::fail(cudaErrorStreamCaptureUnsupported);
  }
  ++emu_rt::state().stats.host_waits;
  if (cudaError_t e = emu_rt::take_fault(); e != cudaSuccess) return emu_rt::fail(e);
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  return emu_rt::create_handle(event, flags <= 7, emu_rt::state().events);
}
inline cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }
inline cudaError_t cudaEventDestroy(cudaEvent_t event) { return emu_rt::destroy_handle(event, emu_rt::state().events); }
inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr) {
  using namespace emu_rt;
  if (cudaError_t e = check_event(event); e != cudaSuccess) return e;
  int device = 0;
  if (cudaError_t e = stream_device(stream, &device); e != cudaSuccess) return e;
  if (device != event->device) return fail(cudaErrorInvalidResourceHandle);  // CUDA: same device only
  std::lock_guard lock(state().mutex);
  event->captured = false;
  event->recorded = true;
  if (cudaError_t status = cudaSuccess; captured(stream, {GraphNode::kEventRecord, "", {}, {}, 0, {}, nullptr, nullptr, 0, 0, event, {}}, &status)) {
    event->captured = status == cudaSuccess;
    if (event->captured) {  // it stands for the stream's work so far: a wait on it forks or joins
      Capture* c = capture_of(stream);
      event->capture = c->id;
      event->frontier = c->frontier[stream];
    }
    return status;
  }
  ++state().stats.event_records;
  event->pending = state().hold_events;
  traced({stream, "", nullptr, event});
  return cudaSuccess;
}
// cudaErrorNotReady is kept as the thread's last error here, the pessimistic reading that
// PyTorch's allocators also assume (they clear it with cudaGetLastError): code that does not
// clear it has the next check_launch blame an unrelated kernel.
inline cudaError_t cudaEventQuery(cudaEvent_t event) {
  using namespace emu_rt;
  if (cudaError_t e = check_event(event); e != cudaSuccess) return e;
  bool pending = false, in_capture = false;
  {
    std::lock_guard lock(state().mutex);
    pending = event->pending;
    in_capture = event->captured;
  }
  if (in_capture) return fail(cudaErrorCapturedEvent);
  return pending ? fail(cudaErrorNotReady) : cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  using namespace emu_rt;
  if (cudaError_t e = check_event(event); e != cudaSuccess) return e;
  std::lock_guard lock(state().mutex);
  if (event->captured) return fail(cudaErrorCapturedEvent);
  ++state().stats.event_waits;
  ++state().stats.host_waits;
  event->pending = false;
  if (cudaError_t e = take_fault(); e != cudaSuccess) return fail(e);
  return cudaSuccess;
}
// During a capture (CUDA's rules, the programming guide's "Cross-stream Dependencies and
// Events" and "Prohibited and Unhandled Operations"): a stream outside any capture waiting for
// an event recorded in one joins that capture (a fork: its later work becomes nodes after the
// event's); a captured stream waiting for an event of its own capture adds the event's nodes to
// its dependencies (a join); an event of another capture would merge two captures
// (cudaErrorStreamCaptureMerge, both invalidated); an event recorded outside any capture may
// only be waited for with cudaEventWaitExternal (otherwise cudaErrorStreamCaptureIsolation,
// the capture invalidated), and one never recorded stands for no work. A stream outside any
// capture waiting for an event whose capture has ended: cudaErrorCapturedEvent here (CUDA's
// behaviour is not documented).
inline cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0) {
  using namespace emu_rt;
  if (flags > cudaEventWaitExternal) return fail(cudaErrorInvalidValue);
  int device = 0;
  if (cudaError_t e = stream_device(stream, &device); e != cudaSuccess) return e;
  if (cudaError_t e = check_event(event); e != cudaSuccess) return e;
  std::lock_guard lock(state().mutex);
  State& s = state();
  std::shared_ptr<Capture> owner;  // the live capture the event was recorded in, if any
  if (event->captured)
    for (auto& [member, c] : s.captures)
      if (c->id == event->capture) owner = c;
  Capture* waiter = capture_of(stream);
  if (waiter == nullptr && event->captured) {
    if (owner == nullptr) return fail(cudaErrorCapturedEvent);
    if (owner->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    s.captures[stream] = owner;  // the fork
    owner->frontier[stream] = event->frontier;
  } else if (waiter != nullptr) {
    if (waiter->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    if (owner.get() == waiter) {
      std::vector<size_t>& f = waiter->frontier[stream];
      for (size_t n : event->frontier)
        if (std::find(f.begin(), f.end(), n) == f.end()) f.push_back(n);
    } else if (owner != nullptr) {
      waiter->invalidated = owner->invalidated = true;
      return fail(cudaErrorStreamCaptureMerge);
    } else if (event->recorded && flags != cudaEventWaitExternal) {
      waiter->invalidated = true;
      return fail(cudaErrorStreamCaptureIsolation);
    }
  }
  ++s.stats.stream_waits;
  traced({stream, "", nullptr, event, true});
  return cudaSuccess;
}

#include "emu_graph.h"
