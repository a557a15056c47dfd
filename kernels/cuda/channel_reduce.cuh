#pragma once
// A deterministic per-channel reduction over [N, C, S] (batch_norm.cu's statistics and
// gradient sums, reduce.cu's column sums) in one launch, parameterised by an Op:
//   Acc    a thread's running accumulator, Acc start(c) before its first value of channel c
//          (a shift, the channel's mean: what every value of the channel is taken against);
//   Value  what one element yields: load<W>(element offset, Value (&)[W]) reads W consecutive
//          elements (W = 1; W = kVector, one 16-byte access per array, when kVectorLoads);
//   add(Acc&, const Value&)            per value: adds and multiplies only, no division;
//   State summary(const Acc&, c)       what a thread hands on (one division per thread at most);
//   State combine(State, State)        associative in exact arithmetic; applied in a fixed tree;
//   finish(State, c)                   writes channel c's results (the statistics, mean and
//                                      invstd, the parameter gradients: whatever the Op is for);
//   kRevisit, revisit_constants(c), revisit<W>(constants, offset, const Value (&)[W])
//                                      when kRevisit and a block holds every value of its
//                                      channels (one chunk), each thread walks its values
//                                      again after finish and hands them to revisit (batch
//                                      norm's apply, in the statistics' launch; its dx, in
//                                      the gradient sums' launch).
//
// Why this shape: the results must repeat bit for bit run to run (SyncBatchNorm ranks and
// repeated runs must agree), so no float atomics: every value goes to a fixed thread,
// threads combine in a fixed tree, chunks in a fixed order.
//   A block (a channel, or 32 channels side by side when S = 1, and chunk k of its values)
//   reduces its values: each thread walks its values kUnroll loads at a time (the offsets
//   by additions, then all kUnroll loads, then the adds: several loads in flight per
//   thread), then the block's threads combine in a fixed halving tree. A load is one value,
//   or, when Op::kVectorLoads, S % kVector == 0 and every pointer the Op touches is 16-byte
//   aligned, kVector consecutive values of one plane as one float4 (two double2) (lane t
//   takes values 4t..4t+3 of each 4 * blockDim.y, added in order). The layout and the pointers'
//   alignment pick the walk, so a given call adds in the same order on every run.
//   One chunk per channel: the block finishes the channel at once.
//   Several: the block stores its State in a partials table, and the last block of the
//   channel group to arrive (an atomic ticket per group, after a __threadfence: the only
//   atomic, on an integer) folds every chunk's State in chunk order and finishes. Which
//   block is last varies run to run; the order it folds in does not.
// So a reduction plus what follows it per channel is one launch (the previous version took
// a second launch to combine the chunks and a third to turn sums into mean and invstd),
// plus a cudaMemsetAsync of the tickets when a channel is split; and when every channel
// fits one block, an elementwise pass that needs the result (kRevisit) joins it too.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/common/batch_norm_index.h"
#include "kernels/cuda/scratch.cuh"
#include "kernels/cuda/strided.cuh"
#include "kernels/cuda/vector_io.cuh"

namespace nd::kernels::cuda::channels {

using detail::kThreads;
using detail::Scratch;
constexpr int kColumns = 32;                // S = 1: channels side by side in a block (one warp row)
constexpr int kRows = kThreads / kColumns;  // S = 1: rows of the batch a block walks at once
constexpr int64_t kValuesPerThread = 16;    // chunk size target: enough work to hide latency
constexpr int64_t kMaxChunks = 1024;        // chunks per channel: fills an H200 (132 SMs x 8 blocks)
constexpr int kUnroll = 4;                  // loads a thread issues before it adds their values
constexpr int kVector = VectorIO::kGroup;   // values per 16-byte load (S % kVector == 0, aligned)

// W consecutive elements of p from `offset`: one access for W == kVector (the caller
// guarantees the 16-byte alignment), a scalar load for W == 1.
template <int W, class T>
__device__ void load_values(const T* p, int64_t offset, T (&v)[W]) {
  static_assert(W == 1 || (W == kVector && (std::is_same_v<T, float> || std::is_same_v<T, double>)),
                "one value, or a 16-byte group of float or double");
  if constexpr (W == 1) v[0] = p[offset];
  else VectorIO::load(v, p, offset, W, true);
}

template <int W, class T>
__device__ void store_values(const T (&v)[W], T* p, int64_t offset) {
  static_assert(W == 1 || W == kVector, "one value or a 16-byte group");
  if constexpr (W == 1) p[offset] = v[0];
  else VectorIO::store(v, p, offset, W, true);
}

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
  const typename Op::State total = smem[threadIdx.x];
  __syncthreads();  // smem is reused by the fold of the chunks
  return total;
}

