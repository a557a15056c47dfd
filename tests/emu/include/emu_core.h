#pragma once
// The emulator's core: runs CUDA kernel bodies on CPU threads so that CI (no GPU) checks
// the kernels' logic. Test-only; never part of libnanoddp. See tests/emu/README.md.
//
// What is emulated:
// - a launch (emu_launch, which tests/emu/emu_rewrite.cpp substitutes for <<<...>>>) runs
//   the grid's blocks one after another; each block runs one OS thread per CUDA thread
//   (a team kept across launches), so the threads of a block really run concurrently:
//   races are races, and -fsanitize=thread sees them. Because blocks run one at a time, a
//   kernel's `__shared__` variable is a function-local `static`: one copy, shared by the
//   threads of the running block (static shared memory is not re-poisoned between blocks).
// - gridDim, blockDim, blockIdx and threadIdx (3-D), with the launch limits checked:
//   block size 1..1024, grid y/z <= 65535, dynamic shared memory <= 227 KiB.
// - `__syncthreads` is a block barrier; `__syncwarp`, the shuffles and ballots are warp
//   barriers. Every barrier checks that all threads reach the SAME call: a thread at
//   another barrier aborts naming both, and a barrier some thread never reaches (a
//   divergent `__syncthreads`) aborts after a timeout instead of hanging.
// - shared memory: `__shared__` arrays (emu_rewrite) and the dynamic shared memory
//   (`extern __shared__`) live in the sanitizer's arena (emu_sanitizer.h), re-filled with
//   0xff bytes (NaN for floats) for every block, red zones between them; dynamic shared
//   memory is aligned to exactly its declared alignment (never more), so a kernel that
//   relies on alignment it did not ask for shows up.
// - the sanitizer (emu_sanitizer.h): shared-memory races, global write conflicts,
//   out-of-bounds and uninitialised reads, warp collectives whose mask is not the warp.
// - partial warps: a block size that is not a multiple of 32 has a last warp of fewer
//   lanes; a warp collective there must name exactly those lanes in its mask.
// - atomics are serialised by one mutex (exact, not fast).
// - the warp-level PTX of kernels/cuda/warp_mma.cuh (mma.sync m16n8k16, ldmatrix, cp.async)
//   through emu_ptx.h: the 32 lanes' registers gathered (emu_warp_gather) and the PTX ISA's
//   lane maps applied; cp.async copies land at the matching wait, poison before it.
// What is NOT emulated: timing, occupancy, registers and the static shared memory limit;
// warp-level scheduling
// (lanes are threads, not lockstep: code that relies on implicit warp synchrony without
// __syncwarp is a race here, as it is on Volta and newer); the mask argument of the *_sync
// intrinsics beyond "the lanes that exist" (a divergent collective over part of a warp
// aborts as a divergent barrier); cub and cuBLAS beyond the calls the stand-ins in this folder
// implement (cub/device/device_radix_sort.cuh, cublas_v2.h), cooperative groups, inline PTX (asm)
// other than warp_mma.cuh's functions, the register file, textures; streams (everything runs synchronously at the launch);
// device math (__expf is expf, the device's libm ulps are the host's; FMA contraction is
// the host compiler's); Linux only (futexes).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "emu_sanitizer.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

// ---- vector types and dim3 -------------------------------------------------------------
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3() = default;
  dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
// A vector type copied through a pointer is ONE access of its whole width on the GPU (an
// LDG.64/128 or STG.64/128, which must be aligned to that width). The host compiler splits
// such a copy into one access per field whenever the fields are used apart, which the
// sanitizer's alignment check would miss and the cost model would count as four warp
// instructions of 16-byte stride (4x the L2 sectors, 4x the shared wavefronts). So the copy
// constructor and assignment are uninstrumented and report one access of sizeof(T) bytes for
// the source and one for the destination (locals on the thread's stack are ignored there as
// everywhere). Reading one field through a pointer (`p->x`) stays a 4-byte access, as nvcc
// may also make it.
EMU_UNCHECKED inline void emu_vector_copy(void* dst, const void* src, size_t n) {
  emu_san::vector_access(src, n, /*write=*/false);
  emu_san::vector_access(dst, n, /*write=*/true);
  __builtin_memcpy(dst, src, n);
}
#define EMU_VECTOR_TYPE(T, A, F, ...)                                                      \
  struct alignas(A) T {                                                                  \
    F __VA_ARGS__;                                                                       \
    T() = default;                                                                       \
    T(const T& o) { emu_vector_copy(this, &o, sizeof(T)); }                              \
    T& operator=(const T& o) {                                                           \
      emu_vector_copy(this, &o, sizeof(T));                                              \
      return *this;                                                                      \
    }                                                                                    \
  };
