// The caching CPU allocator; see cpu_allocator.h for the size classes and the limit.
#include "engine/cpu_allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/error.h"
#include "kernels/cuda/allocator.h"

namespace nd::cpu {

namespace {

struct Cache {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;  // size class -> blocks, last freed last
  AllocatorStats stats;
  std::atomic<bool> fill_on_allocate{false};
  std::atomic<int64_t> allocated{0}, peak{0};  // every live block; outside the mutex
};

// Never destroyed: Storage objects freed during static destruction still find it.
Cache& cache() {
  static Cache* c = new Cache();
  return *c;
}

bool cached_size(size_t nbytes) { return nbytes >= kMinCachedBytes && nbytes <= kMaxCachedBytes; }

// Cached sizes become their size class; others a multiple of kAlignment, as
// aligned_alloc requires.
size_t block_size(size_t nbytes) {
  if (cached_size(nbytes)) return kernels::cuda::round_size(nbytes);
  return (nbytes + kAlignment - 1) / kAlignment * kAlignment;
}

// A cached block of class `size`, or nullptr (counted as a malloc to come).
void* take_cached(size_t size) {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  auto it = c.free_blocks.find(size);
  if (it == c.free_blocks.end() || it->second.empty()) {
    ++c.stats.num_mallocs;
    return nullptr;
  }
  void* p = it->second.back();
  it->second.pop_back();
  c.stats.cached_bytes -= static_cast<int64_t>(size);
  ++c.stats.num_cache_hits;
  return p;
}

void count_allocated(int64_t size) {
  Cache& c = cache();
  const int64_t now = c.allocated.fetch_add(size, std::memory_order_relaxed) + size;
  int64_t peak = c.peak.load(std::memory_order_relaxed);
  while (now > peak && !c.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

}  // namespace

void* allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const size_t size = block_size(nbytes);
  void* p = cached_size(nbytes) ? take_cached(size) : nullptr;
  if (!p) p = std::aligned_alloc(kAlignment, size);
  if (!p) {
    empty_cache();
    p = std::aligned_alloc(kAlignment, size);
  }
  ND_CHECK(p != nullptr, "out of CPU memory: failed to allocate ", nbytes, " bytes (with nanoddp's CPU cache emptied)");
  if (cache().fill_on_allocate.load(std::memory_order_relaxed)) std::memset(p, 0xFF, nbytes);
  count_allocated(static_cast<int64_t>(size));
  return p;
}

void release(void* ptr, size_t nbytes) {
  if (!ptr) return;
  cache().allocated.fetch_sub(static_cast<int64_t>(block_size(nbytes)), std::memory_order_relaxed);
  if (cached_size(nbytes)) {
    const size_t size = block_size(nbytes);
    Cache& c = cache();
    std::lock_guard lock(c.mutex);
    if (c.stats.cached_bytes + static_cast<int64_t>(size) <= static_cast<int64_t>(kCacheLimitBytes)) {
      try {
        c.free_blocks[size].push_back(ptr);
        c.stats.cached_bytes += static_cast<int64_t>(size);
        return;
      } catch (const std::bad_alloc&) {
        // No room to remember the block: free it below.
      }
    }
    ++c.stats.num_frees;
  }
  std::free(ptr);
}

void empty_cache() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  for (auto& [size, blocks] : c.free_blocks) {
    for (void* p : blocks) std::free(p);
    c.stats.num_frees += static_cast<int64_t>(blocks.size());
    c.stats.cached_bytes -= static_cast<int64_t>(size * blocks.size());
    blocks.clear();
  }
}

AllocatorStats memory_stats() {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  AllocatorStats stats = c.stats;
  stats.allocated_bytes = c.allocated.load(std::memory_order_relaxed);
  stats.peak_allocated_bytes = std::max(c.peak.load(std::memory_order_relaxed), stats.allocated_bytes);
  return stats;
}

void reset_peak_memory_stats() {
  Cache& c = cache();
  c.peak.store(c.allocated.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void set_fill_on_allocate(bool enable) { cache().fill_on_allocate.store(enable); }

}  // namespace nd::cpu
