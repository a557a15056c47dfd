// Layer norm: the forward and dx are row reductions (one block per row, statistics in
// double like kernels/cpu/layer_norm.cpp); dweight and dbias are column sums over the
// rows, done by blocks of 32 columns x 8 row lanes, each over a chunk of about 128 rows
// (channel_reduce.cuh's column layout: a grid of column tiles x row chunks, so a narrow
// layer over many rows still fills the GPU): lane k sums the chunk's rows k, k + 8, ...,
// the lanes combine in a fixed tree, and the last block of a column tile to finish adds
// the chunks' partial sums in chunk order. The order depends on the shape only, so the
// result is the same bits on every run (no float atomics).
#include "kernels/cuda/layer_norm.h"

#include <cmath>

#include "kernels/common/twin_types.h"
#include "kernels/cuda/channel_reduce.cuh"
#include "kernels/cuda/row_reduce.cuh"

namespace nd::kernels::cuda {

namespace {

template <class T>
__global__ void layer_norm_forward_kernel(const T* x, const T* weight, const T* bias, int64_t M, int64_t D,
                                          double eps, T* y, T* mean, T* rstd) {
  __shared__ double smem[rows::kWarp];
  for (int64_t m = blockIdx.x; m < M; m += gridDim.x) {
    const T* xr = x + m * D;
    T* yr = y + m * D;
    double s = 0.0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) s += static_cast<double>(xr[d]);
    const double mu = rows::block_sum(s, smem) / static_cast<double>(D);
    double ss = 0.0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const double c = static_cast<double>(xr[d]) - mu;
      ss += c * c;
    }
    const double r = 1.0 / sqrt(rows::block_sum(ss, smem) / static_cast<double>(D) + eps);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const double xhat = (static_cast<double>(xr[d]) - mu) * r;
      const double w = weight ? static_cast<double>(weight[d]) : 1.0;
      const double b = bias ? static_cast<double>(bias[d]) : 0.0;
      yr[d] = static_cast<T>(xhat * w + b);
    }
    if (threadIdx.x == 0) {
      mean[m] = static_cast<T>(mu);
      rstd[m] = static_cast<T>(r);
    }
  }
}

// dx = rstd * (g - mean_d(g) - xhat * mean_d(g * xhat)), g = dy * weight.
template <class T>
__global__ void layer_norm_dx_kernel(const T* dy, const T* x, const T* mean, const T* rstd, const T* weight,
                                     int64_t M, int64_t D, T* dx) {
  __shared__ double smem[rows::kWarp];
  for (int64_t m = blockIdx.x; m < M; m += gridDim.x) {
    const T* xr = x + m * D;
    const T* gr = dy + m * D;
    T* out = dx + m * D;
    const double mu = static_cast<double>(mean[m]), r = static_cast<double>(rstd[m]);
    double sg = 0.0, sgx = 0.0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const double g = static_cast<double>(gr[d]) * (weight ? static_cast<double>(weight[d]) : 1.0);
      sg += g;
      sgx += g * (static_cast<double>(xr[d]) - mu) * r;
    }
    const double mg = rows::block_sum(sg, smem) / static_cast<double>(D);
    const double mgx = rows::block_sum(sgx, smem) / static_cast<double>(D);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const double g = static_cast<double>(gr[d]) * (weight ? static_cast<double>(weight[d]) : 1.0);
      const double xhat = (static_cast<double>(xr[d]) - mu) * r;
      out[d] = static_cast<T>(r * (g - mg - xhat * mgx));
    }
  }
}

// dweight[d] = sum_m dy[m,d] xhat[m,d],  dbias[d] = sum_m dy[m,d]: channels::store_or_finish's
// Op (State, combine, finish), the sums in double.
template <class T>
struct ParamGradOp {
  struct State {  // an aggregate: it lives in __shared__ arrays
    double w, b;
  };
  T* dweight;
  T* dbias;
  __device__ static State combine(State a, State b) { return {a.w + b.w, a.b + b.b}; }
  __device__ void finish(State s, int64_t d) const {
    if (dweight) dweight[d] = static_cast<T>(s.w);
    if (dbias) dbias[d] = static_cast<T>(s.b);
  }
};