// A partial another block stored in this launch, read from L2 (ld.cg): the L1 of this
// SM is not coherent with the other SMs' stores. States are plain structs of doubles.
template <class State>
__device__ State load_partial(const State* p) {
#ifdef __CUDA_ARCH__
  static_assert(sizeof(State) % sizeof(double) == 0, "a State is a struct of doubles");
  State s;
  auto* d = reinterpret_cast<double*>(&s);
  for (size_t i = 0; i < sizeof(State) / sizeof(double); ++i) d[i] = __ldcg(reinterpret_cast<const double*>(p) + i);
  return s;
#else
  return *p;
#endif
}

// The block's lanes' total for column channel c (valid in threads (x, 0)) is stored as
// chunk blockIdx.y's partial; the last block of group blockIdx.x to store folds the chunks
// of each of its channels in order (lane t: chunks t, t + blockDim.y, ...; then the tree)
// and finishes them. With one chunk, the total is finished at once.
template <class Op>
__device__ void store_or_finish(const Op& op, typename Op::State st, int64_t c, bool valid,
                                typename Op::State* partial, unsigned* tickets, typename Op::State* smem) {
  using State = typename Op::State;
  const unsigned chunks = gridDim.y;
  if (chunks == 1) {
    if (threadIdx.y == 0 && valid) op.finish(st, c);
    return;
  }
  __shared__ bool last;
  if (threadIdx.y == 0 && valid) partial[c * chunks + blockIdx.y] = st;
  __threadfence();  // the partial is visible device-wide before the ticket is taken
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) last = atomicAdd(&tickets[blockIdx.x], 1u) == chunks - 1;
  __syncthreads();
  if (!last) return;  // the same for the whole block
  __threadfence();
  State folded{};
  if (valid)
    for (unsigned k = threadIdx.y; k < chunks; k += blockDim.y)
      folded = Op::combine(folded, load_partial(partial + c * chunks + k));
  folded = combine_lanes<Op>(folded, smem);
  if (threadIdx.y == 0 && valid) op.finish(folded, c);
}

