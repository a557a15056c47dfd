// The emulator's sanitizer runtime, shared memory (include/emu_sanitizer.h says what it
// checks; emu_sanitizer_state.h lists the runtime's three files). Built WITHOUT -fsanitize:
// nothing here is instrumented.
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

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "emu_core.h"
#include "emu_sanitizer_state.h"

namespace emu_san {
namespace detail {
Launch L;
unsigned char* arena = nullptr;
thread_local ThreadState* current = nullptr;
}  // namespace detail
using namespace detail;
namespace {

const char* const kKindVerb[] = {"read", "wrote", "atomically updated"};
uint8_t* region_of = nullptr;  // per arena byte: region index + 1, 0 = red zone
ByteState* byte_state = nullptr;

void ensure_arena() {
  if (arena != nullptr) return;
  arena = static_cast<unsigned char*>(std::aligned_alloc(4096, kArenaBytes));
  region_of = static_cast<uint8_t*>(std::calloc(kArenaBytes, 1));
  byte_state = static_cast<ByteState*>(std::calloc(kArenaBytes, sizeof(ByteState)));
  if (arena == nullptr || region_of == nullptr || byte_state == nullptr) emu_die("sanitizer: out of host memory");
}

std::string region_name(const Region& r) {
  char s[160];
  if (r.tag == nullptr)
    std::snprintf(s, sizeof s, "dynamic shared memory (%zu bytes asked at launch)", r.bytes);
  else
    std::snprintf(s, sizeof s, "__shared__ '%s' (%zu bytes)", r.name, r.bytes);
  return s;
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

}  // namespace

// ---- the launch, reports, shared accesses ----------------------------------------------------------
namespace detail {

bool checks_on() {
  static const bool on = [] {
    const char* e = std::getenv("NANODDP_EMU_SANITIZE");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

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

void prepare_launch(const char* kernel, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                    size_t dynamic_smem) {
  ensure_arena();
  L.kernel = kernel;
  L.grid[0] = gx, L.grid[1] = gy, L.grid[2] = gz;
  L.block[0] = bx, L.block[1] = by, L.block[2] = bz;
  L.threads = int(bx * by * bz);
  L.dynamic_bytes = dynamic_smem;
  L.launch_id = (L.launch_id + 1) & 0xfffff;
  if (L.launch_id == 0) L.launch_id = 1;
  while (int(L.states.size()) < L.threads) {
    L.states.push_back(std::make_unique<ThreadState>());
    L.states.back()->tid = int(L.states.size()) - 1;
  }
}

void prepare_block(unsigned x, unsigned y, unsigned z) {
  L.block_idx[0] = x, L.block_idx[1] = y, L.block_idx[2] = z;
  for (const Region& r : L.regions) std::memset(region_of + r.offset, 0, r.bytes);
  L.regions.clear();
  L.static_cursor = kStaticBase;
  ++L.block_stamp;
  L.block_linear = x + L.grid[0] * (y + L.grid[1] * z);
  L.epoch_in_block = 0;
}

void shared_access(ThreadState& t, size_t offset, size_t n, Kind kind) {
  const uint8_t region = region_of[offset];
  for (size_t i = 0; i < n; ++i)
    if (region == 0 || region_of[offset + i] != region) shared_out_of_bounds(t.tid, offset + i, n, kind);
  t.log.push_back(Access{uint32_t(offset), uint16_t(n), kind, t.warp_epoch});
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

}  // namespace detail

// ---- the interface -----------------------------------------------------------------------------------------
bool enabled() { return checks_on(); }
long accesses_checked() { return L.checked; }

bool shared_offset(const void* p, uintptr_t* offset) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(arena);
  if (arena == nullptr || a >= kArenaBytes) return false;
  *offset = a;
  return true;
}

void warp_synced() {
  if (current != nullptr) ++current->warp_epoch;
}

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

}  // namespace emu_san
