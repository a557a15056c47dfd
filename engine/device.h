#pragma once
// Where a tensor lives: `cpu` or `cuda:N`.
#include <cstdint>
#include <string>

#include "kernels/cuda/allocator.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/stream.h"  // cudaStream_t

namespace nd {

enum class DeviceType : uint8_t { CPU, CUDA };
constexpr DeviceType kCPU = DeviceType::CPU;
constexpr DeviceType kCUDA = DeviceType::CUDA;

struct Device {
  DeviceType type = kCPU;
  int index = 0;  // CUDA ordinal; always 0 for cpu

  Device() = default;
  Device(DeviceType t, int i = 0) : type(t), index(t == kCPU ? 0 : i) {}
  // Parses "cpu", "cuda" (= cuda:0) or "cuda:N"; anything else throws nd::Error.
  Device(const std::string& spec);
  Device(const char* spec) : Device(std::string(spec)) {}

  bool is_cpu() const { return type == kCPU; }
  bool is_cuda() const { return type == kCUDA; }
  std::string str() const;  // "cpu" or "cuda:N"
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

namespace cuda {
// Number of usable CUDA devices; 0 when built without CUDA or when no GPU/driver is present.
int device_count();
bool is_available();
// Throws nd::Error saying why `device` cannot be used (not built with CUDA, no GPU,
// ordinal out of range). No-op for cpu and for valid CUDA devices.
void check_device(const Device& device);
// Pinned host memory needs a CUDA GPU: throws nd::Error naming `what` (the caller asking
// for it) and why there is none.
void check_pinned_memory(const char* what);

// The counters of a CUDA device's caching allocator (kernels/cuda/allocator.h), as
// torch.cuda.memory_stats(): a steady training step makes no cudaMalloc, so num_mallocs stops
// growing after the first steps (the apps log it as "cuda_mallocs").
using MemoryStats = kernels::cuda::AllocatorStats;
// requires: device is cuda:N (check_device's errors otherwise; a cpu device is an nd::Error
// pointing to nd::cpu::memory_stats).
MemoryStats memory_stats(const Device& device);
// Starts a new peak_allocated_bytes at the bytes allocated now
// (torch.cuda.reset_peak_memory_stats). requires: device is cuda:N, as memory_stats.
void reset_peak_memory_stats(const Device& device);

// The streams the engine queues a CUDA device's work on, for code that queues its own work
// beside it (the NCCL process group, the DataLoader's copies): every op's kernels go on the
// device's compute stream (PyTorch's torch.cuda.current_stream), collectives on its
// communication stream. requires: device is cuda:N (check_device's errors otherwise).
cudaStream_t current_stream(const Device& device);
cudaStream_t comm_stream(const Device& device);
// Makes `device` current for the calling thread (torch.cuda.set_device): a worker thread
// that copies to or pins for a device calls it first. requires: device is cuda:N.
void set_device(const Device& device);

// A whole step captured once and replayed with one launch (torch.cuda.CUDAGraph):
// Graph(device index), capture_begin / capture_end / replay; kernels/cuda/graph.h says how,
// docs/cuda_graphs.md what can be captured and what is refused.
using Graph = kernels::cuda::Graph;
}  // namespace cuda

}  // namespace nd
