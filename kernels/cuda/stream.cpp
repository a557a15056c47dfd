// Per-device compute and communication streams, events, and the CUDA error check.
#include "kernels/cuda/stream.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cuda/graph.h"

#ifdef NANODDP_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace nd::kernels::cuda {

void require(bool ok, const char* kernel, const std::string& message) {
  if (!ok) throw Error(std::string(kernel) + ": " + message);
}

#ifdef NANODDP_WITH_CUDA

void check(int status, const char* call, const std::string& op) {
  if (status == cudaSuccess) return;
  const auto err = static_cast<cudaError_t>(status);
  // The failed call also left `err` as this thread's last error: clear it, or the next
  // check_launch would report it against an unrelated kernel. (A sticky error, from a
  // faulting kernel, stays whatever is done here.)
  cudaGetLastError();
  throw Error(std::string(call) + " failed in " + op + ": " + cudaGetErrorName(err) + " (" +
              cudaGetErrorString(err) + ")");
}

namespace {
std::atomic<bool>& launch_blocking_flag() {
  static std::atomic<bool> flag{[] {
    const char* env = std::getenv("NANODDP_LAUNCH_BLOCKING");
    return env != nullptr && std::string(env) == "1";
  }()};
  return flag;
}
}  // namespace

void set_launch_blocking(bool blocking) { launch_blocking_flag() = blocking; }
bool launch_blocking() { return launch_blocking_flag(); }

// A kernel that faults (an illegal address, a trap) does so after its launch returned: CUDA
// reports it at a later call, often another kernel's check_launch, which then takes the
// blame. Blocking, the device is synchronised here, so the fault is this kernel's.
void check_launch(const char* kernel) {
  check(cudaGetLastError(), "kernel launch", kernel);
  if (launch_blocking())
    check(cudaDeviceSynchronize(), "kernel (NANODDP_LAUNCH_BLOCKING=1: synchronised after its launch)", kernel);
}

namespace {

struct DeviceStreams {
  cudaStream_t compute = nullptr;
  cudaStream_t comm = nullptr;
};

// Created on first use, never destroyed: the streams live as long as the process, and
// destroying them during static destruction would race the CUDA runtime's own teardown.
DeviceStreams& streams(int device) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<DeviceStreams>>* all = new std::vector<std::unique_ptr<DeviceStreams>>();
  std::lock_guard lock(mutex);
  if (device >= static_cast<int>(all->size())) all->resize(device + 1);
  auto& s = (*all)[device];
  if (!s) {
    const std::string what = "creating the streams of cuda:" + std::to_string(device);
    check(cudaSetDevice(device), "cudaSetDevice", what);
    auto created = std::make_unique<DeviceStreams>();
    check(cudaStreamCreate(&created->compute), "cudaStreamCreate", what);
    check(cudaStreamCreate(&created->comm), "cudaStreamCreate", what);
    s = std::move(created);
  }
  return *s;
}

}  // namespace

// While a graph captures the device's work (graph.h), its stream stands in for the compute stream.
cudaStream_t use_device(int device) {
  check(cudaSetDevice(device), "cudaSetDevice", "cuda:" + std::to_string(device));
  return compute_stream(device);
}

cudaStream_t compute_stream(int device) {
  if (cudaStream_t captured = capture_stream(device)) return captured;
  return streams(device).compute;
}
cudaStream_t comm_stream(int device) { return streams(device).comm; }

void synchronize(int device) {
  refuse_during_capture(device, "synchronize cuda:" + std::to_string(device),
                        "the host cannot wait for work that is only being recorded");
  check(cudaStreamSynchronize(compute_stream(device)), "cudaStreamSynchronize",
        "synchronize(cuda:" + std::to_string(device) + ")");
}

Event::Event(int device) : device_(device) {
  check(cudaSetDevice(device), "cudaSetDevice", "Event");
  check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags", "Event");
}

Event::~Event() {
  if (event_) cudaEventDestroy(event_);  // never throws: runs from destructors
}

Event::Event(Event&& other) noexcept : device_(other.device_), event_(other.event_) { other.event_ = nullptr; }

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_) cudaEventDestroy(event_);
    device_ = other.device_;
    event_ = other.event_;
    other.event_ = nullptr;
  }
  return *this;
}

void Event::record(cudaStream_t stream) { check(cudaEventRecord(event_, stream), "cudaEventRecord", "Event::record"); }
void Event::wait(cudaStream_t stream) const {
  check(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent", "Event::wait");
}
void Event::synchronize() const { check(cudaEventSynchronize(event_), "cudaEventSynchronize", "Event::synchronize"); }
bool Event::query() const { return event_complete(event_, "Event::query"); }

bool event_complete(cudaEvent_t event, const char* op) {
  const cudaError_t status = cudaEventQuery(event);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();  // a status, not a failure: keep it from the next check_launch
    return false;
  }
  check(status, "cudaEventQuery", op);
  return true;
}

#else  // CPU-only build

namespace {
[[noreturn]] void no_cuda() {
  throw Error("nanoddp was built without CUDA (NANODDP_CUDA=OFF or no nvcc at configure time)");
}
}  // namespace

void check(int status, const char* call, const std::string& op) {
  if (status != 0) throw Error(std::string(call) + " failed in " + op);
}
void check_launch(const char*) { no_cuda(); }
void set_launch_blocking(bool) {}
bool launch_blocking() { return false; }
cudaStream_t use_device(int) { no_cuda(); }
cudaStream_t compute_stream(int) { no_cuda(); }
cudaStream_t comm_stream(int) { no_cuda(); }
void synchronize(int) { no_cuda(); }
Event::Event(int device) : device_(device) { no_cuda(); }
Event::~Event() = default;
Event::Event(Event&& other) noexcept : device_(other.device_), event_(other.event_) { other.event_ = nullptr; }
Event& Event::operator=(Event&& other) noexcept {
  device_ = other.device_;
  event_ = other.event_;
  other.event_ = nullptr;
  return *this;
}
void Event::record(cudaStream_t) { no_cuda(); }
void Event::wait(cudaStream_t) const { no_cuda(); }
void Event::synchronize() const { no_cuda(); }
bool Event::query() const { no_cuda(); }
bool event_complete(cudaEvent_t, const char*) { no_cuda(); }

#endif

}  // namespace nd::kernels::cuda
