#pragma once
// The sanitizer runtime's own state, shared by its three files (include/emu_sanitizer.h is
// the interface; this header is not for kernels or tests):
//   emu_sanitizer.cpp         shared memory: the arena, races, uninitialised reads; the running
//                             launch and the reports
//   emu_sanitizer_global.cpp  global memory: tracked allocations, bounds, uninitialised
//                             scratch, write conflicts between blocks and warps
//   emu_access_hooks.cpp      the instrumentation's entry points: the emulator's events and
//                             every load and store of kernel code, handed to the checks above
//                             and to the cost model (emu_cost.cpp)
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace emu_san::detail {

// ---- the shared-memory arena -------------------------------------------------------------
constexpr size_t kArenaBytes = size_t(1) << 20;
constexpr size_t kDynamicBase = 8192;          // dynamic shared memory at kDynamicBase + alignment
constexpr size_t kStaticBase = size_t(512) << 10;  // __shared__ arrays from here on, red zones between
constexpr size_t kSharedRedZone = 64;

enum Kind : uint8_t { kRead = 0, kWrite = 1, kAtomic = 2 };

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

struct Tracked;  // a tracked allocation (emu_sanitizer_global.cpp)

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
extern Launch L;
extern unsigned char* arena;
extern thread_local ThreadState* current;  // non-null while this OS thread runs a checked or counted kernel thread

bool checks_on();  // NANODDP_EMU_SANITIZE is not 0
std::string thread_name(int tid);
std::string block_name();
[[noreturn]] void report(const char* format, ...);

// emu_sanitizer.cpp: the launch's and the block's state; an access to the arena (at once:
// bounds; logged for the barrier); the barrier's check of the epoch's logs.
void prepare_launch(const char* kernel, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                    size_t dynamic_smem);
void prepare_block(unsigned x, unsigned y, unsigned z);
void shared_access(ThreadState& t, size_t offset, size_t n, Kind kind);
void check_epoch();

// emu_sanitizer_global.cpp: the tracked allocation holding (or red-zoning) address a, from the
// launch's snapshot; an access there, checked at once; the snapshot, rebuilt at launch start.
const Tracked* find_tracked(uintptr_t a);
void global_access(ThreadState& t, uintptr_t a, size_t n, Kind kind);
void rebuild_snapshot();

}  // namespace emu_san::detail
