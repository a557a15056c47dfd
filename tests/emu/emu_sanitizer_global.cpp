// The emulator's sanitizer runtime, global memory (include/emu_sanitizer.h says what it
// checks; emu_sanitizer_state.h lists the runtime's three files): the registry of tracked
// allocations (the per-kernel tests' operator new and allocate(), the emulated cudaMalloc),
// the launch's snapshot of it, and each access to it checked at once: red zones, bytes of
// uninitialised scratch, and per 4-byte word the last writer (a word written by two blocks of
// one launch, or by two warps between the same barriers, is a conflict). Built WITHOUT
// -fsanitize: nothing here is instrumented.
#include "emu_sanitizer.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "emu_core.h"
#include "emu_sanitizer_state.h"

namespace emu_san {
namespace detail {
struct Tracked {
  uintptr_t base = 0;
  size_t bytes = 0, red_zone = 0;
  const char* what = "";
  std::unique_ptr<std::atomic<uint8_t>[]> written;        // uninitialised scratch: 1 per written byte
  std::atomic<std::atomic<uint64_t>*> writers{nullptr};  // per 4-byte word: the last writer (lazy)
  ~Tracked() { std::free(writers.load()); }  // calloc: never an operator new block, never tracked
};
}  // namespace detail
using namespace detail;
namespace {

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

}  // namespace

namespace detail {

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

}  // namespace detail

Untracked::Untracked() : nested(in_registry) { in_registry = true; }
Untracked::~Untracked() { in_registry = nested; }

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
