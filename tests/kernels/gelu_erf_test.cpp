// The vectorisable f32 erf and exp of kernels/common/elementwise_math.h (the CPU's exact
// GELU uses them) against libm in f64, and the GELU kernels built on them against the
// libm formula they replaced:
//  - erf_f32: at most 2 ulp from std::erf (f64, rounded) over a dense sweep of every
//    magnitude up to 10 (every 257th f32 bit pattern, both signs), and the special values
//    (+-0 keep their sign, +-inf -> +-1, NaN -> NaN, subnormal, huge);
//  - exp_nonpositive_f32: at most 2 ulp over [-110, 0], subnormal results included;
//  - cpu::unary / unary_backward GELU in f32 at sizes 0, 1, odd and large against
//    x/2 (1 + erff(x / sqrt 2)) and its derivative; in f64 (gradcheck) still libm's, exactly.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/common/elementwise_math.h"
#include "kernels/cpu/elementwise.h"

namespace {

using nd::kernels::UnaryOp;
using nd::kernels::math::erf_f32;
using nd::kernels::math::exp_nonpositive_f32;
using nd::kernels::math::f32_from_bits;

// |got - ref| in units of the f32 spacing at ref (the subnormal spacing below 2^-126).
double ulp_error(float got, double ref) {
  const double spacing = std::ldexp(1.0, std::max(std::ilogb(static_cast<float>(ref)), -126) - 23);
  return std::fabs(static_cast<double>(got) - ref) / spacing;
}

// The largest ulp error of f against ref over every `stride`-th f32 bit pattern from 0 up
// to `limit` in magnitude, with the given sign.
template <class F, class Ref>
double sweep_max_ulp(F f, Ref ref, float limit, bool negative, uint32_t stride) {
  double worst = 0;
  const uint32_t sign = negative ? 0x80000000u : 0u;
  for (uint32_t b = 0; f32_from_bits(b) <= limit; b += stride) {
    const float x = f32_from_bits(b | sign);
    worst = std::max(worst, ulp_error(f(x), ref(static_cast<double>(x))));
  }
  return worst;
}

// The GELU as it was, with libm's erff and expf (same constants, same operation order).
const float kSqrt1_2 = static_cast<float>(nd::kernels::math::kSqrt1_2);
const float kInvSqrt2Pi = static_cast<float>(nd::kernels::math::kInvSqrt2Pi);
float old_gelu(float x) { return x * 0.5f * (1.f + std::erf(x * kSqrt1_2)); }
float old_gelu_derivative(float x) {
  return 0.5f * (1.f + std::erf(x * kSqrt1_2)) + x * (std::exp(-0.5f * x * x) * kInvSqrt2Pi);
}

// erf_f32 and erff differ by up to 3 ulp (2 + libm's 1), at most 3 * 2^-24 absolute as
// |erf| < 1. Through 1 + erf, which loses relative precision where erf is near -1 (x << 0),
// that moves the forward by up to |x| / 2 * 3 * 2^-24 and the derivative's Phi term by
// 3 * 2^-25; the derivative's x * phi term by 3 ulp of phi <= 0.4. So the new kernel must
// be within 3 ulp of the old result plus that slack.
void check_close_to_old(float got, float old, float x, double slack) {
  const double tol = 3 * std::ldexp(1.0, std::ilogb(std::fabs(old) + 1e-38f) - 23) + slack;
  const bool same = got == old || (std::isnan(got) && std::isnan(old));  // +-inf, NaN
  CHECK_MESSAGE((same || std::fabs(static_cast<double>(got) - old) <= tol), "x = " << x << ": " << got << " vs " << old);
}
double forward_slack(float x) { return 0.5 * std::fabs(x) * 3 * std::ldexp(1.0, -24); }
double derivative_slack(float x) { return (0.5 + 0.4 * std::fabs(x)) * 3 * std::ldexp(1.0, -24); }

std::vector<float> gelu_inputs(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-10.f, 10.f);
  std::vector<float> x(n);
  for (auto& v : x) v = u(gen);
  return x;
}

}  // namespace

TEST_CASE("erf_f32 is within 2 ulp of erf over every magnitude up to 10, both signs") {
  const auto ref = [](double x) { return std::erf(x); };
  CHECK(sweep_max_ulp(erf_f32, ref, 10.f, false, 257) <= 2.0);
  CHECK(sweep_max_ulp(erf_f32, ref, 10.f, true, 257) <= 2.0);
  // around the switch between the two pieces, every f32
  double worst = 0;
  for (float x = 0.9f; x < 0.95f; x = std::nextafter(x, 1.f)) worst = std::max(worst, ulp_error(erf_f32(x), std::erf(x)));
  CHECK(worst <= 2.0);
}

