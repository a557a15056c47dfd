#include "engine/storage.h"

#include <cstdlib>

#include "engine/error.h"
#include "kernels/cuda/allocator.h"

namespace nd {

std::atomic<int64_t> Storage::live_{0};

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device.is_cpu()) {
    if (nbytes > 0) {
      const size_t rounded = (nbytes + 63) / 64 * 64;
      data_ = std::aligned_alloc(64, rounded);
      ND_CHECK(data_ != nullptr, "out of CPU memory: failed to allocate ", nbytes, " bytes");
    }
  } else {
    cuda::check_device(device);
    data_ = kernels::cuda::allocate(device.index, nbytes, kernels::cuda::compute_stream(device.index));
  }
  ++live_;
}

Storage::~Storage() {
  if (device_.is_cpu())
    std::free(data_);
  else
    kernels::cuda::release(data_);  // back to the cache of its stream
  --live_;
}

int64_t Storage::live_count() { return live_.load(); }

}  // namespace nd
