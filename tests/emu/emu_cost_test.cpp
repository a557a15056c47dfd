// The cost model's counters (include/emu_cost.h) on tiny kernels with hand-computed answers
// (cost_kernels.cu says why each count is what it is), its occupancy arithmetic against rows
// of bench/kernel_resources.md (ptxas's numbers and the occupancy calculator's verdicts
// committed there), the estimate against closed forms, and the table reader's errors.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "cost_estimate.h"
#include "emu_cost.h"
#include "engine/error.h"

namespace cost_kernels {
void launch_coalesced_copy(const float* in, float* out, int n);
void launch_strided_shared(float* out, int stride);
void launch_broadcast_read(float* out);
void launch_three_barriers(float* out, int blocks);
void launch_wmma_tile(float* out, int ldm);
void launch_float4_copy(const float* in, float* out, int n4);
void launch_float4_shared(float* out);
}  // namespace cost_kernels

namespace {

using namespace cost_kernels;

// Device memory for the tests: 128-byte aligned (as cudaMalloc's 256), so that sector counts
// do not depend on where the heap put a vector. Tracked by emu_stubs.cpp's operator new.
struct Buffer {
  explicit Buffer(size_t n) : p(static_cast<float*>(::operator new(n * sizeof(float), std::align_val_t(128)))) {
    for (size_t i = 0; i < n; ++i) p[i] = float(i);
  }
  ~Buffer() { ::operator delete(p, std::align_val_t(128)); }
  float* p;
};

// Counts of the one launch `run` makes.
template <class F>
emu_cost::LaunchCounts count(F&& run) {
  emu_cost::set_enabled(true);
  emu_cost::clear();
  run();
  emu_cost::set_enabled(false);
  REQUIRE(emu_cost::launches().size() == 1);
  return emu_cost::launches()[0];
}

}  // namespace

TEST_CASE("coalesced copy: n floats read and written are n * 4 bytes each way, in 32-byte sectors") {
  const int n = 1024;
  Buffer in(n), out(n);
  const auto c = count([&] { launch_coalesced_copy(in.p, out.p, n); });
  CHECK(c.kernel == "cost_kernels::coalesced_copy");
  CHECK(c.blocks == 4);
  CHECK(c.threads_per_block == 256);
  CHECK(c.read_sectors * 32 == n * 4);
  CHECK(c.write_sectors * 32 == n * 4);
  CHECK(c.unique_read_sectors == c.read_sectors);
  CHECK(c.unique_write_sectors == c.write_sectors);
  CHECK(c.global_requests == 2 * n / 32);  // one read and one write instruction per warp
  CHECK(c.shared_requests == 0);
  CHECK(c.barriers == 0);
  CHECK(c.mma_flops == 0);
}

TEST_CASE("float4: one 16-byte access per lane, 4 sectors per 128 useful bytes as a scalar copy's") {
  const int n4 = 256;  // 2 blocks of 4 warps
  Buffer in(4 * n4), out(4 * n4);
  const auto c = count([&] { launch_float4_copy(in.p, out.p, n4); });
  CHECK(c.read_sectors * 32 == n4 * 16);  // split into 4-byte accesses: 4x this
  CHECK(c.write_sectors * 32 == n4 * 16);
  CHECK(c.read_sectors * 128 / (n4 * 16) == 4);  // sectors per 128 useful bytes
  CHECK(c.unique_read_sectors == c.read_sectors);
  CHECK(c.global_requests == 2 * n4 / 32);  // one load and one store instruction per warp
  for (int i = 0; i < 4 * n4; ++i) REQUIRE(out.p[i] == 2.0f * float(i));
}

TEST_CASE("float4 in shared memory: 4 wavefronts a warp instruction (quarter-warp phases)") {
  Buffer out(4 * 32);
  const auto c = count([&] { launch_float4_shared(out.p); });
  CHECK(c.shared_requests == 2);  // the store and the load
  CHECK(c.shared_wavefronts == 2 * 4);
  CHECK(c.write_sectors == 32 * 16 / 32);
  CHECK(c.global_requests == 1);
}

TEST_CASE("shared memory: wavefronts are the most distinct words in one bank") {
  Buffer out(32);
  for (const auto& [stride, wavefronts] : {std::pair{1, 1}, {2, 2}, {3, 1}, {32, 32}}) {
    CAPTURE(stride);
    const auto c = count([&] { launch_strided_shared(out.p, stride); });
    CHECK(c.shared_requests == 2);  // the write and the read
    CHECK(c.shared_wavefronts == 2 * wavefronts);
    CHECK(c.write_sectors == 4);
    CHECK(c.barriers == 1);
  }
}

