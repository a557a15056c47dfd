// The instrumentation's entry points, where the sanitizer (include/emu_sanitizer.h) and the
// cost model (include/emu_cost.h) meet the kernels: the emulator's events (emu_core.h's
// launch, block, barrier and thread calls) and every load and store of kernel code
// (-fsanitize=thread's __tsan_* calls, the vector types' whole copies) arrive here and are
// handed to the sanitizer's checks when they are on (NANODDP_EMU_SANITIZE is not 0) and to the
// cost model's counters when it counts (emu_cost::enabled()). Which accesses either sees:
// those of a kernel thread, outside its own stack; the cost model only shared memory and
// tracked device memory, not the emulator's tables. Built WITHOUT -fsanitize: nothing here is
// instrumented.
#include <pthread.h>

#include <cstring>

#include "emu_core.h"
#include "emu_cost.h"
#include "emu_sanitizer.h"
#include "emu_sanitizer_state.h"

namespace emu_san {
using namespace detail;
namespace {

thread_local uintptr_t stack_lo = 0, stack_hi = 0;  // this OS thread's stack: a kernel thread's locals

inline void on_access(const void* p, size_t n, Kind kind) {
  ThreadState* t = current;
  if (t == nullptr) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a - stack_lo < stack_hi - stack_lo) return;  // this thread's locals
  const bool shared = a - reinterpret_cast<uintptr_t>(arena) < kArenaBytes;
  // The cost model counts shared memory and device memory (tracked allocations), not the
  // emulator's own state (blockDim, threadIdx) nor the launching thread's stack (arguments).
  if (L.counting && !emu_cost::quiet() && (shared || find_tracked(a) != nullptr))
    emu_cost::access(t->tid, shared, shared ? a - reinterpret_cast<uintptr_t>(arena) : a, n, kind != kWrite,
                     kind != kRead);
  if (!checks_on()) return;
  ++t->checked;
  if (shared) {
    shared_access(*t, a - reinterpret_cast<uintptr_t>(arena), n, kind);
    return;
  }
  global_access(*t, a, n, kind);
}

// An access the compiler emitted as naturally aligned (__tsan_readN / __tsan_writeN, not the
// unaligned variants): a float4, int4, uint2, double2 ... through a pointer of that type. On the
// GPU a misaligned one faults ("misaligned address"); x86 would not notice.
inline void aligned_access(const void* p, size_t n, Kind kind) {
  if (current != nullptr && reinterpret_cast<uintptr_t>(p) % n != 0)
    report("misaligned %zu-byte %s in kernel %s: %s of %s %s address %p (%zu mod %zu); a vector load or store (float4, "
           "int4, uint2, ...) must be aligned to its size on the GPU",
           n, kind == kWrite ? "store" : "load", L.kernel, thread_name(current->tid).c_str(), block_name().c_str(),
           kind == kWrite ? "writes" : "reads", p, size_t(reinterpret_cast<uintptr_t>(p) % n), n);
  on_access(p, n, kind);
}

}  // namespace

// ---- the emulator's events -----------------------------------------------------------------------------
void begin_launch(const char* kernel, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                  size_t dynamic_smem) {
  prepare_launch(kernel, gx, gy, gz, bx, by, bz, dynamic_smem);
  L.counting = emu_cost::enabled();
  if (L.counting) emu_cost::begin_launch(gx, gy, gz, bx, by, bz, dynamic_smem);
  if (checks_on() || L.counting) rebuild_snapshot();
}

void begin_block(unsigned x, unsigned y, unsigned z) { prepare_block(x, y, z); }

void end_block() {
  if (L.counting) emu_cost::end_epoch();
  if (checks_on()) check_epoch();
}

void end_launch() {
  if (L.counting) emu_cost::end_launch();
  L.counting = false;
  L.kernel = "";
}

void enter_thread(int tid) {
  if (stack_hi == 0) {
    pthread_attr_t attr;
    void* lo = nullptr;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      pthread_attr_getstack(&attr, &lo, &size);
      pthread_attr_destroy(&attr);
    }
    stack_lo = reinterpret_cast<uintptr_t>(lo);
    stack_hi = stack_lo + size;
  }
  ThreadState& t = *L.states[tid];
  t.warp_epoch = 0;
  current = checks_on() || L.counting ? &t : nullptr;
}