EMU_VECTOR_TYPE(float2, 8, float, x, y)
EMU_VECTOR_TYPE(float4, 16, float, x, y, z, w)
EMU_VECTOR_TYPE(double2, 16, double, x, y)
EMU_VECTOR_TYPE(int2, 8, int, x, y)
EMU_VECTOR_TYPE(uint4, 16, unsigned, x, y, z, w)
#undef EMU_VECTOR_TYPE
// Built in place from the fields (locals: nothing to report).
template <class V, class F, class... A>
V emu_make_vector(A... fields) {
  const F f[] = {F(fields)...};
  static_assert(sizeof f == sizeof(V), "one value per field");
  V v;
  __builtin_memcpy(static_cast<void*>(&v), f, sizeof f);
  return v;
}
inline float2 make_float2(float x, float y) { return emu_make_vector<float2, float>(x, y); }
inline float4 make_float4(float x, float y, float z, float w) { return emu_make_vector<float4, float>(x, y, z, w); }
inline double2 make_double2(double x, double y) { return emu_make_vector<double2, double>(x, y); }
inline int2 make_int2(int x, int y) { return emu_make_vector<int2, int>(x, y); }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return emu_make_vector<uint4, unsigned>(x, y, z, w);
}

// ---- the launch's state ------------------------------------------------------------------
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 gridDim, blockDim;

[[noreturn]] inline void emu_die(const char* message) {
  std::fprintf(stderr, "EMU: %s\n", message);
  std::fflush(stderr);
  std::abort();
}