TEST_CASE("shared memory: one word read by a whole warp is a broadcast, one wavefront") {
  Buffer out(32);
  const auto c = count([&] { launch_broadcast_read(out.p); });
  CHECK(c.shared_requests == 2);  // lane 0's write, the warp's read
  CHECK(c.shared_wavefronts == 2);
}

TEST_CASE("barriers are counted per block") {
  Buffer out(5 * 64);
  const auto c = count([&] { launch_three_barriers(out.p, 5); });
  CHECK(c.blocks == 5);
  CHECK(c.barriers == 15);
  CHECK(c.write_sectors == 5 * 64 * 4 / 32);
}

TEST_CASE("WMMA: 2 M N K flops per mma_sync, tiles counted once per warp, by ldmatrix's phases") {
  Buffer out(256);
  for (const auto& [ldm, tile_wavefronts] : {std::pair{16, 8}, {24, 4}}) {
    CAPTURE(ldm);
    const auto c = count([&] { launch_wmma_tile(out.p, ldm); });
    CHECK(c.kernel == "cost_kernels::wmma_tile<" + std::to_string(ldm) + ">");
    CHECK(c.mma_flops == 2 * 16 * 16 * 16);
    const int fill_stores = ldm / 2;  // 16 * ldm bf16, 32 per warp store, 1 wavefront each
    CHECK(c.shared_requests == fill_stores + 2);
    CHECK(c.shared_wavefronts == fill_stores + 2 * tile_wavefronts);
    CHECK(c.write_sectors == 16 * 16 * 4 / 32);  // the f32 accumulator, contiguous
    CHECK(c.read_sectors == 0);
  }
}

TEST_CASE("counting is off unless asked for") {
  Buffer out(32);
  emu_cost::clear();
  launch_broadcast_read(out.p);
  CHECK(emu_cost::launches().empty());
}

TEST_CASE("occupancy: the calculator's blocks per SM, as bench/kernel_resources.md gives them") {
  // Rows of the committed table: (registers, static shared, block) -> blocks per SM.
  CHECK(emu_cost::blocks_per_sm(32, 0, 128) == 16);     // delta_kernel<double, double>: registers, warps
  CHECK(emu_cost::blocks_per_sm(252, 0, 128) == 2);     // 252 registers: 8064 per warp, 4 warps
  CHECK(emu_cost::blocks_per_sm(64, 6144, 256) == 4);   // 64 registers x 8 warps: half the file
  CHECK(emu_cost::blocks_per_sm(24, 0, 256) == 8);      // warps: 64 / 8
  CHECK(emu_cost::blocks_per_sm(16, 100 * 1024, 64) == 2);  // shared: 228 KiB / (100 + 1) KiB
  CHECK(emu_cost::blocks_per_sm(16, 0, 32) == 32);      // the 32-block limit
  CHECK(emu_cost::blocks_per_sm(255, 0, 1024) == 0);    // does not fit
}

TEST_CASE("estimate: each term is its count over its rate, the largest wins, plus the launch") {
  const emu_cost::Device& R = emu_cost::kH200;
  emu_cost::LaunchCounts c;
  c.blocks = 264;  // two blocks on every SM
  c.threads_per_block = 256;
  c.read_sectors = c.unique_read_sectors = int64_t(1) << 25;  // 1 GiB
  c.barriers = 264 * 10;
  const emu_cost::Resources r{32, 0};
  const auto e = emu_cost::estimate(c, &r, nullptr, R);
  CHECK(e.bound == "dram");
  CHECK(e.dram_s == doctest::Approx(double(int64_t(1) << 30) / R.dram_bytes_per_s));
  CHECK(e.l2_s == doctest::Approx(double(int64_t(1) << 30) / R.l2_bytes_per_s));
  CHECK(e.blocks_per_sm == 8);
  CHECK(e.waves == 1);
  CHECK(e.barrier_s == doctest::Approx(10 * R.barrier_cycles / R.clock_hz));
  CHECK(e.total_s == doctest::Approx(e.dram_s + R.launch_s));
  // 133 blocks: the busiest SM runs 2 of them, so per-SM terms count 2/133 of the work.
  c = {};
  c.blocks = 133;
  c.mma_flops = 133 * int64_t(1) << 30;
  const auto q = emu_cost::estimate(c, nullptr, nullptr, R);
  CHECK(q.bound == "mma");
  CHECK(q.mma_s == doctest::Approx(2.0 * double(int64_t(1) << 30) / (R.mma_sync_flops_per_s / R.sms)));
  CHECK(q.blocks_per_sm == 0);
  CHECK(q.waves == 2);
}

