// Tiny kernels with hand-computed costs for the cost model's tests (emu_cost_test.cpp).
// Written as CUDA and rewritten by emu_rewrite like kernels/cuda; never compiled by nvcc,
// never part of the library. Each comment gives the count the test expects and why.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

namespace cost_kernels {

// One 4-byte read and one 4-byte write per thread, consecutive across a warp: a warp reads
// 128 bytes = 4 sectors and writes 4 more. n floats: n / 8 sectors each way.
__global__ void coalesced_copy(const float* in, float* out, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = in[i];
}

// One warp; lane l writes then reads word l * stride of a shared array. Banks are words mod
// 32: stride 1 hits 32 banks once (1 wavefront each way), stride 2 two words in each of 16
// banks (2 wavefronts), stride 32 all 32 words in bank 0 (32 wavefronts). Then each lane
// writes out[lane] (4 sectors).
__global__ void strided_shared(float* out, int stride) {
  __shared__ float words[32 * 32];
  const int lane = int(threadIdx.x);
  words[lane * stride] = float(lane);
  __syncthreads();
  out[lane] = words[lane * stride];
}

// One warp: lane 0 writes one word (1 wavefront), then every lane reads it: one word, a
// broadcast, 1 wavefront.
__global__ void broadcast_read(float* out) {
  __shared__ float word;
  if (threadIdx.x == 0) word = 42.0f;
  __syncthreads();
  out[threadIdx.x] = word;
}

// Three __syncthreads per block.
__global__ void three_barriers(float* out) {
  __shared__ float cell[64];
  const int t = int(threadIdx.x);
  cell[t] = float(t);
  __syncthreads();
  const float mirrored = cell[63 - t];
  __syncthreads();
  cell[t] += mirrored;
  __syncthreads();
  out[blockIdx.x * 64 + t] = cell[(t + 1) % 64];
}

// One warp: fills a 16 x ldm bf16 tile in shared memory (32 consecutive bf16 = 16 words per
// warp store: 1 wavefront each, ldm / 2 stores), loads it twice as WMMA A and B fragments,
// multiplies (2 x 16 x 16 x 16 = 8192 flops) and stores the f32 accumulator to out (16 rows
// of 64 bytes: 32 sectors). A tile load reads rows of 32 bytes ldm * 2 bytes apart in 4 phases
// of 8 rows x 16 bytes: with ldm = 16 rows 4 apart share banks (2 wavefronts a phase, 8 a
// load); with ldm = 24 the 8 rows fall in distinct banks (1 a phase, 4 a load).
template <int Ldm>
__global__ void wmma_tile(float* out) {
  __shared__ __align__(32) __nv_bfloat16 tile[16 * Ldm];
  const int lane = int(threadIdx.x);
  for (int i = lane; i < 16 * Ldm; i += 32) tile[i] = __nv_bfloat16(float(i % 7));
  __syncthreads();
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  wmma::fill_fragment(c, 0.0f);
  wmma::load_matrix_sync(a, tile, Ldm);
  wmma::load_matrix_sync(b, tile, Ldm);
  wmma::mma_sync(c, a, b, c);
  wmma::store_matrix_sync(out, c, 16, wmma::mem_row_major);
}

// One float4 in and one float4 out per thread, the fused optimizer's VectorIO form (fields
// taken apart, a new float4 stored). On the GPU each is one 16-byte access (LDG.128 /
// STG.128): a warp moves 512 bytes = 16 sectors each way per instruction, 4 sectors per 128
// useful bytes, as the scalar copy. The host compiler splits the copy into four 4-byte
// accesses; counted as four warp instructions of 16-byte stride they would cost 16 sectors
// each (16 per 128 useful bytes): the emulator's vector types report one access (emu_core.h).
// Then the same through shared memory: lane l stores 16 bytes at word 4 l (4 wavefronts, the
// hardware's quarter-warp phases) and reads them back.
__global__ void float4_copy(const float4* in, float4* out, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const float4 q = in[i];
  out[i] = make_float4(2 * q.x, 2 * q.y, 2 * q.z, 2 * q.w);
}
__global__ void float4_shared(float4* out) {
  __shared__ float4 cells[32];
  const int lane = int(threadIdx.x);
  cells[lane] = make_float4(float(lane), 1, 2, 3);
  __syncwarp();
  const float4 q = cells[lane];
  out[lane] = make_float4(q.x, q.y, q.z, q.w);
}

// ---- launchers ----------------------------------------------------------------------------------
void launch_coalesced_copy(const float* in, float* out, int n) { coalesced_copy<<<(n + 255) / 256, 256>>>(in, out, n); }
void launch_strided_shared(float* out, int stride) { strided_shared<<<1, 32>>>(out, stride); }
void launch_broadcast_read(float* out) { broadcast_read<<<1, 32>>>(out); }
void launch_three_barriers(float* out, int blocks) { three_barriers<<<blocks, 64>>>(out); }
void launch_float4_copy(const float* in, float* out, int n4) {
  float4_copy<<<(n4 + 127) / 128, 128>>>(reinterpret_cast<const float4*>(in), reinterpret_cast<float4*>(out), n4);
}
void launch_float4_shared(float* out) { float4_shared<<<1, 32>>>(reinterpret_cast<float4*>(out)); }
void launch_wmma_tile(float* out, int ldm) {
  if (ldm == 16) wmma_tile<16><<<1, 32>>>(out);
  else wmma_tile<24><<<1, 32>>>(out);
}

}  // namespace cost_kernels