void leave_thread() { current = nullptr; }

void block_barrier_opens() {
  if (L.counting) emu_cost::barrier(), emu_cost::end_epoch();
  if (checks_on()) check_epoch();
}

void atomic_access(const void* p, size_t n) { on_access(p, n, kAtomic); }
void vector_access(const void* p, size_t n, bool write) { aligned_access(p, n, write ? kWrite : kRead); }

}  // namespace emu_san

// ---- the instrumentation's entry points -----------------------------------------------------------------
// -fsanitize=thread calls these for every memory access of the rewritten kernels. Atomic
// operations of instrumented code (none in kernels; std::shared_ptr and the like in host code
// of the same files) are carried out as sequentially consistent ones.
extern "C" {
using emu_san::Kind;
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_ignore_thread_begin() {}
void __tsan_ignore_thread_end() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
void __tsan_read_range(void* p, unsigned long n) { emu_san::on_access(p, n, emu_san::kRead); }
void __tsan_write_range(void* p, unsigned long n) { emu_san::on_access(p, n, emu_san::kWrite); }
#define EMU_SAN_ACCESS(N)                                                                    \
  void __tsan_read##N(void* p) { emu_san::aligned_access(p, N, emu_san::kRead); }            \
  void __tsan_write##N(void* p) { emu_san::aligned_access(p, N, emu_san::kWrite); }          \
  void __tsan_unaligned_read##N(void* p) { emu_san::on_access(p, N, emu_san::kRead); }       \
  void __tsan_unaligned_write##N(void* p) { emu_san::on_access(p, N, emu_san::kWrite); }     \
  void __tsan_volatile_read##N(void* p) { emu_san::on_access(p, N, emu_san::kRead); }        \
  void __tsan_volatile_write##N(void* p) { emu_san::on_access(p, N, emu_san::kWrite); }      \
  void __tsan_unaligned_volatile_read##N(void* p) { emu_san::on_access(p, N, emu_san::kRead); } \
  void __tsan_unaligned_volatile_write##N(void* p) { emu_san::on_access(p, N, emu_san::kWrite); }
EMU_SAN_ACCESS(1)
EMU_SAN_ACCESS(2)
EMU_SAN_ACCESS(4)
EMU_SAN_ACCESS(8)
EMU_SAN_ACCESS(16)
#undef EMU_SAN_ACCESS

void* __tsan_memcpy(void* d, const void* s, unsigned long n) {
  emu_san::on_access(s, n, emu_san::kRead);
  emu_san::on_access(d, n, emu_san::kWrite);
  return std::memcpy(d, s, n);
}
void* __tsan_memmove(void* d, const void* s, unsigned long n) {
  emu_san::on_access(s, n, emu_san::kRead);
  emu_san::on_access(d, n, emu_san::kWrite);
  return std::memmove(d, s, n);
}
void* __tsan_memset(void* d, int c, unsigned long n) {
  emu_san::on_access(d, n, emu_san::kWrite);
  return std::memset(d, c, n);
}

void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
#define EMU_SAN_ATOMIC(N, T)                                                                                    \
  T __tsan_atomic##N##_load(const volatile T* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); }          \
  void __tsan_atomic##N##_store(volatile T* a, T v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); }          \
  T __tsan_atomic##N##_exchange(volatile T* a, T v, int) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }   \
  T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_fetch_nand(volatile T* a, T v, int) {                                                   \
    return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST);                                                         \
  }                                                                                                             \
  int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {                          \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                     \
  }                                                                                                             \
  int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {                            \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                      \
  }                                                                                                             \
  T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, int) {                                \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                           \
    return c;                                                                                                   \
  }
EMU_SAN_ATOMIC(8, char)
EMU_SAN_ATOMIC(16, short)
EMU_SAN_ATOMIC(32, int)
EMU_SAN_ATOMIC(64, long)
#undef EMU_SAN_ATOMIC
}