TEST_CASE("estimate per device: the H100's 3.0 TB/s copy against the H200's 4.3, the same SMs and tensor cores") {
  emu_cost::LaunchCounts dram;  // 1 GiB read by 132 blocks
  dram.blocks = 132;
  dram.threads_per_block = 256;
  dram.read_sectors = dram.unique_read_sectors = int64_t(1) << 25;
  const double gib = double(int64_t(1) << 30);
  const auto h100 = emu_cost::estimate(dram, nullptr, nullptr, emu_cost::kH100);
  const auto h200 = emu_cost::estimate(dram, nullptr, nullptr, emu_cost::kH200);
  CHECK(h100.bound == "dram");
  CHECK(h100.dram_s == doctest::Approx(gib / 3.0e12));
  CHECK(h200.dram_s == doctest::Approx(gib / 4.3e12));
  CHECK(h100.total_s == doctest::Approx(gib / 3.0e12 + 2.5e-6));
  emu_cost::LaunchCounts mma;  // 1 GFLOP on each of 132 SMs: 132 / 593.4 TFLOP/s on both
  mma.blocks = 132;
  mma.mma_flops = 132 * int64_t(1) << 30;
  for (const emu_cost::Device& d : emu_cost::kDevices) {
    CAPTURE(d.name);
    const auto e = emu_cost::estimate(mma, nullptr, nullptr, d);
    CHECK(e.bound == "mma");
    CHECK(e.mma_s == doctest::Approx(132 * gib / 593.4e12));
  }
  CHECK(std::string(emu_cost::kDevices[0].name) == "H200");
  CHECK(std::string(emu_cost::kDevices[1].name) == "H100");
}

TEST_CASE("estimate: the issue term, a kernel's instructions per mma x the mma it ran, 4 schedulers an SM") {
  // 133 blocks of 4000 mma.sync m16n8k16 each at 20 issue slots per mma: the busiest SM runs 2
  // blocks, 2 x 4000 x 20 = 160000 warp instructions over 4 schedulers at 1.98 GHz = 20.2 us,
  // above the tensor cores' 2 x 4000 x 4096 flops / (593.4 / 132 TFLOP/s) = 7.29 us.
  emu_cost::LaunchCounts c;
  c.blocks = 133;
  c.mma_flops = 133 * 4000 * emu_cost::kMmaFlops;
  const emu_cost::Issue slow{20.0}, fast{4.0};
  for (const emu_cost::Device& d : emu_cost::kDevices) {
    CAPTURE(std::string(d.name));
    const auto e = emu_cost::estimate(c, nullptr, &slow, d);
    CHECK(e.issue_s == doctest::Approx(160000 / (4 * 1.98e9)));
    CHECK(e.mma_s == doctest::Approx(2 * 4000 * 4096 / (593.4e12 / 132)));
    CHECK(e.bound == "issue");
    CHECK(e.total_s == doctest::Approx(160000 / (4 * 1.98e9) + 2.5e-6));
    // 4 slots per mma: 32000 instructions, 4.04 us, below the tensor cores' time.
    const auto f = emu_cost::estimate(c, nullptr, &fast, d);
    CHECK(f.issue_s == doctest::Approx(32000 / (4 * 1.98e9)));
    CHECK(f.bound == "mma");
    // A kernel without a SASS row has no issue term.
    const auto none = emu_cost::estimate(c, nullptr, nullptr, d);
    CHECK(none.issue_s == 0);
    CHECK(none.bound == "mma");
  }
}

namespace {
// The cells of `kernel`'s row in a markdown table, split here by hand: what the readers must
// agree with, whatever the regenerated table says today.
std::vector<std::string> row_cells(const std::string& path, const std::string& kernel) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    for (size_t at = 1, bar; (bar = line.find('|', at)) != std::string::npos; at = bar + 1)
      cells.push_back(line.substr(at + 1, bar - at - 2));
    if (!cells.empty() && cells[0] == "`" + kernel + "`") return cells;
  }
  return {};
}
}  // namespace

