#include "engine/storage.h"

#include "engine/cpu_allocator.h"
#include "engine/error.h"
#include "kernels/cuda/allocator.h"
#include "kernels/cuda/host_allocator.h"

namespace nd {

std::atomic<int64_t> Storage::live_{0};

Storage::Storage(size_t nbytes, Device device, bool pinned) : nbytes_(nbytes), device_(device), pinned_(pinned) {
  if (pinned) {
    ND_CHECK(device.is_cpu(), "pinned memory is host memory: expected device cpu, found ", device.str());
    cuda::check_pinned_memory("pinned_memory");
    data_ = kernels::cuda::allocate_pinned(nbytes);
  } else if (device.is_cpu()) {
    data_ = cpu::allocate(nbytes);
  } else {
    cuda::check_device(device);
    data_ = kernels::cuda::allocate(device.index, nbytes, kernels::cuda::compute_stream(device.index));
  }
  ++live_;
}

Storage::~Storage() {
  if (pinned_)
    kernels::cuda::release_pinned(data_);  // reused once its pending copies have run
  else if (device_.is_cpu())
    cpu::release(data_, nbytes_);  // back to the CPU cache (large blocks) or to free
  else
    kernels::cuda::release(data_);  // back to the cache of its stream
  --live_;
}

void Storage::wait_for_copies() const {
  if (pinned_) kernels::cuda::wait_copies(data_);
}

int64_t Storage::live_count() { return live_.load(); }

}  // namespace nd
