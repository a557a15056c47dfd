// The pinned host allocator; see host_allocator.h for why blocks carry events.
#include "kernels/cuda/host_allocator.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/common/error.h"
#include "kernels/cuda/allocator.h"

#ifdef NANODDP_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace nd::kernels::cuda {

#ifdef NANODDP_WITH_CUDA

namespace {

struct PendingCopy {
  int device = 0;
  cudaEvent_t event = nullptr;
};

struct Block {
  size_t size = 0;  // rounded
  bool live = false;
  std::vector<PendingCopy> pending;
};

struct HostAllocator {
  std::mutex mutex;
  std::unordered_map<void*, Block> blocks;             // every block we hold, live or released
  std::map<size_t, std::vector<void*>> released;       // per size class, most recent last
  std::map<int, std::vector<cudaEvent_t>> free_events;  // per device, for reuse
  HostAllocatorStats stats;

  // Drops the block's completed copies (their events go back to the pool); true when
  // none is left. Caller holds the mutex.
  bool reap(Block& b) {
    auto done = [&](const PendingCopy& c) {
      if (!event_complete(c.event, "pinned host memory")) return false;
      free_events[c.device].push_back(c.event);
      return true;
    };
    b.pending.erase(std::remove_if(b.pending.begin(), b.pending.end(), done), b.pending.end());
    return b.pending.empty();
  }

  // A released block of class `size` with no copy outstanding, taken off its list, or nullptr.
  void* take_released(size_t size) {
    auto it = released.find(size);
    if (it == released.end()) return nullptr;
    std::vector<void*>& list = it->second;
    for (auto p = list.rbegin(); p != list.rend(); ++p) {
      if (!reap(blocks.at(*p))) continue;
      void* ptr = *p;
      list.erase(std::next(p).base());
      return ptr;
    }
    return nullptr;
  }
};

// Never destroyed, like the device allocator: Storage objects freed during static
// destruction still find it.
HostAllocator& host_allocator() {
  static HostAllocator* a = new HostAllocator();
  return *a;
}

}  // namespace

void* allocate_pinned(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const size_t size = round_size(nbytes);
  HostAllocator& a = host_allocator();
  std::lock_guard lock(a.mutex);
  void* ptr = a.take_released(size);
  if (ptr) {
    ++a.stats.num_cache_hits;
    a.stats.cached_bytes -= static_cast<int64_t>(size);
  } else {
    check(cudaHostAlloc(&ptr, size, cudaHostAllocPortable), "cudaHostAlloc",
          "pinned host memory (" + std::to_string(nbytes) + " bytes)");
    ++a.stats.num_host_allocs;
    a.blocks[ptr].size = size;
  }
  a.blocks.at(ptr).live = true;
  a.stats.allocated_bytes += static_cast<int64_t>(size);
  return ptr;
}

void release_pinned(void* ptr) {
  if (!ptr) return;
  HostAllocator& a = host_allocator();
  std::lock_guard lock(a.mutex);
  auto it = a.blocks.find(ptr);
  if (it == a.blocks.end() || !it->second.live) return;  // not ours: never throws
  it->second.live = false;
  a.released[it->second.size].push_back(ptr);
  a.stats.allocated_bytes -= static_cast<int64_t>(it->second.size);
  a.stats.cached_bytes += static_cast<int64_t>(it->second.size);
}

void record_copy(void* block, int device, cudaStream_t stream) {
  HostAllocator& a = host_allocator();
  std::lock_guard lock(a.mutex);
  auto it = a.blocks.find(block);
  require(it != a.blocks.end() && it->second.live, "record_copy", "the block is not a live pinned allocation");
  a.reap(it->second);  // a buffer copied every step keeps only the copies still in flight
  std::vector<cudaEvent_t>& pool = a.free_events[device];
  cudaEvent_t event = nullptr;
  if (pool.empty()) {
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags", "pinned host memory");
  } else {
    event = pool.back();
    pool.pop_back();
  }
  const cudaError_t status = cudaEventRecord(event, stream);
  if (status != cudaSuccess) pool.push_back(event);
  check(status, "cudaEventRecord", "pinned host memory");
  it->second.pending.push_back({device, event});
}

void wait_copies(void* block) {
  HostAllocator& a = host_allocator();
  std::vector<PendingCopy> pending;
  {
    std::lock_guard lock(a.mutex);
    auto it = a.blocks.find(block);
    if (it == a.blocks.end()) return;
    pending.swap(it->second.pending);
  }
  // Waits outside the lock (the data loader's thread may be allocating meanwhile); the
  // block is live, so no other thread looks at its copies.
  for (const PendingCopy& c : pending)
    check(cudaEventSynchronize(c.event), "cudaEventSynchronize", "pinned host memory");
  std::lock_guard lock(a.mutex);
  for (const PendingCopy& c : pending) a.free_events[c.device].push_back(c.event);
}

void empty_pinned_cache() {
  HostAllocator& a = host_allocator();
  std::lock_guard lock(a.mutex);
  for (auto& [size, list] : a.released) {
    for (void* ptr : list) {
      for (const PendingCopy& c : a.blocks.at(ptr).pending) {
        check(cudaEventSynchronize(c.event), "cudaEventSynchronize", "empty_pinned_cache");
        a.free_events[c.device].push_back(c.event);
      }
      check(cudaFreeHost(ptr), "cudaFreeHost", "empty_pinned_cache");
      a.blocks.erase(ptr);
      ++a.stats.num_host_frees;
      a.stats.cached_bytes -= static_cast<int64_t>(size);
    }
    list.clear();
  }
}

HostAllocatorStats pinned_memory_stats() {
  HostAllocator& a = host_allocator();
  std::lock_guard lock(a.mutex);
  HostAllocatorStats s = a.stats;
  for (const auto& [ptr, b] : a.blocks) s.num_pending_copies += static_cast<int64_t>(b.pending.size());
  return s;
}

#else  // CPU-only build

void* allocate_pinned(size_t) {
  throw Error("pinned host memory needs CUDA, and nanoddp was built without it (NANODDP_CUDA=OFF or no nvcc at "
              "configure time)");
}
void release_pinned(void*) {}
void record_copy(void*, int, cudaStream_t) {
  throw Error("nanoddp was built without CUDA (NANODDP_CUDA=OFF or no nvcc at configure time)");
}
void wait_copies(void*) {}
void empty_pinned_cache() {}
HostAllocatorStats pinned_memory_stats() { return {}; }

#endif

}  // namespace nd::kernels::cuda
