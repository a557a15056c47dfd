// The cost model's counters (include/emu_cost.h says what is counted and how the accesses
// get here). Built WITHOUT -fsanitize: nothing here is instrumented.
//
// Why per-lane logs grouped at the barrier, not counts at the access: a warp's coalescing and
// bank conflicts are properties of one warp-level instruction, i.e. of the k-th access of each
// of its 32 lanes, and the emulator runs lanes as free threads. The logs of one barrier epoch
// are walked when the barrier opens, by its last thread, while the others wait, so the counts
// do not depend on how the OS interleaved the threads: the same kernel and data give the same
// counts every run.
#include "emu_cost.h"

#include "emu_sanitizer.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

namespace emu_cost {
namespace {

struct Access {
  uintptr_t address;
  uint32_t bytes;
  bool shared, read, write;
};

std::atomic<int> on{-1};  // -1: not yet read from NANODDP_EMU_COST
std::vector<LaunchCounts> done;
LaunchCounts current;
bool running = false;
std::vector<std::vector<Access>> logs;  // per thread of the block: this epoch's accesses
std::unordered_set<uintptr_t> read_set, write_set;  // sectors touched in this launch
std::mutex tile_mutex;  // count_mma / count_tile come from one lane per warp, concurrently
thread_local const char* next_kernel = nullptr;  // set by the launching thread, read at its launch
thread_local int quiet_depth = 0;

// A warp instruction's device-memory accesses: distinct sectors.
int64_t sectors(const std::vector<Access*>& accesses, std::unordered_set<uintptr_t>& touched) {
  uintptr_t list[32 * 8];
  std::vector<uintptr_t> more;
  int n = 0;
  for (const Access* a : accesses)
    for (uintptr_t s = a->address / 32; s <= (a->address + a->bytes - 1) / 32; ++s) {
      if (n < int(std::size(list))) list[n++] = s;
      else more.push_back(s);
    }
  more.insert(more.end(), list, list + n);
  std::sort(more.begin(), more.end());
  more.erase(std::unique(more.begin(), more.end()), more.end());
  touched.insert(more.begin(), more.end());
  return int64_t(more.size());
}

// Wavefronts of one shared-memory phase: max over banks of the distinct 4-byte words in it.
int64_t wavefronts(std::vector<uintptr_t>& words) {
  std::sort(words.begin(), words.end());
  words.erase(std::unique(words.begin(), words.end()), words.end());
  int per_bank[32] = {};
  int most = 0;
  for (const uintptr_t w : words) most = std::max(most, ++per_bank[w % 32]);
  return most;
}

int64_t shared_wavefronts(const std::vector<Access*>& accesses) {
  std::vector<uintptr_t> words;
  for (const Access* a : accesses)
    for (uintptr_t w = a->address / 4; w <= (a->address + a->bytes - 1) / 4; ++w) words.push_back(w);
  return wavefronts(words);
}

}  // namespace

bool enabled() {
  int v = on.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("NANODDP_EMU_COST");
    v = e != nullptr && *e != '\0' && std::strcmp(e, "0") != 0;
    on.store(v);
  }
  return v != 0;
}
void set_enabled(bool enable) { on.store(enable ? 1 : 0); }
const std::vector<LaunchCounts>& launches() { return done; }
void clear() { done.clear(); }

Quiet::Quiet() { ++quiet_depth; }
Quiet::~Quiet() { --quiet_depth; }
bool quiet() { return quiet_depth > 0; }

void count_mma(int64_t flops) {
  if (!running) return;
  std::lock_guard lock(tile_mutex);
  current.mma_flops += flops;
}

void count_tile(const void* p, int rows, int row_bytes, size_t stride_bytes, bool write) {
  if (!running) return;
  uintptr_t base = reinterpret_cast<uintptr_t>(p);
  const bool shared = emu_san::shared_offset(p, &base);
  std::lock_guard lock(tile_mutex);
  if (!shared) {
    std::vector<Access> rows_of(static_cast<size_t>(rows));
    std::vector<Access*> all;
    for (int r = 0; r < rows; ++r) {
      rows_of[size_t(r)] = Access{base + size_t(r) * stride_bytes, uint32_t(row_bytes), false, !write, write};
      all.push_back(&rows_of[size_t(r)]);
    }
    (write ? current.write_sectors : current.read_sectors) += sectors(all, write ? write_set : read_set);
    ++current.global_requests;
    return;
  }
  // Phases of 8 rows x 16 bytes (ldmatrix / stmatrix: one 8x8 16-bit matrix per phase).
  for (int c = 0; c < row_bytes; c += 16)
    for (int r0 = 0; r0 < rows; r0 += 8) {
      std::vector<uintptr_t> words;
      for (int r = r0; r < std::min(rows, r0 + 8); ++r)
        for (int b = c; b < std::min(row_bytes, c + 16); b += 4) words.push_back((base + size_t(r) * stride_bytes + b) / 4);
      current.shared_wavefronts += wavefronts(words);
    }
  ++current.shared_requests;
}

