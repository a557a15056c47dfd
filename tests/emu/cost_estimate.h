#pragma once
// The cost model's second half: from one launch's counts (include/emu_cost.h) to a time on
// one GPU (an H200 or an H100: kDevices). Each count is divided by the rate of the unit that
// serves it; the estimate is the largest of those times (the units overlap perfectly) plus a
// fixed launch cost. Rates and their sources: tests/emu/README.md ("The cost model"); they
// are constants here so that a GPU run (bench/gpu_check.sh) can say how far each one is off.
//
// Spread over the SMs: blocks are dealt round-robin to the SMs (132 on both), so the busiest
// SM runs ceil(blocks / 132) of them. Per-SM work (shared wavefronts, tensor-core flops, L2 -> SM
// sectors) is timed on that SM: a grid of 133 blocks costs two blocks' time, as on the GPU.
// DRAM is shared: unique sectors / HBM rate. Barriers cost a fixed latency per barrier per
// wave of resident blocks (waves = ceil(blocks / (132 x blocks per SM)), occupancy from the
// registers and static shared memory in bench/kernel_resources.md and the launch's own block
// size and dynamic shared memory).
// Instruction issue: a kernel with a row in bench/kernel_sass.md (the SASS of its main loop,
// read from the sm_90 cubin) issues that row's instructions per mma for every mma the launch
// ran (mma flops / 4096: an HMMA.16816 is m16n8k16), spread as the per-SM terms are, at one
// warp instruction per cycle per scheduler (4 an SM). Only the main loop's slots: prologue and
// epilogue (Q's load, the output stores) are not counted. A kernel without a row (every SIMT
// kernel, the f16 instantiations) gets no issue term.
#include <cstdint>
#include <map>
#include <string>

#include "emu_cost.h"

namespace emu_cost {

// One GPU's rates (sm_90, SXM); README.md says where each comes from.
struct Device {
  const char* name;               // as the GPU's name contains it ("NVIDIA H100 80GB HBM3")
  int sms;
  double clock_hz;                // boost clock, seen in nvidia-smi under load
  double dram_bytes_per_s;        // device-to-device copy (read + write) measured on this workplace's machine
  double l2_bytes_per_s;          // L2 -> SMs, an assumption (not measured here)
  double shared_wavefronts_per_sm_cycle;  // 32 banks x 4 bytes per cycle
  double mma_sync_flops_per_s;    // mma.sync/WMMA: assumed 60% of wgmma's dense bf16 peak
  int schedulers;                 // warp schedulers per SM, one warp instruction a cycle each
  double barrier_cycles;          // one __syncthreads with every warp already there
  double launch_s;                // launch and drain of a short kernel
};
// The same GH100 chip with other memory: only the DRAM rate differs (4.3 TB/s copy on the
// H200's HBM3e, 3.0 on the H100's HBM3). The measured bf16 GEMMs (788 TFLOP/s on the H200,
// 798 on the H100) say the tensor cores run alike, so both take mma.sync at 60% of 989.
inline constexpr Device kH200{"H200", 132, 1.98e9, 4.3e12, 7.0e12, 1, 0.6 * 989e12, 4, 40, 2.5e-6};
inline constexpr Device kH100{"H100", 132, 1.98e9, 3.0e12, 7.0e12, 1, 0.6 * 989e12, 4, 40, 2.5e-6};
inline constexpr Device kDevices[] = {kH200, kH100};  // the tool's output order

// A kernel's compiled resources, from bench/kernel_resources.md's "## Kernels" table.
struct Resources {
  int registers = 0;
  int static_shared = 0;
};
// name (as the table spells it, e.g. `tc_forward_kernel<BFloat16, 64>`) -> resources; the
// first row of a name wins (a header's kernel appears once per file that instantiates it,
// with the same code). nd::Error when the file cannot be read or has no kernels table.
std::map<std::string, Resources> read_resources(const std::string& path);

// A kernel's main loop, from bench/kernel_sass.md: warp instructions (issue slots) per mma.
struct Issue {
  double instructions_per_mma = 0;
};
// name (as the table spells it) -> its main loop's instructions / iteration over its mma /
// iteration. nd::Error when the file cannot be read, has no kernel rows, or a row's cells are
// not numbers.
std::map<std::string, Issue> read_issue(const std::string& path);

// flops of one mma.sync m16n8k16 (2 x 16 x 8 x 16): mma flops / this = HMMA instructions.
inline constexpr int64_t kMmaFlops = 4096;

// Resident blocks per SM: the CUDA occupancy calculator's arithmetic for sm_90, the same as
// bench/kernel_resources.sh's blocks_per_sm (registers per warp in units of 256 over 4
// sub-partitions, 64 warps, 32 blocks, 228 KiB of shared memory in 128-byte units with 1 KiB
// reserved per block). 0 when one block does not fit.
int blocks_per_sm(int registers, int64_t shared_bytes, int64_t threads);

struct Estimate {
  double dram_s = 0, l2_s = 0, shared_s = 0, mma_s = 0, issue_s = 0, barrier_s = 0, total_s = 0;
  int blocks_per_sm = 0;  // 0: the kernel is not in the resources table (occupancy unknown)
  int64_t waves = 0;
  std::string bound;      // the largest term: "dram", "l2", "shared", "mma", "issue", "barrier" or "launch"
};
// The row of `kernel` in a table read above: its exact name, else the one row that adds
// template arguments to it (GCC's name leaves out defaulted ones: `delta_kernel<BFloat16>` is
// `delta_kernel<BFloat16, float>` in the table); nullptr when there is none.
template <class Row>
const Row* find_row(const std::map<std::string, Row>& table, const std::string& kernel) {
  if (const auto it = table.find(kernel); it != table.end()) return &it->second;
  if (kernel.empty() || kernel.back() != '>') return nullptr;
  const std::string prefix = kernel.substr(0, kernel.size() - 1) + ", ";
  const Row* found = nullptr;
  for (auto it = table.lower_bound(prefix); it != table.end() && it->first.rfind(prefix, 0) == 0; ++it) {
    if (found != nullptr) return nullptr;  // ambiguous
    found = &it->second;
  }
  return found;
}

// The launch's time on `device`. resources: nullptr when the kernel has no row (then waves
// assume one block per SM); issue: nullptr when it has no SASS row (then no issue term).
Estimate estimate(const LaunchCounts& c, const Resources* resources, const Issue* issue, const Device& device);

}  // namespace emu_cost
