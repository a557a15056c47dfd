// Layer norm: the forward and dx are row reductions (one block per row, statistics in
// double like kernels/cpu/layer_norm.cpp); dweight and dbias are column sums over the
// rows, done by blocks of 32 columns x 8 row lanes: lane k sums rows k, k + 8, ... and
// the 8 lane sums are added in lane order, so the result does not depend on scheduling
// (no atomics).
#include "kernels/cuda/layer_norm.h"

#include <cmath>

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

constexpr int kColumns = 32;  // columns per block (one warp reads 32 adjacent elements)
constexpr int kLanes = 8;     // row lanes per block

// dweight[d] = sum_m dy[m,d] xhat[m,d],  dbias[d] = sum_m dy[m,d].
template <class T>
__global__ void layer_norm_dweight_kernel(const T* dy, const T* x, const T* mean, const T* rstd, int64_t M,
                                          int64_t D, T* dweight, T* dbias) {
  __shared__ double sw[kLanes][kColumns];
  __shared__ double sb[kLanes][kColumns];
  const int col = static_cast<int>(threadIdx.x) % kColumns, lane = static_cast<int>(threadIdx.x) / kColumns;
  for (int64_t d0 = int64_t(blockIdx.x) * kColumns; d0 < D; d0 += int64_t(gridDim.x) * kColumns) {
    const int64_t d = d0 + col;
    double w = 0.0, b = 0.0;
    if (d < D) {
      for (int64_t m = lane; m < M; m += kLanes) {
        const double g = static_cast<double>(dy[m * D + d]);
        b += g;
        w += g * (static_cast<double>(x[m * D + d]) - static_cast<double>(mean[m])) * static_cast<double>(rstd[m]);
      }
    }
    sw[lane][col] = w;
    sb[lane][col] = b;
    __syncthreads();
    if (lane == 0 && d < D) {
      for (int k = 1; k < kLanes; ++k) {
        w += sw[k][col];
        b += sb[k][col];
      }
      if (dweight) dweight[d] = static_cast<T>(w);
      if (dbias) dbias[d] = static_cast<T>(b);
    }
    __syncthreads();  // sw, sb are rewritten by the next column tile
  }
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
  if (dweight != nullptr || dbias != nullptr) {
    const unsigned blocks = rows::blocks_for((D + kColumns - 1) / kColumns);
    layer_norm_dweight_kernel<T><<<blocks, kColumns * kLanes, 0, stream>>>(dy, x, mean, rstd, M, D, dweight, dbias);
    check_launch("layer_norm_backward (dweight, dbias)");
  }
  if (dx == nullptr || M == 0) return;
  layer_norm_dx_kernel<T>
      <<<rows::blocks_for(M), rows::threads_for(D), 0, stream>>>(dy, x, mean, rstd, weight, M, D, dx);
  check_launch("layer_norm_backward (dx)");
}

template void layer_norm_forward<float>(const float*, const float*, const float*, int64_t, int64_t, double, float*,
                                        float*, float*, cudaStream_t);
template void layer_norm_forward<double>(const double*, const double*, const double*, int64_t, int64_t, double,
                                         double*, double*, double*, cudaStream_t);
template void layer_norm_backward<float>(const float*, const float*, const float*, const float*, const float*,
                                         int64_t, int64_t, float*, float*, float*, cudaStream_t);
template void layer_norm_backward<double>(const double*, const double*, const double*, const double*,
                                          const double*, int64_t, int64_t, double*, double*, double*, cudaStream_t);

}  // namespace nd::kernels::cuda
