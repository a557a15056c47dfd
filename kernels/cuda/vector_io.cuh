#pragma once
// Groups of kGroup (4) consecutive values moved with one or two 16-byte accesses (float4,
// double2), the form of kernels/common/optim_math.h's ScalarIO that the fused optimizer
// steps use on the device. A 16-byte access is one instruction where four scalar ones
// would be four: fewer instructions per byte, and with every load of a group issued
// before the first use, more bytes in flight per thread.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/optim_math.h"

namespace nd::kernels::cuda {

// requires, when `vector`: count == kGroup and (src or dst) + i 16-byte aligned.
struct VectorIO {
  static constexpr int kGroup = optim_math::kGroup;
  template <class T>
  __host__ __device__ static void load(T (&x)[kGroup], const T* __restrict__ src, int64_t i, int64_t count, bool vector) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "float or double");
    if (!vector) return optim_math::ScalarIO::load(x, src, i, count, vector);
    if constexpr (sizeof(T) == 4) {
      const float4 q = *reinterpret_cast<const float4*>(src + i);
      x[0] = q.x, x[1] = q.y, x[2] = q.z, x[3] = q.w;
    } else {
      const double2 a = reinterpret_cast<const double2*>(src + i)[0];
      const double2 b = reinterpret_cast<const double2*>(src + i)[1];
      x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
    }
  }
  // Sets a flag that many threads may set at once (GradScaler's non-finite answer).
  __device__ static void flag(int32_t* p) { atomicMax(p, 1); }
  template <class T>
  __host__ __device__ static void store(const T (&x)[kGroup], T* __restrict__ dst, int64_t i, int64_t count, bool vector) {
    if (!vector) return optim_math::ScalarIO::store(x, dst, i, count, vector);
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float4*>(dst + i) = make_float4(x[0], x[1], x[2], x[3]);
    } else {
      reinterpret_cast<double2*>(dst + i)[0] = make_double2(x[0], x[1]);
      reinterpret_cast<double2*>(dst + i)[1] = make_double2(x[2], x[3]);
    }
  }
};

}  // namespace nd::kernels::cuda
