#include "engine/storage.h"

#include "engine/cpu_allocator.h"
#include "kernels/cuda/allocator.h"

namespace nd {

std::atomic<int64_t> Storage::live_{0};

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device.is_cpu()) {
    data_ = cpu::allocate(nbytes);
  } else {
    cuda::check_device(device);
    data_ = kernels::cuda::allocate(device.index, nbytes, kernels::cuda::compute_stream(device.index));
  }
  ++live_;
}

Storage::~Storage() {
  if (device_.is_cpu())
    cpu::release(data_, nbytes_);  // back to the CPU cache (large blocks) or to free
  else
    kernels::cuda::release(data_);  // back to the cache of its stream
  --live_;
}

int64_t Storage::live_count() { return live_.load(); }

}  // namespace nd
