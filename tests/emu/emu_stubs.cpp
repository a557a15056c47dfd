// Host stand-ins for what kernels/cuda/*.cu call from kernels/cuda/{stream,allocator,runtime}.cpp,
// which an emulation test must not link (libnanoddp's CUDA objects define the same names).
// allocate() fills new memory with 0xff bytes (NaN in f32 and f64), as the allocator's
// set_fill_on_allocate(true) does, so scratch a kernel reads before writing shows up.
#include <cstdlib>
#include <cstring>
#include <string>

#include "emu_core.h"
#include "engine/error.h"
#include "kernels/cuda/allocator.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

void check(int status, const char* call, const std::string& op) {
  if (status != 0) throw Error(std::string(call) + " failed in " + op);
}
void require(bool ok, const char* kernel, const std::string& message) {
  if (!ok) throw Error(std::string(kernel) + ": " + message);
}
void check_launch(const char*) {}
void* allocate(int, size_t nbytes, cudaStream_t) {
  if (nbytes == 0) return nullptr;
  void* p = std::aligned_alloc(256, (nbytes + 255) / 256 * 256);  // cudaMalloc aligns to 256 bytes
  if (p == nullptr) throw Error("emulated allocate: out of host memory");
  std::memset(p, 0xff, nbytes);
  return p;
}
void release(void* ptr) { std::free(ptr); }
void copy_host_to_device(int, void* dst, const void* src, size_t nbytes) { std::memcpy(dst, src, nbytes); }

}  // namespace nd::kernels::cuda
