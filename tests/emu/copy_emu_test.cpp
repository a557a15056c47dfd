// kernels/cuda/copy.cu in the emulator against kernels/cpu/copy.cpp: strided copies with
// dtype conversion (f32 <-> bf16 / f16 rounding to nearest even, f64 -> f32, floats ->
// integers and bool, integers -> floats) through a transposed source, and fill of 1-, 2-,
// 4- and 8-byte types. Every conversion is one rounding the IEEE rules fix, so outputs are
// compared byte for byte.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "emu_test.h"
#include "kernels/common/float16.h"
#include "kernels/cpu/copy.h"
#include "kernels/cuda/copy.h"

namespace {

using namespace nd::kernels;
using namespace nd::emu_test;
using nd::BFloat16;
using nd::Half;

// A [3, 4, 5] index space read through a [5, 4, 3] buffer (a transpose), written contiguous.
const int64_t kShape[3] = {3, 4, 5};
const int64_t kTransposed[3] = {1, 3, 12};
const int64_t kContiguous[3] = {20, 5, 1};

template <class S, class D>
void check_copy(const std::vector<S>& src, const char* what) {
  INFO(std::string(what));
  // Raw buffers (std::vector<bool> has no data()); 0x5a bytes are never a result below.
  std::vector<unsigned char> ref(60 * sizeof(D), 0), got(60 * sizeof(D), 0x5a);
  cpu::copy_strided<S, D>(3, kShape, src.data(), kTransposed, reinterpret_cast<D*>(ref.data()), kContiguous);
  cuda::copy_strided<S, D>(3, kShape, src.data(), kTransposed, reinterpret_cast<D*>(got.data()), kContiguous,
                           nullptr);
  CHECK(got == ref);
}

TEST_CASE("copy_strided converts like the CPU, byte for byte") {
  // Values with more mantissa than bf16/f16 keep, ties included, an f16 subnormal and overflow.
  auto f = uniform(60, 1, -300, 300);
  f[0] = 1.00390625f;       // 1 + 2^-8: a bf16 tie (rounds to even)
  f[1] = 3.0e-6f;           // an f16 subnormal
  f[2] = 70000.0f;          // f16 overflow -> inf
  f[3] = -0.0f;
  const auto d = cast<double>(f);
  const auto b = cast<BFloat16>(f);
  const auto h = cast<Half>(f);
  const auto i64 = cast<int64_t>(f);
  const auto i32 = cast<int32_t>(f);
  std::vector<uint8_t> u8(60);
  for (int i = 0; i < 60; ++i) u8[i] = static_cast<uint8_t>(i * 7);
  check_copy<float, BFloat16>(f, "f32 -> bf16");
  check_copy<float, Half>(f, "f32 -> f16");
  check_copy<BFloat16, float>(b, "bf16 -> f32");
  check_copy<Half, float>(h, "f16 -> f32");
  check_copy<BFloat16, Half>(b, "bf16 -> f16");
  check_copy<double, float>(d, "f64 -> f32");
  check_copy<float, double>(f, "f32 -> f64");
  check_copy<double, int64_t>(d, "f64 -> i64");
  check_copy<float, bool>(f, "f32 -> bool");
  check_copy<int64_t, float>(i64, "i64 -> f32");
  check_copy<int32_t, double>(i32, "i32 -> f64");
  check_copy<uint8_t, BFloat16>(u8, "u8 -> bf16");
  check_copy<int64_t, int32_t>(i64, "i64 -> i32");
  check_copy<float, float>(f, "f32 -> f32");
}

template <class T>
void check_fill(T value, const char* what) {
  INFO(std::string(what));
  std::vector<unsigned char> ref(1000 * sizeof(T), 0), got(1000 * sizeof(T), 0x5a);
  cpu::fill<T>(1000, value, reinterpret_cast<T*>(ref.data()));
  cuda::fill<T>(1000, value, reinterpret_cast<T*>(got.data()), nullptr);
  CHECK(got == ref);
}

TEST_CASE("fill writes every element of 1-, 2-, 4- and 8-byte types") {
  check_fill<float>(-2.5f, "f32");
  check_fill<double>(1e300, "f64");
  check_fill<BFloat16>(BFloat16(3.0f), "bf16");
  check_fill<Half>(Half(-1.5f), "f16");
  check_fill<int64_t>(-7, "i64");
  check_fill<uint8_t>(200, "u8");
  check_fill<bool>(true, "bool");
}

template <class T>
void check_add_constant(T value) {
  INFO((sizeof(T) == 8 ? "i64 " : "i32 "), value);
  const int64_t n = 1000;
  std::vector<T> a(n);
  for (int64_t i = 0; i < n; ++i) a[i] = static_cast<T>(i * 7919 - 3000);
  a[0] = std::numeric_limits<T>::max();  // wraps around, as in PyTorch
  a[1] = std::numeric_limits<T>::min();
  auto b = a;
  cpu::add_constant<T>(n, value, a.data());
  cuda::add_constant<T>(n, value, b.data(), nullptr);
  CHECK(a == b);
  CHECK(a[2] == static_cast<T>(2 * 7919 - 3000 + value));
}

TEST_CASE("add_constant adds to every int64 and int32 element, wrapping at the ends") {
  check_add_constant<int64_t>(1);
  check_add_constant<int64_t>(-5);
  check_add_constant<int32_t>(1);
  check_add_constant<int32_t>(-123456);
}

}  // namespace
