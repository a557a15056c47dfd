#pragma once
// A deterministic per-channel reduction over [N, C, S] (batch_norm.cu's statistics and
// gradient sums, reduce.cu's column sums), parameterised by an Op: its per-thread State,
// add(State&, element offset, channel), combine(State, State) and finish(State, channel).
//
// Why this shape: the results must repeat bit for bit run to run (SyncBatchNorm ranks and
// repeated runs must agree), so there are no atomics: every value goes to a fixed thread,
// threads combine in a fixed tree, blocks in a fixed order.
//   level 1: block (channel or 32 channels, chunk k) -> State; with one chunk per channel
//            the block writes the result directly;
//   level 2: one block per channel folds its chunks' States in chunk order.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/common/batch_norm_index.h"
#include "kernels/cuda/scratch.cuh"
#include "kernels/cuda/strided.cuh"

namespace nd::kernels::cuda::channels {

using detail::kThreads;
using detail::Scratch;
constexpr int kColumns = 32;                // S = 1: channels side by side in a block (one warp row)
constexpr int kRows = kThreads / kColumns;  // S = 1: rows of the batch a block walks at once
constexpr int64_t kValuesPerThread = 16;    // chunk size target: enough work to hide latency
constexpr int64_t kMaxChunks = 1024;        // chunks per channel (gridDim.y <= 65535)

// Combines the States of the threadIdx.y lanes of each block column in a fixed halving
// tree (blockDim.y a power of two); threads (x, 0) return their column's total.
template <class Op>
__device__ typename Op::State combine_lanes(typename Op::State st, typename Op::State* smem) {
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  smem[t] = st;
  __syncthreads();
  for (int h = blockDim.y / 2; h > 0; h /= 2) {
    if (threadIdx.y < h) smem[t] = Op::combine(smem[t], smem[t + h * blockDim.x]);
    __syncthreads();
  }
  return smem[threadIdx.x];
}

// Chunk k's State of channel c: the channel's result when it has one chunk.
template <class Op>
__device__ void store(const Op& op, const typename Op::State& st, int64_t c, int64_t k, typename Op::State* partial) {
  if (gridDim.y == 1) {
    op.finish(st, c);
  } else {
    partial[c * gridDim.y + k] = st;
  }
}

// S > 1. Grid (C, chunks), block (1, kThreads): lane t of block (c, k) adds values
// j = begin + t, begin + t + kThreads, ... < end of channel c.
template <class Op>
__global__ void channel_partials_kernel(Op op, int64_t C, int64_t S, int64_t values, int64_t chunk_length,
                                        typename Op::State* partial) {
  __shared__ typename Op::State smem[kThreads];
  const int64_t c = blockIdx.x, k = blockIdx.y;
  const int64_t begin = k * chunk_length;
  const int64_t end = begin + chunk_length < values ? begin + chunk_length : values;
  typename Op::State st{};
  const int64_t first = begin + threadIdx.y;
  if (first < end) {
    ChannelWalk w = channel_walk(first, blockDim.y, C, S, c);
    for (int64_t j = first; j < end; j += blockDim.y, w.next()) op.add(st, w.offset, c);
  }
  st = combine_lanes<Op>(st, smem);
  if (threadIdx.y == 0) store(op, st, c, k, partial);
}

// S = 1 ([N, C] with rows ld apart). Grid (ceil(C / kColumns), chunks), block (kColumns,
// kRows): thread (tx, ty) of block (b, k) adds rows n = begin + ty, begin + ty + kRows,
// ... < end of channel b * kColumns + tx; a warp reads kColumns consecutive channels of one row.
template <class Op>
__global__ void column_partials_kernel(Op op, int64_t N, int64_t C, int64_t ld, int64_t chunk_length,
                                       typename Op::State* partial) {
  __shared__ typename Op::State smem[kThreads];
  const int64_t c = int64_t(blockIdx.x) * kColumns + threadIdx.x, k = blockIdx.y;
  const int64_t begin = k * chunk_length;
  const int64_t end = begin + chunk_length < N ? begin + chunk_length : N;
  typename Op::State st{};
  if (c < C)
    for (int64_t n = begin + threadIdx.y; n < end; n += kRows) op.add(st, n * ld + c, c);
  st = combine_lanes<Op>(st, smem);
  if (threadIdx.y == 0 && c < C) store(op, st, c, k, partial);
}

// Level 2. Grid (C), block (1, kThreads): lane t folds chunks t, t + kThreads, ... in
// order, then the lanes combine in the fixed tree.
template <class Op>
__global__ void combine_partials_kernel(Op op, int64_t chunks, const typename Op::State* partial) {
  __shared__ typename Op::State smem[kThreads];
  const int64_t c = blockIdx.x;
  typename Op::State st{};
  for (int64_t k = threadIdx.y; k < chunks; k += blockDim.y) st = Op::combine(st, partial[c * chunks + k]);
  st = combine_lanes<Op>(st, smem);
  if (threadIdx.y == 0) op.finish(st, c);
}

// Op's result for each channel c < C of [N, C, S] (rows of [N, C] ld elements apart when
// S == 1; ld == C when contiguous): one launch when a channel's values fit one chunk, else
// the partials (in scratch from the caching allocator) and their combination.
template <class Op>
void reduce(const char* kernel, const Op& op, int64_t N, int64_t C, int64_t S, int64_t ld, cudaStream_t stream) {
  if (C == 0) return;
  require(C <= int64_t(0x7fffffff), kernel, "at most 2^31 - 1 channels, found " + std::to_string(C));
  using State = typename Op::State;
  const bool columns = S == 1;
  const int64_t per_chunk = (columns ? kRows : kThreads) * kValuesPerThread;
  const ChannelChunks chunks = channel_chunks(N * S, per_chunk, kMaxChunks);
  const Scratch scratch(kernel, chunks.count > 1 ? sizeof(State) * C * chunks.count : 0, stream);
  State* partial = scratch.as<State>();
  const auto chunk_count = static_cast<unsigned>(chunks.count);
  if (columns) {
    const dim3 grid(static_cast<unsigned>((C + kColumns - 1) / kColumns), chunk_count);
    column_partials_kernel<Op><<<grid, dim3(kColumns, kRows), 0, stream>>>(op, N, C, ld, chunks.length, partial);
  } else {
    const dim3 grid(static_cast<unsigned>(C), chunk_count);
    channel_partials_kernel<Op><<<grid, dim3(1, kThreads), 0, stream>>>(op, C, S, N * S, chunks.length, partial);
  }
  check_launch(kernel);
  if (chunks.count == 1) return;
  combine_partials_kernel<Op><<<static_cast<unsigned>(C), dim3(1, kThreads), 0, stream>>>(op, chunks.count, partial);
  check_launch(kernel);
}

}  // namespace nd::kernels::cuda::channels
