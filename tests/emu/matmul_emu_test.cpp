// kernels/cuda/matmul.cu in the emulator against kernels/cpu/matmul.cpp: gemm, bmm and
// bmm_bf16 / bmm_f16 through the cuBLAS stand-in (include/cublas_v2.h), which checks the arguments
// as cuBLAS does (lda/ldb/ldc against the column-major shapes, types, compute type) and
// computes the column-major product it was asked for. So these tests check matmul.cu's
// row-major -> column-major mapping (operand swap, transposes, leading dimensions, batch
// strides, alpha/beta) and its K == 0 kernel; not cuBLAS itself.
//
// Tolerances: the stand-in accumulates in double and rounds once; the CPU (Eigen) sums K
// products in T, then alpha and beta C: each within gamma_{K+2} (|alpha| sum|a b| + |beta C|)
// of the exact value, so check_sum_bound with n = K + 2. bf16 operands: their products are
// exact in f32, the same bound with f32's u against cpu::bmm<float> on the widened
// operands. Elements of C outside the matrices (ldc > N, gaps between batch strides) must
// stay bit-equal (bound 0).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <cublas_v2.h>

#include "emu_test.h"
#include "engine/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/matmul.h"

// matmul.cu's other dependencies, from kernels/cuda/{stream,runtime}.cpp (not linked here):
// one emulated device whose compute stream is the null stream, and the TF32 switch.
namespace nd::kernels::cuda {
namespace {
bool tf32_allowed = false;
}
cudaStream_t compute_stream(int) { return nullptr; }
void set_allow_tf32(bool allow) { tf32_allowed = allow; }
bool allow_tf32() { return tf32_allowed; }
}  // namespace nd::kernels::cuda

namespace {

using namespace nd::kernels;
using namespace nd::emu_test;

struct Case {
  bool ta, tb;
  int64_t batch, M, N, K;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0;  // ld = stored width + pad
  bool bcast_a = false, bcast_b = false;    // batch stride 0
  double alpha = 1, beta = 0;
};

std::string describe(const Case& c) {
  return "ta " + std::to_string(c.ta) + " tb " + std::to_string(c.tb) + " batch " + std::to_string(c.batch) + " M " +
         std::to_string(c.M) + " N " + std::to_string(c.N) + " K " + std::to_string(c.K) + " pads " +
         std::to_string(c.pad_a) + "/" + std::to_string(c.pad_b) + "/" + std::to_string(c.pad_c) + " bcast " +
         std::to_string(c.bcast_a) + "/" + std::to_string(c.bcast_b) + " alpha " + std::to_string(c.alpha) +
         " beta " + std::to_string(c.beta);
}

// Layout of one operand: stored rows x cols (row-major) with ld = cols + pad; batch stride
// 0 (broadcast) or rows * ld + 3 (a gap between matrices).
struct Layout {
  int64_t rows, cols, ld, stride, size;
};
Layout layout(int64_t rows, int64_t cols, int64_t pad, int64_t batch, bool bcast) {
  Layout l{rows, cols, cols + pad, 0, 0};
  l.stride = bcast ? 0 : rows * l.ld + 3;
  l.size = (bcast ? 0 : batch - 1) * l.stride + rows * l.ld;
  return l;
}

// Element (r, c) of op(X) for batch b.
template <class T>
double op_at(const std::vector<T>& x, const Layout& l, bool trans, int64_t b, int64_t r, int64_t c) {
  return static_cast<double>(x[b * l.stride + (trans ? c * l.ld + r : r * l.ld + c)]);
}

// In: the operands' element type (T, or BFloat16 for bmm_bf16, Half for bmm_f16); T: C's.
template <class T, class In>
void check_case(const Case& c, bool use_gemm, unsigned seed) {
  constexpr bool f16 = std::is_same_v<In, nd::Half>;
  INFO(describe(c), use_gemm ? " gemm" : f16 ? " bmm_f16" : !std::is_same_v<In, T> ? " bmm_bf16" : " bmm",
       sizeof(T) == 4 ? " f32" : " f64");
  const Layout la = layout(c.ta ? c.K : c.M, c.ta ? c.M : c.K, c.pad_a, c.batch, c.bcast_a);
  const Layout lb = layout(c.tb ? c.N : c.K, c.tb ? c.K : c.N, c.pad_b, c.batch, c.bcast_b);
  const Layout lc = layout(c.M, c.N, c.pad_c, c.batch, false);
  std::vector<T> A, B;
  std::vector<In> A_in, B_in;
  if constexpr (std::is_same_v<In, T>) {
    A = cast<T>(uniform(la.size, seed));
    B = cast<T>(uniform(lb.size, seed + 1));
    A_in = A;
    B_in = B;
  } else if constexpr (f16) {
    const auto a = rounded_f16(uniform(la.size, seed)), b = rounded_f16(uniform(lb.size, seed + 1));
    A = a;
    B = b;
    A_in = to_f16(a);
    B_in = to_f16(b);
  } else {
    const auto a = rounded_bf16(uniform(la.size, seed)), b = rounded_bf16(uniform(lb.size, seed + 1));
    A = a;
    B = b;
    A_in = to_bf16(a);
    B_in = to_bf16(b);
  }
  const T alpha = static_cast<T>(c.alpha), beta = static_cast<T>(c.beta);
  // beta == 0: C starts as NaN (must not be read); else values; the gaps keep theirs either way.
  const std::vector<T> C0 = c.beta == 0 ? nans<T>(lc.size) : cast<T>(uniform(lc.size, seed + 2));
  auto C_cpu = C0, C_emu = C0;
  if (use_gemm) {
    cpu::gemm<T>(c.ta, c.tb, c.M, c.N, c.K, alpha, A.data(), la.ld, B.data(), lb.ld, beta, C_cpu.data(), lc.ld);
    cuda::gemm<T>(c.ta, c.tb, c.M, c.N, c.K, alpha, A.data(), la.ld, B.data(), lb.ld, beta, C_emu.data(), lc.ld,
                  nullptr);
  } else {
    cpu::bmm<T>(c.ta, c.tb, c.batch, c.M, c.N, c.K, alpha, A.data(), la.ld, la.stride, B.data(), lb.ld, lb.stride,
                beta, C_cpu.data(), lc.ld, lc.stride);
    if constexpr (std::is_same_v<In, T>)
      cuda::bmm<T>(c.ta, c.tb, c.batch, c.M, c.N, c.K, alpha, A_in.data(), la.ld, la.stride, B_in.data(), lb.ld,
                   lb.stride, beta, C_emu.data(), lc.ld, lc.stride, nullptr);
    else if constexpr (f16)
      cuda::bmm_f16(c.ta, c.tb, c.batch, c.M, c.N, c.K, alpha, A_in.data(), la.ld, la.stride, B_in.data(), lb.ld,
                    lb.stride, beta, C_emu.data(), lc.ld, lc.stride, nullptr);
    else
      cuda::bmm_bf16(c.ta, c.tb, c.batch, c.M, c.N, c.K, alpha, A_in.data(), la.ld, la.stride, B_in.data(), lb.ld,
                     lb.stride, beta, C_emu.data(), lc.ld, lc.stride, nullptr);
  }
  std::vector<double> bound(lc.size, 0.0);  // 0 outside the matrices: untouched, bit-equal
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < c.K; ++k) s += std::abs(op_at(A, la, c.ta, b, i, k) * op_at(B, lb, c.tb, b, k, j));
        const int64_t at = b * lc.stride + i * lc.ld + j;
        bound[at] = std::abs(c.alpha) * s + (c.beta == 0 ? 0.0 : std::abs(c.beta * double(C0[at])));
      }
  check_sum_bound("C", C_emu, C_cpu, bound, c.K + 2);
}

