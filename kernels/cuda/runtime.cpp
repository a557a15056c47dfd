// Device discovery and host <-> device copies. Compiled in every build: the CPU-only
// build answers "built without CUDA" instead of failing to link.
#include "kernels/cuda/runtime.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "kernels/common/error.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/host_allocator.h"
#include "kernels/cuda/stream.h"

#ifdef NANODDP_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace nd::kernels::cuda {

namespace {
std::atomic<bool> g_allow_tf32{false};
}
void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }

#ifdef NANODDP_WITH_CUDA

bool built_with_cuda() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string unavailable_reason() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  cudaGetLastError();
  if (err != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
  return n == 0 ? "cudaGetDeviceCount found 0 devices" : "available";
}

namespace {

// One pinned (page-locked, portable to every device) staging buffer for the process,
// allocated on first use and kept; copies larger than it go through in chunks.
constexpr size_t kStagingBytes = size_t(16) << 20;

struct Staging {
  std::mutex mutex;
  void* buffer = nullptr;
};

Staging& staging() {
  static Staging* s = new Staging();  // never freed: see allocator.cpp
  return *s;
}

void* staging_buffer(Staging& s) {
  if (!s.buffer)
    check(cudaHostAlloc(&s.buffer, kStagingBytes, cudaHostAllocPortable), "cudaHostAlloc", "pinned staging buffer");
  return s.buffer;
}

// Host <-> device through the staging buffer on `stream` (of `device`, made current), one
// chunk at a time: host -> pinned -> device, or device -> pinned -> host. Each chunk waits
// for its DMA before the buffer is refilled (to the device) or read (to the host).
void staged_copy(int device, bool to_device, void* dst, const void* src, size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return;
  const std::string what = (to_device ? "copy to cuda:" : "copy from cuda:") + std::to_string(device);
  Staging& s = staging();
  std::lock_guard lock(s.mutex);
  void* pinned = staging_buffer(s);
  for (size_t off = 0; off < nbytes; off += kStagingBytes) {
    const size_t n = std::min(kStagingBytes, nbytes - off);
    char* to = static_cast<char*>(dst) + off;
    const char* from = static_cast<const char*>(src) + off;
    if (to_device) {
      std::memcpy(pinned, from, n);
      check(cudaMemcpyAsync(to, pinned, n, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync(HostToDevice)", what);
    } else {
      check(cudaMemcpyAsync(pinned, from, n, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync(DeviceToHost)", what);
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", what);
    if (!to_device) std::memcpy(to, pinned, n);
  }
}

}  // namespace

// Up to the staging buffer's size, a copy to the device goes through a pinned block of
// its own from the cache (host_allocator.h) and returns without waiting for the device:
// the host's bytes are in the block once memcpy returns, and the block is not reused
// before its recorded copy has run. Larger copies (a data set, a checkpoint) go through
// the staging buffer in chunks, waiting for each, rather than pinning their whole size.
void copy_host_to_device(int device, void* dst, const void* src, size_t nbytes) {
  copy_host_to_device(device, dst, src, nbytes, use_device(device));
}

void copy_host_to_device(int device, void* dst, const void* src, size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return;
  if (capture_active())
    refuse_during_capture(device, "copy " + std::to_string(nbytes) + " bytes from the host to cuda:" + std::to_string(device),
                        "a replay would copy whatever the host's staging memory holds then; fill a static CUDA tensor "
                        "with copy_ before replay()");
  check(cudaSetDevice(device), "cudaSetDevice", "copy to cuda:" + std::to_string(device));
  if (nbytes > kStagingBytes) return staged_copy(device, true, dst, src, nbytes, stream);
  void* block = allocate_pinned(nbytes);
  try {
    std::memcpy(block, src, nbytes);
    check(cudaMemcpyAsync(dst, block, nbytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync(HostToDevice)",
          "copy to cuda:" + std::to_string(device));
    record_copy(block, device, stream);
  } catch (...) {
    release_pinned(block);
    throw;
  }
  release_pinned(block);
}

void copy_device_to_host(int device, void* dst, const void* src, size_t nbytes) {
  if (capture_active())
    refuse_during_capture(device, "copy " + std::to_string(nbytes) + " bytes from cuda:" + std::to_string(device) + " to the host",
                        "the host would wait for a value the capture only records; read it after a replay");
  staged_copy(device, false, dst, src, nbytes, use_device(device));
}

void copy_pinned_to_device_async(int device, void* dst, void* src_block, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  if (capture_active())
    refuse_during_capture(device, "copy " + std::to_string(nbytes) + " bytes from pinned memory to cuda:" + std::to_string(device),
                        "fill a static CUDA tensor with copy_ before replay()");
  cudaStream_t stream = use_device(device);
  check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync(HostToDevice)",
        "non-blocking copy to cuda:" + std::to_string(device));
  record_copy(src_block, device, stream);
}

void copy_device_to_device(int dst_device, void* dst, int src_device, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  const std::string what = "copy from cuda:" + std::to_string(src_device) + " to cuda:" + std::to_string(dst_device);
  if (src_device != dst_device) synchronize(src_device);  // src's producers ran on its own stream
  cudaStream_t stream = use_device(dst_device);
  if (src_device == dst_device)
    check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync(DeviceToDevice)",
          what);
  else
    check(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, stream), "cudaMemcpyPeerAsync", what);
}

#else  // CPU-only build

namespace {
[[noreturn]] void no_cuda() {
  throw Error("nanoddp was built without CUDA (NANODDP_CUDA=OFF or no nvcc at configure time)");
}
}  // namespace

bool built_with_cuda() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "nanoddp was built without CUDA"; }
void copy_host_to_device(int, void*, const void*, size_t) { no_cuda(); }
void copy_host_to_device(int, void*, const void*, size_t, cudaStream_t) { no_cuda(); }
void copy_device_to_host(int, void*, const void*, size_t) { no_cuda(); }
void copy_pinned_to_device_async(int, void*, void*, const void*, size_t) { no_cuda(); }
void copy_device_to_device(int, void*, int, const void*, size_t) { no_cuda(); }

#endif

}  // namespace nd::kernels::cuda
