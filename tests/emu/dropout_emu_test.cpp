// kernels/cuda/dropout.cu in the emulator against kernels/cpu/dropout.cpp: the same
// (seed, offset) must drop exactly the same elements on both devices (the mask is
// kernels/common/dropout_mask.h on both), so outputs are compared bit for bit: each kept
// element is one multiplication by the same scale. f32 and f64, p = 0, 0.3, 1, an offset,
// a length that is not a multiple of the block, forward and backward, in place.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "emu_test.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cuda/dropout.h"

namespace {

using namespace nd::kernels;
using namespace nd::emu_test;

template <class T>
void check_dropout(int64_t n, double p, uint64_t seed, uint64_t offset) {
  INFO("n = ", n, ", p = ", p, ", offset = ", offset, sizeof(T) == 4 ? " f32" : " f64");
  const auto x = cast<T>(uniform(n, 1, 0.5, 1.5));  // never 0: a zero output means dropped
  std::vector<T> y1(n);
  auto y2 = nans<T>(n);
  cpu::dropout_forward<T>(x.data(), n, p, seed, offset, y1.data());
  cuda::dropout_forward<T>(x.data(), n, p, seed, offset, y2.data(), nullptr);
  check_equal("forward", y2, y1);
  int64_t dropped = 0;
  for (const T v : y2) dropped += v == T(0);
  if (p == 0) CHECK(dropped == 0);
  if (p == 1) CHECK(dropped == n);
  if (p > 0 && p < 1) CHECK((dropped > 0 && dropped < n));
  auto dx2 = x;  // backward in place: dx == dy
  std::vector<T> dx1(n);
  cpu::dropout_backward<T>(x.data(), n, p, seed, offset, dx1.data());
  cuda::dropout_backward<T>(dx2.data(), n, p, seed, offset, dx2.data(), nullptr);
  check_equal("backward (in place)", dx2, dx1);
}

TEST_CASE("dropout masks are bit-equal with the CPU's") {
  check_dropout<float>(1000, 0.3, 42, 0);
  check_dropout<float>(777, 0.3, 7, 12345);
  check_dropout<double>(1000, 0.5, 42, 3);
  check_dropout<float>(300, 0.0, 1, 0);
  check_dropout<float>(300, 1.0, 1, 0);
}

}  // namespace
