// The emulator's sanitizer runtime (include/emu_sanitizer.h says what it checks and how the
// kernels' memory accesses reach it). Built WITHOUT -fsanitize: nothing here is instrumented.
//
// Why checks at the barrier, not at the access: threads of a block run concurrently, so
// whether thread A's write comes before thread B's read of the same shared byte changes
// from run to run. A check at the access would report some races some runs. Instead each
// thread logs its shared-memory accesses; when a __syncthreads opens, the last thread to
// arrive walks the epoch's logs warp by warp, warp epoch (__syncwarp count) by warp epoch,
// lane by lane, each lane in program order. The verdict depends on the accesses only, not
// on their interleaving, so a race is reported on every run or on none.
//
// Per byte of the arena and per epoch, for each kind (plain read, plain write, atomic) the
// walk remembers up to two threads of different warps and up to two threads of the current
// (warp, warp epoch) group. That is exact for the question asked ("is there an earlier access
// of a conflicting kind by a thread not ordered with this one?"): of two different warps one
// differs from the asking warp; of two different threads one differs from the asking thread.
#include "emu_sanitizer.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "emu_core.h"

namespace emu_san {
namespace {

// ---- the shared-memory arena -------------------------------------------------------------
constexpr size_t kArenaBytes = size_t(1) << 20;
constexpr size_t kDynamicBase = 8192;          // dynamic shared memory at kDynamicBase + alignment
constexpr size_t kStaticBase = size_t(512) << 10;  // __shared__ arrays from here on, red zones between
constexpr size_t kSharedRedZone = 64;

enum Kind : uint8_t { kRead = 0, kWrite = 1, kAtomic = 2 };
const char* const kKindVerb[] = {"read", "wrote", "atomically updated"};

struct Region {
  size_t offset, bytes;
  const void* tag;  // the declaration (emu_rewrite's static char), nullptr: dynamic shared memory
  const char* name;
};

struct Access {
  uint32_t offset;
  uint16_t bytes;
  Kind kind;
  uint32_t warp_epoch;
};

struct ThreadState {
  int tid = 0;
  uint32_t warp_epoch = 0;
  std::vector<Access> log;  // shared-memory accesses of the current block epoch
  long checked = 0;
};

// Per byte of the arena: what the walk of the current epoch has seen (see the top).
struct ByteState {
  uint32_t epoch;    // epoch stamp the fields below belong to
  uint32_t written;  // block stamp of the last block that wrote the byte
  int16_t cross[3][2];  // per kind: threads of up to two different warps
  int16_t group[3][2];  // per kind: up to two threads of the group (group_warp, group_epoch)
  int16_t group_warp;
  uint32_t group_epoch;
};

// ---- global memory ---------------------------------------------------------------------------
struct Tracked {
  uintptr_t base = 0;
  size_t bytes = 0, red_zone = 0;
  const char* what = "";
  std::unique_ptr<std::atomic<uint8_t>[]> written;        // uninitialised scratch: 1 per written byte
  std::atomic<std::atomic<uint64_t>*> writers{nullptr};  // per 4-byte word: the last writer (lazy)
  ~Tracked() { std::free(writers.load()); }  // calloc: never an operator new block, never tracked
};

struct Registry {
  std::mutex mutex;
  std::map<uintptr_t, std::unique_ptr<Tracked>> by_base;
  std::vector<std::unique_ptr<Tracked>> retired;  // untracked during a launch: freed at the next one
  long version = 0;
};
// The registry allocates (map nodes, shadows): with operator new tracked, those allocations
// come back here; they are left untracked.
thread_local bool in_registry = false;
struct RegistryCall {
  const bool nested = in_registry;
  RegistryCall() { in_registry = true; }
  ~RegistryCall() { in_registry = nested; }
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: operator delete calls untrack late
  return *r;
}

// ---- the running launch (one at a time: emu_launch_mutex) ---------------------------------------
struct Launch {
  const char* kernel = "";
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1}, block_idx[3] = {0, 0, 0};
  int threads = 0;
  size_t dynamic_bytes = 0;
  uint32_t launch_id = 0, block_linear = 0, epoch_in_block = 0;
  uint32_t epoch_stamp = 0, block_stamp = 0;  // unique per block epoch / block, over the whole run
  std::vector<std::unique_ptr<ThreadState>> states;
  std::vector<Region> regions;
  size_t static_cursor = kStaticBase;
  std::mutex mutex;  // regions
  std::vector<Tracked*> snapshot;  // tracked allocations by base, fixed during the launch
  long snapshot_version = -1;
  long checked = 0;
  bool counting = false;  // the cost model (emu_cost.h) counts this launch's accesses
};
Launch L;
unsigned char* arena = nullptr;
uint8_t* region_of = nullptr;  // per arena byte: region index + 1, 0 = red zone
ByteState* byte_state = nullptr;
thread_local ThreadState* current = nullptr;  // non-null while this OS thread runs a checked kernel thread
thread_local uintptr_t stack_lo = 0, stack_hi = 0;

bool checks_on() {
  static const bool on = [] {
    const char* e = std::getenv("NANODDP_EMU_SANITIZE");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

void ensure_arena() {
  if (arena != nullptr) return;
  arena = static_cast<unsigned char*>(std::aligned_alloc(4096, kArenaBytes));
  region_of = static_cast<uint8_t*>(std::calloc(kArenaBytes, 1));
  byte_state = static_cast<ByteState*>(std::calloc(kArenaBytes, sizeof(ByteState)));
  if (arena == nullptr || region_of == nullptr || byte_state == nullptr) emu_die("sanitizer: out of host memory");
}

// ---- reports ---------------------------------------------------------------------------------------
std::string thread_name(int tid) {
  const unsigned bx = L.block[0], by = L.block[1];
  char s[96];
  std::snprintf(s, sizeof s, "thread (%u,%u,%u)", unsigned(tid) % bx, unsigned(tid) / bx % by, unsigned(tid) / (bx * by));
  return s;
}
std::string block_name() {
  char s[64];
  std::snprintf(s, sizeof s, "block (%u,%u,%u)", L.block_idx[0], L.block_idx[1], L.block_idx[2]);
  return s;
}
std::string region_name(const Region& r) {
  char s[160];
  if (r.tag == nullptr)
    std::snprintf(s, sizeof s, "dynamic shared memory (%zu bytes asked at launch)", r.bytes);
  else
    std::snprintf(s, sizeof s, "__shared__ '%s' (%zu bytes)", r.name, r.bytes);
  return s;
}
[[noreturn]] void report(const char* format, ...) {
  char body[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(body, sizeof body, format, args);
  va_end(args);
  std::fprintf(stderr, "EMU sanitizer: %s\n", body);
  std::fflush(stderr);
  std::abort();
}

// ---- shared memory ------------------------------------------------------------------------------------
Region* place(size_t offset, size_t bytes, const void* tag, const char* name) {
  if (offset + bytes + kSharedRedZone > kArenaBytes || L.regions.size() >= 255)
    report("kernel %s: more shared memory than the emulator's arena holds", L.kernel);
  L.regions.push_back(Region{offset, bytes, tag, name});
  std::memset(region_of + offset, int(L.regions.size()), bytes);
  std::memset(arena + offset, 0xff, bytes);
  return &L.regions.back();
}

[[noreturn]] void shared_out_of_bounds(int tid, size_t offset, size_t n, Kind kind) {
  const Region* before = nullptr;
  const Region* after = nullptr;
  for (const Region& r : L.regions) {
    if (r.offset + r.bytes <= offset && (before == nullptr || r.offset > before->offset)) before = &r;
    if (r.offset > offset && (after == nullptr || r.offset < after->offset)) after = &r;
  }
  const char* verb = kind == kWrite ? "writes" : kind == kRead ? "reads" : "atomically updates";
  if (before != nullptr && offset - (before->offset + before->bytes) < kSharedRedZone)
    report("out-of-bounds shared memory access in kernel %s: %s of %s %s %zu bytes at byte %zu of %s, past its end",
           L.kernel, thread_name(tid).c_str(), block_name().c_str(), verb, n, offset - before->offset,
           region_name(*before).c_str());
  if (after != nullptr)
    report("out-of-bounds shared memory access in kernel %s: %s of %s %s %zu bytes %zu bytes before the start of %s",
           L.kernel, thread_name(tid).c_str(), block_name().c_str(), verb, n, after->offset - offset,
           region_name(*after).c_str());
  report("out-of-bounds shared memory access in kernel %s: %s of %s %s %zu bytes outside every shared array", L.kernel,
         thread_name(tid).c_str(), block_name().c_str(), verb, n);
}

void shared_access(ThreadState& t, size_t offset, size_t n, Kind kind) {
  const uint8_t region = region_of[offset];
  for (size_t i = 0; i < n; ++i)
    if (region == 0 || region_of[offset + i] != region) shared_out_of_bounds(t.tid, offset + i, n, kind);
  t.log.push_back(Access{uint32_t(offset), uint16_t(n), kind, t.warp_epoch});
}

// Conflicting kinds: a read with a write or an atomic; a write with anything; an atomic
// with a plain access.
bool conflicts(Kind a, Kind b) { return a == kWrite || b == kWrite || (a != b); }

void insert_distinct(int16_t (&slots)[2], int tid, bool by_warp) {
  for (int16_t& s : slots) {
    if (s >= 0 && (by_warp ? s / 32 == tid / 32 : s == tid)) return;
    if (s < 0) {
      s = int16_t(tid);
      return;
    }
  }
}

[[noreturn]] void race(const Region& r, size_t byte, int tid, Kind kind, int other, Kind other_kind) {
  const bool one_warp = tid / 32 == other / 32;
  report("shared-memory race in kernel %s: %s %s and %s %s byte %zu of %s in %s between the same two barriers (%s)",
         L.kernel, thread_name(other).c_str(), kKindVerb[other_kind], thread_name(tid).c_str(), kKindVerb[kind],
         byte - r.offset, region_name(r).c_str(), block_name().c_str(),
         one_warp ? "lanes of one warp with no __syncwarp between them" : "no __syncthreads between them");
}

// Calls f(thread, access) for the epoch's accesses in the fixed order: warp by warp, warp
// epoch by warp epoch, lane by lane, each lane's accesses in program order.
template <class F>
void walk_epoch(F&& f) {
  const int threads = L.threads;
  for (int w0 = 0; w0 < threads; w0 += 32) {
    const int w1 = std::min(threads, w0 + 32);
    size_t cursor[32] = {};
    for (;;) {
      uint32_t epoch = UINT32_MAX;
      for (int t = w0; t < w1; ++t) {
        const auto& log = L.states[t]->log;
        if (cursor[t - w0] < log.size()) epoch = std::min(epoch, log[cursor[t - w0]].warp_epoch);
      }
      if (epoch == UINT32_MAX) break;
      for (int t = w0; t < w1; ++t) {
        const auto& log = L.states[t]->log;
        size_t& c = cursor[t - w0];
        for (; c < log.size() && log[c].warp_epoch == epoch; ++c) f(t, log[c]);
      }
    }
  }
}

void check_epoch() {
  ++L.epoch_stamp;
  const uint32_t stamp = L.epoch_stamp;
  // Pass 1: races.
  walk_epoch([&](int tid, const Access& a) {
    const int warp = tid / 32;
    for (size_t b = a.offset; b < size_t(a.offset) + a.bytes; ++b) {
      ByteState& s = byte_state[b];
      if (s.epoch != stamp) {
        std::memset(s.cross, 0xff, sizeof s.cross);
        std::memset(s.group, 0xff, sizeof s.group);
        s.group_warp = -1;
        s.epoch = stamp;
      }
      if (s.group_warp != warp || s.group_epoch != a.warp_epoch) {
        std::memset(s.group, 0xff, sizeof s.group);
        s.group_warp = int16_t(warp);
        s.group_epoch = a.warp_epoch;
      }
      for (int k = 0; k < 3; ++k) {
        if (!conflicts(a.kind, Kind(k))) continue;
        for (int16_t other : s.cross[k])
          if (other >= 0 && other / 32 != warp) race(L.regions[region_of[b] - 1], b, tid, a.kind, other, Kind(k));
        for (int16_t other : s.group[k])
          if (other >= 0 && other != tid) race(L.regions[region_of[b] - 1], b, tid, a.kind, other, Kind(k));
      }
      insert_distinct(s.cross[a.kind], tid, true);
      insert_distinct(s.group[a.kind], tid, false);
    }
  });
  // Pass 2 (the epoch is race-free): reads of bytes no thread of the block wrote before.
  walk_epoch([&](int tid, const Access& a) {
    for (size_t b = a.offset; b < size_t(a.offset) + a.bytes; ++b) {
      ByteState& s = byte_state[b];
      if (a.kind != kWrite && s.written != L.block_stamp) {
        const Region& r = L.regions[region_of[b] - 1];
        report("uninitialised shared memory read in kernel %s: %s of %s %s byte %zu of %s, which no thread of the block "
               "wrote before",
               L.kernel, thread_name(tid).c_str(), block_name().c_str(), a.kind == kRead ? "reads" : "atomically updates",
               b - r.offset, region_name(r).c_str());
      }
      if (a.kind != kRead) s.written = L.block_stamp;
    }
  });
  for (int t = 0; t < L.threads; ++t) {
    L.checked += L.states[t]->checked;
    L.states[t]->checked = 0;
    L.states[t]->log.clear();
  }
  ++L.epoch_in_block;
}

// ---- global memory -----------------------------------------------------------------------------------------
const Tracked* find_tracked(uintptr_t a) {
  const auto& v = L.snapshot;
  auto it = std::upper_bound(v.begin(), v.end(), a, [](uintptr_t x, const Tracked* t) { return x < t->base; });
  // The allocation at or below a, or the one just above it if a is in its leading red zone.
  if (it != v.end() && a + (*it)->red_zone >= (*it)->base) return *it;
  if (it == v.begin()) return nullptr;
  const Tracked* t = *(it - 1);
  return a < t->base + t->bytes + t->red_zone ? t : nullptr;
}

void global_access(ThreadState& t, uintptr_t a, size_t n, Kind kind) {
  const Tracked* tr = find_tracked(a);
  if (tr == nullptr) return;
  const char* verb = kind == kWrite ? "writes" : kind == kRead ? "reads" : "atomically updates";
  if (a < tr->base) {
    // Past the end of the allocation below, or before the start of this one: name both.
    const auto& v = L.snapshot;
    const auto it = std::lower_bound(v.begin(), v.end(), tr->base, [](const Tracked* x, uintptr_t b) { return x->base < b; });
    const Tracked* below = it == v.begin() ? nullptr : *(it - 1);
    char also[160] = "";
    if (below != nullptr)
      std::snprintf(also, sizeof also, ", %zu bytes past the end of the %s below it (%zu bytes)",
                    size_t(a - (below->base + below->bytes)), below->what, below->bytes);
    report("out-of-bounds global memory access in kernel %s: %s of %s %s %zu bytes %zu bytes before the start of %s "
           "(%zu bytes)%s",
           L.kernel, thread_name(t.tid).c_str(), block_name().c_str(), verb, n, size_t(tr->base - a), tr->what, tr->bytes,
           also);
  }
  if (a + n > tr->base + tr->bytes)
    report("out-of-bounds global memory access in kernel %s: %s of %s %s %zu bytes at byte %zu of %s (%zu bytes), past "
           "its end",
           L.kernel, thread_name(t.tid).c_str(), block_name().c_str(), verb, n, size_t(a - tr->base), tr->what, tr->bytes);
  const size_t offset = a - tr->base;
  if (tr->written && kind != kWrite)
    for (size_t i = 0; i < n; ++i)
      if (tr->written[offset + i].load(std::memory_order_relaxed) == 0)
        report("uninitialised global memory read in kernel %s: %s of %s %s byte %zu of %s (%zu bytes), which no kernel "
               "or copy wrote",
               L.kernel, thread_name(t.tid).c_str(), block_name().c_str(), verb, offset + i, tr->what, tr->bytes);
  if (kind == kRead) return;
  if (tr->written)
    for (size_t i = 0; i < n; ++i) tr->written[offset + i].store(1, std::memory_order_relaxed);
  if (kind == kAtomic) return;
  // The last writer of each 4-byte word: launch (20 bits), block's linear index (20), epoch
  // (14), thread (10).
  std::atomic<uint64_t>* words = tr->writers.load(std::memory_order_acquire);
  if (words == nullptr) {
    auto* fresh = static_cast<std::atomic<uint64_t>*>(std::calloc((tr->bytes + 3) / 4, sizeof(uint64_t)));
    if (fresh == nullptr) emu_die("sanitizer: out of host memory");
    if (const_cast<Tracked*>(tr)->writers.compare_exchange_strong(words, fresh)) words = fresh;
    else std::free(fresh);
  }
  const uint64_t me = (uint64_t(L.launch_id & 0xfffff) << 44) | (uint64_t(L.block_linear & 0xfffff) << 24) |
                      (uint64_t(L.epoch_in_block & 0x3fff) << 10) | uint64_t(t.tid & 0x3ff);
  for (size_t w = offset / 4; w <= (offset + n - 1) / 4; ++w) {
    const uint64_t before = words[w].exchange(me, std::memory_order_relaxed);
    if (before == 0 || before >> 44 != me >> 44) continue;  // never, or in another launch
    const int other = int(before & 0x3ff);
    const bool other_block = (before >> 24 & 0xfffff) != (me >> 24 & 0xfffff);
    const bool same_epoch = (before >> 10 & 0x3fff) == (me >> 10 & 0x3fff);
    if (other_block) {
      const unsigned b = unsigned(before >> 24 & 0xfffff), gx = L.grid[0], gy = L.grid[1];
      report("global memory write conflict in kernel %s: two blocks write byte %zu of %s (%zu bytes) in one launch "
             "without an atomic: %s of %s, and %s of block (%u,%u,%u)",
             L.kernel, w * 4, tr->what, tr->bytes, thread_name(t.tid).c_str(), block_name().c_str(),
             thread_name(other).c_str(), b % gx, b / gx % gy, b / (gx * gy));
    }
    if (same_epoch && other / 32 != t.tid / 32)
      report("global memory write conflict in kernel %s: %s and %s of %s both write byte %zu of %s (%zu bytes) between "
             "the same two barriers, without an atomic",
             L.kernel, thread_name(other).c_str(), thread_name(t.tid).c_str(), block_name().c_str(), w * 4, tr->what,
             tr->bytes);
  }
}

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

void rebuild_snapshot() {
  RegistryCall call;  // the snapshot's vector and the retired records' frees stay untracked
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.retired.clear();
  if (L.snapshot_version == r.version) return;
  L.snapshot.clear();
  for (auto& [base, t] : r.by_base) L.snapshot.push_back(t.get());
  L.snapshot_version = r.version;
}

}  // namespace

// ---- the interface -----------------------------------------------------------------------------------------
bool enabled() { return checks_on(); }
long accesses_checked() { return L.checked; }

void begin_launch(const char* kernel, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                  size_t dynamic_smem) {
  ensure_arena();
  L.kernel = kernel;
  L.grid[0] = gx, L.grid[1] = gy, L.grid[2] = gz;
  L.block[0] = bx, L.block[1] = by, L.block[2] = bz;
  L.threads = int(bx * by * bz);
  L.dynamic_bytes = dynamic_smem;
  L.launch_id = (L.launch_id + 1) & 0xfffff;
  L.counting = emu_cost::enabled();
  if (L.counting) emu_cost::begin_launch(gx, gy, gz, bx, by, bz, dynamic_smem);
  if (L.launch_id == 0) L.launch_id = 1;
  while (int(L.states.size()) < L.threads) {
    L.states.push_back(std::make_unique<ThreadState>());
    L.states.back()->tid = int(L.states.size()) - 1;
  }
  if (checks_on() || L.counting) rebuild_snapshot();
}

void begin_block(unsigned x, unsigned y, unsigned z) {
  L.block_idx[0] = x, L.block_idx[1] = y, L.block_idx[2] = z;
  for (const Region& r : L.regions) std::memset(region_of + r.offset, 0, r.bytes);
  L.regions.clear();
  L.static_cursor = kStaticBase;
  ++L.block_stamp;
  L.block_linear = x + L.grid[0] * (y + L.grid[1] * z);
  L.epoch_in_block = 0;
}

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

Untracked::Untracked() : nested(in_registry) { in_registry = true; }
Untracked::~Untracked() { in_registry = nested; }

bool shared_offset(const void* p, uintptr_t* offset) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(arena);
  if (arena == nullptr || a >= kArenaBytes) return false;
  *offset = a;
  return true;
}

void warp_synced() {
  if (current != nullptr) ++current->warp_epoch;
}

void atomic_access(const void* p, size_t n) { on_access(p, n, kAtomic); }
void vector_access(const void* p, size_t n, bool write) { aligned_access(p, n, write ? kWrite : kRead); }

unsigned char* static_shared(const void* tag, size_t bytes, size_t align, const char* name) {
  std::lock_guard lock(L.mutex);
  for (const Region& r : L.regions)
    if (r.tag == tag) return arena + r.offset;
  align = std::max<size_t>(align, 16);
  const size_t offset = (L.static_cursor + kSharedRedZone + align - 1) / align * align;
  place(offset, bytes, tag, name);
  L.static_cursor = offset + bytes;
  return arena + offset;
}

unsigned char* dynamic_shared(size_t align) {
  align = std::max<size_t>(align, 16);
  if (align > 2048 || (align & (align - 1))) emu_die("extern __shared__ alignment not a power of two <= 2048");
  std::lock_guard lock(L.mutex);
  for (const Region& r : L.regions)
    if (r.tag == nullptr) return arena + r.offset;
  // kDynamicBase is a multiple of 4096: the pointer is a multiple of align, an odd one.
  place(kDynamicBase + align, L.dynamic_bytes, nullptr, "");
  return arena + kDynamicBase + align;
}

void bad_mask(const char* call, unsigned mask, unsigned lanes, int warp, int tid) {
  report("%s in kernel %s: %s of %s in warp %d calls it with mask 0x%08x, but the warp's lanes are 0x%08x%s", call,
         L.kernel, thread_name(tid).c_str(), block_name().c_str(), warp, mask, lanes,
         (mask & ~lanes) ? " (lanes that do not exist: a partial warp)" : " (lanes that reach it are left out)");
}

void track(const void* p, size_t n, const char* what, bool uninitialised, size_t red_zone) {
  if (in_registry) return;
  RegistryCall call;
  auto t = std::make_unique<Tracked>();
  t->base = reinterpret_cast<uintptr_t>(p);
  t->bytes = n;
  t->red_zone = red_zone;
  t->what = what;
  if (uninitialised) t->written.reset(new std::atomic<uint8_t>[n]());
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto& slot = r.by_base[t->base];
  if (slot) r.retired.push_back(std::move(slot));
  slot = std::move(t);
  ++r.version;
}

void untrack(const void* p) {
  if (in_registry) return;
  RegistryCall call;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.by_base.find(reinterpret_cast<uintptr_t>(p));
  if (it == r.by_base.end()) return;
  r.retired.push_back(std::move(it->second));
  r.by_base.erase(it);
  ++r.version;
}

void host_wrote(const void* p, size_t n) {
  if (n == 0 || in_registry) return;
  RegistryCall call;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = r.by_base.upper_bound(a);
  if (it == r.by_base.begin()) return;
  Tracked& t = *std::prev(it)->second;
  if (!t.written || a >= t.base + t.bytes) return;
  const size_t begin = a - t.base, end = std::min(t.bytes, begin + n);
  for (size_t i = begin; i < end; ++i) t.written[i].store(1, std::memory_order_relaxed);
}

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
