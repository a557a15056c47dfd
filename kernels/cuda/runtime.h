#pragma once
// The CUDA runtime as the engine sees it: device count, memory, copies.
// runtime.cpp is compiled in every build; without NANODDP_WITH_CUDA it reports
// "built without CUDA" and every allocation or copy throws nd::Error.
#include <cstddef>
#include <string>

namespace nd::kernels::cuda {

bool built_with_cuda();
int device_count();                      // 0 when no driver/GPU
std::string unavailable_reason();        // why device_count() is 0
// requires: device_count() > device. ensures: nbytes of device memory (nullptr if nbytes == 0).
void* device_malloc(int device, size_t nbytes);
void device_free(int device, void* ptr);
// Synchronous copies; dst/src on the given device (or host), non-overlapping.
void copy_host_to_device(int device, void* dst, const void* src, size_t nbytes);
void copy_device_to_host(int device, void* dst, const void* src, size_t nbytes);
void copy_device_to_device(int dst_device, void* dst, int src_device, const void* src, size_t nbytes);

}  // namespace nd::kernels::cuda
