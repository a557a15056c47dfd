#pragma once
// The caching CPU allocator behind every CPU Storage. A training step allocates the same
// tensor sizes every step; giving each large freed block to the next request of its size
// class skips malloc's mmap / munmap (or heap trim) cycle and the first-touch page faults
// of fresh memory (bench/RESULTS.md, finding 4). The CUDA twin is kernels/cuda/allocator.h.
//
// Blocks of kMinCachedBytes to kMaxCachedBytes are rounded up to a size class (the CUDA
// allocator's round_size: four classes per power of two, so at most 25% more) and, when
// released, kept on their class's free list (the most recently freed is reused first) as
// long as the cache stays within kCacheLimitBytes; a block that would exceed it is freed.
// Other blocks go straight to aligned_alloc / free: small ones are cheap to malloc, and
// huge ones (the dataset and its one-off conversions) would stay resident for nothing.
// Only released blocks are reused, so memory in use is never handed out twice; a reused
// block's contents are undefined, exactly as malloc's. Thread-safe: the data loader's
// thread allocates too. The cost: a cached block serves only its own class, so a phase
// with other sizes (an evaluation pass between training steps) raises the peak by up to
// what the cache holds; empty_cache() gives it back.
// Every block in use is counted (allocated_bytes) with its peak, cached size or not, so a
// program can read the most CPU tensor memory a step needed (bench_train, the apps' logs).
// Tests: tests/engine/cpu_allocator_test.cpp.
#include <cstddef>
#include <cstdint>

namespace nd::cpu {

inline constexpr size_t kAlignment = 64;
inline constexpr size_t kMinCachedBytes = size_t{64} << 10;    // 64 KiB
inline constexpr size_t kMaxCachedBytes = size_t{32} << 20;    // 32 MiB
inline constexpr size_t kCacheLimitBytes = size_t{256} << 20;  // 256 MiB

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // held by live allocations (block sizes: rounded up as above)
  int64_t peak_allocated_bytes = 0;  // maximum of allocated_bytes since the last reset
  int64_t cached_bytes = 0;    // in free blocks kept for reuse (rounded sizes)
  int64_t num_cache_hits = 0;  // requests served from the cache
  int64_t num_mallocs = 0;     // aligned_alloc calls for blocks of cached sizes
  int64_t num_frees = 0;       // such blocks given back with free (over the limit, empty_cache)
};

// ensures: a kAlignment-aligned block of at least nbytes, or nullptr when nbytes == 0.
// Out of memory: empties the cache and retries once, then throws nd::Error.
void* allocate(size_t nbytes);
// requires: ptr came from allocate(nbytes) with this nbytes and was not released since,
// or is nullptr. Never throws.
void release(void* ptr, size_t nbytes);
// Frees every cached block.
void empty_cache();
// torch.cuda.memory_stats()'s counters for the CPU: allocated_bytes and its peak are
// torch.cuda.memory_allocated() and max_memory_allocated(); what the cache holds besides
// is cached_bytes (allocated + cached: the process's CPU tensor memory, PyTorch's reserved).
AllocatorStats memory_stats();
// Starts a new peak at the bytes allocated now (torch.cuda.reset_peak_memory_stats()).
void reset_peak_memory_stats();
// Testing aid, off by default: every allocation is filled with 0xFF bytes (NaN in f32
// and f64) before it is handed out, so code that reads memory it never wrote shows up.
void set_fill_on_allocate(bool enable);

}  // namespace nd::cpu
