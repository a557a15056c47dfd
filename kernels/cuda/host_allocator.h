#pragma once
// Pinned (page-locked) host memory for CPU tensors that feed asynchronous copies to a
// GPU: Tensor::pin_memory(), TensorOptions::pinned_memory(true), DataLoaderOptions::
// pin_memory, and the block each upload from pageable memory is copied into
// (runtime.h copy_host_to_device). The DMA engine reads pinned memory directly, so a copy from it can be
// queued on the compute stream and return at once (Tensor::to(cuda, non_blocking)).
//
// Why events on each block: such a copy returns before the GPU has read the block. Its
// tensor may be dropped at once, or written by the host; the block must not reach a new
// owner, nor be overwritten, until the copy has run. Each asynchronous copy records an
// event on the block (record_copy); a released block is handed out again only once its
// events have completed, and a host write to a live block first waits for them
// (wait_copies: every in-place op does this through Storage::wait_for_copies; code that
// writes through data_ptr() calls that itself). Reuse after completion is PyTorch's
// CachingHostAllocator rule; PyTorch leaves the in-place race to the user. Why a cache at
// all: cudaHostAlloc maps and locks pages, far slower than malloc, and a training loop
// pins the same batch sizes every step.
//
// Sizes are rounded to the device allocator's size classes (allocator.h round_size);
// blocks are never split. Compiled in every build; without NANODDP_WITH_CUDA, or with
// no GPU, allocation throws an nd::Error saying why. Tests: tests/cuda/cuda_ops_test.cpp
// ("cuda pinned memory", on a GPU and emulated) and tests/emu/emulib_runtime_test.cpp (the
// emulator's events held pending: reuse and writes that wait).
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

struct HostAllocatorStats {
  int64_t allocated_bytes = 0;     // held by live pinned blocks (rounded sizes)
  int64_t cached_bytes = 0;        // in released blocks kept for reuse
  int64_t num_host_allocs = 0;     // cudaHostAlloc calls
  int64_t num_host_frees = 0;      // cudaFreeHost calls
  int64_t num_cache_hits = 0;      // requests served by a released block
  int64_t num_pending_copies = 0;  // recorded copies not yet seen complete
};

// ensures: at least nbytes of pinned host memory whose previous copies have all run, or
// nullptr when nbytes == 0. Throws nd::Error when CUDA is absent or cudaHostAlloc fails.
void* allocate_pinned(size_t nbytes);
// Returns ptr (from allocate_pinned, or nullptr) to the cache; it is reused only after
// its recorded copies complete. Never throws.
void release_pinned(void* ptr);
// An asynchronous copy reading (or writing) the block that starts at `block` was queued
// on `stream` of `device` (the current device): records an event after it.
void record_copy(void* block, int device, cudaStream_t stream);
// Blocks the host until every copy recorded on `block` has run (no-op when none).
void wait_copies(void* block);
// Frees every released block with cudaFreeHost (waiting for its copies first).
void empty_pinned_cache();
HostAllocatorStats pinned_memory_stats();

}  // namespace nd::kernels::cuda
