// kernels/cuda/index.cu in the emulator against kernels/cpu/index.cpp: index_select (exact:
// a gather) and index_add with repeated indices (atomic adds in any order: each element is
// its start value plus at most K terms, so the two differ by at most 2 gamma_{K+1} of the
// sum of their magnitudes), f32 and f64, inner sizes 1 and 7, a gather over the middle axis.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "emu_test.h"
#include "kernels/cpu/index.h"
#include "kernels/cuda/index.h"

namespace {

using namespace nd::kernels;
using namespace nd::emu_test;

template <class T>
void check_index(int64_t outer, int64_t D, int64_t inner) {
  INFO("outer ", outer, " D ", D, " inner ", inner, sizeof(T) == 4 ? " f32" : " f64");
  const std::vector<int64_t> index = {3, 0, 3, D - 1, 1, 3, 2};  // repeats: index_add adds them
  const int64_t K = static_cast<int64_t>(index.size());
  const auto x = cast<T>(uniform(outer * D * inner, 1)), dy = cast<T>(uniform(outer * K * inner, 2));
  std::vector<T> y1(outer * K * inner);
  auto y2 = nans<T>(y1.size());
  cpu::index_select<T>(outer, D, inner, x.data(), K, index.data(), y1.data());
  cuda::index_select<T>(outer, D, inner, x.data(), K, index.data(), y2.data(), nullptr);
  check_equal("index_select", y2, y1);

  auto dx1 = x, dx2 = x;  // index_add accumulates into its output
  cpu::index_add<T>(outer, D, inner, K, index.data(), dy.data(), dx1.data());
  cuda::index_add<T>(outer, D, inner, K, index.data(), dy.data(), dx2.data(), nullptr);
  std::vector<double> bound(x.size());
  for (size_t i = 0; i < x.size(); ++i) bound[i] = std::abs(double(x[i]));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t i = 0; i < inner; ++i)
        bound[(o * D + index[k]) * inner + i] += std::abs(double(dy[(o * K + k) * inner + i]));
  check_sum_bound("index_add", dx2, dx1, bound, K + 1);
}

TEST_CASE("index_select and index_add with repeated indices") {
  check_index<float>(3, 5, 7);
  check_index<float>(40, 6, 1);
  check_index<double>(3, 5, 7);
}

}  // namespace
