#pragma once
// Welford's one-pass (count, mean, M2) and Chan's combine of two such summaries, shared
// by the CUDA batch-norm statistics kernels and their CPU test (tests/kernels/welford_test.cpp).
//
// Why not sum and sum of squares: sum x^2 - (sum x)^2 / n cancels catastrophically when
// |mean| >> std (a channel at 1e4 with std 1e-3 keeps no digit of its variance in f64
// after 1e6 values). Welford updates the mean and M2 = sum (x - mean)^2 directly, and
// Chan's formula merges two disjoint summaries exactly as if one had seen all values,
// so threads, blocks and chunks can each keep one and combine them in a fixed order.
// SyncBatchNorm still all-reduces (count, sum, sum of squares): welford_sum and
// welford_sumsq hand those out from the accurate summary.
#include "kernels/common/host_device.h"

namespace nd::kernels {

// The summary of `count` values. Aggregate without initializers so that CUDA can hold
// arrays of it in shared memory; `Welford{}` is the empty summary.
struct Welford {
  double count;  // number of values (exact in double up to 2^53)
  double mean;
  double m2;  // sum of squared deviations from mean
};

// Adds one value:  n += 1,  d = x - mean,  mean += d / n,  M2 += d * (x - mean_new).
ND_HOST_DEVICE void welford_add(Welford& w, double x) {
  w.count += 1.0;
  const double d = x - w.mean;
  w.mean += d / w.count;
  w.m2 += d * (x - w.mean);
}

// Chan, Golub & LeVeque: the summary of the union of two disjoint sets,
//   n = na + nb,  d = mean_b - mean_a,
//   mean = mean_a + d * nb / n,   M2 = M2a + M2b + d^2 * na * nb / n.
// Either side may be empty (then the other is returned unchanged).
ND_HOST_DEVICE Welford welford_combine(const Welford& a, const Welford& b) {
  if (b.count == 0.0) return a;
  if (a.count == 0.0) return b;
  const double n = a.count + b.count;
  const double d = b.mean - a.mean;
  const double fb = b.count / n;
  return Welford{n, a.mean + d * fb, a.m2 + b.m2 + d * d * a.count * fb};
}

// sum x = n * mean.
ND_HOST_DEVICE double welford_sum(const Welford& w) { return w.count * w.mean; }

// sum x^2 = M2 + n * mean^2.
ND_HOST_DEVICE double welford_sumsq(const Welford& w) { return w.m2 + w.count * w.mean * w.mean; }

}  // namespace nd::kernels
