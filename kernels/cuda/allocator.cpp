// The caching device allocator; see allocator.h for the reuse rule and size classes.
#include "kernels/cuda/allocator.h"

#include <algorithm>
#include <bit>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/common/error.h"

#ifdef NANODDP_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace nd::kernels::cuda {

size_t round_size(size_t nbytes) {
  constexpr size_t kMin = 512;
  if (nbytes == 0) return 0;
  if (nbytes <= kMin) return kMin;
  // Four classes per power of two: 2^k * {1, 1.25, 1.5, 1.75}.
  const size_t pow2 = std::bit_floor(nbytes);
  const size_t step = pow2 / 4;
  return (nbytes + step - 1) / step * step;
}

#ifdef NANODDP_WITH_CUDA

namespace {

struct Block {
  int device = 0;
  size_t size = 0;  // rounded
  cudaStream_t stream = nullptr;
};

struct Allocator {
  std::mutex mutex;
  std::unordered_map<void*, Block> live;                                   // handed out
  std::map<std::pair<cudaStream_t, size_t>, std::vector<void*>> cached;  // free, per (stream, class)
  std::unordered_map<void*, Block> cached_blocks;                          // free, for empty_cache
  std::vector<AllocatorStats> stats;
  std::set<cudaStream_t> private_pools;  // held graph pools: never freed by free_cached
  bool fill_on_allocate = false;

  AllocatorStats& stats_of(int device) {
    if (device >= static_cast<int>(stats.size())) stats.resize(device + 1);
    return stats[device];
  }

  // Frees every cached block of `device` outside the held private pools (or only those of
  // `pool` when given). Caller holds the mutex.
  void free_cached(int device, cudaStream_t pool = nullptr) {
    for (auto it = cached_blocks.begin(); it != cached_blocks.end();) {
      const bool in_pool = private_pools.count(it->second.stream) > 0;
      if (it->second.device != device || (pool == nullptr ? in_pool : it->second.stream != pool)) {
        ++it;
        continue;
      }
      auto& list = cached[{it->second.stream, it->second.size}];
      list.erase(std::find(list.begin(), list.end(), it->first));
      check(cudaSetDevice(device), "cudaSetDevice", "empty_cache");
      check(cudaFree(it->first), "cudaFree", "empty_cache");
      AllocatorStats& s = stats_of(device);
      s.reserved_bytes -= static_cast<int64_t>(it->second.size);
      ++s.num_frees;
      it = cached_blocks.erase(it);
    }
  }
};

// Never destroyed: Storage objects freed during static destruction still find it, and
// no cudaFree runs after the CUDA runtime has begun its own teardown.
Allocator& allocator() {
  static Allocator* a = new Allocator();
  return *a;
}

std::string describe(const AllocatorStats& s) {
  return std::to_string(s.allocated_bytes) + " bytes allocated, " + std::to_string(s.reserved_bytes) +
         " bytes reserved, peak " + std::to_string(s.peak_allocated_bytes) + " bytes";
}

}  // namespace

void* allocate(int device, size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return nullptr;
  const size_t size = round_size(nbytes);
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  AllocatorStats& s = a.stats_of(device);
  void* ptr = nullptr;
  auto it = a.cached.find({stream, size});
  if (it != a.cached.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    a.cached_blocks.erase(ptr);
    ++s.num_cache_hits;
  } else {
    const std::string what = "allocate(" + std::to_string(nbytes) + " bytes on cuda:" + std::to_string(device) + ")";
    check(cudaSetDevice(device), "cudaSetDevice", what);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (a.private_pools.count(stream)) check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing", what);
    cudaError_t err = cudaSuccess;
    if (capture != cudaStreamCaptureStatusNone) {
      // A graph's pool grows during its capture: cudaMalloc is not recorded, and the block
      // stays the graph's (hold_private_pool); the capture's global mode would refuse it.
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      check(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode", what);
      err = cudaMalloc(&ptr, size);
      check(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode", what);
    } else {
      err = cudaMalloc(&ptr, size);
    }
    if (err == cudaErrorMemoryAllocation && capture == cudaStreamCaptureStatusNone) {
      cudaGetLastError();  // clear it, give the cache back, try once more
      a.free_cached(device);
      err = cudaMalloc(&ptr, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw Error("CUDA out of memory: tried to allocate " + std::to_string(size) + " bytes on cuda:" +
                  std::to_string(device) + " (" + describe(s) + " by nanoddp); free tensors or use a smaller batch");
    }
    check(err, "cudaMalloc", what);
    ++s.num_mallocs;
    s.reserved_bytes += static_cast<int64_t>(size);
  }
  a.live[ptr] = Block{device, size, stream};
  s.allocated_bytes += static_cast<int64_t>(size);
  s.peak_allocated_bytes = std::max(s.peak_allocated_bytes, s.allocated_bytes);
  if (a.fill_on_allocate) {
    check(cudaSetDevice(device), "cudaSetDevice", "fill_on_allocate");
    check(cudaMemsetAsync(ptr, 0xFF, size, stream), "cudaMemsetAsync", "fill_on_allocate");
  }
  return ptr;
}

void release(void* ptr) {
  if (!ptr) return;
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  auto it = a.live.find(ptr);
  if (it == a.live.end()) return;  // not ours: nothing to do (never throws)
  const Block b = it->second;
  a.live.erase(it);
  a.cached[{b.stream, b.size}].push_back(ptr);
  a.cached_blocks[ptr] = b;
  a.stats_of(b.device).allocated_bytes -= static_cast<int64_t>(b.size);
}

void empty_cache(int device) {
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  a.free_cached(device);
}

void hold_private_pool(int, cudaStream_t stream) {
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  a.private_pools.insert(stream);
}

void release_private_pool(int device, cudaStream_t stream, cudaStream_t successor) {
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  a.free_cached(device, stream);
  a.private_pools.erase(stream);
  for (auto& [ptr, block] : a.live)
    if (block.stream == stream) block.stream = successor;
}

AllocatorStats memory_stats(int device) {
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  return a.stats_of(device);
}

void set_fill_on_allocate(bool enable) {
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  a.fill_on_allocate = enable;
}

void reset_peak_memory_stats(int device) {
  Allocator& a = allocator();
  std::lock_guard lock(a.mutex);
  AllocatorStats& s = a.stats_of(device);
  s.peak_allocated_bytes = s.allocated_bytes;
}

#else  // CPU-only build

void* allocate(int, size_t, cudaStream_t) {
  throw Error("nanoddp was built without CUDA (NANODDP_CUDA=OFF or no nvcc at configure time)");
}
void release(void*) {}
void empty_cache(int) {}
void hold_private_pool(int, cudaStream_t) {}
void release_private_pool(int, cudaStream_t, cudaStream_t) {}
AllocatorStats memory_stats(int) { return {}; }
void set_fill_on_allocate(bool) {}
void reset_peak_memory_stats(int) {}

#endif

}  // namespace nd::kernels::cuda