// Grid (ceil(D / kColumns), chunks), block (kColumns, kRows): thread (tx, ty) of block (b, k)
// adds rows begin + ty, begin + ty + kRows, ... < end of column b * kColumns + tx; a warp
// reads kColumns adjacent elements of one row.
template <class T>
__global__ void layer_norm_dweight_kernel(const T* dy, const T* x, const T* mean, const T* rstd, int64_t M,
                                          int64_t D, int64_t chunk_rows, ParamGradOp<T> op,
                                          typename ParamGradOp<T>::State* partial, unsigned* tickets) {
  using State = typename ParamGradOp<T>::State;
  __shared__ State smem[channels::kColumns * channels::kRows];
  const int64_t d = int64_t(blockIdx.x) * channels::kColumns + threadIdx.x, begin = blockIdx.y * chunk_rows;
  const int64_t end = begin + chunk_rows < M ? begin + chunk_rows : M;
  const bool valid = d < D;
  State st{};
  if (valid) {
    for (int64_t m = begin + threadIdx.y; m < end; m += channels::kRows) {
      const double g = static_cast<double>(dy[m * D + d]);
      st.b += g;
      st.w += g * (static_cast<double>(x[m * D + d]) - static_cast<double>(mean[m])) * static_cast<double>(rstd[m]);
    }
  }
  st = channels::combine_lanes<ParamGradOp<T>>(st, smem);
  channels::store_or_finish(op, st, d, valid, partial, tickets, smem);
}

// dweight and dbias in one launch (plus the tickets' memset when the rows are split).
template <class T>
void launch_param_grads(const T* dy, const T* x, const T* mean, const T* rstd, int64_t M, int64_t D, T* dweight,
                        T* dbias, cudaStream_t stream) {
  const char* kernel = "layer_norm_backward (dweight, dbias)";
  using State = typename ParamGradOp<T>::State;
  const ChannelChunks chunks =
      channel_chunks(M, channels::kRows * channels::kValuesPerThread, channels::kMaxChunks);
  const int64_t tiles = (D + channels::kColumns - 1) / channels::kColumns;
  require(tiles <= int64_t(0x7fffffff), kernel, "at most 2^31 - 1 column tiles, found " + std::to_string(tiles));
  const channels::ChunkScratch<State> scratch(kernel, D, tiles, chunks.count, stream);
  layer_norm_dweight_kernel<T>
      <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks.count)),
         dim3(channels::kColumns, channels::kRows), 0, stream>>>(dy, x, mean, rstd, M, D, chunks.length,
                                                                  ParamGradOp<T>{dweight, dbias}, scratch.partial,
                                                                  scratch.tickets);
  check_launch(kernel);
}

}  // namespace

template <typename T>
void layer_norm_forward(const T* x, const T* weight, const T* bias, int64_t M, int64_t D, double eps, T* y,
                        T* mean, T* rstd, cudaStream_t stream) {
  if (M == 0) return;
  require(D > 0, "layer_norm_forward", "expected rows of at least one element, found D = " + std::to_string(D));
  layer_norm_forward_kernel<T>
      <<<rows::blocks_for(M), rows::threads_for(D), 0, stream>>>(x, weight, bias, M, D, eps, y, mean, rstd);
  check_launch("layer_norm_forward");
}

template <typename T>
void layer_norm_backward(const T* dy, const T* x, const T* mean, const T* rstd, const T* weight, int64_t M,
                         int64_t D, T* dx, T* dweight, T* dbias, cudaStream_t stream) {
  if (D == 0) return;
  if (dweight != nullptr || dbias != nullptr) launch_param_grads(dy, x, mean, rstd, M, D, dweight, dbias, stream);
  if (dx == nullptr || M == 0) return;
  layer_norm_dx_kernel<T>
      <<<rows::blocks_for(M), rows::threads_for(D), 0, stream>>>(dy, x, mean, rstd, weight, M, D, dx);
  check_launch("layer_norm_backward (dx)");
}

#define ND_INSTANTIATE(T)                                                                                        \
  template void layer_norm_forward<T>(const T*, const T*, const T*, int64_t, int64_t, double, T*, T*, T*,          \
                                      cudaStream_t);                                                               \
  template void layer_norm_backward<T>(const T*, const T*, const T*, const T*, const T*, int64_t, int64_t, T*, T*, \
                                       T*, cudaStream_t);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)

}  // namespace nd::kernels::cuda
