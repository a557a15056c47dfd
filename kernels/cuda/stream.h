#pragma once
// Streams, events and error checks for the CUDA backend.
//
// Each device has one compute stream (every kernel, cuBLAS call and engine copy runs
// there, so work on one device is ordered without further synchronisation) and one
// communication stream for collectives that want to overlap compute. Both are created
// *blocking* (not cudaStreamNonBlocking): they stay ordered with the legacy default
// stream, which the NCCL process group records its "ready" event on. Events order the
// two streams where a collective needs the compute stream's results.
//
// Compiled in every build: without NANODDP_WITH_CUDA every function throws "built
// without CUDA". cudaStream_t is declared here so engine code can name it either way.
#include <string>

struct CUstream_st;
typedef CUstream_st* cudaStream_t;  // the CUDA runtime's own definition, repeated
struct CUevent_st;
typedef CUevent_st* cudaEvent_t;

namespace nd::kernels::cuda {

// Makes `device` current for this thread and returns its compute stream (created on
// first use). Every kernel launch in the engine goes through this. While a CUDA graph
// captures the device's work (graph.h), both return the graph's capture stream.
cudaStream_t use_device(int device);
cudaStream_t compute_stream(int device);
cudaStream_t comm_stream(int device);
// Blocks the host until everything queued on the device's compute stream has run.
void synchronize(int device);

// An event on one device: record on a stream, make another stream wait for it, or
// block the host. Move-only; destroyed with the object.
class Event {
 public:
  explicit Event(int device);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(cudaStream_t stream);
  void wait(cudaStream_t stream) const;  // `stream` waits for the recorded work
  void synchronize() const;              // the host waits
  bool query() const;                    // true once the recorded work has completed

 private:
  int device_ = 0;
  cudaEvent_t event_ = nullptr;
};

// nd::Error "<call> failed in <op>: <CUDA's message>" when `status` (a cudaError_t)
// is not cudaSuccess. `op` names the kernel or engine op that made the call.
void check(int status, const char* call, const std::string& op);
// nd::Error "<kernel>: <message>" unless ok (argument limits of the kernels).
void require(bool ok, const char* kernel, const std::string& message);
// After a kernel launch: reports a bad launch configuration or an earlier async error (a
// kernel fault is reported by whichever call comes next: a later kernel's check_launch, a
// copy to the host, a synchronize). With launch blocking on, it then synchronises the device
// and reports a fault of this kernel as "kernel (NANODDP_LAUNCH_BLOCKING=1: synchronised
// after its launch) failed in <kernel>: <CUDA's message>", as CUDA_LAUNCH_BLOCKING=1 does for
// PyTorch. A debugging aid: every launch then waits for the device.
void check_launch(const char* kernel);
// Launch blocking: on when the environment has NANODDP_LAUNCH_BLOCKING=1 at the first launch,
// or set here (a process-wide setting).
void set_launch_blocking(bool blocking);
bool launch_blocking();
// cudaEventQuery as a bool: true once the event's work has run, false while it is queued
// (that cudaErrorNotReady is cleared from the thread's last error, so the next
// check_launch does not report it); any other status is an nd::Error naming `op`.
bool event_complete(cudaEvent_t event, const char* op);

}  // namespace nd::kernels::cuda
