// From a launch's counts to a time on one GPU (cost_estimate.h says how).
#include "cost_estimate.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "engine/error.h"

namespace emu_cost {
namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" `"), b = s.find_last_not_of(" `");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

int64_t round_up(int64_t v, int64_t unit) { return (v + unit - 1) / unit * unit; }

}  // namespace

std::map<std::string, Resources> read_resources(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw nd::Error("cost model: cannot read " + path + " (bench/kernel_resources.md: the ptxas table)");
  std::map<std::string, Resources> table;
  std::string line;
  bool in_kernels = false;
  int row = 0;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_kernels = line == "## Kernels";
    if (!in_kernels || line.rfind("| `", 0) != 0) continue;
    ++row;
    std::vector<std::string> cells;
    std::stringstream ss(line.substr(1));
    for (std::string cell; std::getline(ss, cell, '|');) cells.push_back(trim(cell));
    // kernel | file | registers | spills | stack | static shared | ...
    if (cells.size() < 6)
      throw nd::Error("cost model: " + path + ": kernels row " + std::to_string(row) + " has " +
                      std::to_string(cells.size()) + " cells, expected at least 6: " + line);
    try {
      table.emplace(cells[0], Resources{std::stoi(cells[2]), std::stoi(cells[5])});
    } catch (const std::exception&) {
      throw nd::Error("cost model: " + path + ": kernels row " + std::to_string(row) +
                      ": expected numbers for registers and static shared memory, found '" + cells[2] + "' and '" +
                      cells[5] + "'");
    }
  }
  if (table.empty()) throw nd::Error("cost model: " + path + " has no '## Kernels' table rows");
  return table;
}

const Resources* find_resources(const std::map<std::string, Resources>& table, const std::string& kernel) {
  if (const auto it = table.find(kernel); it != table.end()) return &it->second;
  if (kernel.empty() || kernel.back() != '>') return nullptr;
  const std::string prefix = kernel.substr(0, kernel.size() - 1) + ", ";
  const Resources* found = nullptr;
  for (auto it = table.lower_bound(prefix); it != table.end() && it->first.rfind(prefix, 0) == 0; ++it) {
    if (found != nullptr) return nullptr;  // ambiguous
    found = &it->second;
  }
  return found;
}

int blocks_per_sm(int registers, int64_t shared_bytes, int64_t threads) {
  const int64_t warps = (threads + 31) / 32;
  const int64_t per_warp = round_up(int64_t(registers) * 32, 256);
  int64_t by_regs = 32;
  if (per_warp * round_up(warps, 4) > 65536) by_regs = 0;
  else if (per_warp > 0) by_regs = 16384 / per_warp * 4 / warps;
  const int64_t by_smem = shared_bytes > 227 * 1024 ? 0 : 228 * 1024 / round_up(shared_bytes + 1024, 128);
  const int64_t by_warps = 64 / warps;
  return int(std::min({int64_t(32), by_regs, by_smem, by_warps}));
}

Estimate estimate(const LaunchCounts& c, const Resources* resources, const Device& d) {
  Estimate e;
  const int64_t busiest = (c.blocks + d.sms - 1) / d.sms;  // blocks on the busiest SM
  const double share = c.blocks > 0 ? double(busiest) / double(c.blocks) : 0;  // its part of the launch
  e.dram_s = double(c.unique_read_sectors + c.unique_write_sectors) * 32 / d.dram_bytes_per_s;
  e.l2_s = double(c.read_sectors + c.write_sectors) * 32 * share / (d.l2_bytes_per_s / d.sms);
  e.shared_s = double(c.shared_wavefronts) * share / (d.shared_wavefronts_per_sm_cycle * d.clock_hz);
  e.mma_s = double(c.mma_flops) * share / (d.mma_sync_flops_per_s / d.sms);
  if (resources != nullptr)
    e.blocks_per_sm = blocks_per_sm(resources->registers, resources->static_shared + int64_t(c.dynamic_shared),
                                    c.threads_per_block);
  const int64_t resident = d.sms * std::max(1, e.blocks_per_sm);
  e.waves = (c.blocks + resident - 1) / resident;
  const double barriers_per_block = c.blocks > 0 ? double(c.barriers) / double(c.blocks) : 0;
  e.barrier_s = double(e.waves) * barriers_per_block * d.barrier_cycles / d.clock_hz;
  const std::pair<double, const char*> terms[] = {
      {e.dram_s, "dram"}, {e.l2_s, "l2"}, {e.shared_s, "shared"}, {e.mma_s, "mma"}, {e.barrier_s, "barrier"}};
  const auto* top = std::max_element(std::begin(terms), std::end(terms),
                                     [](const auto& a, const auto& b) { return a.first < b.first; });
  e.bound = top->first > d.launch_s ? top->second : "launch";
  e.total_s = d.launch_s + top->first;
  return e;
}

}  // namespace emu_cost
