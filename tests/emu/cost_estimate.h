#pragma once
// The cost model's second half: from one launch's counts (include/emu_cost.h) to an H200 time.
// Each count is divided by the rate of the unit that serves it; the estimate is the largest
// of those times (the units overlap perfectly) plus a fixed launch cost. Rates and their
// sources: tests/emu/README.md ("The cost model"); they are constants here so that the first
// GPU run (bench/gpu_check.sh) can say how far each one is off.
//
// Spread over the SMs: blocks are dealt round-robin to the 132 SMs, so the busiest SM runs
// ceil(blocks / 132) of them. Per-SM work (shared wavefronts, tensor-core flops, L2 -> SM
// sectors) is timed on that SM: a grid of 133 blocks costs two blocks' time, as on the GPU.
// DRAM is shared: unique sectors / HBM rate. Barriers cost a fixed latency per barrier per
// wave of resident blocks (waves = ceil(blocks / (132 x blocks per SM)), occupancy from the
// registers and static shared memory in bench/kernel_resources.md and the launch's own block
// size and dynamic shared memory).
#include <cstdint>
#include <map>
#include <string>

#include "emu_cost.h"

namespace emu_cost {

// H200 SXM (sm_90) rates; README.md says where each comes from.
struct H200 {
  static constexpr int kSms = 132;
  static constexpr double kClockHz = 1.98e9;           // boost clock, seen in nvidia-smi under load
  static constexpr double kDramBytesPerS = 4.3e12;     // device-to-device copy measured here (4.8 peak)
  static constexpr double kL2BytesPerS = 7.0e12;       // L2 -> SMs, an assumption (not measured here)
  static constexpr double kSharedWavefrontsPerSmCycle = 1;  // 32 banks x 4 bytes per cycle
  static constexpr double kMmaSyncFlopsPerS = 0.6 * 989e12;  // mma.sync/WMMA: assumed 60% of wgmma's dense bf16 peak
  static constexpr double kBarrierCycles = 40;         // one __syncthreads with every warp already there
  static constexpr double kLaunchS = 2.5e-6;           // launch and drain of a short kernel
};

// A kernel's compiled resources, from bench/kernel_resources.md's "## Kernels" table.
struct Resources {
  int registers = 0;
  int static_shared = 0;
};
// name (as the table spells it, e.g. `tc_forward_kernel<BFloat16, 64>`) -> resources; the
// first row of a name wins (a header's kernel appears once per file that instantiates it,
// with the same code). nd::Error when the file cannot be read or has no kernels table.
std::map<std::string, Resources> read_resources(const std::string& path);

// Resident blocks per SM: the CUDA occupancy calculator's arithmetic for sm_90, the same as
// bench/kernel_resources.sh's blocks_per_sm (registers per warp in units of 256 over 4
// sub-partitions, 64 warps, 32 blocks, 228 KiB of shared memory in 128-byte units with 1 KiB
// reserved per block). 0 when one block does not fit.
int blocks_per_sm(int registers, int64_t shared_bytes, int64_t threads);

struct Estimate {
  double dram_s = 0, l2_s = 0, shared_s = 0, mma_s = 0, barrier_s = 0, total_s = 0;
  int blocks_per_sm = 0;  // 0: the kernel is not in the resources table (occupancy unknown)
  int64_t waves = 0;
  std::string bound;      // the largest term: "dram", "l2", "shared", "mma", "barrier" or "launch"
};
// The row of `kernel`: its exact name, else the one row that adds template arguments to it
// (GCC's name leaves out defaulted ones: `delta_kernel<BFloat16>` is `delta_kernel<BFloat16,
// float>` in the table); nullptr when there is none.
const Resources* find_resources(const std::map<std::string, Resources>& table, const std::string& kernel);

// resources: nullptr when the kernel has no row (then waves assume one block per SM).
Estimate estimate(const LaunchCounts& c, const Resources* resources);

}  // namespace emu_cost
