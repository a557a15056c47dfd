// Device management, allocation and copies. Compiled in every build: the
// CPU-only build answers "built without CUDA" instead of failing to link.
#include "kernels/cuda/runtime.h"

#include "engine/error.h"

#ifdef NANODDP_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace nd::kernels::cuda {

#ifdef NANODDP_WITH_CUDA

namespace {
void check(cudaError_t err, const char* call, const std::string& what) {
  ND_CHECK(err == cudaSuccess, call, " failed for ", what, ": ", cudaGetErrorString(err));
}
}  // namespace

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

void* device_malloc(int device, size_t nbytes) {
  if (nbytes == 0) return nullptr;
  check(cudaSetDevice(device), "cudaSetDevice", "cuda:" + std::to_string(device));
  void* ptr = nullptr;
  check(cudaMalloc(&ptr, nbytes), "cudaMalloc",
        std::to_string(nbytes) + " bytes on cuda:" + std::to_string(device));
  return ptr;
}

void device_free(int device, void* ptr) {
  if (!ptr) return;
  cudaSetDevice(device);
  cudaFree(ptr);  // never throws: runs from destructors
}

void copy_host_to_device(int device, void* dst, const void* src, size_t nbytes) {
  check(cudaSetDevice(device), "cudaSetDevice", "cuda:" + std::to_string(device));
  check(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice), "cudaMemcpy(HostToDevice)",
        std::to_string(nbytes) + " bytes");
}

void copy_device_to_host(int device, void* dst, const void* src, size_t nbytes) {
  check(cudaSetDevice(device), "cudaSetDevice", "cuda:" + std::to_string(device));
  check(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost), "cudaMemcpy(DeviceToHost)",
        std::to_string(nbytes) + " bytes");
}

void copy_device_to_device(int dst_device, void* dst, int src_device, const void* src, size_t nbytes) {
  check(cudaMemcpyPeer(dst, dst_device, src, src_device, nbytes), "cudaMemcpyPeer",
        std::to_string(nbytes) + " bytes");
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
void* device_malloc(int, size_t) { no_cuda(); }
void device_free(int, void*) {}
void copy_host_to_device(int, void*, const void*, size_t) { no_cuda(); }
void copy_device_to_host(int, void*, const void*, size_t) { no_cuda(); }
void copy_device_to_device(int, void*, int, const void*, size_t) { no_cuda(); }

#endif

}  // namespace nd::kernels::cuda
