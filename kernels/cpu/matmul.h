#pragma once
// GEMM on the CPU: the one matrix-multiply entry point every CPU op (linear, conv via
// im2col, attention) goes through. Row-major, BLAS-like argument list so the CUDA twin
// (cuBLAS) has the same signature. Eigen does the work and uses OpenMP threads; called
// from inside an OpenMP parallel region it runs single-threaded (no oversubscription).
// Test: tests/kernels/matmul_kernel_test.cpp. Benchmark: bench/bench_cpu_ops.cpp.
#include <cstdint>

namespace nd::kernels::cpu {

// C = alpha * op(A) * op(B) + beta * C, all row-major; op(X) = X or X^T.
//   op(A) is [M, K]: A is stored [M, K] (lda >= K), or [K, M] when trans_a (lda >= M).
//   op(B) is [K, N]: B is stored [K, N] (ldb >= N), or [N, K] when trans_b (ldb >= K).
//   C is [M, N] with ldc >= N.
// requires: C does not overlap A or B.
// ensures:  C is written; when beta == 0, C is not read (NaN/garbage in C is ignored).
//           K == 0 gives C = beta * C.
// in-place: no.
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// Batched GEMM: for b in [0, batch):
//   C_b = alpha * op(A_b) * op(B_b) + beta * C_b,  X_b = X + b * stride_x.
// A stride of 0 broadcasts that operand over the batch (A and B only).
// requires: as gemm, per matrix; the C_b do not overlap each other (stride_c >= M*ldc
//           for a dense layout) nor any A_b / B_b.
// ensures:  every C_b written as in gemm.
// in-place: no.
// Threads: small matrices run one matrix per thread; large ones use Eigen's threads
// inside each product (measured in bench_cpu_ops, row "bmm").
template <class T>
void bmm(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, T alpha,
         const T* A, int64_t lda, int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b,
         T beta, T* C, int64_t ldc, int64_t stride_c);

}  // namespace nd::kernels::cpu
