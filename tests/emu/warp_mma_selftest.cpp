// The emulator's warp-level PTX (include/emu_ptx.h, behind kernels/cuda/warp_mma.cuh), run by
// CTest (tests/emu/CMakeLists.txt): `nanoddp_emu_warp_mma_selftest <case>` runs one kernel of
// warp_mma_kernels.cu (rewritten and instrumented like kernels/cuda). Value cases print
// "warp_mma selftest ok"; the others must abort with the message their CTest entry expects.
//   mma_bf16, mma_f16     4 warps, each D = A B + C on random tiles with fragments loaded by
//                         the documented lane map, against the product in double;
//   ldmatrix_bf16/_f16    the same product from shared memory through ldmatrix .x4, .x2.trans,
//                         .x2 (B^T), .x1, .x4.trans (A^T);
//   cp_async              a double-buffered stream of 6 tiles (.cg, .ca 4/8, the zero-fill
//                         edge) equals the input, padding zero;
//   missing_wait_poison   the last tile waited one group too few: its reads see the poison
//                         (NaN), not the stale tile before it;
//   missing_wait, no_barrier_after_wait, never_waited, misaligned_ldmatrix,
//   misaligned_cp_async, misaligned_float4, mma_partial_warp: the aborts.
// Tolerance of the products: D is C plus 16 exact products (bf16 x bf16 and f16 x f16 are
// exact in f32) summed in f32 in some order; any order is within gamma_17 sum |terms|
// (gamma_n = n u / (1 - n u), u = 2^-24) of the exact sum. The double reference's own error is
// negligible; a wrong lane map errs by O(1) on most of the 128 outputs.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace warp_mma_kernels {
template <class T>
void launch_mma_from_registers(const T* a, const T* b, const float* c, float* d, int warps);
template <class T>
void launch_mma_from_ldmatrix(const T* a, const T* b, float* d);
void launch_stream_tiles(const float* in, float* out, int n, int mistake);
void launch_misaligned_ldmatrix(float* out);
void launch_misaligned_cp_async(const float* in, float* out);
void launch_misaligned_float4(const float* in, float* out);
void launch_mma_partial_warp(float* out);
}  // namespace warp_mma_kernels

namespace {

using namespace warp_mma_kernels;

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (!ok && ++failures <= 10) std::printf("warp_mma selftest FAILED: %s\n", what.c_str());
}

// `tiles` random A (16x16), B (16x8), C (16x8) tiles, values of the 16-bit type T.
template <class T>
struct Tiles {
  std::vector<T> a, b;
  std::vector<float> c;
  Tiles(int tiles, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (int i = 0; i < tiles * 256; ++i) a.push_back(T(u(rng)));
    for (int i = 0; i < tiles * 128; ++i) b.push_back(T(u(rng)));
    for (int i = 0; i < tiles * 128; ++i) c.push_back(u(rng));
  }
  // d (16x8 per tile, row-major) against A B + C in double, with C taken as zero if !with_c.
  void check(const float* d, int tile, bool with_c, const std::string& what) const {
    const double gamma = 17 * 0x1p-24 / (1 - 17 * 0x1p-24);
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        double exact = with_c ? c[tile * 128 + i * 8 + j] : 0.0, magnitude = std::fabs(exact);
        for (int k = 0; k < 16; ++k) {
          const double p = double(float(a[tile * 256 + i * 16 + k])) * double(float(b[tile * 128 + k * 8 + j]));
          exact += p;
          magnitude += std::fabs(p);
        }
        const double got = d[i * 8 + j];
        expect(std::fabs(got - exact) <= gamma * magnitude,
               what + ": tile " + std::to_string(tile) + " D[" + std::to_string(i) + "][" + std::to_string(j) +
                   "] = " + std::to_string(got) + ", expected " + std::to_string(exact));
      }
  }
};

template <class T>
void mma_case() {
  const int warps = 4;
  Tiles<T> t(warps, 7);
  std::vector<float> d(warps * 128);
  launch_mma_from_registers(t.a.data(), t.b.data(), t.c.data(), d.data(), warps);
  for (int w = 0; w < warps; ++w) t.check(d.data() + w * 128, w, true, "mma from registers");
}

template <class T>
void ldmatrix_case() {
  Tiles<T> t(1, 11);
  std::vector<float> d(4 * 128);
  launch_mma_from_ldmatrix(t.a.data(), t.b.data(), d.data());
  const char* ways[4] = {"ldmatrix .x4 A, .x2.trans B", "ldmatrix .x2 B^T", "ldmatrix .x1", "ldmatrix .x4.trans A^T"};
  for (int v = 0; v < 4; ++v) t.check(d.data() + v * 128, 0, false, ways[v]);
}

// The stream's expected output: out[k 256 + i] = in[k 256 + (i + 128) % 256], 0 past n.
void cp_async_case(int mistake, bool expect_poison) {
  const int n = 5 * 256 + 7, tiles = 6;
  std::vector<float> in(n), out(tiles * 256, -1.0f);
  for (int i = 0; i < n; ++i) in[i] = float(i % 1000) + 0.5f;
  launch_stream_tiles(in.data(), out.data(), n, mistake);
  int nan = 0;
  for (int k = 0; k < tiles; ++k)
    for (int i = 0; i < 256; ++i) {
      const int src = k * 256 + (i + 128) % 256;
      const float want = src < n ? in[src] : 0.0f, got = out[k * 256 + i];
      nan += std::isnan(got);
      if (!expect_poison) expect(got == want, "stream out[" + std::to_string(k * 256 + i) + "] = " + std::to_string(got) +
                                                  ", expected " + std::to_string(want));
    }
  if (expect_poison) {  // the last tile, read before its copy: poison, not tile 3's stale values
    std::printf("a missing cp.async wait read %d poisoned (NaN) values\n", nan);
    expect(nan == 256, "exactly the last tile read before its copy is poison");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: nanoddp_emu_warp_mma_selftest <case>\n");
    return 2;
  }
  const std::string what = argv[1];
  std::vector<float> in(64, 1.0f), out(64);
  if (what == "mma_bf16") mma_case<__nv_bfloat16>();
  else if (what == "mma_f16") mma_case<__half>();
  else if (what == "ldmatrix_bf16") ldmatrix_case<__nv_bfloat16>();
  else if (what == "ldmatrix_f16") ldmatrix_case<__half>();
  else if (what == "cp_async") cp_async_case(0, false);
  else if (what == "missing_wait") cp_async_case(1, false);
  else if (what == "missing_wait_poison") cp_async_case(4, true);
  else if (what == "no_barrier_after_wait") cp_async_case(2, false);
  else if (what == "never_waited") cp_async_case(3, true);
  else if (what == "misaligned_ldmatrix") launch_misaligned_ldmatrix(out.data());
  else if (what == "misaligned_cp_async") launch_misaligned_cp_async(in.data(), out.data());
  else if (what == "misaligned_float4") launch_misaligned_float4(in.data(), out.data());
  else if (what == "mma_partial_warp") launch_mma_partial_warp(out.data());
  else {
    std::fprintf(stderr, "nanoddp_emu_warp_mma_selftest: unknown case '%s'\n", what.c_str());
    return 2;
  }
  if (failures == 0) std::printf("warp_mma selftest ok\n");
  return failures == 0 ? 0 : 1;
}