TEST_CASE("the SASS table: instructions per mma from bench/kernel_sass.md, a bad file is an nd::Error naming it") {
  const std::string file = NANODDP_SOURCE_DIR "/bench/kernel_sass.md";
  const auto table = emu_cost::read_issue(file);
  for (const std::string kernel : {"tc_forward_kernel<BFloat16, 64, false>", "tc_dk_dv_kernel<BFloat16, 128, false>",
                                   "tensor_core_gemm_kernel<__nv_bfloat16, int, conv_index::ForwardGemm<float>>"}) {
    CAPTURE(kernel);
    const auto cells = row_cells(file, kernel);
    REQUIRE(cells.size() > 4);  // kernel | file | main loop | mma / iteration | instructions / iteration
    const auto* row = emu_cost::find_row(table, kernel);
    REQUIRE(row != nullptr);
    CHECK(row->instructions_per_mma == doctest::Approx(std::stod(cells[4]) / std::stod(cells[3])));
    CHECK(row->instructions_per_mma > 1);
  }
  CHECK(emu_cost::find_row(table, "tc_forward_kernel<Half, 64, false>") == nullptr);  // no row: no issue term
  CHECK_THROWS_WITH_AS(emu_cost::read_issue("/nonexistent/kernel_sass.md"),
                       doctest::Contains("cannot read /nonexistent/kernel_sass.md"), nd::Error);
  const std::string path = "emu_cost_test_bad_sass.md";
  std::ofstream(path) << "| `k<float>` | x.cu | at 0x10 | 0 | 12 |\n";
  CHECK_THROWS_WITH_AS(emu_cost::read_issue(path),
                       doctest::Contains("kernel row 1: expected positive numbers for mma and instructions per "
                                         "iteration, found '0' and '12'"),
                       nd::Error);
  std::ofstream(path) << "| `k<float>` | x.cu | at 0x10 |\n";
  CHECK_THROWS_WITH_AS(emu_cost::read_issue(path), doctest::Contains("kernel row 1 has 3 cells, expected at least 5"),
                       nd::Error);
  std::ofstream(path) << "# nothing here\n";
  CHECK_THROWS_WITH_AS(emu_cost::read_issue(path), doctest::Contains("emu_cost_test_bad_sass.md has no table rows"),
                       nd::Error);
  std::remove(path.c_str());
}

namespace {
// Column `column` (0 = the kernel's name) of the line of the resources table whose name cell is
// `kernel` and whose registers cell is a number, split here by hand: what read_resources must
// agree with, whatever the regenerated table says today.
long table_cell(const std::string& path, const std::string& kernel, size_t column) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    for (size_t at = 1, bar; (bar = line.find('|', at)) != std::string::npos; at = bar + 1)
      cells.push_back(line.substr(at + 1, bar - at - 2));
    if (cells.size() > column && cells[0] == "`" + kernel + "`" && !cells[2].empty() &&
        cells[2].find_first_not_of("0123456789") == std::string::npos)
      return std::stol(cells[column]);
  }
  return -1;
}
}  // namespace

TEST_CASE("the resources table: read from bench/kernel_resources.md, a bad file is an nd::Error naming it") {
  const std::string file = NANODDP_SOURCE_DIR "/bench/kernel_resources.md";
  const auto table = emu_cost::read_resources(file);
  const std::string dk_dv = "tc_dk_dv_kernel<BFloat16, 128, false>";
  REQUIRE(table.count(dk_dv) == 1);
  CHECK(table.at(dk_dv).registers == table_cell(file, dk_dv, 2));
  CHECK(table.at(dk_dv).registers > 0);
  CHECK(table.at("forward_kernel<float, 64>").static_shared == table_cell(file, "forward_kernel<float, 64>", 5));
  CHECK(table.at("forward_kernel<float, 64>").static_shared > 0);
  // GCC leaves out defaulted template arguments; the one row that adds them is the kernel's.
  const auto* delta = emu_cost::find_row(table, "delta_kernel<BFloat16>");
  REQUIRE(delta != nullptr);
  CHECK(delta->registers == table.at("delta_kernel<BFloat16, float>").registers);
  CHECK(emu_cost::find_row(table, "tc_forward_kernel<BFloat16>") == nullptr);  // six rows: ambiguous
  CHECK(emu_cost::find_row(table, "no_such_kernel<float>") == nullptr);
  CHECK_THROWS_WITH_AS(emu_cost::read_resources("/nonexistent/kernel_resources.md"),
                       doctest::Contains("cannot read /nonexistent/kernel_resources.md"), nd::Error);
  const std::string path = "emu_cost_test_bad_table.md";
  std::ofstream(path) << "## Kernels\n\n| `k<float>` | x.cu | many | 0/0 | 0 | 0 |\n";
  CHECK_THROWS_WITH_AS(emu_cost::read_resources(path), doctest::Contains("expected numbers for registers"), nd::Error);
  std::ofstream(path) << "# nothing here\n";
  CHECK_THROWS_WITH_AS(emu_cost::read_resources(path), doctest::Contains("has no 'Kernels' table rows"), nd::Error);
  std::remove(path.c_str());
}
