#pragma once
// Storage: one allocation plus its version counter. Every view and every
// detach() of a tensor shares the Storage, hence the counter: an in-place
// write through any alias is seen by every SavedTensor that recorded a version.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/device.h"

namespace nd {

class Storage {
 public:
  // Allocates nbytes on `device` through its caching allocator (engine/cpu_allocator.h,
  // kernels/cuda/allocator.h; 64-byte aligned on cpu); contents uninitialised. `pinned`
  // (cpu only): page-locked host memory (kernels/cuda/host_allocator.h), which copies to a
  // GPU can read asynchronously; needs CUDA.
  Storage(size_t nbytes, Device device, bool pinned = false);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool is_pinned() const { return pinned_; }
  // Pinned storage: blocks until every asynchronous copy that reads it has run, so the
  // host may overwrite it (ops::check_inplace calls this before every in-place op; a raw
  // write through data_ptr() must call it first).
  void wait_for_copies() const;

  // Version counter: bumped by every in-place write; `op` names the writer
  // ("add_", "copy_", "Adam.step") and is reported by version errors.
  int64_t version() const { return version_; }
  void bump_version(const std::string& op) {
    ++version_;
    last_modified_by_ = op;
  }
  const std::string& last_modified_by() const { return last_modified_by_; }

  // Number of Storage objects alive in this process (leak and cycle tests).
  static int64_t live_count();

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  bool pinned_ = false;
  int64_t version_ = 0;
  std::string last_modified_by_;
  static std::atomic<int64_t> live_;
};

}  // namespace nd