// half: 0 for T x T, 1 for bmm_bf16, 2 for bmm_f16.
template <class T>
void check_all_shapes(int half) {
  unsigned seed = 10;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::vector<Case> cases = {
          {ta, tb, 1, 1, 1, 1},                               // everything 1
          {ta, tb, 1, 7, 5, 9},                               // odd sizes, dense
          {ta, tb, 1, 1, 13, 6, 2, 0, 3, false, false, 0.5},  // a row vector, ld > width
          {ta, tb, 1, 11, 1, 4, 0, 5, 1, false, false, -1.5, 0.25},  // a column, beta != 0
          {ta, tb, 3, 5, 6, 7, 1, 2, 3, false, false, 2.0, -1.0},    // batched, strided gaps
          {ta, tb, 4, 3, 9, 5, 0, 1, 0, true, false},                // A broadcast
          {ta, tb, 4, 6, 2, 3, 2, 0, 1, false, true, 1.0, 1.0},      // B broadcast
          {ta, tb, 2, 4, 4, 1, 3, 3, 3, true, true, 0.75, 0.5},      // both broadcast, K = 1
      };
      for (const Case& c : cases) {
        if (half == 1) {
          check_case<float, nd::BFloat16>(c, false, seed++);
          continue;
        }
        if (half == 2) {
          check_case<float, nd::Half>(c, false, seed++);
          continue;
        }
        if (c.batch == 1 && !c.bcast_a && !c.bcast_b) check_case<T, T>(c, true, seed++);
        check_case<T, T>(c, false, seed++);
      }
    }
}

TEST_CASE("gemm and bmm f32: every transpose pair, ld > width, batch strides and broadcast, alpha/beta") {
  cuda::set_allow_tf32(false);
  check_all_shapes<float>(0);
  CHECK(emu_cublas::last_compute == CUBLAS_COMPUTE_32F);
  CHECK(emu_cublas::last_ab_type == CUDA_R_32F);
}

TEST_CASE("gemm and bmm f64") {
  check_all_shapes<double>(0);
  CHECK(emu_cublas::last_compute == CUBLAS_COMPUTE_64F);
  CHECK(emu_cublas::last_ab_type == CUDA_R_64F);
  CHECK(emu_cublas::last_c_type == CUDA_R_64F);
}

