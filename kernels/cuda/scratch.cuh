#pragma once
// Temporary device memory for the duration of one launcher call (shared by the .cu files).
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/allocator.h"
#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda::detail {

// A buffer from the caching allocator on `stream`, returned when it goes out of scope.
// Work queued on `stream` before the return still owns it: the allocator hands the block
// out again only to later work on the same stream. nbytes == 0 gives a null pointer.
class Scratch {
 public:
  Scratch(const char* kernel, size_t nbytes, cudaStream_t stream) {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice", kernel);
    ptr_ = allocate(device, nbytes, stream);
  }
  ~Scratch() { release(ptr_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

}  // namespace nd::kernels::cuda::detail
