#include "engine/device.h"

#include "engine/error.h"
#include "kernels/cuda/runtime.h"

namespace nd {

Device::Device(const std::string& spec) {
  if (spec == "cpu") {
    *this = Device(kCPU);
    return;
  }
  if (spec == "cuda") {
    *this = Device(kCUDA, 0);
    return;
  }
  if (spec.rfind("cuda:", 0) == 0 && spec.size() > 5 && spec.size() < 9) {
    int index = 0;
    for (size_t i = 5; i < spec.size(); ++i) {
      ND_CHECK(spec[i] >= '0' && spec[i] <= '9', "invalid device '", spec,
               "': expected 'cpu', 'cuda' or 'cuda:N' with N a non-negative integer");
      index = index * 10 + (spec[i] - '0');
    }
    *this = Device(kCUDA, index);
    return;
  }
  throw Error("invalid device '" + spec + "': expected 'cpu', 'cuda' or 'cuda:N'");
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

namespace cuda {

int device_count() { return kernels::cuda::device_count(); }
bool is_available() { return device_count() > 0; }

void check_device(const Device& device) {
  if (device.is_cpu()) return;
  ND_CHECK(kernels::cuda::built_with_cuda(), "device ", device.str(),
           " requested, but nanoddp was built without CUDA (NANODDP_CUDA=OFF or no nvcc at "
           "configure time); use device cpu or rebuild with -DNANODDP_CUDA=ON");
  const int n = device_count();
  ND_CHECK(n > 0, "device ", device.str(), " requested, but no CUDA GPU is available (",
           kernels::cuda::unavailable_reason(), "); use device cpu");
  ND_CHECK(device.index < n, "device ", device.str(), " requested, but only ", n,
           " CUDA device(s) exist (cuda:0..cuda:", n - 1, ")");
}

void check_pinned_memory(const char* what) {
  ND_CHECK(is_available(), what, ": pinned host memory needs a CUDA GPU, and none is available (",
           kernels::cuda::unavailable_reason(), "); leave pin_memory off on the CPU");
}

MemoryStats memory_stats(const Device& device) {
  ND_CHECK(device.is_cuda(), "cuda::memory_stats: expected a CUDA device (cuda:N), found ", device.str(),
           "; the CPU allocator's counters are nd::cpu::memory_stats()");
  check_device(device);
  return kernels::cuda::memory_stats(device.index);
}

void reset_peak_memory_stats(const Device& device) {
  ND_CHECK(device.is_cuda(), "cuda::reset_peak_memory_stats: expected a CUDA device (cuda:N), found ", device.str(),
           "; the CPU allocator's is nd::cpu::reset_peak_memory_stats()");
  check_device(device);
  kernels::cuda::reset_peak_memory_stats(device.index);
}

cudaStream_t current_stream(const Device& device) {
  check_device(device);
  ND_CHECK(device.is_cuda(), "cuda::current_stream: expected a CUDA device (cuda:N), found ", device.str());
  return kernels::cuda::compute_stream(device.index);
}

void set_device(const Device& device) {
  check_device(device);
  ND_CHECK(device.is_cuda(), "cuda::set_device: expected a CUDA device (cuda:N), found ", device.str());
  kernels::cuda::use_device(device.index);
}

cudaStream_t comm_stream(const Device& device) {
  check_device(device);
  ND_CHECK(device.is_cuda(), "cuda::comm_stream: expected a CUDA device (cuda:N), found ", device.str());
  return kernels::cuda::comm_stream(device.index);
}

}  // namespace cuda
}  // namespace nd
