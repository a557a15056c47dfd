// The sanitizer's tests (tests/emu/CMakeLists.txt, label emu): `nanoddp_emu_sanitizer_test
// <case>` runs one kernel of sanitizer_kernels.cu. "clean" must pass every detector and print
// "sanitizer selftest ok"; every other case must abort with the report its CTest entry expects.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "kernels/cuda/allocator.h"

namespace sanitizer_kernels {
void launch_clean(const float* in, float* out, float* scratch, int n, int blocks);
void launch_reuse_without_trailing_barrier(const float* in, float* out);
void launch_read_without_barrier(float* out);
void launch_warp_tile_without_syncwarp(float* out);
void launch_every_block_writes_out0(float* out);
void launch_copy_one_too_many(const float* in, float* out);
void launch_shared_one_too_many(float* out);
void launch_dynamic_past_launch(float* out);
void launch_read_unwritten_shared(float* out);
void launch_read_unwritten_scratch(float* scratch, float* out);
void launch_shuffle_partial_warp(float* out);
}  // namespace sanitizer_kernels

namespace {

using namespace sanitizer_kernels;

int clean() {
  const int n = 256, blocks = 3, threads = 80;
  std::vector<float> in(n), out(blocks * threads);
  for (int i = 0; i < n; ++i) in[i] = float(i % 7) - 2.5f;
  auto* scratch = static_cast<float*>(nd::kernels::cuda::allocate(0, sizeof(float) * blocks * threads, nullptr));
  const long before = emu_san::accesses_checked();
  launch_clean(in.data(), out.data(), scratch, n, blocks);
  nd::kernels::cuda::release(scratch);
  const long checked = emu_san::accesses_checked() - before;
  if (checked < blocks * threads * 4) {
    std::printf("sanitizer selftest FAILED: only %ld accesses checked (is the kernel instrumented?)\n", checked);
    return 1;
  }
  std::printf("sanitizer selftest ok (%ld accesses checked)\n", checked);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: nanoddp_emu_sanitizer_test <case>\n");
    return 2;
  }
  const std::string what = argv[1];
  std::vector<float> in(64, 1.0f), out(64), small(4);
  if (what == "clean") return clean();
  if (what == "missing_trailing_barrier") launch_reuse_without_trailing_barrier(std::vector<float>(128).data(), out.data());
  else if (what == "missing_barrier_before_read") launch_read_without_barrier(out.data());
  else if (what == "missing_syncwarp") launch_warp_tile_without_syncwarp(out.data());
  else if (what == "two_blocks_one_element") launch_every_block_writes_out0(small.data());
  else if (what == "one_past_the_end") launch_copy_one_too_many(in.data(), out.data());
  else if (what == "shared_one_past_the_end") launch_shared_one_too_many(out.data());
  else if (what == "dynamic_shared_past_the_launch") launch_dynamic_past_launch(out.data());
  else if (what == "unwritten_shared") launch_read_unwritten_shared(out.data());
  else if (what == "unwritten_scratch") {
    auto* scratch = static_cast<float*>(nd::kernels::cuda::allocate(0, 16 * sizeof(float), nullptr));
    launch_read_unwritten_scratch(scratch, out.data());
  } else if (what == "full_mask_partial_warp") launch_shuffle_partial_warp(out.data());
  else {
    std::fprintf(stderr, "unknown case %s\n", what.c_str());
    return 2;
  }
  std::printf("sanitizer selftest FAILED: %s ran without a report\n", what.c_str());
  return 1;
}
