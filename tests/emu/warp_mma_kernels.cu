// Kernels that exercise kernels/cuda/warp_mma.cuh, for the emulator's checks of its warp-level
// PTX (warp_mma_selftest.cpp) and, compiled by nvcc in CUDA builds (nanoddp_warp_mma_sm90),
// as proof that every function of the header compiles for sm_90. Never part of the library.
//
// The lane maps written out here are the test's own reading of the PTX ISA (fragments of
// mma.m16n8k16, ldmatrix's row addresses), independent of tests/emu/include/emu_ptx.h: a
// wrong map on either side gives a wrong product. Launchers take pointers the kernels can
// read: host memory under the emulator, device memory on a GPU.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/warp_mma.cuh"

namespace warp_mma_kernels {

using nd::kernels::cuda::pack2;

// One 16x16 (A) x 16x8 (B) + 16x8 (C) product per warp, fragments loaded straight from
// global memory by the documented map; warp w takes tile w. All row-major.
template <class T>
__global__ void mma_from_registers(const T* a, const T* b, const float* c, float* d) {
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  a += w * 256;
  b += w * 128;
  c += w * 128;
  d += w * 128;
  uint32_t fa[4], fb[2];
  for (int r = 0; r < 4; ++r) {
    const int row = g + 8 * (r % 2), col = 2 * t + 8 * (r / 2);
    fa[r] = pack2(a[row * 16 + col], a[row * 16 + col + 1]);
  }
  for (int r = 0; r < 2; ++r) fb[r] = pack2(b[(2 * t + 8 * r) * 8 + g], b[(2 * t + 8 * r + 1) * 8 + g]);
  float acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
  nd::kernels::cuda::mma_m16n8k16<T>(acc, fa, fb, acc);
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = acc[i];
}

// The same product with the fragments from shared memory through ldmatrix, four ways:
// d[0] A by .x4, B ([k][n]) by .x2.trans; d[1] B from B^T ([n][k]) by .x2; d[2] A and B by
// .x1 (.trans for B), one 8x8 matrix at a time; d[3] A from A^T ([k][m]) by .x4.trans. C = 0.
template <class T>
__global__ void mma_from_ldmatrix(const T* a, const T* b, float* d) {
  __shared__ __align__(16) T sa[16][16];
  __shared__ __align__(16) T sat[16][16];
  __shared__ __align__(16) T sb[16][8];
  __shared__ __align__(16) T sbt[8][16];
  const int lane = threadIdx.x;
  for (int i = lane; i < 256; i += 32) {
    sa[i / 16][i % 16] = a[i];
    sat[i % 16][i / 16] = a[i];
  }
  for (int i = lane; i < 128; i += 32) {
    sb[i / 8][i % 8] = b[i];
    sbt[i % 8][i / 8] = b[i];
  }
  __syncthreads();
  using nd::kernels::cuda::ldmatrix;
  using nd::kernels::cuda::ldmatrix_trans;
  const int m = lane / 8, j = lane % 8;  // lane l gives row j of matrix m
  uint32_t fa[4], fb[2], fa1[1], fb1[1];
  float acc[4][4] = {};
  // a[i] is rows 8 (i % 2), columns 8 (i / 2): lane l's row is (l % 16), column 8 (l / 16).
  ldmatrix(fa, &sa[lane % 16][8 * (lane / 16)]);
  ldmatrix_trans(fb, &sb[lane % 16][0]);  // matrices k 0-7, k 8-15
  nd::kernels::cuda::mma_m16n8k16<T>(acc[0], fa, fb, acc[0]);
  ldmatrix(fb, &sbt[j][8 * (m % 2)]);  // rows n, columns k 0-7 then 8-15
  nd::kernels::cuda::mma_m16n8k16<T>(acc[1], fa, fb, acc[1]);
  for (int i = 0; i < 4; ++i) {
    ldmatrix(fa1, &sa[8 * (i % 2) + j][8 * (i / 2)]);  // lanes 8-31 give (ignored) valid addresses
    fa[i] = fa1[0];
  }
  for (int i = 0; i < 2; ++i) {
    ldmatrix_trans(fb1, &sb[8 * i + j][0]);
    fb[i] = fb1[0];
  }
  nd::kernels::cuda::mma_m16n8k16<T>(acc[2], fa, fb, acc[2]);
  // A^T: a[i]'s matrix is At rows k = 8 (i / 2) + j, columns m = 8 (i % 2), transposed.
  ldmatrix_trans(fa, &sat[8 * (m / 2) + j][8 * (m % 2)]);
  ldmatrix_trans(fb, &sb[lane % 16][0]);
  nd::kernels::cuda::mma_m16n8k16<T>(acc[3], fa, fb, acc[3]);
  const int g = lane / 4, t = lane % 4;
  for (int v = 0; v < 4; ++v)
    for (int i = 0; i < 4; ++i) d[v * 128 + (g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = acc[v][i];
}

// A double-buffered stream of 256-float tiles through shared memory: tile k + 1 is copied
// while tile k is read; out[i] = in[i] for i < n, 0 for the padding of the last tile. Each
// of the 64 threads copies 16 bytes (.cg, the src-size form at the edge) except every
// fourth tile, copied by .ca in 4- and 8-byte pieces; the last tile's group is left open
// and closed by wait_all. `mistake`: 0 none; 1 no wait before reading tile 0; 2 no
// __syncthreads after the waits; 3 never waits; 4 the last tile waited with wait_group<1>
// (one group too few: the classic off-by-one), wait_all only after reading it.
__global__ void stream_tiles(const float* in, float* out, int n, int mistake) {
  __shared__ __align__(16) float buf[2][256];
  const int tiles = (n + 255) / 256, t = threadIdx.x;
  auto issue = [&](int k) {
    float* dst = &buf[k % 2][4 * t];
    const int first = k * 256 + 4 * t, left = n - first;
    const float* src = in + first;
    if (k % 4 == 3 && left >= 4) {
      nd::kernels::cuda::cp_async_ca<8>(dst, src);
      nd::kernels::cuda::cp_async_ca<4>(dst + 2, src + 2);
      nd::kernels::cuda::cp_async_ca<4>(dst + 3, src + 3);
    } else if (left >= 4) {
      nd::kernels::cuda::cp_async_cg_16(dst, src);
    } else {
      nd::kernels::cuda::cp_async_cg_16_zfill(dst, left > 0 ? src : in, 4 * (left > 0 ? left : 0));
    }
    if (k + 1 < tiles || mistake == 4) nd::kernels::cuda::cp_async_commit_group();
  };
  issue(0);
  if (mistake == 3) return;
  for (int k = 0; k < tiles; ++k) {
    if (k + 1 < tiles) issue(k + 1);
    if (mistake == 1 && k == 0) {
    } else if (k + 2 < tiles || mistake == 4) {
      nd::kernels::cuda::cp_async_wait_group<1>();
    } else if (k + 1 < tiles) {
      nd::kernels::cuda::cp_async_wait_group<0>();  // tile k + 1's copy is in no group yet
    } else {
      nd::kernels::cuda::cp_async_wait_all();
    }
    if (mistake != 2) __syncthreads();
    for (int i = t; i < 256; i += 64) out[k * 256 + i] = buf[k % 2][(i + 128) % 256];  // others' copies
    __syncthreads();  // the buffer is overwritten by the issue two tiles on
  }
  if (mistake == 4) nd::kernels::cuda::cp_async_wait_all();
}

// Deliberately wrong uses, one thread or lane each: an ldmatrix row 8 bytes off, a cp.async
// destination 4 bytes off, a float4 load 4 bytes off, an mma in a warp of 16 lanes.
__global__ void misaligned_ldmatrix(float* out) {
  __shared__ __align__(16) __nv_bfloat16 tile[8][16];
  const int lane = threadIdx.x;
  for (int i = lane; i < 128; i += 32) tile[i / 16][i % 16] = __float2bfloat16(float(i));
  __syncwarp();
  uint32_t r[1];
  nd::kernels::cuda::ldmatrix(r, &tile[lane % 8][lane == 5 ? 4 : 0]);
  out[lane] = float(r[0] & 0xffffu);
}
__global__ void misaligned_cp_async(const float* in, float* out) {
  __shared__ __align__(16) float buf[64 + 4];
  nd::kernels::cuda::cp_async_cg_16(&buf[4 * threadIdx.x + (threadIdx.x == 2 ? 1 : 0)], in + 4 * threadIdx.x);
  nd::kernels::cuda::cp_async_wait_all();
  out[threadIdx.x] = buf[4 * threadIdx.x];
}
__global__ void misaligned_float4(const float* in, float* out) {
  reinterpret_cast<float4*>(out)[threadIdx.x] = reinterpret_cast<const float4*>(in + (threadIdx.x == 3 ? 1 : 0))[threadIdx.x];
}
__global__ void mma_partial_warp(float* out) {
  const uint32_t a[4] = {}, b[2] = {};
  float acc[4] = {};
  nd::kernels::cuda::mma_m16n8k16<__nv_bfloat16>(acc, a, b, acc);
  out[threadIdx.x] = acc[0];
}

template <class T>
void launch_mma_from_registers(const T* a, const T* b, const float* c, float* d, int warps) {
  mma_from_registers<T><<<1, 32 * warps>>>(a, b, c, d);
}
template void launch_mma_from_registers(const __nv_bfloat16*, const __nv_bfloat16*, const float*, float*, int);
template void launch_mma_from_registers(const __half*, const __half*, const float*, float*, int);
template <class T>
void launch_mma_from_ldmatrix(const T* a, const T* b, float* d) {
  mma_from_ldmatrix<T><<<1, 32>>>(a, b, d);
}
template void launch_mma_from_ldmatrix(const __nv_bfloat16*, const __nv_bfloat16*, float*);
template void launch_mma_from_ldmatrix(const __half*, const __half*, float*);
void launch_stream_tiles(const float* in, float* out, int n, int mistake) { stream_tiles<<<1, 64>>>(in, out, n, mistake); }
void launch_misaligned_ldmatrix(float* out) { misaligned_ldmatrix<<<1, 32>>>(out); }
void launch_misaligned_cp_async(const float* in, float* out) { misaligned_cp_async<<<1, 16>>>(in, out); }
void launch_misaligned_float4(const float* in, float* out) { misaligned_float4<<<1, 8>>>(in, out); }
void launch_mma_partial_warp(float* out) { mma_partial_warp<<<1, 48>>>(out); }

}  // namespace warp_mma_kernels
