// Host stand-ins for what kernels/cuda/*.cu call from kernels/cuda/{stream,allocator,runtime}.cpp,
// which an emulation test must not link (libnanoddp's CUDA objects define the same names).
// allocate() fills new memory with 0xff bytes (NaN in f32 and f64), as the allocator's
// set_fill_on_allocate(true) does, and registers it with the sanitizer as uninitialised
// scratch between red zones. The tests hand kernels host memory from std::vector as device
// memory, so operator new is replaced too: every heap block gets red zones and is tracked
// (include/emu_sanitizer.h), which is how an index one past a vector's end is caught.
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "emu_core.h"
#include "engine/error.h"
#include "kernels/cuda/allocator.h"
#include "kernels/cuda/graph.h"
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
cudaStream_t capture_stream(int) { return nullptr; }  // graph.cpp's: no capture in the per-kernel tests
cudaStream_t capture_origin(int) { return nullptr; }
constexpr size_t kScratchRedZone = 256;  // cudaMalloc aligns to 256 bytes: the red zones keep that
void* allocate(int, size_t nbytes, cudaStream_t) {
  if (nbytes == 0) return nullptr;
  auto* raw = static_cast<unsigned char*>(std::aligned_alloc(256, 2 * kScratchRedZone + (nbytes + 255) / 256 * 256));
  if (raw == nullptr) throw Error("emulated allocate: out of host memory");
  unsigned char* p = raw + kScratchRedZone;
  std::memset(p, 0xff, nbytes);
  emu_san::track(p, nbytes, "scratch from allocate()", /*uninitialised=*/true, kScratchRedZone);
  return p;
}
void release(void* ptr) {
  if (ptr == nullptr) return;
  emu_san::untrack(ptr);
  std::free(static_cast<unsigned char*>(ptr) - kScratchRedZone);
}
void copy_host_to_device(int, void* dst, const void* src, size_t nbytes, cudaStream_t) {
  std::memcpy(dst, src, nbytes);
  emu_san::host_wrote(dst, nbytes);
}

}  // namespace nd::kernels::cuda

// ---- operator new with red zones ------------------------------------------------------------------
// [raw ... | the raw pointer | kRedZone][n bytes][kRedZone]. Allocations made while the
// sanitizer itself allocates (its map nodes) are laid out alike but not tracked.
namespace {
constexpr size_t kRedZone = 64;

void* tracked_new(size_t n, size_t align) {
  align = align < 16 ? 16 : align;
  const size_t lead = (kRedZone + sizeof(void*) + align - 1) / align * align;
  const size_t total = (lead + n + kRedZone + align - 1) / align * align;
  auto* raw = static_cast<unsigned char*>(std::aligned_alloc(align, total));
  if (raw == nullptr) return nullptr;
  unsigned char* p = raw + lead;
  std::memcpy(p - sizeof(void*), &raw, sizeof(void*));
  emu_san::track(p, n, "heap block (operator new)", /*uninitialised=*/false, kRedZone);
  return p;
}
void* tracked_new_or_throw(size_t n, size_t align) {
  void* p = tracked_new(n, align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void tracked_delete(void* p) {
  if (p == nullptr) return;
  emu_san::untrack(p);
  void* raw;
  std::memcpy(&raw, static_cast<unsigned char*>(p) - sizeof(void*), sizeof(void*));
  std::free(raw);
}
}  // namespace

void* operator new(size_t n) { return tracked_new_or_throw(n, 16); }
void* operator new[](size_t n) { return tracked_new_or_throw(n, 16); }
void* operator new(size_t n, std::align_val_t a) { return tracked_new_or_throw(n, size_t(a)); }
void* operator new[](size_t n, std::align_val_t a) { return tracked_new_or_throw(n, size_t(a)); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return tracked_new(n, 16); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return tracked_new(n, 16); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return tracked_new(n, size_t(a)); }
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return tracked_new(n, size_t(a)); }
void operator delete(void* p) noexcept { tracked_delete(p); }
void operator delete[](void* p) noexcept { tracked_delete(p); }
void operator delete(void* p, size_t) noexcept { tracked_delete(p); }
void operator delete[](void* p, size_t) noexcept { tracked_delete(p); }
void operator delete(void* p, std::align_val_t) noexcept { tracked_delete(p); }
void operator delete[](void* p, std::align_val_t) noexcept { tracked_delete(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { tracked_delete(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { tracked_delete(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { tracked_delete(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { tracked_delete(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { tracked_delete(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { tracked_delete(p); }
