// kernels/cpu/matmul: gemm and bmm against a triple loop written here, on random data
// with odd sizes, every transpose combination, padded leading dimensions, alpha/beta.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace cpu = nd::kernels::cpu;

namespace {

template <class T>
std::vector<T> random_vec(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) x = T(u(gen));
  return v;
}

// C = alpha * op(A) op(B) + beta * C, the definition, in double.
template <class T>
void gemm_naive(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = ta ? A[k * lda + i] : A[i * lda + k];
        const double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        acc += a * b;
      }
      const double c0 = beta == T(0) ? 0.0 : double(beta) * C[i * ldc + j];
      C[i * ldc + j] = T(double(alpha) * acc + c0);
    }
}

template <class T>
void check_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, T beta, int64_t pad,
                double tol) {
  const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
  auto A = random_vec<T>(size_t((ta ? K : M) * lda), 1);
  auto B = random_vec<T>(size_t((tb ? N : K) * ldb), 2);
  auto C = random_vec<T>(size_t(M * ldc), 3);
  auto expect = C;
  if (beta == T(0))  // beta == 0 must ignore whatever C holds, NaN included
    for (int64_t i = 0; i < M; ++i) C[i * ldc] = std::numeric_limits<T>::quiet_NaN();
  gemm_naive(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, expect.data(), ldc);
  cpu::gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  double err = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) err = std::max(err, std::abs(double(C[i * ldc + j]) - expect[i * ldc + j]));
  // padding columns of C are untouched
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = N; j < ldc; ++j) CHECK(C[i * ldc + j] == expect[i * ldc + j]);
  CHECK_MESSAGE(err <= tol * std::sqrt(double(K) + 1), "ta=" << ta << " tb=" << tb << " M=" << M
                << " N=" << N << " K=" << K << " err=" << err);
}

}  // namespace

TEST_CASE("gemm known value: [[1,2],[3,4]] * [[5,6],[7,8]] = [[19,22],[43,50]]") {
  const double A[] = {1, 2, 3, 4}, B[] = {5, 6, 7, 8};
  double C[4];
  cpu::gemm(false, false, 2, 2, 2, 1.0, A, 2, B, 2, 0.0, C, 2);
  CHECK(C[0] == 19);
  CHECK(C[1] == 22);
  CHECK(C[2] == 43);
  CHECK(C[3] == 50);
  // A^T * B = [[1,3],[2,4]] * [[5,6],[7,8]] = [[26,30],[38,44]]; then 2*that + 1*C
  cpu::gemm(true, false, 2, 2, 2, 2.0, A, 2, B, 2, 1.0, C, 2);
  CHECK(C[0] == 19 + 52);
  CHECK(C[1] == 22 + 60);
  CHECK(C[2] == 43 + 76);
  CHECK(C[3] == 50 + 88);
}

TEST_CASE("gemm matches the triple loop (f64, every transpose, odd sizes)") {
  const int64_t sizes[][3] = {{1, 1, 1}, {7, 5, 3}, {13, 1, 29}, {1, 17, 9}, {33, 65, 47}, {130, 67, 259}};
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto& s : sizes) {
        check_gemm<double>(ta, tb, s[0], s[1], s[2], 1.0, 0.0, 0, 1e-13);
        check_gemm<double>(ta, tb, s[0], s[1], s[2], -0.5, 1.5, 3, 1e-13);
      }
}

TEST_CASE("gemm matches the triple loop (f32, large enough for Eigen's threads)") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_gemm<float>(ta, tb, 257, 191, 311, 1.0f, 0.0f, 1, 2e-6);
      check_gemm<float>(ta, tb, 5, 300, 7, 2.0f, 1.0f, 0, 2e-6);
    }
}

TEST_CASE("gemm with K == 0 scales C by beta") {
  std::vector<double> C = {1, 2, 3, 4};
  cpu::gemm<double>(false, false, 2, 2, 0, 1.0, nullptr, 1, nullptr, 2, 3.0, C.data(), 2);
  CHECK(C == std::vector<double>{3, 6, 9, 12});
  cpu::gemm<double>(false, false, 2, 2, 0, 1.0, nullptr, 1, nullptr, 2, 0.0, C.data(), 2);
  CHECK(C == std::vector<double>{0, 0, 0, 0});
}

TEST_CASE("bmm matches per-matrix triple loops, including a broadcast operand") {
  for (int64_t batch : {1, 3, 9}) {
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool broadcast_b : {false, true}) {
          const int64_t M = 11, N = 6, K = 13;
          const int64_t lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
          const int64_t sa = M * K, sb = broadcast_b ? 0 : K * N, sc = M * N + 2;
          auto A = random_vec<double>(size_t(batch * sa), 4);
          auto B = random_vec<double>(size_t(broadcast_b ? K * N : batch * sb), 5);
          auto C = random_vec<double>(size_t(batch * sc), 6);
          auto expect = C;
          for (int64_t b = 0; b < batch; ++b)
            gemm_naive(ta, tb, M, N, K, 0.75, A.data() + b * sa, lda, B.data() + b * sb, ldb, 0.5,
                       expect.data() + b * sc, ldc);
          cpu::bmm(ta, tb, batch, M, N, K, 0.75, A.data(), lda, sa, B.data(), ldb, sb, 0.5,
                   C.data(), ldc, sc);
          for (size_t i = 0; i < C.size(); ++i) REQUIRE(C[i] == doctest::Approx(expect[i]).epsilon(1e-12));
        }
  }
}

TEST_CASE("bmm float, many small matrices (one per thread)") {
  const int64_t batch = 37, M = 9, N = 16, K = 16;
  auto A = random_vec<float>(size_t(batch * M * K), 7);
  auto B = random_vec<float>(size_t(batch * N * K), 8);
  std::vector<float> C(size_t(batch * M * N)), expect(C.size());
  for (int64_t b = 0; b < batch; ++b)
    gemm_naive(false, true, M, N, K, 1.0f, A.data() + b * M * K, K, B.data() + b * N * K, K, 0.0f,
               expect.data() + b * M * N, N);
  cpu::bmm(false, true, batch, M, N, K, 1.0f, A.data(), K, M * K, B.data(), K, N * K, 0.0f,
           C.data(), N, M * N);
  for (size_t i = 0; i < C.size(); ++i) REQUIRE(C[i] == doctest::Approx(expect[i]).epsilon(1e-5));
}
