#pragma once
// CUDA twins of kernels/cpu/matmul.h through cuBLAS (cublasGemmEx and
// cublasGemmStridedBatchedEx). Row-major C = op(A) op(B) is computed as the
// column-major product C^T = op(B)^T op(A)^T, so no operand is transposed in memory.
// f32 runs in full f32 (CUBLAS_COMPUTE_32F) unless set_allow_tf32(true); f64 in f64.
#include <cstdint>

#include "kernels/common/float16.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/stream.h"

namespace nd::kernels::cuda {

// Contracts as cpu::gemm / cpu::bmm (row-major, lda/ldb/ldc in elements, a batch
// stride of 0 broadcasts A or B). All pointers on the device whose stream is given.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc, cudaStream_t stream);

template <class T>
void bmm(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
         int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, T beta, T* C, int64_t ldc, int64_t stride_c,
         cudaStream_t stream);

// Mixed precision (engine/autocast.h): bf16 operands, f32 accumulation, f32 C, on bf16
// tensor cores. Contract as bmm<float>. Its CPU twin is cpu::bmm<float> on the operands
// widened back to f32 (bf16 x bf16 products are exact in f32), which engine/ops/matmul.cpp
// runs on the CPU.
void bmm_bf16(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
              const BFloat16* A, int64_t lda, int64_t stride_a, const BFloat16* B, int64_t ldb, int64_t stride_b,
              float beta, float* C, int64_t ldc, int64_t stride_c, cudaStream_t stream);

// The same with f16 operands (autocast to f16, engine/autocast.h): f16 tensor cores, f32
// accumulation and C. The CPU twin is cpu::bmm<float> on the f16 values widened to f32
// (f16 x f16 products are exact in f32 too: 11 + 11 significant bits).
void bmm_f16(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, float alpha,
             const Half* A, int64_t lda, int64_t stride_a, const Half* B, int64_t ldb, int64_t stride_b, float beta,
             float* C, int64_t ldc, int64_t stride_c, cudaStream_t stream);

// TF32 for f32 products: set_allow_tf32 / allow_tf32 in runtime.h.

}  // namespace nd::kernels::cuda
