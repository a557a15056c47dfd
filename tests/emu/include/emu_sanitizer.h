#pragma once
// The emulator's sanitizer: what compute-sanitizer (racecheck, memcheck, initcheck,
// synccheck) would report on a GPU, seen on the CPU. Runtime in tests/emu/emu_sanitizer*.cpp and emu_access_hooks.cpp;
// what each detector sees and what it cannot is in tests/emu/README.md ("The sanitizer").
//
// How it sees memory: the rewritten kernels (nanoddp_emu_kernels) are compiled with
// -fsanitize=thread but NOT linked with ThreadSanitizer's runtime: every load and store of
// kernel code calls __tsan_readN / __tsan_writeN, which emu_access_hooks.cpp defines. Those
// hooks ignore everything outside a kernel thread, the thread's own stack and memory
// nobody tracks, and check:
// - shared memory: every `__shared__` array and the launch's dynamic shared memory live in
//   one arena with unused bytes (red zones) between them, reset and re-poisoned per block.
//   An access to a red zone is an out-of-bounds report at the access. Other accesses are
//   logged per thread; when a block barrier opens (and when the block ends) the last thread
//   to arrive checks the epoch's logs in a fixed order: two threads touching one byte, one
//   of them writing, is a race unless they are lanes of one warp separated by __syncwarp;
//   then a read of a byte no thread has written in this block is an uninitialised read.
//   The same accesses give the same report every run, whatever the threads' interleaving.
// - global memory: allocations registered with track() (the per-kernel tests' operator new
//   and allocate(), the emulated cudaMalloc) have red zones; an access there is reported at
//   once. A write remembers (launch, block, barrier epoch, thread) per 4-byte word: a word
//   written twice in one launch by two blocks, or by two threads of different warps between
//   the same barriers, is a conflict. Scratch registered as uninitialised reports a read of
//   a byte no kernel (or host copy) wrote.
// Reports print "EMU sanitizer: ..." naming the kernel, the memory, the byte offset and both
// threads, then abort (the test fails, CI fails).
#include <cstddef>
#include <cstdint>

#include "emu_cost.h"

#define EMU_UNCHECKED __attribute__((no_sanitize("thread")))

namespace emu_san {

// ---- called by emu_core.h's launch, on the launching thread ----
void begin_launch(const char* kernel, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                  size_t dynamic_smem);
void begin_block(unsigned x, unsigned y, unsigned z);
void end_block();
void end_launch();

// ---- called in a kernel thread ----
void enter_thread(int tid);
void leave_thread();
void block_barrier_opens();  // by the last thread to reach __syncthreads, before the others go on
void warp_synced();          // after __syncwarp: this lane's accesses before it precede its warp's after it
void atomic_access(const void* p, size_t n);
// A vector type (float4, double2, ...) copied whole (emu_core.h): one naturally aligned
// access of n bytes, checked for alignment and counted by the cost model as one.
void vector_access(const void* p, size_t n, bool write);
// A `__shared__` declaration (emu_rewrite): the array's place in this block's arena. Every
// thread calls it; the first call of a block places the array.
unsigned char* static_shared(const void* tag, size_t bytes, size_t align, const char* name);
// `extern __shared__`: the launch's dynamic shared memory, aligned to exactly max(align, 16).
unsigned char* dynamic_shared(size_t align);
// A warp collective whose mask is not the set of lanes that exist (a partial warp).
[[noreturn]] void bad_mask(const char* call, unsigned mask, unsigned lanes, int warp, int tid);

// ---- global memory (any thread, outside kernels) ----
void track(const void* p, size_t n, const char* what, bool uninitialised, size_t red_zone);
void untrack(const void* p);
void host_wrote(const void* p, size_t n);  // a host copy or memset into tracked memory
bool enabled();                            // NANODDP_EMU_SANITIZE=0 turns the checks off
long accesses_checked();                   // accesses checked since the start (tests check > 0)
// True when p is in the shared-memory arena; then *offset is its offset there (the cost model).
bool shared_offset(const void* p, uintptr_t* offset);
// While one lives, this thread's heap allocations are not tracked: the emulator's own
// per-block tables (warp barriers, shuffle slots) are not device memory to check or count.
struct Untracked {
  Untracked();
  ~Untracked();
  Untracked(const Untracked&) = delete;
  Untracked& operator=(const Untracked&) = delete;
  const bool nested;
};

}  // namespace emu_san
