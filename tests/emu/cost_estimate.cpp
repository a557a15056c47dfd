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

// The cells of each kernel row ("| `name` | ..." lines) of a markdown table in `path`; with
// `section`, only the rows under that "## " heading. `what` names the file in errors; a row
// of fewer than `min_cells` cells is one.
std::vector<std::vector<std::string>> kernel_rows(const std::string& path, const std::string& what,
                                                  const std::string& section, size_t min_cells) {
  std::ifstream in(path);
  if (!in) throw nd::Error("cost model: cannot read " + path + " (" + what + ")");
  std::vector<std::vector<std::string>> rows;
  bool in_section = section.empty();
  for (std::string line; std::getline(in, line);) {
    if (!section.empty() && line.rfind("## ", 0) == 0) in_section = line == section;
    if (!in_section || line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream ss(line.substr(1));
    for (std::string cell; std::getline(ss, cell, '|');) cells.push_back(trim(cell));
    if (cells.size() < min_cells)
      throw nd::Error("cost model: " + path + ": kernel row " + std::to_string(rows.size() + 1) + " has " +
                      std::to_string(cells.size()) + " cells, expected at least " + std::to_string(min_cells));
    rows.push_back(std::move(cells));
  }
  if (rows.empty())
    throw nd::Error("cost model: " + path + " has no " + (section.empty() ? "" : "'" + section.substr(3) + "' ") +
                    "table rows");
  return rows;
}

// "cost model: PATH: kernel row N: expected ..., found 'a' and 'b'".
nd::Error bad_row(const std::string& path, size_t row, const std::string& expected, const std::string& a,
                  const std::string& b) {
  return nd::Error("cost model: " + path + ": kernel row " + std::to_string(row) + ": expected " + expected +
                   ", found '" + a + "' and '" + b + "'");
}

}  // namespace

std::map<std::string, Resources> read_resources(const std::string& path) {
  std::map<std::string, Resources> table;
  const auto rows = kernel_rows(path, "bench/kernel_resources.md: the ptxas table", "## Kernels", 6);
  for (size_t row = 0; row < rows.size(); ++row) {
    const auto& cells = rows[row];  // kernel | file | registers | spills | stack | static shared | ...
    try {
      table.emplace(cells[0], Resources{std::stoi(cells[2]), std::stoi(cells[5])});
    } catch (const std::exception&) {
      throw bad_row(path, row + 1, "numbers for registers and static shared memory", cells[2], cells[5]);
    }
  }
  return table;
}

std::map<std::string, Issue> read_issue(const std::string& path) {
  std::map<std::string, Issue> table;
  const auto rows = kernel_rows(path, "bench/kernel_sass.md: the main loops' SASS", "", 5);
  for (size_t row = 0; row < rows.size(); ++row) {
    const auto& cells = rows[row];  // kernel | file | main loop | mma / iteration | instructions / iteration | ...
    double mma = 0, instructions = 0;
    try {
      mma = std::stod(cells[3]), instructions = std::stod(cells[4]);
    } catch (const std::exception&) {
      mma = 0;
    }
    if (!(mma > 0) || !(instructions > 0))
      throw bad_row(path, row + 1, "positive numbers for mma and instructions per iteration", cells[3], cells[4]);
    table.emplace(cells[0], Issue{instructions / mma});
  }
  return table;
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

Estimate estimate(const LaunchCounts& c, const Resources* resources, const Issue* issue, const Device& d) {
  Estimate e;
  const int64_t busiest = (c.blocks + d.sms - 1) / d.sms;  // blocks on the busiest SM
  const double share = c.blocks > 0 ? double(busiest) / double(c.blocks) : 0;  // its part of the launch
  e.dram_s = double(c.unique_read_sectors + c.unique_write_sectors) * 32 / d.dram_bytes_per_s;
  e.l2_s = double(c.read_sectors + c.write_sectors) * 32 * share / (d.l2_bytes_per_s / d.sms);
  e.shared_s = double(c.shared_wavefronts) * share / (d.shared_wavefronts_per_sm_cycle * d.clock_hz);
  e.mma_s = double(c.mma_flops) * share / (d.mma_sync_flops_per_s / d.sms);
  if (issue != nullptr)
    e.issue_s = double(c.mma_flops / kMmaFlops) * issue->instructions_per_mma * share / (d.schedulers * d.clock_hz);
  if (resources != nullptr)
    e.blocks_per_sm = blocks_per_sm(resources->registers, resources->static_shared + int64_t(c.dynamic_shared),
                                    c.threads_per_block);
  const int64_t resident = d.sms * std::max(1, e.blocks_per_sm);
  e.waves = (c.blocks + resident - 1) / resident;
  const double barriers_per_block = c.blocks > 0 ? double(c.barriers) / double(c.blocks) : 0;
  e.barrier_s = double(e.waves) * barriers_per_block * d.barrier_cycles / d.clock_hz;
  const std::pair<double, const char*> terms[] = {
      {e.dram_s, "dram"}, {e.l2_s, "l2"}, {e.shared_s, "shared"}, {e.mma_s, "mma"}, {e.issue_s, "issue"},
      {e.barrier_s, "barrier"}};
  const auto* top = std::max_element(std::begin(terms), std::end(terms),
                                     [](const auto& a, const auto& b) { return a.first < b.first; });
  e.bound = top->first > d.launch_s ? top->second : "launch";
  e.total_s = d.launch_s + top->first;
  return e;
}

}  // namespace emu_cost
