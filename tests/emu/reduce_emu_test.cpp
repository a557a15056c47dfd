// kernels/cuda/reduce.cu in the emulator against kernels/cpu/reduce.cpp: row sums, variances
// (corrections 0 and 1), maxima with their first index (ties, NaN as the maximum) and the
// scatter of the max gradient, f32 and f64, rows of one element, a partial warp, several
// warps and 256 threads striding, and empty rows for the sum. Column sums (bias gradients)
// over [R, C] views: one launch (R <= 128) and two, a partial block of columns, rows
// further apart than C, one row repeated (ld = 0), and no rows. Repeated runs agree bit
// for bit.
//
// Tolerance: both accumulate in double, in different orders (2 gamma_R of the sum of |x|),
// then round to T once; 4 (R + 4) 2^-53 relative to sum|x| plus one rounding to T (2u) of
// the value covers it. Maxima and indices are exact.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "emu_test.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/reduce.h"

namespace {

using namespace nd::kernels;
using namespace nd::emu_test;

template <class T>
void check_reduce(int64_t M, int64_t R) {
  INFO("M = ", M, ", R = ", R, sizeof(T) == 4 ? " f32" : " f64");
  auto x = cast<T>(uniform(M * R, 1, -1, 3));
  if (R > 3) {
    x[2] = x[R - 1] = T(10);  // row 0: a tie, the first index wins
    x[R + 1] = static_cast<T>(NAN);  // row 1: NaN is the maximum
  }
  const double u = sizeof(T) == 4 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53);
  std::vector<double> abs_sum(M), sq_sum(M);
  for (int64_t i = 0; i < M * R; ++i)
    if (!std::isnan(double(x[i]))) {
      abs_sum[i / R] += std::abs(double(x[i]));
      sq_sum[i / R] += double(x[i]) * double(x[i]);
    }
  const double gamma = 4.0 * double(R + 4) * std::ldexp(1.0, -53);
  std::vector<T> s1(M);
  auto s2 = nans<T>(M);
  cpu::sum_rows<T>(M, R, x.data(), s1.data());
  cuda::sum_rows<T>(M, R, x.data(), s2.data(), nullptr);
  check_within("sum_rows", s2, s1, [&](size_t m) {
    return std::isnan(double(s1[m])) ? 0.0 : gamma * abs_sum[m] + 2 * u * std::abs(double(s1[m]));
  });
  if (R > 1) {
    for (int64_t correction : {0, 1}) {
      std::vector<T> v1(M);
      auto v2 = nans<T>(M);
      cpu::var_rows<T>(M, R, correction, x.data(), v1.data());
      cuda::var_rows<T>(M, R, correction, x.data(), v2.data(), nullptr);
      // Two passes: the mean's error enters squared-deviation sums bounded by sum x^2.
      check_within("var_rows", v2, v1, [&](size_t m) {
        return std::isnan(double(v1[m])) ? 0.0 : 4 * gamma * sq_sum[m] + 2 * u * std::abs(double(v1[m]));
      });
      for (int64_t m = 0; m < M; ++m)
        if (std::isnan(double(v1[m]))) CHECK(std::isnan(double(v2[m])));
    }
  }
  std::vector<T> mx1(M);
  auto mx2 = nans<T>(M);
  std::vector<int64_t> i1(M), i2(M, -7);
  cpu::max_rows<T>(M, R, x.data(), mx1.data(), i1.data());
  cuda::max_rows<T>(M, R, x.data(), mx2.data(), i2.data(), nullptr);
  for (int64_t m = 0; m < M; ++m) {
    CHECK(i2[m] == i1[m]);
    CHECK((mx2[m] == mx1[m] || (std::isnan(double(mx1[m])) && std::isnan(double(mx2[m])))));
  }
  const auto dy = cast<T>(uniform(M, 2));
  std::vector<T> dx1(M * R);
  auto dx2 = nans<T>(M * R);
  cpu::scatter_rows<T>(M, R, i1.data(), dy.data(), dx1.data());
  cuda::scatter_rows<T>(M, R, i1.data(), dy.data(), dx2.data(), nullptr);
  check_equal("scatter_rows", dx2, dx1);
}

TEST_CASE("row reductions f32: one element, a partial warp, several warps, 256 threads striding") {
  check_reduce<float>(3, 1);
  check_reduce<float>(4, 7);
  check_reduce<float>(3, 100);
  check_reduce<float>(2, 1500);
}

TEST_CASE("row reductions f64") {
  check_reduce<double>(4, 7);
  check_reduce<double>(2, 1500);
}

template <class T>
void check_columns(int64_t R, int64_t C, int64_t ld) {
  INFO("R = ", R, ", C = ", C, ", ld = ", ld, sizeof(T) == 4 ? " f32" : " f64");
  const int64_t extent = R == 0 ? 0 : (R - 1) * ld + C;
  const auto x = cast<T>(uniform(extent, 5, -1, 3));
  const double u = sizeof(T) == 4 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53);
  std::vector<double> abs_sum(C);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) abs_sum[c] += std::abs(double(x[r * ld + c]));
  const double gamma = 4.0 * double(R + 4) * std::ldexp(1.0, -53);
  std::vector<T> s1(C);
  auto s2 = nans<T>(C), s3 = nans<T>(C);
  cpu::sum_columns<T>(R, C, ld, x.data(), s1.data());
  cuda::sum_columns<T>(R, C, ld, x.data(), s2.data(), nullptr);
  check_within("sum_columns", s2, s1, [&](size_t c) { return gamma * abs_sum[c] + 2 * u * std::abs(double(s1[c])); });
  cuda::sum_columns<T>(R, C, ld, x.data(), s3.data(), nullptr);
  check_equal("sum_columns run twice", s3, s2);
}

TEST_CASE("column sums f32: one chunk and several (folded by the last block), a partial block of columns, strided and repeated rows") {
  for (int64_t R : {1, 5, 128, 129, 1000})
    for (int64_t C : {1, 33, 70}) {
      check_columns<float>(R, C, C);
      check_columns<float>(R, C, C + 3);
    }
  check_columns<float>(300, 40, 0);
  check_columns<float>(0, 33, 33);
}

TEST_CASE("column sums f64") {
  check_columns<double>(129, 33, 33);
  check_columns<double>(7, 70, 75);
}

TEST_CASE("an empty row sums to zero") {
  std::vector<float> out = nans<float>(3);
  cuda::sum_rows<float>(3, 0, nullptr, out.data(), nullptr);
  check_equal("sum of empty rows", out, std::vector<float>(3, 0.0f));
}

}  // namespace
