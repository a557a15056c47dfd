// Deliberately broken kernels for the sanitizer's tests (emu_sanitizer_test.cpp), one per
// detector, and one clean kernel that uses everything the detectors must accept. Written as
// CUDA and rewritten by emu_rewrite like kernels/cuda; never compiled by nvcc, never part of
// the library. Each broken kernel goes wrong in exactly one thread or one pair, so the report
// (checked word for word by CTest) is the same every run.
#include <cuda_runtime.h>

#include <cstdint>

namespace sanitizer_kernels {

// Everything legal: barriers between phases that reuse shared memory, a warp exchange through
// shared memory with __syncwarp, shared atomics, dynamic shared memory, a partial last warp
// whose collectives name exactly its lanes, and scratch written before it is read.
__global__ void clean(const float* in, float* out, float* scratch, int n) {
  __shared__ float tile[64];
  __shared__ int count;
  extern __shared__ float dyn[];
  const int t = threadIdx.x, lane = t % 32;
  if (t == 0) count = 0;
  float acc = 0;
  for (int phase = 0; phase < 2; ++phase) {
    if (t < 64) tile[t] = in[(blockIdx.x * 2 + phase) * 64 % n + t];
    __syncthreads();
    acc += tile[(t + 32) % 64];
    __syncthreads();  // the trailing barrier: nobody overwrites tile while others read it
  }
  atomicAdd(&count, 1);
  dyn[t] = acc;
  __syncwarp(t < 64 ? 0xffffffffu : 0x0000ffffu);
  acc += dyn[(t / 32) * 32 + (lane ^ 1) % (t < 64 ? 32 : 16)];
  const unsigned lanes = t < 64 ? 0xffffffffu : 0x0000ffffu;
  acc += __shfl_xor_sync(lanes, acc, 1);
  const unsigned votes = __ballot_sync(lanes, acc > 0);
  scratch[blockIdx.x * blockDim.x + t] = acc + float(votes & 1);
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = scratch[blockIdx.x * blockDim.x + (t + 1) % blockDim.x] + float(count);
}

// Phase 1 overwrites `tile` while the other warp may still read phase 0's values.
__global__ void reuse_without_trailing_barrier(const float* in, float* out) {
  __shared__ float tile[128];
  const int t = threadIdx.x;
  float acc = 0;
  for (int phase = 0; phase < 2; ++phase) {
    tile[t] = in[phase * 64 + t];
    __syncthreads();
    acc += tile[(t + 32) % 64];
    // missing: __syncthreads();
  }
  out[t] = acc;
}

// Warp 1 reads what warp 0 wrote, with no barrier between.
__global__ void read_without_barrier(float* out) {
  __shared__ double partial[32];
  const int t = threadIdx.x;
  if (t < 32) partial[t] = t;
  // missing: __syncthreads();
  if (t == 32) {
    double s = 0;
    for (int i = 0; i < 32; ++i) s += partial[i];
    out[0] = float(s);
  }
}

// A lane reads its neighbour's slot with no __syncwarp after the writes.
__global__ void warp_tile_without_syncwarp(float* out) {
  __shared__ float lane_values[32];
  const int lane = threadIdx.x;
  lane_values[lane] = float(lane);
  // missing: __syncwarp();
  out[lane] = lane_values[lane ^ 1];
}

__global__ void every_block_writes_out0(float* out) {
  if (threadIdx.x == 0) out[0] = float(blockIdx.x);  // should be out[blockIdx.x]
}

__global__ void copy_one_too_many(const float* in, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = in[i + 1];  // the last thread reads in[n]
}

__global__ void shared_one_too_many(float* out) {
  __shared__ float buffer[64];
  const int t = threadIdx.x;
  buffer[t + 1 < 64 ? t + 1 : 64] = float(t);  // thread 63 writes buffer[64]
  if (t == 63) return;
  __syncthreads();
  out[t] = buffer[t + 1];
}

__global__ void dynamic_past_launch(float* out) {
  extern __shared__ float dyn[];
  const int t = threadIdx.x;
  if (t <= 32) dyn[t] = float(t);  // 128 bytes were asked for: dyn[32] is past them
  out[t] = float(t);
}

__global__ void read_unwritten_shared(float* out) {
  __shared__ float sums[32];
  const int t = threadIdx.x;
  if (t < 31) sums[t] = float(t);  // sums[31] is never written
  __syncthreads();
  if (t == 0) out[0] = sums[31];
}

__global__ void read_unwritten_scratch(float* scratch, float* out) {
  const int t = threadIdx.x;
  if (t < 16 && t != 5) scratch[t] = float(t);  // scratch[5] is never written
  __syncthreads();
  if (t < 16) out[t] = scratch[t];
}

__global__ void shuffle_partial_warp(float* out) {
  float v = float(threadIdx.x);
  v += __shfl_xor_sync(0xffffffffu, v, 1);  // the block has 48 threads: warp 1 has lanes 0..15 only
  out[threadIdx.x] = v;
}

// ---- launchers ----------------------------------------------------------------------------------
void launch_clean(const float* in, float* out, float* scratch, int n, int blocks) {
  clean<<<blocks, 80, 80 * sizeof(float)>>>(in, out, scratch, n);
}
void launch_reuse_without_trailing_barrier(const float* in, float* out) {
  reuse_without_trailing_barrier<<<1, 64>>>(in, out);
}
void launch_read_without_barrier(float* out) { read_without_barrier<<<1, 64>>>(out); }
void launch_warp_tile_without_syncwarp(float* out) { warp_tile_without_syncwarp<<<1, 32>>>(out); }
void launch_every_block_writes_out0(float* out) { every_block_writes_out0<<<2, 32>>>(out); }
void launch_copy_one_too_many(const float* in, float* out) { copy_one_too_many<<<2, 32>>>(in, out); }
void launch_shared_one_too_many(float* out) { shared_one_too_many<<<1, 64>>>(out); }
void launch_dynamic_past_launch(float* out) { dynamic_past_launch<<<1, 64, 32 * sizeof(float)>>>(out); }
void launch_read_unwritten_shared(float* out) { read_unwritten_shared<<<1, 32>>>(out); }
void launch_read_unwritten_scratch(float* scratch, float* out) { read_unwritten_scratch<<<1, 32>>>(scratch, out); }
void launch_shuffle_partial_warp(float* out) { shuffle_partial_warp<<<1, 48>>>(out); }

}  // namespace sanitizer_kernels