TEST_CASE("bmm_bf16 against cpu::bmm<float> on the widened bf16 operands") {
  check_all_shapes<float>(1);
  CHECK(emu_cublas::last_compute == CUBLAS_COMPUTE_32F);  // bf16 tensor cores, f32 accumulation
  CHECK(emu_cublas::last_ab_type == CUDA_R_16BF);
  CHECK(emu_cublas::last_c_type == CUDA_R_32F);
}

TEST_CASE("bmm_f16 against cpu::bmm<float> on the widened f16 operands") {
  check_all_shapes<float>(2);
  CHECK(emu_cublas::last_compute == CUBLAS_COMPUTE_32F);  // f16 tensor cores, f32 accumulation
  CHECK(emu_cublas::last_ab_type == CUDA_R_16F);
  CHECK(emu_cublas::last_c_type == CUDA_R_32F);
}

TEST_CASE("allow_tf32 selects CUBLAS_COMPUTE_32F_FAST_TF32 for f32 only") {
  cuda::set_allow_tf32(true);
  check_case<float, float>({false, true, 2, 3, 4, 5}, false, 1);
  CHECK(emu_cublas::last_compute == CUBLAS_COMPUTE_32F_FAST_TF32);
  check_case<float, nd::BFloat16>({false, true, 2, 3, 4, 5}, false, 2);
  CHECK(emu_cublas::last_compute == CUBLAS_COMPUTE_32F);
  check_case<double, double>({false, true, 2, 3, 4, 5}, false, 3);
  CHECK(emu_cublas::last_compute == CUBLAS_COMPUTE_64F);
  cuda::set_allow_tf32(false);
}

TEST_CASE("K == 0: C = beta C without cuBLAS, beta == 0 overwrites NaN (and empty M, N, batch do nothing)") {
  const int64_t calls = emu_cublas::calls;
  check_case<float, float>({false, false, 1, 3, 4, 0, 0, 0, 2, false, false, 1.0, 0.0}, true, 1);
  check_case<float, float>({true, false, 3, 3, 4, 0, 0, 0, 2, false, false, 1.0, -2.0}, false, 2);
  check_case<double, double>({false, true, 2, 5, 1, 0, 0, 0, 0, false, false, 1.0, 0.5}, false, 3);
  CHECK(emu_cublas::calls == calls);  // the scale kernel, not cuBLAS
  std::vector<float> C = nans<float>(4), A(4, 1.0f);
  cuda::gemm<float>(false, false, 0, 2, 2, 1.0f, A.data(), 2, A.data(), 2, 0.0f, C.data(), 2, nullptr);
  cuda::bmm<float>(false, false, 0, 2, 2, 2, 1.0f, A.data(), 2, 4, A.data(), 2, 4, 0.0f, C.data(), 2, 4, nullptr);
  cuda::gemm<float>(false, false, 2, 0, 2, 1.0f, A.data(), 2, A.data(), 2, 0.0f, C.data(), 2, nullptr);
  for (float x : C) CHECK(std::isnan(x));  // nothing written
  CHECK(emu_cublas::calls == calls);
}

TEST_CASE("errors: a leading dimension too small, a foreign stream, sizes beyond int") {
  std::vector<float> A(64, 1.0f), B(64, 1.0f), C(64, 0.0f);
  // Row-major A [3, 5] needs lda >= 5: cuBLAS sees it as the column-major [5, 3] operand.
  CHECK_THROWS_WITH_AS(
      cuda::gemm<float>(false, false, 3, 4, 5, 1.0f, A.data(), 4, B.data(), 4, 0.0f, C.data(), 4, nullptr),
      doctest::Contains("cublasGemmEx failed: CUBLAS_STATUS_INVALID_VALUE"), nd::Error);
  // Row-major C [3, 4] needs ldc >= 4.
  CHECK_THROWS_WITH_AS(cuda::bmm<float>(false, false, 2, 3, 4, 2, 1.0f, A.data(), 2, 6, B.data(), 4, 8, 0.0f,
                                        C.data(), 3, 12, nullptr),
                       doctest::Contains("cublasGemmStridedBatchedEx failed: CUBLAS_STATUS_INVALID_VALUE"), nd::Error);
  // Transposed B stored [N, K] = [4, 2] needs ldb >= 2 only: valid.
  CHECK_NOTHROW(cuda::gemm<float>(false, true, 3, 4, 2, 1.0f, A.data(), 2, B.data(), 2, 0.0f, C.data(), 4, nullptr));
  auto* other = reinterpret_cast<cudaStream_t>(uintptr_t(0x10));
  CHECK_THROWS_WITH_AS(
      cuda::gemm<float>(false, false, 2, 2, 2, 1.0f, A.data(), 2, B.data(), 2, 0.0f, C.data(), 2, other),
      doctest::Contains("compute stream"), nd::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm<float>(false, false, int64_t(1) << 31, 1, 1, 1.0f, A.data(), 1, B.data(), 1, 0.0f,
                                         C.data(), 1, nullptr),
                       doctest::Contains("fit in int"), nd::Error);
}

}  // namespace