TEST_CASE("erf_f32 special values") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(erf_f32(0.f) == 0.f);
  CHECK_FALSE(std::signbit(erf_f32(0.f)));
  CHECK(erf_f32(-0.f) == 0.f);
  CHECK(std::signbit(erf_f32(-0.f)));
  CHECK(erf_f32(inf) == 1.f);
  CHECK(erf_f32(-inf) == -1.f);
  CHECK(std::isnan(erf_f32(std::numeric_limits<float>::quiet_NaN())));
  CHECK(erf_f32(std::numeric_limits<float>::max()) == 1.f);
  CHECK(erf_f32(-3e38f) == -1.f);
  CHECK(erf_f32(4.f) == 1.f);
  for (float tiny : {1e-45f, 1e-40f, std::numeric_limits<float>::min(), 1e-20f, 1e-7f})
    CHECK(ulp_error(erf_f32(-tiny), std::erf(-static_cast<double>(tiny))) <= 1.0);
}

TEST_CASE("exp_nonpositive_f32 is within 2 ulp of exp on [-110, 0], subnormal results included") {
  CHECK(sweep_max_ulp(exp_nonpositive_f32, [](double t) { return std::exp(t); }, 110.f, true, 97) <= 2.0);
  CHECK(exp_nonpositive_f32(-0.f) == 1.f);
  CHECK(exp_nonpositive_f32(-std::numeric_limits<float>::infinity()) == 0.f);
  CHECK(exp_nonpositive_f32(-1000.f) == 0.f);
  CHECK(std::isnan(exp_nonpositive_f32(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("cpu GELU f32 forward and backward match the libm formula at sizes 0, 1, odd, large") {
  namespace cpu = nd::kernels::cpu;
  for (int64_t n : {0, 1, 17, 100003}) {
    CAPTURE(n);
    std::vector<float> x = gelu_inputs(n, 7u + static_cast<uint32_t>(n));
    if (n == 17) {  // the special values, in the middle of a vectorised row
      const float inf = std::numeric_limits<float>::infinity();
      x[3] = 0.f, x[4] = -0.f, x[5] = inf, x[6] = -inf, x[7] = 1e-40f, x[8] = -30.f, x[9] = 30.f;
    }
    std::vector<float> y(n), dy(n, 1.f), dx(n);
    const int64_t stride = 1;
    cpu::unary<float>(UnaryOp::gelu, {}, 1, &n, x.data(), &stride, y.data(), &stride);
    cpu::unary_backward<float>(UnaryOp::gelu, {}, n, x.data(), y.data(), dy.data(), dx.data());
    for (int64_t i = 0; i < n; ++i) {
      check_close_to_old(y[i], old_gelu(x[i]), x[i], forward_slack(x[i]));
      if (std::isinf(x[i])) {
        CHECK(std::isnan(dx[i]));  // 1 + inf * 0, as before
      } else {
        check_close_to_old(dx[i], old_gelu_derivative(x[i]), x[i], derivative_slack(x[i]));
      }
    }
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float y = 0, dx = 0;
  const int64_t one = 1;
  cpu::unary<float>(UnaryOp::gelu, {}, 1, &one, &nan, &one, &y, &one);
  const float dy = 1.f;
  cpu::unary_backward<float>(UnaryOp::gelu, {}, 1, &nan, &y, &dy, &dx);
  CHECK(std::isnan(y));
  CHECK(std::isnan(dx));
}

// (Within 2e-16, not bit-exact: GCC may contract a * b + c into an FMA differently here.)
TEST_CASE("cpu GELU f64 still uses libm's erf and exp") {
  namespace cpu = nd::kernels::cpu;
  const int64_t n = 1001;
  std::vector<double> x(n), y(n), dy(n, 1.0), dx(n);
  for (int64_t i = 0; i < n; ++i) x[i] = -10.0 + 0.02 * static_cast<double>(i);
  const int64_t stride = 1;
  cpu::unary<double>(UnaryOp::gelu, {}, 1, &n, x.data(), &stride, y.data(), &stride);
  cpu::unary_backward<double>(UnaryOp::gelu, {}, n, x.data(), y.data(), dy.data(), dx.data());
  for (int64_t i = 0; i < n; ++i) {
    const double cdf = 0.5 * (1.0 + std::erf(x[i] * nd::kernels::math::kSqrt1_2));
    CHECK(y[i] == doctest::Approx(x[i] * cdf).epsilon(2e-16));
    CHECK(dx[i] == doctest::Approx(cdf + x[i] * std::exp(-0.5 * x[i] * x[i]) * nd::kernels::math::kInvSqrt2Pi)
                       .epsilon(2e-16));
  }
}
