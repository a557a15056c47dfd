// The emulator's own checks, run by CTest (tests/emu/CMakeLists.txt): `emu_selftest <case>`.
//   shuffles    warp shuffles, ballots and a block reduction give the values CUDA defines
//               (prints "selftest ok", exits 0 on success);
//   divergent   half a warp at a shuffle, the other half at __syncwarp: aborts naming both
//               (a barrier some threads never reach aborts too, after 30 s: not run here);
//   misaligned  a WMMA load from a pointer off the 256-bit grid: aborts;
//   ldm         a WMMA load with an ldm that is not a multiple of 8 bf16: aborts;
//   unaligned   dynamic shared memory used at more alignment than declared: the pointer is
//               aligned to exactly what was declared (prints its offset).
// Kernels are plain functions launched through emu_launch, as emu_rewrite would produce.
#include <cstdio>
#include <cstring>
#include <string>

#include "cuda_runtime.h"
#include "mma.h"

namespace {

int failures = 0;
void expect(bool ok, const char* what) {
  if (!ok) {
    std::printf("selftest FAILED: %s\n", what);
    ++failures;
  }
}

__global__ void shuffle_kernel(int* out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int* o = out + warp * 32 * 5 + lane * 5;
  o[0] = __shfl_sync(0xffffffffu, lane * 10, 3);         // every lane reads lane 3
  o[1] = __shfl_xor_sync(0xffffffffu, lane, 1);          // pairs swap
  o[2] = __shfl_down_sync(0xffffffffu, lane, 4);         // lanes >= 28 keep their own
  o[3] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 2 == 0) == 0x55555555u);
  __shared__ int partial[4];
  int v = threadIdx.x;
  for (int d = 16; d > 0; d /= 2) v += __shfl_xor_sync(0xffffffffu, v, d);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  o[4] = partial[0] + partial[1] + partial[2] + partial[3];  // sum of 0..127
  __syncthreads();
}

__global__ void divergent_kernel(int* out) {
  int v = threadIdx.x;
  if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);  // half a warp shuffles,
  else __syncwarp();                                                    // the other half does not
  out[threadIdx.x] = v;
}

__global__ void wmma_load_kernel(const __nv_bfloat16* p, unsigned ldm) {
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __nv_bfloat16, nvcuda::wmma::row_major> a;
  nvcuda::wmma::load_matrix_sync(a, p, ldm);
}

__global__ void dynamic_shared_kernel(uintptr_t* offset) {
  float* s = reinterpret_cast<float*>(emu_dynamic_shared(16));
  if (threadIdx.x == 0) *offset = reinterpret_cast<uintptr_t>(s) % 32;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "";
  alignas(64) static __nv_bfloat16 tile[64 * 16];
  if (which == "shuffles") {
    static int out[128 * 5];
    emu_launch(dim3(2), dim3(128), 0, nullptr, "shuffle_kernel", [&] { shuffle_kernel(out); });
    for (int t = 0; t < 128; ++t) {
      const int lane = t % 32, *o = out + t * 5;
      expect(o[0] == 30, "__shfl_sync from lane 3");
      expect(o[1] == (lane ^ 1), "__shfl_xor_sync");
      expect(o[2] == (lane + 4 < 32 ? lane + 4 : lane), "__shfl_down_sync");
      expect(o[3] == 1, "__ballot_sync");
      expect(o[4] == 127 * 128 / 2, "warp butterfly + __syncthreads block sum");
    }
    expect(emu_blocks_run == 2, "two blocks run");
  } else if (which == "divergent") {
    static int out[64];
    emu_launch(dim3(1), dim3(64), 0, nullptr, "divergent_kernel", [&] { divergent_kernel(out); });
  } else if (which == "misaligned") {
    emu_launch(dim3(1), dim3(32), 0, nullptr, "wmma_load_kernel", [&] { wmma_load_kernel(tile + 8, 16); });  // 16 bytes off
  } else if (which == "ldm") {
    emu_launch(dim3(1), dim3(32), 0, nullptr, "wmma_load_kernel", [&] { wmma_load_kernel(tile, 12); });
  } else if (which == "unaligned") {
    uintptr_t offset = 99;
    emu_launch(dim3(1), dim3(32), 1024, nullptr, "dynamic_shared_kernel", [&] { dynamic_shared_kernel(&offset); });
    std::printf("dynamic shared memory declared 16-byte aligned sits at 16 mod 32: %s\n",
                offset == 16 ? "yes" : "no");
    expect(offset == 16, "dynamic shared memory aligned to exactly its declaration");
  } else {
    std::printf("usage: emu_selftest shuffles|divergent|misaligned|ldm|unaligned\n");
    return 2;
  }
  if (failures == 0) std::printf("selftest ok\n");
  return failures == 0 ? 0 : 1;
}
