// kernels/cuda/softmax.cu in the emulator against kernels/cpu/softmax.cpp: softmax and
// log-softmax, forward and backward, f32 and f64, on rows of one partial warp (D = 7), one
// full warp (D = 32), several warps (D = 100) and 256 threads striding (D = 1000), with
// large and -inf logits (a row maximum that matters, and exp(-inf) = 0).
//
// Tolerance: each output is a formula around a row maximum (exact) and a D-term sum (of
// exp, or of dy * y) that the two sides add in different orders: within 2 gamma_D of the
// sum of |terms|, bounded by D times the tensor's largest |value| here; 4 (D + 16) u of
// that largest value (u of T) covers the sums and the elementwise roundings.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "emu_test.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/softmax.h"

namespace {

using namespace nd::kernels;
using namespace nd::emu_test;

template <class T>
void check_softmax(int64_t M, int64_t D) {
  INFO("M = ", M, ", D = ", D, sizeof(T) == 4 ? " f32" : " f64");
  std::vector<T> x = cast<T>(uniform(M * D, 1, -4, 4));
  const std::vector<T> dy = cast<T>(uniform(M * D, 2));
  x[D - 1] += 100;  // a row whose maximum (its last element) must be subtracted: exp(100) overflows f32
  if (D > 1) x[D + 1] = -INFINITY;
  const double rel = rel_for<T>(D);
  for (bool log : {false, true}) {
    const std::string name = log ? "log_softmax " : "softmax ";
    std::vector<T> y1(M * D), dx1(M * D);
    auto y2 = nans<T>(M * D), dx2 = nans<T>(M * D);
    if (log) {
      cpu::log_softmax_forward<T>(x.data(), M, D, y1.data());
      cuda::log_softmax_forward<T>(x.data(), M, D, y2.data(), nullptr);
    } else {
      cpu::softmax_forward<T>(x.data(), M, D, y1.data());
      cuda::softmax_forward<T>(x.data(), M, D, y2.data(), nullptr);
    }
    check_rel(name + "forward", y2, y1, rel);
    if (log) {
      cpu::log_softmax_backward<T>(dy.data(), y1.data(), M, D, dx1.data());
      cuda::log_softmax_backward<T>(dy.data(), y1.data(), M, D, dx2.data(), nullptr);
    } else {
      cpu::softmax_backward<T>(dy.data(), y1.data(), M, D, dx1.data());
      cuda::softmax_backward<T>(dy.data(), y1.data(), M, D, dx2.data(), nullptr);
    }
    check_rel(name + "backward", dx2, dx1, rel);
  }
  // In place (y == x), as the engine may call it.
  auto inplace = x;
  std::vector<T> y1(M * D);
  cpu::softmax_forward<T>(x.data(), M, D, y1.data());
  cuda::softmax_forward<T>(inplace.data(), M, D, inplace.data(), nullptr);
  check_rel("softmax in place", inplace, y1, rel);
}

TEST_CASE("softmax and log_softmax f32: partial warp, one warp, several warps, 256 threads striding") {
  check_softmax<float>(4, 7);
  check_softmax<float>(3, 32);
  check_softmax<float>(3, 100);
  check_softmax<float>(2, 1000);
}

TEST_CASE("softmax and log_softmax f64") {
  check_softmax<double>(3, 7);
  check_softmax<double>(2, 1000);
}

}  // namespace
