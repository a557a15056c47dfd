// GEMM through Eigen Maps over the caller's row-major buffers (no copies).
//
// Why Maps and not a hand-written kernel: Eigen's GEBP kernel is packed, blocked for the
// caches and vectorised for -march=native (AVX-512 here); bench_cpu_ops shows it within a
// few percent of a bare Eigen product, which is the ceiling for this code path.
// A transposed operand is the same buffer seen as column-major: a row-major [K, M] array
// with leading dimension ld is exactly a column-major [M, K] array with outer stride ld.
#include "kernels/cpu/matmul.h"

// GCC 12 reports -W(maybe-)uninitialized inside Eigen's AVX-512 packet code once it is
// inlined here (a known false positive: `__m256d __Y = __Y;` in avxintrin.h).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Core>
#include <omp.h>

#include "kernels/common/twin_types.h"

namespace nd::kernels::cpu {
namespace {

using Stride = Eigen::OuterStride<>;
template <class T, int Order>
using ConstMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, 0, Stride>;
template <class T>
using OutMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Stride>;

// op(X) as an Eigen expression: [rows, cols] logical shape, stored row-major unless
// transposed (then it is the column-major view of the stored [cols, rows] array).
template <class T, bool Trans>
auto op_map(const T* X, int64_t rows, int64_t cols, int64_t ld) {
  constexpr int order = Trans ? Eigen::ColMajor : Eigen::RowMajor;
  return ConstMap<T, order>(X, rows, cols, Stride(ld));
}

template <class T, bool TA, bool TB>
void gemm_impl(int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
               int64_t ldb, T beta, T* C, int64_t ldc) {
  OutMap<T> c(C, M, N, Stride(ldc));
  auto a = op_map<T, TA>(A, M, K, lda);
  auto b = op_map<T, TB>(B, K, N, ldb);
  if (beta == T(0)) {
    if (K == 0 || alpha == T(0)) {
      c.setZero();
    } else {
      c.noalias() = alpha * a * b;  // assignment never reads C (garbage/NaN ignored)
    }
    return;
  }
  if (beta != T(1)) c *= beta;
  if (K == 0 || alpha == T(0)) return;
  c.noalias() += alpha * a * b;
}

}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (!trans_a && !trans_b) return gemm_impl<T, false, false>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (!trans_a && trans_b) return gemm_impl<T, false, true>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (trans_a && !trans_b) return gemm_impl<T, true, false>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  return gemm_impl<T, true, true>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <class T>
void bmm(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, T alpha,
         const T* A, int64_t lda, int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b,
         T beta, T* C, int64_t ldc, int64_t stride_c) {
  auto one = [&](int64_t b) {
    gemm(trans_a, trans_b, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb, beta,
         C + b * stride_c, ldc);
  };
  // One matrix per thread wins unless each product is big enough for Eigen to split
  // well across threads and the batch is too short to balance (bench_cpu_ops "bmm").
  const int threads = omp_get_max_threads();
  const bool small = double(M) * double(N) * double(K) < 256.0 * 256.0 * 256.0;
  if (batch > 1 && threads > 1 && !omp_in_parallel() && (small || batch >= 4 * threads)) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < batch; ++b) one(b);
  } else {
    for (int64_t b = 0; b < batch; ++b) one(b);
  }
}

#define ND_INSTANTIATE(T) \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, int64_t, T, T*, \
      int64_t); \
  template void bmm<T>(bool, bool, int64_t, int64_t, int64_t, int64_t, T, const T*, int64_t, int64_t, const T*, \
      int64_t, int64_t, T, T*, int64_t, int64_t);
ND_FOR_EACH_TWIN_TYPE(ND_INSTANTIATE)
#undef ND_INSTANTIATE

}  // namespace nd::kernels::cpu
