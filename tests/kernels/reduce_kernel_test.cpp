// kernels/cpu sum_columns (column sums of an [R, C] array read in place) against a naive
// per-column loop in double over rows 0..R-1, which is the order the kernel promises, so
// the results must agree bit for bit: with 1, 2, 3 and 7 threads, for empty, single,
// odd, chunk-straddling and large sizes, with rows padded (ld > C) and repeated (ld = 0).
#include <doctest/doctest.h>

#include "omp_threads.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/reduce.h"

namespace {

using nd::kernels::cpu::sum_columns;

template <class T>
std::vector<T> naive_column_sums(int64_t R, int64_t C, int64_t ld, const std::vector<T>& x) {
  std::vector<T> out(C);
  for (int64_t c = 0; c < C; ++c) {
    double acc = 0;
    for (int64_t r = 0; r < R; ++r) acc += x[r * ld + c];
    out[c] = static_cast<T>(acc);
  }
  return out;
}

template <class T>
void check_sizes(int64_t R, int64_t C, int64_t ld) {
  CAPTURE(R);
  CAPTURE(C);
  CAPTURE(ld);
  std::mt19937 gen(static_cast<unsigned>(R * 131 + C * 7 + ld));
  std::uniform_real_distribution<double> u(-1, 1);
  // Room for R rows ld apart, each C wide (ld = 0: one row read R times).
  const int64_t n = R == 0 || C == 0 ? 0 : (R - 1) * ld + C;
  std::vector<T> x(n);
  for (auto& v : x) v = static_cast<T>(u(gen));
  const std::vector<T> expected = naive_column_sums(R, C, ld, x);
  nd::testing::OmpThreads scoped(1);
  for (int threads : {1, 2, 3, 7}) {
    CAPTURE(threads);
    scoped.set(threads);
    std::vector<T> out(C, T(-99));  // every entry must be written, including R = 0 zeros
    sum_columns<T>(R, C, ld, x.data(), out.data());
    CHECK(out == expected);
  }
}

}  // namespace

TEST_CASE("sum_columns: known values") {
  // [[1, 2, 3], [4, 5, 6]] -> [5, 7, 9]; with ld = 4 the padding column (100) is skipped.
  const std::vector<float> x = {1, 2, 3, 100, 4, 5, 6, 100};
  std::vector<float> out(3);
  sum_columns<float>(2, 3, 4, x.data(), out.data());
  CHECK(out == std::vector<float>{5, 7, 9});
  sum_columns<float>(3, 3, 0, x.data(), out.data());  // ld = 0: row 0 three times
  CHECK(out == std::vector<float>{3, 6, 9});
}

TEST_CASE("sum_columns: exact against the row-ordered reference, any thread count (f32, f64)") {
  // (R, C): empty either way, single row / column, odd, chunk edges (16), and sizes over the
  // threading threshold (R * C > 65536) with C splitting unevenly over the threads.
  const std::vector<std::pair<int64_t, int64_t>> sizes = {
      {0, 5}, {5, 0}, {0, 0}, {1, 1}, {1, 7}, {7, 1}, {13, 16}, {9, 17}, {31, 33},
      {6400, 16}, {1664, 64}, {300, 300}, {257, 1000}, {70000, 3}, {2, 40001}};
  for (const auto& [R, C] : sizes) {
    check_sizes<float>(R, C, C);
    check_sizes<double>(R, C, C);
    check_sizes<float>(R, C, C + 5);  // rows of a wider array (a slice of the kept dims' parent)
  }
  check_sizes<float>(200, 400, 0);
  check_sizes<double>(3, 5, 0);
}

TEST_CASE("sum_columns: accumulates in double") {
  // 2^24 + 1 + 1 + ... in f32 would stay at 2^24; in double the ones add up.
  const int64_t R = 1001;
  std::vector<float> x(R * 2, 1.0f);
  x[0] = 16777216.0f;
  std::vector<float> out(2);
  sum_columns<float>(R, 2, 2, x.data(), out.data());
  CHECK(out[0] == 16777216.0f + 1000.0f);
  CHECK(out[1] == 1001.0f);
}
