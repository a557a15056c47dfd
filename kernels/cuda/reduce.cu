// Row reductions: one block of kThreads threads per row of a contiguous [M, R] array.
// Each thread accumulates a strided slice of the row in double (as the CPU reference
// does), then the block combines the partial results in shared memory. Column sums over
// leading dims (bias gradients) read their [R, C] view in place through channel_reduce.cuh.
#include "kernels/cuda/reduce.h"

#include "kernels/cuda/channel_reduce.cuh"
#include "kernels/cuda/strided.cuh"

namespace nd::kernels::cuda {

namespace {

using detail::kThreads;

// Sum of v over the block; every thread gets the result. Uses kThreads doubles of `smem`.
__device__ double block_sum(double v, double* smem) {
  smem[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) smem[threadIdx.x] += smem[threadIdx.x + s];
    __syncthreads();
  }
  const double total = smem[0];
  __syncthreads();  // smem may be reused by the caller's next block_sum
  return total;
}

template <class T>
__global__ void sum_rows_kernel(int64_t R, const T* x, T* out) {
  __shared__ double smem[kThreads];
  const T* row = x + blockIdx.x * R;
  double acc = 0;
  for (int64_t r = threadIdx.x; r < R; r += kThreads) acc += static_cast<double>(row[r]);
  const double total = block_sum(acc, smem);
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<T>(total);
}

// The column sum as a channel_reduce.cuh Op: in double, as the CPU's sum_columns.
template <class T>
struct ColumnSumOp {
  using Acc = double;
  using Value = T;
  using State = double;
  static constexpr bool kRevisit = false;
  static constexpr bool kVectorLoads = false;  // S = 1 only: the column walk
  const T* x;
  T* out;
  __device__ static Acc start(int64_t) { return 0.0; }
  template <int W>
  __device__ void load(int64_t offset, Value (&v)[W]) const {
    channels::load_values<W>(x, offset, v);
  }
  __device__ static void add(Acc& a, Value v) { a += static_cast<double>(v); }
  __device__ static State summary(Acc a, int64_t) { return a; }
  __device__ static State combine(State a, State b) { return a + b; }
  __device__ void finish(State st, int64_t c) const { out[c] = static_cast<T>(st); }
};

// Two passes, as the CPU: mean first, then the sum of squared deviations.
template <class T>
__global__ void var_rows_kernel(int64_t R, int64_t correction, const T* x, T* out) {
  __shared__ double smem[kThreads];
  const T* row = x + blockIdx.x * R;
  double acc = 0;
  for (int64_t r = threadIdx.x; r < R; r += kThreads) acc += static_cast<double>(row[r]);
  const double mean = block_sum(acc, smem) / static_cast<double>(R);
  double ss = 0;
  for (int64_t r = threadIdx.x; r < R; r += kThreads) {
    const double d = static_cast<double>(row[r]) - mean;
    ss += d * d;
  }
  const double total = block_sum(ss, smem);
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<T>(total / static_cast<double>(R - correction));
}

// True when candidate (v, i) beats (best, bi): NaN is the largest value, ties go to
// the smaller index (the first maximum, as the CPU scan finds).
template <class T>
__device__ bool beats(T v, int64_t i, T best, int64_t bi) {
  const bool v_nan = v != v, best_nan = best != best;
  if (v_nan || best_nan) return v_nan && (!best_nan || i < bi);
  return v > best || (v == best && i < bi);
}

template <class T>
__global__ void max_rows_kernel(int64_t R, const T* x, T* values, int64_t* indices) {
  __shared__ T sval[kThreads];
  __shared__ int64_t sidx[kThreads];
  const T* row = x + blockIdx.x * R;
  T best = row[0];
  int64_t bi = 0;
  for (int64_t r = threadIdx.x; r < R; r += kThreads)
    if (beats(row[r], r, best, bi)) {
      best = row[r];
      bi = r;
    }
  sval[threadIdx.x] = best;
  sidx[threadIdx.x] = bi;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s && beats(sval[threadIdx.x + s], sidx[threadIdx.x + s], sval[threadIdx.x], sidx[threadIdx.x])) {
      sval[threadIdx.x] = sval[threadIdx.x + s];
      sidx[threadIdx.x] = sidx[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (values) values[blockIdx.x] = sval[0];
    if (indices) indices[blockIdx.x] = sidx[0];
  }
}

template <class T>
__global__ void scatter_rows_kernel(int64_t M, int64_t R, const int64_t* indices, const T* dy, T* dx) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < M * R; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / R, r = i % R;
    dx[i] = r == indices[m] ? dy[m] : T(0);
  }
}

void check_rows(const char* kernel, int64_t M) {
  require(M <= int64_t(0x7fffffff), kernel, "at most 2^31 - 1 rows per launch, found " + std::to_string(M));
}

}  // namespace

template <class T>
void sum_rows(int64_t M, int64_t R, const T* x, T* out, cudaStream_t stream) {
  if (M == 0) return;
  check_rows("sum_rows", M);
  sum_rows_kernel<T><<<static_cast<unsigned>(M), kThreads, 0, stream>>>(R, x, out);
  check_launch("sum_rows");
}

template <class T>
void sum_columns(int64_t R, int64_t C, int64_t ld, const T* x, T* out, cudaStream_t stream) {
  channels::reduce("sum_columns", ColumnSumOp<T>{x, out}, R, C, 1, ld, /*aligned_pointers=*/false, stream);
}

template <class T>
void var_rows(int64_t M, int64_t R, int64_t correction, const T* x, T* out, cudaStream_t stream) {
  if (M == 0) return;
  check_rows("var_rows", M);
  var_rows_kernel<T><<<static_cast<unsigned>(M), kThreads, 0, stream>>>(R, correction, x, out);
  check_launch("var_rows");
}

template <class T>
void max_rows(int64_t M, int64_t R, const T* x, T* values, int64_t* indices, cudaStream_t stream) {
  if (M == 0) return;
  check_rows("max_rows", M);
  max_rows_kernel<T><<<static_cast<unsigned>(M), kThreads, 0, stream>>>(R, x, values, indices);
  check_launch("max_rows");
}

template <class T>
void scatter_rows(int64_t M, int64_t R, const int64_t* indices, const T* dy, T* dx, cudaStream_t stream) {
  if (M * R == 0) return;
  scatter_rows_kernel<T><<<detail::blocks_for(M * R), kThreads, 0, stream>>>(M, R, indices, dy, dx);
  check_launch("scatter_rows");
}

#define ND_INST(T)                                                                        \
  template void sum_rows<T>(int64_t, int64_t, const T*, T*, cudaStream_t);                \
  template void sum_columns<T>(int64_t, int64_t, int64_t, const T*, T*, cudaStream_t);    \
  template void var_rows<T>(int64_t, int64_t, int64_t, const T*, T*, cudaStream_t);       \
  template void max_rows<T>(int64_t, int64_t, const T*, T*, int64_t*, cudaStream_t);      \
  template void scatter_rows<T>(int64_t, int64_t, const int64_t*, const T*, T*, cudaStream_t);
ND_INST(float)
ND_INST(double)
ND_INST(int64_t)
ND_INST(int32_t)

}  // namespace nd::kernels::cuda