// Waiting without a mutex: threads sleep on a 32-bit generation counter with Linux futexes
// (a woken thread needs no lock, so a barrier of 256 threads costs 256 wake-ups, not 256
// turns at one mutex). emu_futex_wait returns after at most `timeout_ms` even if nothing
// changed (the caller re-checks).
inline void emu_futex_wait(std::atomic<int>& word, int expected, int timeout_ms) {
  timespec ts{timeout_ms / 1000, long(timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<int*>(&word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}
inline void emu_futex_wake_all(std::atomic<int>& word) {
  syscall(SYS_futex, reinterpret_cast<int*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

// A reusable barrier for n threads that checks all of them wait at the same call, and
// aborts when some never arrive (a divergent barrier would hang on the GPU, or worse).
class EmuBarrier {
 public:
  EmuBarrier(int n, const char* what, bool block = false) : n_(n), what_(what), block_(block) {}
  EMU_UNCHECKED void wait(const char* call);

 private:
  const int n_;
  const char* const what_;
  const bool block_;  // a __syncthreads barrier: the sanitizer checks each epoch as it opens
  std::atomic<int> count_{0}, generation_{0};
  std::atomic<const char*> first_call_{nullptr};  // the call the first arrival is at
};

inline EmuBarrier* emu_block_barrier = nullptr;
inline std::vector<std::unique_ptr<EmuBarrier>> emu_warp_barriers;
// [warp][lane * kEmuExchangeWords + i]: what each lane publishes to a warp collective (a
// shuffle one word, an mma.sync its fragments: emu_ptx.h).
constexpr int kEmuExchangeWords = 8;
inline std::vector<std::vector<uint64_t>> emu_warp_exchange;
inline long emu_blocks_run = 0;  // blocks run since the program started (tests check > 0)
inline long emu_launches = 0;    // launches since the program started

inline int emu_linear_tid() {
  return int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}
inline int emu_warp() { return emu_linear_tid() / 32; }
inline int emu_lane() { return emu_linear_tid() % 32; }

inline void EmuBarrier::wait(const char* call) {
  const int generation = generation_.load(std::memory_order_acquire);
  const char* first = nullptr;
  if (!first_call_.compare_exchange_strong(first, call) && first != call && std::strcmp(first, call) != 0) {
    std::fprintf(stderr, "EMU: divergent %s barrier: thread %d of block (%u,%u,%u) is at %s while others wait at %s\n",
                 what_, emu_linear_tid(), blockIdx.x, blockIdx.y, blockIdx.z, call, first);
    emu_die("aborting");
  }
  if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {  // the last arrival releases the others
    if (block_) emu_san::block_barrier_opens();
    count_.store(0, std::memory_order_relaxed);
    first_call_.store(nullptr, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    emu_futex_wake_all(generation_);
    return;
  }
  for (int spin = 0; spin < 64 && generation_.load(std::memory_order_acquire) == generation; ++spin)
    std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  while (generation_.load(std::memory_order_acquire) == generation) {
    emu_futex_wait(generation_, generation, 1000);
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(30)) {
      std::fprintf(stderr, "EMU: %s barrier at %s reached by %d of %d threads after 30 s (a divergent call?): block (%u,%u,%u)\n",
                   what_, call, count_.load(), n_, blockIdx.x, blockIdx.y, blockIdx.z);
      emu_die("aborting");
    }
  }
}
inline void emu_warp_sync(const char* call) { emu_warp_barriers[emu_warp()]->wait(call); }

// The lanes of this thread's warp that exist (all 32 but in the last warp of a block whose
// size is not a multiple of 32); a collective's mask must be exactly those.
inline unsigned emu_warp_lanes() {
  const int threads = int(blockDim.x * blockDim.y * blockDim.z), n = std::min(32, threads - emu_warp() * 32);
  return n == 32 ? 0xffffffffu : (1u << n) - 1;
}
inline void emu_check_mask(unsigned mask, const char* call) {
  const unsigned lanes = emu_warp_lanes();
  if (mask != lanes) emu_san::bad_mask(call, mask, lanes, emu_warp(), emu_linear_tid());
}

// `extern __shared__ __align__(A) T name[];` becomes `T* name = emu_dynamic_shared(A)`
// (emu_rewrite): the launch's dynamic shared memory, aligned to max(A, 16) bytes and
// deliberately NOT to twice that. 16 is what CUDA guarantees without an __align__.
inline unsigned char* emu_dynamic_shared(size_t align) { return emu_san::dynamic_shared(align); }
// `__shared__ T name[N];` becomes a reference to the array's place in the arena (emu_rewrite).
inline unsigned char* emu_static_shared(const void* tag, size_t bytes, size_t align, const char* name) {
  return emu_san::static_shared(tag, bytes, align, name);
}

// ---- qualifiers and intrinsics -----------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __constant__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __restrict__ __restrict

inline void __syncthreads() { emu_block_barrier->wait("__syncthreads"); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  emu_check_mask(mask, "__syncwarp");
  emu_warp_sync("__syncwarp");
  emu_san::warp_synced();
}
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// Warp exchange: every lane publishes v, then reads lane src's value. All 32 lanes must
// call it (the mask argument of the *_sync intrinsics is not emulated: full warps only).
template <class T>
EMU_UNCHECKED T emu_exchange(unsigned mask, T v, int src, const char* call) {
  emu_check_mask(mask, call);
  static_assert(sizeof(T) <= 8, "emulated shuffles move at most 8 bytes, like CUDA's");
  const int w = emu_warp(), lane = emu_lane();
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  emu_warp_sync(call);  // everyone has read the previous exchange
  emu_warp_exchange[w][lane * kEmuExchangeWords] = bits;
  emu_warp_sync(call);  // everyone has written
  const uint64_t got = emu_warp_exchange[w][src * kEmuExchangeWords];
  T r;
  std::memcpy(&r, &got, sizeof(T));
  return r;
}
template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = emu_lane();
  return emu_exchange(mask, v, (lane / width) * width + (src % width), "__shfl_sync");
}
template <class T>
T __shfl_xor_sync(unsigned members, T v, int mask, int width = 32) {
  const int lane = emu_lane(), src = lane ^ mask;
  return emu_exchange(members, v, (src / width == lane / width) ? src : lane, "__shfl_xor_sync");
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = emu_lane(), src = lane + int(delta);
  return emu_exchange(mask, v, (src / width == lane / width) ? src : lane, "__shfl_down_sync");
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = emu_lane(), src = lane - int(delta);
  return emu_exchange(mask, v, (src >= 0 && src / width == lane / width) ? src : lane, "__shfl_up_sync");
}
EMU_UNCHECKED inline unsigned __ballot_sync(unsigned mask, int pred) {
  emu_check_mask(mask, "__ballot_sync");
  const int w = emu_warp(), lane = emu_lane();
  emu_warp_sync("__ballot_sync");
  emu_warp_exchange[w][lane * kEmuExchangeWords] = pred != 0;
  emu_warp_sync("__ballot_sync");
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r |= unsigned((mask >> l & 1) && emu_warp_exchange[w][l * kEmuExchangeWords] != 0) << l;
  return r;
}
// Warp gather (the warp-level matrix instructions, emu_ptx.h): every lane of a FULL warp
// publishes `n` words; returns the warp's table, lane l's words at [l * kEmuExchangeWords].
// Valid until this lane's next warp collective (which first waits for every lane to arrive).
EMU_UNCHECKED inline const uint64_t* emu_warp_gather(const uint64_t* mine, int n, const char* call) {
  if (emu_warp_lanes() != 0xffffffffu) {
    std::fprintf(stderr, "EMU: %s: warp %d of block (%u,%u,%u) has %d lanes; the instruction needs all 32\n", call,
                 emu_warp(), blockIdx.x, blockIdx.y, blockIdx.z, __builtin_popcount(emu_warp_lanes()));
    emu_die("aborting");
  }
  const int w = emu_warp(), lane = emu_lane();
  emu_warp_sync(call);  // everyone has read the previous exchange
  std::memcpy(&emu_warp_exchange[w][size_t(lane) * kEmuExchangeWords], mine, sizeof(uint64_t) * size_t(n));
  emu_warp_sync(call);  // everyone has written
  return emu_warp_exchange[w].data();
}
// Called when a kernel thread returns, if set (emu_ptx.h: no cp.async left in flight).
inline thread_local void (*emu_thread_exit_check)() = nullptr;
inline int __any_sync(unsigned m, int p) { return __ballot_sync(m, p) != 0; }
inline int __all_sync(unsigned m, int p) { return __ballot_sync(m, p) == 0xffffffffu; }

template <class T>
T __ldg(const T* p) {
  return *p;
}
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __saturatef(float x) { return x < 0 ? 0.0f : x > 1 ? 1.0f : x; }
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
using std::max;
using std::min;

inline std::mutex emu_atomic_mutex;
template <class T>
EMU_UNCHECKED T atomicAdd(T* p, T v) {
  emu_san::atomic_access(p, sizeof(T));
  std::lock_guard<std::mutex> g(emu_atomic_mutex);
  const T old = *p;
  *p = old + v;
  return old;
}
template <class T>
EMU_UNCHECKED T atomicMin(T* p, T v) {
  emu_san::atomic_access(p, sizeof(T));
  std::lock_guard<std::mutex> g(emu_atomic_mutex);
  const T old = *p;
  *p = std::min(old, v);
  return old;
}
template <class T>
EMU_UNCHECKED T atomicMax(T* p, T v) {
  emu_san::atomic_access(p, sizeof(T));
  std::lock_guard<std::mutex> g(emu_atomic_mutex);
  const T old = *p;
  *p = std::max(old, v);
  return old;
}

// ---- launches ----------------------------------------------------------------------------
// A block's CUDA threads are a team of worker threads kept across blocks and launches
// (starting 256 fresh threads per block would cost more than most kernels here).
// run(n, job) runs job(t) on workers t = 0..n-1 concurrently and returns when all have.
class EmuTeam {
 public:
  ~EmuTeam() {
    stop_.store(true);
    generation_.fetch_add(1);
    emu_futex_wake_all(generation_);
    for (auto& w : workers_) w.join();
  }
  template <class Job>
  void run(int n, Job& job) {
    const int current = generation_.load();  // a new worker waits for the next generation
    while (int(workers_.size()) < n)
      workers_.emplace_back([this, id = int(workers_.size()), current] { work(id, current); });
    job_ = [&job](int t) { job(t); };
    active_.store(n);
    remaining_.store(n);
    generation_.fetch_add(1, std::memory_order_release);  // publishes job_ and active_
    emu_futex_wake_all(generation_);
    for (int r; (r = remaining_.load(std::memory_order_acquire)) != 0;) emu_futex_wait(remaining_, r, 1000);
  }

 private:
  void work(int id, int seen) {
    for (;;) {
      int g;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) emu_futex_wait(generation_, seen, 1000);
      if (stop_.load()) return;
      // active_ must belong to generation g: a worker left out of g may wake only when
      // the next run has begun. Re-reading the generation settles it (it cannot move on
      // while a worker that takes part has not finished).
      const int active = active_.load(std::memory_order_acquire);
      if (generation_.load(std::memory_order_acquire) != g) continue;
      seen = g;
      if (id >= active) continue;
      job_(id);
      if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) emu_futex_wake_all(remaining_);
    }
  }
  std::vector<std::thread> workers_;
  std::function<void(int)> job_;
  std::atomic<int> active_{0}, generation_{0}, remaining_{0};
  std::atomic<bool> stop_{false};
};
inline EmuTeam emu_team;

// emu_launch(grid, block[, dynamic shared bytes[, stream]], "kernel", [&] { kernel(args...); }):
// runs the grid to completion before returning (streams are not emulated). emu_rewrite
// passes the kernel's name as written at the launch, for the sanitizer's reports.
inline std::mutex emu_launch_mutex;
template <class F>
void emu_launch_impl(dim3 grid, dim3 block, size_t smem, const char* name, F&& kernel) {
  const long threads = long(block.x) * block.y * block.z;
  if (threads <= 0 || threads > 1024) emu_die("block size outside 1..1024");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) emu_die("empty grid (CUDA reports an invalid configuration)");
  if (grid.y > 65535 || grid.z > 65535) emu_die("grid y or z over 65535");
  if (grid.x > 2147483647u) emu_die("grid x over 2^31 - 1");
  if (smem > 227 * 1024) emu_die("dynamic shared memory over 227 KiB (the H100/H200 opt-in limit)");
  // One grid at a time: the launch state above is global (host threads that launch
  // concurrently, e.g. a collective's thread and the training loop, take turns).
  std::lock_guard launch_lock(emu_launch_mutex);
  ++emu_launches;
  gridDim = grid;
  blockDim = block;
  emu_san::begin_launch(name, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
  const int warps = int((threads + 31) / 32);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        emu_san::begin_block(bx, by, bz);
        EmuBarrier block_barrier(int(threads), "block", true);
        emu_block_barrier = &block_barrier;
        {
          emu_san::Untracked untracked;  // the emulator's tables, not device memory
          emu_warp_barriers.clear();
          for (int w = 0; w < warps; ++w)
            emu_warp_barriers.push_back(std::make_unique<EmuBarrier>(int(std::min<long>(32, threads - 32 * w)), "warp"));
          emu_warp_exchange.assign(warps, std::vector<uint64_t>(32 * kEmuExchangeWords));
        }
        auto job = [&](int t) {
          threadIdx = dim3(unsigned(t % block.x), unsigned((t / block.x) % block.y), unsigned(t / (block.x * block.y)));
          blockIdx = dim3(bx, by, bz);
          emu_san::enter_thread(t);
          kernel();
          if (emu_thread_exit_check != nullptr) emu_thread_exit_check();
          emu_san::leave_thread();
        };
        emu_team.run(int(threads), job);
        emu_san::end_block();
        ++emu_blocks_run;
      }
  emu_san::end_launch();
}
// A launch's arguments converted to the kernel's parameter types and copied, once, at the
// launch (emu_rewrite.cpp): what CUDA does, and what a launch captured into a graph replays.
template <class... P>
std::tuple<std::decay_t<P>...> emu_kernel_args(void (*)(P...), std::type_identity_t<P>... args) {
  return {args...};
}
template <class F>
void emu_launch(dim3 g, dim3 b, const char* name, F&& kernel) {
  emu_launch_impl(g, b, 0, name, kernel);
}
template <class F>
void emu_launch(dim3 g, dim3 b, size_t smem, const char* name, F&& kernel) {
  emu_launch_impl(g, b, smem, name, kernel);
}
// With a stream: cuda_runtime.h's emu_launch_allowed(stream, name) (found by argument-dependent
// lookup) refuses a stream that is unknown or belongs to another device than the current
// one, recording the error for cudaGetLastError as CUDA does, and a launch a test made fault;
// the kernel then does not run. On a stream being captured, emu_launch_captured records the
// launch (its arguments already copied) as a node of the graph instead of running it.
template <class S, class F>
void emu_launch(dim3 g, dim3 b, size_t smem, S stream, const char* name, F&& kernel) {
  if constexpr (std::is_pointer_v<S>) {
    if (emu_launch_captured(stream, g, b, smem, name, kernel)) return;
    if (!emu_launch_allowed(stream, name)) return;
  }
  emu_launch_impl(g, b, smem, name, kernel);
}