// use(offset, values) for the W-value groups starting at j = first, first + step, ... < end
// of channel c (a walk from channel_walk; with W > 1, first, step and end are multiples of
// W and S % W == 0, so a group lies in one plane), kUnroll groups at a time: the offsets,
// then the loads, then the uses.
template <int W, class Op, class Use>
__device__ void walk_values(const Op& op, int64_t first, int64_t end, int64_t step, int64_t C, int64_t S, int64_t c,
                            Use&& use) {
  ChannelWalk w = channel_walk(first, step, C, S, c);
  for (int64_t j = first; j < end; j += kUnroll * step) {
    int64_t offset[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      offset[u] = w.offset;
      if (j + u * step < end) w.next();
    }
    typename Op::Value v[kUnroll][W];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (j + u * step < end) op.template load<W>(offset[u], v[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (j + u * step < end) use(offset[u], v[u]);
  }
}

// The State of a thread's values (an empty one when it has none).
template <int W, class Op>
__device__ typename Op::State reduce_values(const Op& op, int64_t first, int64_t end, int64_t step, int64_t C,
                                            int64_t S, int64_t c) {
  if (first >= end) return typename Op::State{};
  typename Op::Acc acc = op.start(c);
  walk_values<W>(op, first, end, step, C, S, c, [&](int64_t, const typename Op::Value(&v)[W]) {
#pragma unroll
    for (int k = 0; k < W; ++k) op.add(acc, v[k]);
  });
  return op.summary(acc, c);
}

// The second walk of kRevisit Ops (one chunk per channel): the same values, after finish's
// writes (a __syncthreads makes them visible to the block).
template <int W, class Op>
__device__ void revisit_values(const Op& op, int64_t first, int64_t end, int64_t step, int64_t C, int64_t S,
                               int64_t c) {
  if (first >= end) return;
  const auto constants = op.revisit_constants(c);
  walk_values<W>(op, first, end, step, C, S, c, [&](int64_t offset, const typename Op::Value(&v)[W]) {
    op.template revisit<W>(constants, offset, v);
  });
}

// S > 1. Grid (C, chunks), block (1, kThreads): lane t of block (c, k) adds the W-value
// groups starting at j = begin + W t, begin + W (t + kThreads), ... < end of channel c
// (W = kVector: S % kVector == 0, the chunk length a multiple of kVector, aligned pointers).
template <class Op, int W>
__global__ void channel_kernel(Op op, int64_t C, int64_t S, int64_t values, int64_t chunk_length,
                               typename Op::State* partial, unsigned* tickets) {
  __shared__ typename Op::State smem[kThreads];
  const int64_t c = blockIdx.x, begin = blockIdx.y * chunk_length;
  const int64_t end = begin + chunk_length < values ? begin + chunk_length : values;
  const int64_t first = begin + W * int64_t(threadIdx.y), step = W * int64_t(blockDim.y);
  typename Op::State st = reduce_values<W>(op, first, end, step, C, S, c);
  st = combine_lanes<Op>(st, smem);
  store_or_finish(op, st, c, true, partial, tickets, smem);
  if constexpr (Op::kRevisit) {
    if (gridDim.y != 1) return;
    __syncthreads();
    revisit_values<W>(op, first, end, step, C, S, c);
  }
}

// S = 1 ([N, C] with rows ld apart). Grid (ceil(C / kColumns), chunks), block (kColumns,
// kRows): thread (tx, ty) of block (b, k) adds rows n = begin + ty, begin + ty + kRows,
// ... < end of channel b * kColumns + tx; a warp reads kColumns consecutive channels of one
// row. (As a walk: C' = 1 channel of S' = 1 with planes ld apart.)
template <class Op>
__global__ void column_kernel(Op op, int64_t N, int64_t C, int64_t ld, int64_t chunk_length,
                              typename Op::State* partial, unsigned* tickets) {
  __shared__ typename Op::State smem[kThreads];
  const int64_t c = int64_t(blockIdx.x) * kColumns + threadIdx.x, begin = blockIdx.y * chunk_length;
  const int64_t end = begin + chunk_length < N ? begin + chunk_length : N;
  const bool valid = c < C;
  typename Op::State st{};
  if (valid) st = reduce_values<1>(op, begin + threadIdx.y, end, kRows, ld, 1, c);
  st = combine_lanes<Op>(st, smem);
  store_or_finish(op, st, c, valid, partial, tickets, smem);
  if constexpr (Op::kRevisit) {
    if (gridDim.y != 1) return;
    __syncthreads();
    if (valid) revisit_values<1>(op, begin + threadIdx.y, end, kRows, ld, 1, c);
  }
}

// The scratch of a launch that splits C channels, in `groups` groups of the grid's x, into
// `chunks` chunks (blockIdx.y): store_or_finish's partials and the groups' tickets (zeroed on
// `stream`), from the caching allocator; both null with one chunk.
template <class State>
struct ChunkScratch {
  ChunkScratch(const char* kernel, int64_t C, int64_t groups, int64_t chunks, cudaStream_t stream)
      : scratch(kernel, chunks > 1 ? partial_bytes(C, chunks) + sizeof(unsigned) * groups : 0, stream),
        partial(scratch.as<State>()),
        tickets(chunks > 1 ? reinterpret_cast<unsigned*>(scratch.as<unsigned char>() + partial_bytes(C, chunks))
                           : nullptr) {
    if (tickets) check(cudaMemsetAsync(tickets, 0, sizeof(unsigned) * groups, stream), "cudaMemsetAsync", kernel);
  }
  static size_t partial_bytes(int64_t C, int64_t chunks) { return (sizeof(State) * C * chunks + 15) / 16 * 16; }
  const Scratch scratch;
  State* const partial;
  unsigned* const tickets;
};

// Op's result for each channel c < C of [N, C, S] (rows of [N, C] ld elements apart when
// S == 1; ld == C when contiguous), in one launch: the partials and tickets, when a channel
// is split into chunks, in scratch from the caching allocator (the tickets zeroed first).
// `aligned_pointers`: every array the Op reads or writes per value is 16-byte aligned (with
// S % kVector == 0, the 16-byte walk). Returns whether every channel was one chunk (then a
// kRevisit Op revisited its values).
template <class Op>
bool reduce(const char* kernel, const Op& op, int64_t N, int64_t C, int64_t S, int64_t ld, bool aligned_pointers,
            cudaStream_t stream) {
  if (C == 0) return true;
  require(C <= int64_t(0x7fffffff), kernel, "at most 2^31 - 1 channels, found " + std::to_string(C));
  using State = typename Op::State;
  const bool columns = S == 1;
  const bool vector = Op::kVectorLoads && !columns && S % kVector == 0 && aligned_pointers;
  const int64_t per_chunk = (columns ? kRows : kThreads) * kValuesPerThread;
  // Vector walks split channels in whole groups: chunks of groups, lengths back in values.
  const int64_t unit = vector ? kVector : 1;
  ChannelChunks chunks = channel_chunks(N * S / unit, per_chunk / unit, kMaxChunks);
  chunks.length *= unit;
  const int64_t groups = columns ? (C + kColumns - 1) / kColumns : C;
  const ChunkScratch<State> scratch(kernel, C, groups, chunks.count, stream);
  State* partial = scratch.partial;
  unsigned* tickets = scratch.tickets;
  const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>(chunks.count));
  if (columns) {
    column_kernel<Op><<<grid, dim3(kColumns, kRows), 0, stream>>>(op, N, C, ld, chunks.length, partial, tickets);
  } else if (vector) {
    if constexpr (Op::kVectorLoads)
      channel_kernel<Op, kVector>
          <<<grid, dim3(1, kThreads), 0, stream>>>(op, C, S, N * S, chunks.length, partial, tickets);
  } else {
    channel_kernel<Op, 1><<<grid, dim3(1, kThreads), 0, stream>>>(op, C, S, N * S, chunks.length, partial, tickets);
  }
  check_launch(kernel);
  return chunks.count == 1;
}

}  // namespace nd::kernels::cuda::channels