void begin_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, size_t dynamic_shared) {
  const char* name = next_kernel;
  next_kernel = nullptr;
  current = LaunchCounts{};
  current.kernel = name != nullptr ? name : "(launched without emu_cost::kernel)";
  current.grid[0] = gx, current.grid[1] = gy, current.grid[2] = gz;
  current.block[0] = bx, current.block[1] = by, current.block[2] = bz;
  current.dynamic_shared = dynamic_shared;
  current.blocks = int64_t(gx) * gy * gz;
  current.threads_per_block = int64_t(bx) * by * bz;
  logs.assign(size_t(current.threads_per_block), {});
  read_set.clear();
  write_set.clear();
  running = true;
}

void access(int tid, bool shared, uintptr_t address, size_t n, bool read, bool write) {
  if (n == 0) return;
  logs[size_t(tid)].push_back(Access{address, uint32_t(n), shared, read, write});
}

void barrier() { ++current.barriers; }

// The epoch's logs, warp by warp: the k-th access of each lane is one warp instruction. Its
// device-memory reads, device-memory writes and shared accesses are counted apart (a
// divergent warp may mix them; the hardware would issue them as separate instructions).
void end_epoch() {
  const size_t threads = logs.size();
  std::vector<Access*> reads, writes, shared;
  for (size_t w0 = 0; w0 < threads; w0 += 32) {
    const size_t w1 = std::min(threads, w0 + 32);
    size_t longest = 0;
    for (size_t t = w0; t < w1; ++t) longest = std::max(longest, logs[t].size());
    for (size_t k = 0; k < longest; ++k) {
      reads.clear(), writes.clear(), shared.clear();
      for (size_t t = w0; t < w1; ++t) {
        if (k >= logs[t].size()) continue;
        Access* a = &logs[t][k];
        if (a->shared) shared.push_back(a);
        else {
          if (a->read) reads.push_back(a);
          if (a->write) writes.push_back(a);
        }
      }
      if (!reads.empty()) current.read_sectors += sectors(reads, read_set), ++current.global_requests;
      if (!writes.empty()) current.write_sectors += sectors(writes, write_set), ++current.global_requests;
      if (!shared.empty()) current.shared_wavefronts += shared_wavefronts(shared), ++current.shared_requests;
    }
  }
  for (auto& log : logs) log.clear();
}

void end_launch() {
  if (!running) return;
  running = false;
  current.unique_read_sectors = int64_t(read_set.size());
  current.unique_write_sectors = int64_t(write_set.size());
  done.push_back(current);
}

const char* table_name(const char* pretty_function) {
  std::string s = pretty_function;
  const size_t at = s.find("Kernel = ");
  s = at == std::string::npos ? s : s.substr(at + 9);
  if (!s.empty() && s.back() == ']') s.pop_back();
  if (!s.empty() && s.front() == '&') s.erase(0, 1);
  // GCC's spelling -> c++filt's (what bench/kernel_resources.sh demangles), then its prefixes.
  const std::pair<const char*, const char*> renames[] = {
      {"long unsigned int", "unsigned long"}, {"short unsigned int", "unsigned short"}, {"long int", "long"},
      {"short int", "short"}, {"{anonymous}::", ""}, {"nd::kernels::cuda::", ""}, {"nd::kernels::", ""}, {"nd::", ""}};
  for (const auto& [from, to] : renames)
    for (size_t p; (p = s.find(from)) != std::string::npos;) s.replace(p, std::strlen(from), to);
  for (size_t p; (p = s.find("> >")) != std::string::npos;) s.replace(p, 3, ">>");
  return strdup(s.c_str());  // once per instantiation (a function-local static keeps it)
}

void set_next_kernel(const char* name) { next_kernel = name; }

}  // namespace emu_cost
