// kernels/cuda/elementwise.cu in the emulator against kernels/cpu/elementwise.cpp: every
// unary op (forward on a transposed strided input, backward), every binary op with a
// broadcast (zero-stride) operand and alpha, in place, with a number operand on either side,
// and every comparison on f32, f64
// and the integer types. The emulated kernel evaluates the same per-element functions
// (kernels/common/elementwise_math.h) as the CPU, so what is checked is the indexing:
// values agree to 8 ulps of the largest value (the two compilations may contract a
// multiply-add differently: check_ulps);
// comparisons exactly.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "emu_test.h"
#include "engine/error.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/elementwise.h"

namespace {

using namespace nd::kernels;
using namespace nd::emu_test;

// A [3, 4, 5] index space read through a [5, 4, 3] buffer (strides 1, 3, 12: a transpose).
const int64_t kShape[3] = {3, 4, 5};
const int64_t kTransposed[3] = {1, 3, 12};
const int64_t kContiguous[3] = {20, 5, 1};
const int64_t kBroadcast[3] = {0, 1, 0};  // b: [1, 4, 1]

template <class T>
void check_unary() {
  const auto x = cast<T>(uniform(60, 1, 0.1, 2.0)), xs = cast<T>(uniform(60, 2, -2.0, 2.0)),
             dy = cast<T>(uniform(60, 3));
  for (int op = 0; op <= static_cast<int>(cpu::UnaryOp::sign); ++op) {
    const auto uop = static_cast<cpu::UnaryOp>(op);
    INFO("unary op ", op, sizeof(T) == 4 ? " f32" : " f64");
    const cpu::UnaryParams p{uop == cpu::UnaryOp::clamp ? -0.5 : 0.1, 0.7};
    // log, sqrt, rsqrt want positive inputs; the rest get both signs.
    const bool positive = uop == cpu::UnaryOp::log || uop == cpu::UnaryOp::sqrt || uop == cpu::UnaryOp::rsqrt;
    const auto& in = positive ? x : xs;
    std::vector<T> y1(60);
    auto y2 = nans<T>(60);
    cpu::unary<T>(uop, p, 3, kShape, in.data(), kTransposed, y1.data(), kContiguous);
    cuda::unary<T>(uop, p, 3, kShape, in.data(), kTransposed, y2.data(), kContiguous, nullptr);
    check_ulps("unary forward", y2, y1);
    std::vector<T> dx1(60), fwd(60);
    auto dx2 = nans<T>(60);
    cpu::unary<T>(uop, p, 3, kShape, in.data(), kContiguous, fwd.data(), kContiguous);
    cpu::unary_backward<T>(uop, p, 60, in.data(), fwd.data(), dy.data(), dx1.data());
    cuda::unary_backward<T>(uop, p, 60, in.data(), fwd.data(), dy.data(), dx2.data(), nullptr);
    check_ulps("unary backward", dx2, dx1);
  }
}

template <class T>
void check_binary() {
  const auto a = cast<T>(uniform(60, 4, 0.5, 2.0)), b = cast<T>(uniform(4, 5, 0.5, 2.0));
  for (int op = 0; op <= static_cast<int>(cpu::BinaryOp::minimum); ++op) {
    INFO("binary op ", op, sizeof(T) == 4 ? " f32" : " f64");
    const auto bop = static_cast<cpu::BinaryOp>(op);
    std::vector<T> y1(60);
    auto y2 = nans<T>(60);
    cpu::binary<T>(bop, T(0.5), 3, kShape, a.data(), kTransposed, b.data(), kBroadcast, y1.data(), kContiguous);
    cuda::binary<T>(bop, T(0.5), 3, kShape, a.data(), kTransposed, b.data(), kBroadcast, y2.data(), kContiguous,
                    nullptr);
    check_ulps("binary, transposed a, broadcast b", y2, y1);
    auto inplace = a;  // out == a with equal strides
    cuda::binary<T>(bop, T(0.5), 3, kShape, inplace.data(), kContiguous, b.data(), kBroadcast, inplace.data(),
                    kContiguous, nullptr);
    cpu::binary<T>(bop, T(0.5), 3, kShape, a.data(), kContiguous, b.data(), kBroadcast, y1.data(), kContiguous);
    check_ulps("binary in place", inplace, y1);
  }
}

template <class T>
void check_binary_scalar() {
  const auto a = cast<T>(uniform(60, 6, 0.5, 2.0));
  const T s = T(0.7);
  for (int op = 0; op <= static_cast<int>(cpu::BinaryOp::minimum); ++op)
    for (bool scalar_first : {false, true}) {
      INFO("binary op ", op, " with a number ", scalar_first ? "first" : "second", sizeof(T) == 4 ? " f32" : " f64");
      const auto bop = static_cast<cpu::BinaryOp>(op);
      std::vector<T> y1(60);
      auto y2 = nans<T>(60);
      cpu::binary_scalar<T>(bop, 3, kShape, a.data(), kTransposed, s, scalar_first, y1.data(), kContiguous);
      cuda::binary_scalar<T>(bop, 3, kShape, a.data(), kTransposed, s, scalar_first, y2.data(), kContiguous,
                             nullptr);
      check_ulps("binary_scalar, transposed a", y2, y1);
      // The CPU twin is binary() with the number broadcast.
      const int64_t zero[3] = {0, 0, 0};
      std::vector<T> y3(60);
      if (scalar_first)
        cpu::binary<T>(bop, T(1), 3, kShape, &s, zero, a.data(), kTransposed, y3.data(), kContiguous);
      else
        cpu::binary<T>(bop, T(1), 3, kShape, a.data(), kTransposed, &s, zero, y3.data(), kContiguous);
      CHECK(y3 == y1);
      auto inplace = a;
      cuda::binary_scalar<T>(bop, 3, kShape, inplace.data(), kContiguous, s, scalar_first, inplace.data(),
                             kContiguous, nullptr);
      cpu::binary_scalar<T>(bop, 3, kShape, a.data(), kContiguous, s, scalar_first, y1.data(), kContiguous);
      check_ulps("binary_scalar in place", inplace, y1);
    }
}

template <class T>
void check_compare() {
  std::vector<T> a(60), b(4);
  for (int i = 0; i < 60; ++i) a[i] = static_cast<T>(i % 3);
  for (int i = 0; i < 4; ++i) b[i] = static_cast<T>(i % 2);
  for (int op = 0; op <= static_cast<int>(cpu::CompareOp::ge); ++op) {
    INFO("compare op ", op, " on a ", sizeof(T), "-byte type");
    const auto cop = static_cast<cpu::CompareOp>(op);
    bool y1[60], y2[60];
    std::memset(y2, 0x7f, sizeof(y2));  // neither true (1) nor false (0)
    cpu::compare<T>(cop, 3, kShape, a.data(), kTransposed, b.data(), kBroadcast, y1);
    cuda::compare<T>(cop, 3, kShape, a.data(), kTransposed, b.data(), kBroadcast, y2, nullptr);
    CHECK(std::memcmp(y1, y2, sizeof(y1)) == 0);
  }
}

TEST_CASE("elementwise unary ops, strided forward and backward") {
  check_unary<float>();
  check_unary<double>();
}

TEST_CASE("elementwise binary ops with broadcasting, alpha and in place") {
  check_binary<float>();
  check_binary<double>();
}

TEST_CASE("elementwise binary ops with a number operand, either side, strided and in place") {
  check_binary_scalar<float>();
  check_binary_scalar<double>();
}

TEST_CASE("elementwise comparisons on every compiled type") {
  check_compare<float>();
  check_compare<double>();
  check_compare<int64_t>();
  check_compare<int32_t>();
  check_compare<uint8_t>();
}

TEST_CASE("elementwise over more than 10 dimensions is an nd::Error") {
  const std::vector<int64_t> shape(11, 1), strides(11, 1);
  float x = 1, y = 0;
  CHECK_THROWS_WITH_AS(cuda::unary<float>(cpu::UnaryOp::neg, {}, 11, shape.data(), &x, strides.data(), &y,
                                          strides.data(), nullptr),
                       doctest::Contains("at most 10 dimensions are supported, found 11"), nd::Error);
}

}  // namespace
