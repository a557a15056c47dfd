#pragma once
// The CUDA runtime as the engine sees it: device count and copies between host and
// device. Device memory comes from the caching allocator (allocator.h); kernels run on
// each device's compute stream (stream.h). runtime.cpp is compiled in every build;
// without NANODDP_WITH_CUDA it reports "built without CUDA" and every copy throws.
#include <cstddef>
#include <string>

#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

bool built_with_cuda();
int device_count();                      // 0 when no driver/GPU
std::string unavailable_reason();        // why device_count() is 0

// Host <-> device copies, ordered on the device's compute stream after every kernel
// queued there, staged through pinned host memory (so the DMA engine reads page-locked
// memory); `src`/`dst` on the host may be reused as soon as they return.
// To the device: up to 16 MiB copied into a pinned block of its own and queued, without
// waiting for the device (kernels queued after it see the data; host_allocator.h keeps
// the block until the copy has run); larger copies wait for each 16 MiB chunk.
// To the host: waits for the device (the host reads the bytes on return).
// requires: dst/src do not overlap; device pointers on `device`.
void copy_host_to_device(int device, void* dst, const void* src, size_t nbytes);
// The same on `stream` (a stream of `device`) instead of the compute stream: for data that
// kernels on that stream read (kernels queued there after it see it).
void copy_host_to_device(int device, void* dst, const void* src, size_t nbytes, cudaStream_t stream);
void copy_device_to_host(int device, void* dst, const void* src, size_t nbytes);
// Pinned host -> device without waiting: queued on the device's compute stream, which is
// all the ordering kernels there need; records the copy on the pinned block that starts at
// `src_block` (host_allocator.h), which then outlives the copy and is not overwritten
// before it has run. requires: src lies in that live pinned block.
void copy_pinned_to_device_async(int device, void* dst, void* src_block, const void* src, size_t nbytes);
// Device -> device, queued on dst_device's compute stream (asynchronous to the host).
// Across devices the source device's compute stream is drained first.
void copy_device_to_device(int dst_device, void* dst, int src_device, const void* src, size_t nbytes);

// TF32 tensor-core math for f32 GEMMs (about 10 bits of mantissa, relative error near
// 1e-3). Off by default so that CUDA matches the CPU reference; like PyTorch's
// torch.backends.cuda.matmul.allow_tf32. A process-wide setting, read at each GEMM.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace nd::kernels::cuda
