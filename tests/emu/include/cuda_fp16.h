#pragma once
// Emulator stand-in for <cuda_fp16.h>: __half holds the raw bits; conversions go through
// nd::Half (kernels/common/float16.h: IEEE binary16, round to nearest even, subnormals),
// also as a constructor from float and a conversion to float, as the device type has.
#include <cstdint>

#include "kernels/common/float16.h"

struct __half {
  uint16_t x;
  __half() = default;
  __half(float f) : x(nd::Half::from_float(f)) {}
  operator float() const { return nd::Half::to_float(x); }
};
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __half2float(__half h) { return nd::Half::to_float(h.x); }
inline __half __ushort_as_half(uint16_t bits) {
  __half r;
  r.x = bits;
  return r;
}
inline uint16_t __half_as_ushort(__half h) { return h.x; }
