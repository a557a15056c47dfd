#pragma once
// The emulator's cost model: what one launch of a kernel asks of an H200, counted while the
// emulator runs it, and the time that asks for at the H200's rates. Runtime in
// tests/emu/emu_cost.cpp; what it counts, the rates with their sources and what it ignores are
// in tests/emu/README.md ("The cost model"). Off unless NANODDP_EMU_COST is set (to anything
// but 0), or a program turns it on with set_enabled(true).
//
// How it sees the kernel: the sanitizer's hooks (emu_sanitizer.h) see every load and store of
// kernel code. With counting on they hand each access outside the thread's own stack to this
// file: shared memory (the arena) or device memory (an allocation the sanitizer tracks: the
// tests' heap blocks, allocate() scratch, the emulated cudaMalloc). Per thread the accesses
// between two barriers are logged in program order; when the barrier opens, the k-th access of
// every lane of a warp is taken as one warp-level instruction (so the model assumes the lanes
// run the same instructions: divergent code is approximated). Per instruction:
// - device memory: distinct 32-byte sectors (what coalescing leaves), reads and writes apart;
// - shared memory: wavefronts = max over the 32 banks (4-byte words) of the distinct words
//   addressed in that bank; a word read by several lanes is one (broadcast).
// WMMA loads and stores (mma.h) are counted per call as tiles, not per lane: every emulated
// lane reads the whole tile, which would count it 32 times.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace emu_cost {

// What one launch asked for. Sectors are 32 bytes. Barriers: __syncthreads summed over blocks.
struct LaunchCounts {
  std::string kernel;  // the instantiation, as bench/kernel_resources.md names it
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  size_t dynamic_shared = 0;
  int64_t blocks = 0, threads_per_block = 0;
  int64_t read_sectors = 0, write_sectors = 0;                // per warp instruction (L2 -> SM traffic)
  int64_t unique_read_sectors = 0, unique_write_sectors = 0;  // distinct over the launch (DRAM, if L2 holds all)
  int64_t global_requests = 0;                                // warp-level device-memory instructions
  int64_t shared_requests = 0, shared_wavefronts = 0;         // wavefronts >= requests; more = bank conflicts
  int64_t barriers = 0;
  int64_t mma_flops = 0;  // 2 M N K per warp-level matrix multiply-accumulate
};

bool enabled();
void set_enabled(bool on);
// Launches counted since the last clear(), in order.
const std::vector<LaunchCounts>& launches();
void clear();

// ---- called by kernel code (mma.h; the emu-ptx mma.sync emulation) ----
// One warp-level matrix multiply-accumulate of `flops` (2 M N K), called by one lane.
void count_mma(int64_t flops);
// A warp-level tile access by one lane for the whole warp: `rows` rows of `row_bytes` bytes,
// `stride_bytes` apart, at p (shared or device memory). Shared tiles are read or written in
// phases of 8 rows x 16 bytes, as ldmatrix/stmatrix do; each phase costs the wavefronts its
// banks need.
void count_tile(const void* p, int rows, int row_bytes, size_t stride_bytes, bool write);
// While a Quiet lives on a thread, that thread's accesses are not counted (a WMMA call's
// per-lane copies of a tile; count_tile counts the tile once).
struct Quiet {
  Quiet();
  ~Quiet();
  Quiet(const Quiet&) = delete;
  Quiet& operator=(const Quiet&) = delete;
};

// ---- called by the sanitizer's entry points (emu_access_hooks.cpp) ----
void begin_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, size_t dynamic_shared);
void end_epoch();  // a __syncthreads opened (by its last thread), or the block ended (barrier = false)
void barrier();
void end_launch();
bool quiet();  // this thread is inside a Quiet
// An access of n bytes by thread `tid` of the running block; shared: `address` is the offset
// in the arena.
void access(int tid, bool shared, uintptr_t address, size_t n, bool read, bool write);

// The instantiation's name for the cost table (`kern<nd::BFloat16, 128>` as
// `kern<BFloat16, 128>`, bench/kernel_resources.md's spelling), from __PRETTY_FUNCTION__.
const char* table_name(const char* pretty_function);
void set_next_kernel(const char* table_name);

// emu_rewrite writes a launch `kern<T, D><<<...>>>(...)` as
// `emu_launch(..., emu_cost::kernel<&kern<T, D>>("kern<T, D>"), ...)`: the sanitizer's reports
// keep the name as written; the cost model learns the instantiation.
template <auto Kernel>
const char* kernel(const char* as_written) {
  static const char* const name = table_name(__PRETTY_FUNCTION__);
  set_next_kernel(name);
  return as_written;
}

}  // namespace emu_cost

