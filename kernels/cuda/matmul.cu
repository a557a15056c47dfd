// GEMM through cuBLAS. cuBLAS is column-major; a row-major [r, c] matrix with leading
// dimension ld is the column-major [c, r] matrix with the same ld. So row-major
//   C = op(A) op(B)          ([M, N] = [M, K] [K, N])
// is column-major
//   C^T = op(B)^T op(A)^T    ([N, M] = [N, K] [K, M])
// which is one cuBLAS call with the operands swapped and each keeping its own
// transpose flag. One handle per device, bound to that device's compute stream (cublasSetStream
// resets the workspace, so it is called only when that stream changes: a graph's capture).
#include "kernels/cuda/matmul.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/strided.cuh"
#include "kernels/common/twin_types.h"

namespace nd::kernels::cuda {

namespace {

void check_cublas(cublasStatus_t status, const char* call, const std::string& op) {
  require(status == CUBLAS_STATUS_SUCCESS, op.c_str(),
          std::string(call) + " failed: " + cublasGetStatusName(status) + " (" + cublasGetStatusString(status) + ")");
}

// The device's handle, created on first use and never destroyed (see allocator.cpp).
cublasHandle_t handle_for(cudaStream_t stream) {
  static std::mutex mutex;
  static auto* handles = new std::vector<std::pair<cublasHandle_t, cudaStream_t>>();  // handle, its stream
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice", "gemm");
  std::lock_guard lock(mutex);
  if (device >= static_cast<int>(handles->size())) handles->resize(device + 1, {nullptr, nullptr});
  auto& [h, bound] = (*handles)[device];
  if (!h) check_cublas(cublasCreate(&h), "cublasCreate", "gemm on cuda:" + std::to_string(device));
  require(stream == compute_stream(device), "gemm",
          "cuBLAS runs on the compute stream of cuda:" + std::to_string(device) + " only");
  // Rebound only when the compute stream changes: a CUDA graph's capture (graph.h) and back.
  if (bound != stream) {
    check_cublas(cublasSetStream(h, stream), "cublasSetStream", "gemm");
    bound = stream;
  }
  return h;
}

// C_b = beta * C_b for an empty inner dimension (K == 0); beta == 0 writes zeros
// without reading C, as the contract says (C may hold NaN).
template <class T>
__global__ void scale_c_kernel(int64_t batch, int64_t M, int64_t N, T beta, T* C, int64_t ldc, int64_t stride_c) {
  const int64_t n = batch * M * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / (M * N), r = (i / N) % M, c = i % N;
    T* p = C + b * stride_c + r * ldc + c;
    *p = beta == T(0) ? T(0) : beta * *p;
  }
}

template <class T>
cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, double>) return CUDA_R_64F;
  else if constexpr (std::is_same_v<T, Half>) return CUDA_R_16F;
  else return CUDA_R_16BF;
}

// In: the operands' type; T: C's, alpha's and beta's (f32 for bf16 operands).
template <class In, class T>
void gemm_batched(const char* op, bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K,
                  T alpha, const In* A, int64_t lda, int64_t stride_a, const In* B, int64_t ldb, int64_t stride_b,
                  T beta, T* C, int64_t ldc, int64_t stride_c, cudaStream_t stream) {
  if (batch == 0 || M == 0 || N == 0) return;
  const int64_t kIntMax = 0x7fffffff;
  require(M <= kIntMax && N <= kIntMax && K <= kIntMax && lda <= kIntMax && ldb <= kIntMax && ldc <= kIntMax &&
              batch <= kIntMax,
          op, "dimensions and leading dimensions must fit in int for cuBLAS");
  if (K == 0) {
    scale_c_kernel<T><<<detail::blocks_for(batch * M * N), detail::kThreads, 0, stream>>>(batch, M, N, beta, C, ldc,
                                                                                         stride_c);
    check_launch(op);
    return;
  }
  cublasHandle_t h = handle_for(stream);
  constexpr bool f32_operands = std::is_same_v<In, float>, f64 = std::is_same_v<T, double>;
  const cudaDataType_t type = cuda_type<In>(), c_type = cuda_type<T>();
  const cublasComputeType_t compute = f64                ? CUBLAS_COMPUTE_64F
                                      : !f32_operands    ? CUBLAS_COMPUTE_32F  // bf16 / f16 tensor cores
                                      : allow_tf32()     ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                         : CUBLAS_COMPUTE_32F;
  const auto ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
  const int lda_ = static_cast<int>(lda), ldb_ = static_cast<int>(ldb);
  if (batch == 1) {
    check_cublas(cublasGemmEx(h, tb, ta, m, n, k, &alpha, B, type, ldb_, A, type, lda_, &beta, C, c_type,
                              static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx", op);
  } else {
    check_cublas(cublasGemmStridedBatchedEx(h, tb, ta, m, n, k, &alpha, B, type, ldb_, stride_b, A, type, lda_,
                                            stride_a, &beta, C, c_type, static_cast<int>(ldc), stride_c,
                                            static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx", op);
  }
}

}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc, cudaStream_t stream) {
  gemm_batched<T, T>("gemm", trans_a, trans_b, 1, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, stream);
}

template <class T>
void bmm(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
         int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, T beta, T* C, int64_t ldc, int64_t stride_c,
         cudaStream_t stream) {
  gemm_batched<T, T>("bmm", trans_a, trans_b, batch, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
                  stride_c, stream);
}

void bmm_bf16(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
              const BFloat16* A, int64_t lda, int64_t stride_a, const BFloat16* B, int64_t ldb, int64_t stride_b,
              float beta, float* C, int64_t ldc, int64_t stride_c, cudaStream_t stream) {
  gemm_batched<BFloat16, float>("bmm (autocast bf16)", trans_a, trans_b, batch, M, N, K, alpha, A, lda, stride_a, B,
                                ldb, stride_b, beta, C, ldc, stride_c, stream);
}

void bmm_f16(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha, const Half* A,
             int64_t lda, int64_t stride_a, const Half* B, int64_t ldb, int64_t stride_b, float beta, float* C,
             int64_t ldc, int64_t stride_c, cudaStream_t stream) {
  gemm_batched<Half, float>("bmm (autocast f16)", trans_a, trans_b, batch, M, N, K, alpha, A, lda, stride_a, B, ldb,
                            stride_b, beta, C, ldc, stride_c, stream);
}

#define ND_INSTANTIATE(T) \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, int64_t, T, T*, \
      int64_t, cudaStream_t); \
  template void bmm<T>(bool, bool, int64_t, int64_t, int64_t, int64_t, T, const T*, int64_t, int64_t, const T*, \
      int64_t, int64_t, T, T*, int64_t, int64_t, cudaStream_t);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cuda
