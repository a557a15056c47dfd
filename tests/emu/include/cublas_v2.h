#pragma once
// Emulator stand-in for <cublas_v2.h> (and the library_types.h names it brings): exactly
// what kernels/cuda/matmul.cu calls, on host memory, with cuBLAS's documented semantics
// (cuBLAS Library reference, "cublasGemmEx" and "cublasGemmStridedBatchedEx"):
//   column-major; C_i = alpha op(A_i) op(B_i) + beta C_i, op(A) m x k, op(B) k x n, C m x n;
//   X_i = X + i * strideX (a stride of 0 reuses one matrix);
//   m, n, k, batchCount >= 0, lda >= max(1, transa == N ? m : k),
//   ldb >= max(1, transb == N ? k : n), ldc >= max(1, m), else CUBLAS_STATUS_INVALID_VALUE;
//   m == 0, n == 0 or batchCount == 0: nothing is done; k == 0: C = beta C;
//   beta == 0: C is not read (NaN in C is overwritten);
//   alpha/beta in host memory (the default pointer mode), of the compute type's scalar type
//   (double for CUBLAS_COMPUTE_64F, float for the 32F ones);
//   the type combinations matmul.cu relies on (64F: all R_64F; 32F and 32F_FAST_TF32: A, B
//   R_32F with C R_32F, or A, B R_16BF with C R_32F or R_16BF, or A, B R_16F with C R_32F
//   or R_16F); anything else
//   CUBLAS_STATUS_NOT_SUPPORTED.
// The product is a naive triple loop accumulated in double (then rounded to C's type): a
// reference, not cuBLAS's order of additions, and TF32 rounding is not emulated (the compute
// type of the last call is recorded in emu_cublas::last_compute for tests to check).
// It checks the arguments and semantics of our calls, not cuBLAS itself.
// Handle and stream calls are no-ops returning CUBLAS_STATUS_SUCCESS.
#include <cstdint>
#include <cstring>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

// ---- library_types.h -------------------------------------------------------------------
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
using cudaDataType = cudaDataType_t;

// ---- cublas_api.h ----------------------------------------------------------------------
enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cublasComputeType_t {
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
  CUBLAS_COMPUTE_64F = 70
};
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
struct cublasContext {
  cudaStream_t stream = nullptr;
};
using cublasHandle_t = cublasContext*;

namespace emu_cublas {

// What the last GEMM call asked for (tests check the compute type matmul.cu picks).
inline cublasComputeType_t last_compute = CUBLAS_COMPUTE_32F;
inline cudaDataType_t last_ab_type = CUDA_R_32F, last_c_type = CUDA_R_32F;
inline int64_t calls = 0;

inline double load(const void* p, cudaDataType_t t, int64_t i) {
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_64F: return static_cast<const double*>(p)[i];
    case CUDA_R_16F: {
      __half h;
      std::memcpy(&h, static_cast<const char*>(p) + 2 * i, 2);
      return __half2float(h);
    }
    default: {  // CUDA_R_16BF
      __nv_bfloat16 h;
      std::memcpy(&h, static_cast<const char*>(p) + 2 * i, 2);
      return float(h);
    }
  }
}
inline void store(void* p, cudaDataType_t t, int64_t i, double v) {
  switch (t) {
    case CUDA_R_32F: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case CUDA_R_64F: static_cast<double*>(p)[i] = v; break;
    case CUDA_R_16F: {
      const __half h = __float2half_rn(static_cast<float>(v));
      std::memcpy(static_cast<char*>(p) + 2 * i, &h, 2);
      break;
    }
    default: {  // CUDA_R_16BF, rounded to nearest even from the f32 value
      const __nv_bfloat16 h(static_cast<float>(v));
      std::memcpy(static_cast<char*>(p) + 2 * i, &h, 2);
    }
  }
}

inline bool supported(cudaDataType_t ab, cudaDataType_t c, cublasComputeType_t compute) {
  if (compute == CUBLAS_COMPUTE_64F) return ab == CUDA_R_64F && c == CUDA_R_64F;
  if (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_FAST_TF32)
    return (ab == CUDA_R_32F && c == CUDA_R_32F) || (ab == CUDA_R_16BF && (c == CUDA_R_32F || c == CUDA_R_16BF)) ||
           (ab == CUDA_R_16F && (c == CUDA_R_32F || c == CUDA_R_16F));
  return false;
}

inline cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const void* alpha, const void* A, cudaDataType_t Atype, int lda, long long strideA,
                           const void* B, cudaDataType_t Btype, int ldb, long long strideB, const void* beta, void* C,
                           cudaDataType_t Ctype, int ldc, long long strideC, int batch,
                           cublasComputeType_t compute) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto max1 = [](int x) { return x > 1 ? x : 1; };
  if (m < 0 || n < 0 || k < 0 || batch < 0 || (transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) ||
      (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T) || lda < max1(transa == CUBLAS_OP_N ? m : k) ||
      ldb < max1(transb == CUBLAS_OP_N ? k : n) || ldc < max1(m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (Atype != Btype || !supported(Atype, Ctype, compute)) return CUBLAS_STATUS_NOT_SUPPORTED;
  last_compute = compute;
  last_ab_type = Atype;
  last_c_type = Ctype;
  ++calls;
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  const bool f64 = compute == CUBLAS_COMPUTE_64F;
  const double a = f64 ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  const double b = f64 ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);
  // cuBLAS queues kernels on the handle's stream: on a stream being captured the product
  // becomes a node of the graph (alpha and beta read now, as from host pointers), run by each
  // replay; otherwise it runs now.
  auto product = [=] {
  for (int64_t i = 0; i < batch; ++i)
    for (int64_t col = 0; col < n; ++col)
      for (int64_t row = 0; row < m; ++row) {
        double sum = 0;
        for (int64_t l = 0; l < k; ++l) {
          // op(A)[row, l] and op(B)[l, col], column-major: element (r, c) of X at X[r + c * ldx].
          const int64_t ia = transa == CUBLAS_OP_N ? row + l * lda : l + row * lda;
          const int64_t ib = transb == CUBLAS_OP_N ? l + col * ldb : col + l * ldb;
          sum += load(A, Atype, i * strideA + ia) * load(B, Btype, i * strideB + ib);
        }
        const int64_t ic = i * strideC + row + col * ldc;
        const double prior = b == 0 ? 0.0 : b * load(C, Ctype, ic);  // beta == 0: C is not read
        store(C, Ctype, ic, a * sum + prior);
      }
  };
  if (!emu_launch_captured(handle->stream, dim3(1), dim3(1), 0, "cublasGemm", product)) product();
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace emu_cublas

inline cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new cublasContext();
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
inline const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
inline const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an unsupported value or parameter was passed to the function";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
  }
  return "unknown status";
}

inline cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                   int n, int k, const void* alpha, const void* A, cudaDataType_t Atype, int lda,
                                   const void* B, cudaDataType_t Btype, int ldb, const void* beta, void* C,
                                   cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType, cublasGemmAlgo_t) {
  return emu_cublas::gemm(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C, Ctype,
                          ldc, 0, 1, computeType);
}

inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                                 cublasOperation_t transb, int m, int n, int k, const void* alpha,
                                                 const void* A, cudaDataType_t Atype, int lda, long long strideA,
                                                 const void* B, cudaDataType_t Btype, int ldb, long long strideB,
                                                 const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                                                 long long strideC, int batchCount, cublasComputeType_t computeType,
                                                 cublasGemmAlgo_t) {
  return emu_cublas::gemm(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta,
                          C, Ctype, ldc, strideC, batchCount, computeType);
}
