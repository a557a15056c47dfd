#pragma once
// The caching device allocator: every CUDA Storage allocates through it, so a steady
// training step (the same tensor sizes each step) makes no cudaMalloc or cudaFree call.
//
// Why it is safe to hand a freed block to the next request: a block is cached with the
// stream it was allocated on and is only reused by a request on that same stream.
// Work on one stream runs in order, so every kernel that used the block before it was
// freed has run before any kernel of the new owner starts. A tensor used on another
// stream (a collective on the communication stream) must be kept alive by that work
// until it completes, as the NCCL process group's Work does.
//
// Sizes are rounded up to a size class (512 B minimum, then four classes per power of
// two, so at most 25% is wasted); blocks are reused only within their class and never
// split. Compiled in every build; without NANODDP_WITH_CUDA allocation throws.
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // held by live allocations (rounded sizes)
  int64_t reserved_bytes = 0;        // obtained from cudaMalloc and not yet returned
  int64_t peak_allocated_bytes = 0;  // maximum of allocated_bytes since the last reset
  int64_t num_mallocs = 0;           // cudaMalloc calls made by the allocator
  int64_t num_frees = 0;             // cudaFree calls made by the allocator
  int64_t num_cache_hits = 0;        // requests served from the cache
};

// The size class nbytes is rounded up to (0 stays 0).
size_t round_size(size_t nbytes);

// requires: 0 <= device < device count. ensures: at least nbytes of device memory usable
// in stream order on `stream`, or nullptr when nbytes == 0. Out of memory: frees the
// cache and retries once, then throws nd::Error with the device's statistics.
void* allocate(int device, size_t nbytes, cudaStream_t stream);
// Returns ptr (from allocate, or nullptr) to its stream's cache. Never throws.
void release(void* ptr);
// Returns every cached (free) block of `device` to the driver with cudaFree, except those of
// a held private pool.
void empty_cache(int device);
// A CUDA graph's private pool (graph.h, PyTorch's graph pool): the blocks allocated on
// `stream` (the graph's capture stream, which nothing else allocates on) are the graph's.
// While held, empty_cache and the out-of-memory retry keep them, so the addresses a replay
// writes are never handed to anyone else; during the capture, a block freed is reused only
// by the capture, and a cudaMalloc runs in the relaxed capture mode (cudaMalloc is not
// recorded: the memory is the graph's for its life).
void hold_private_pool(int device, cudaStream_t stream);
// Ends the hold: the pool's free blocks go back to the driver, its live ones (tensors made
// during the capture that are still referenced) become blocks of `successor` (the compute
// stream the replays ran on), freed into its cache as usual.
void release_private_pool(int device, cudaStream_t stream, cudaStream_t successor);
AllocatorStats memory_stats(int device);
// Testing aid, off by default: every allocation is filled with 0xFF bytes (NaN in f32
// and f64) on its stream before it is handed out, so an output element that a kernel
// leaves unwritten shows up as NaN.
void set_fill_on_allocate(bool enable);
void reset_peak_memory_stats(int device);

}  // namespace nd::kernels::cuda
