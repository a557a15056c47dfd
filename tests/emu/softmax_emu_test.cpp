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

// Every shape class of the one-pass forward (the row's maximum and sum found together, online:
// kernels/common/online_softmax.h), against the CPU, and the same bits on a rerun: rows of a
// partial warp, a warp, several warps, a block of 256 threads and longer; rows holding -inf,
// a row of only -inf (NaN, as the CPU and PyTorch give), a maximum in the last element (the
// running maximum moves late) and in the first. The forward reads x twice (statistics, then
// the output) and writes y once: the cost model's sectors show it.
template <class T>
void check_forward_one_pass(int64_t M, int64_t D) {
  INFO("M = ", M, ", D = ", D, sizeof(T) == 4 ? " f32" : " f64");
  std::vector<T> x = cast<T>(uniform(M * D, 7, -30, 30));
  x[D - 1] = 90;  // row 0: its maximum last
  if (M > 1) x[D] = 90;  // row 1: first
  if (M > 2)
    for (int64_t d = 0; d < D; d += 3) x[2 * D + d] = -INFINITY;  // row 2: some -inf
  if (M > 3)
    for (int64_t d = 0; d < D; ++d) x[3 * D + d] = -INFINITY;  // row 3: fully masked
  for (bool log : {false, true}) {
    INFO(std::string(log ? "log_softmax" : "softmax"));
    std::vector<T> y1(M * D);
    if (log) cpu::log_softmax_forward<T>(x.data(), M, D, y1.data());
    else cpu::softmax_forward<T>(x.data(), M, D, y1.data());
    auto run = [&] {
      auto y = nans<T>(M * D);
      const auto launches = launches_of([&] {
        if (log) cuda::log_softmax_forward<T>(x.data(), M, D, y.data(), nullptr);
        else cuda::softmax_forward<T>(x.data(), M, D, y.data(), nullptr);
      });
      REQUIRE(launches.size() == 1);
      if (D % 32 == 0) {  // whole warps of consecutive elements: 4 sectors per 32 floats (5 if unaligned)
        const double sectors = double(M * D * sizeof(T)) / 32;
        CHECK(launches[0].write_sectors <= 1.3 * sectors);      // y written once (twice before)
        CHECK(launches[0].read_sectors <= 2.6 * sectors + 4 * M);  // x read twice (three passes before)
      }
      return y;
    };
    const auto y2 = run();
    check_rel("forward", y2, y1, rel_for<T>(D));
    CHECK_MESSAGE(same_bits(y2, run()), "not bit-reproducible");
  }
}

TEST_CASE("softmax and log_softmax forward in one pass: every shape class, -inf and masked rows, bit-reproducible") {
  check_forward_one_pass<float>(5, 7);
  check_forward_one_pass<float>(4, 32);
  check_forward_one_pass<float>(4, 96);
  check_forward_one_pass<float>(4, 256);
  check_forward_one_pass<float>(4, 1024);
  check_forward_one_pass<float>(4, 3000);
  check_forward_one_pass<double>(4, 300);
}

TEST_CASE("softmax and log_softmax f64") {
  check_softmax<double>(3, 7);
  check_softmax<double>(2, 1000);
}

}  // namespace
