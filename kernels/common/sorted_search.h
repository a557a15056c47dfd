#pragma once
// Binary search in a sorted array, usable on the host and in CUDA kernels (the CUDA
// embedding backward finds each row's run of sorted indices with it).
#include <cstdint>

#include "kernels/common/host_device.h"

namespace nd::kernels {

// The first position k in [0, n) with keys[k] >= value, or n when there is none.
// requires: keys[0..n) sorted ascending.
template <class K>
ND_HOST_DEVICE int64_t lower_bound(const K* keys, int64_t n, K value) {
  int64_t lo = 0, hi = n;  // invariant: keys[< lo] < value <= keys[>= hi]
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < value) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

}  // namespace nd::kernels
