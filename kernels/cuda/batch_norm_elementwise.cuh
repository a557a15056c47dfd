#pragma once
// The elementwise passes of batch normalisation over [N, C, S] (batch_norm.cu's apply and
// input gradients): one grid-stride kernel over groups of kGroup = 4 consecutive elements,
// each group's loads issued before its arithmetic, and a Map per pass saying what a group
// loads, computes and stores.
//
// Why groups: 4 loads in flight per thread (8 for dx) instead of 1, and where S is a
// multiple of 4 and every pointer is 16-byte aligned a group lies in one channel and moves
// as one float4 / double2 (kernels/cuda/vector_io.cuh), with its channel's coefficients
// fetched once. Elsewhere (S = 1, odd planes, views off alignment) a group may span
// channels, each element with its own, fetched from the per-channel arrays (L1 hits).
// Channels are tracked by additions (ElementWalk, kernels/common/batch_norm_index.h), no
// division per element. Tests: tests/emu/batch_norm_emu_test.cpp (every path).
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "kernels/common/batch_norm_activation.h"
#include "kernels/common/batch_norm_index.h"
#include "kernels/common/optim_math.h"
#include "kernels/cuda/stream.h"
#include "kernels/cuda/strided.cuh"
#include "kernels/cuda/vector_io.cuh"

namespace nd::kernels::cuda::batch_norm_elementwise {

using detail::kThreads;
constexpr int kGroup = optim_math::kGroup;

// map.group(i, count, c, vector) for groups of kGroup consecutive elements i.. of [N, C, S]
// (count < kGroup only at the end), c[k] the channel of element i + k, grid-stride; the
// channels tracked by additions (ElementWalk). `vector`: S % kGroup == 0 and the Map's
// pointers 16-byte aligned, so a whole group is one channel's and loads as one access.
// map.prepared(): what a thread computes once before its first group.
template <class Map>
__global__ void elementwise_kernel(const Map unprepared, int64_t total, int64_t C, int64_t S, bool vector) {
  const Map map = unprepared.prepared();
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (first * kGroup >= total) return;
  const int64_t step = int64_t(gridDim.x) * blockDim.x * kGroup;
  for (ElementWalk w = element_walk(first * kGroup, step, C, S); w.i < total; w.next()) {
    const int64_t count = total - w.i < kGroup ? total - w.i : kGroup;
    int64_t c[kGroup], s = w.s;
    c[0] = w.c;
#pragma unroll
    for (int k = 1; k < kGroup; ++k) {
      c[k] = c[k - 1];
      if (++s == S) {
        s = 0;
        c[k] = c[k] + 1 == C ? 0 : c[k] + 1;
      }
    }
    map.group(w.i, count, c, vector && count == kGroup);
  }
}

// y = act((x - mean[c]) * (invstd[c] * weight[c]) + bias[c]). Subtract the mean first, as
// the CPU: folding it into the shift cancels when |mean| >> std.
template <class T>
struct ApplyMap {
  const T *x, *mean, *invstd, *weight, *bias;
  T* y;
  BatchNormActivation act;
  __device__ ApplyMap prepared() const { return *this; }
  __device__ void group(int64_t i, int64_t count, const int64_t (&c)[kGroup], bool vector) const {
    T v[kGroup];
    VectorIO::load(v, x, i, count, vector);
    T m = 0, a = 0, b = 0;
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      if (k == 0 || !vector) {  // a vector group is one channel's
        m = mean[c[k]];
        a = invstd[c[k]] * (weight ? weight[c[k]] : T(1));
        b = bias ? bias[c[k]] : T(0);
      }
      v[k] = act.forward((v[k] - m) * a + b);
    }
    VectorIO::store(v, y, i, count, vector);
  }
};

// Training: dx = w * invstd * (dy - sum_dy / count - (x - mean) * invstd^2 * sum_dy_xmu / count)
//              = a * dy - (x - mean) * p - q,  with a = w * invstd, p = a * invstd^2 * sum_dy_xmu / count,
//                q = a * sum_dy / count per channel (in double, then T). Shared by InputGradMap
// and the fused backward's second walk (batch_norm.cu), so both round alike.
template <class T>
struct InputGradCoefficients {
  T m, a, p, q;
  __device__ T operator()(T dy, T x) const { return a * dy - (x - m) * p - q; }
};

template <class T>
__device__ InputGradCoefficients<T> input_grad_coefficients(const T* mean, const T* invstd, const T* weight,
                                                            const double* sum_dy, const double* sum_dy_xmu,
                                                            double inv_count, int64_t c) {
  const double is = static_cast<double>(invstd[c]);
  const double ad = (weight ? static_cast<double>(weight[c]) : 1.0) * is;
  return {mean[c], static_cast<T>(ad), static_cast<T>(ad * (sum_dy_xmu[c] * inv_count * is * is)),
          static_cast<T>(ad * (sum_dy[c] * inv_count))};
}

// dy taken back through the activation (the forward's output y) as it is loaded, when on.
template <class T>
__device__ void load_dy(T (&g)[kGroup], const T* dy, const T* y, BatchNormActivation act, int64_t i, int64_t count,
                        bool vector) {
  VectorIO::load(g, dy, i, count, vector);
  if (!act.on()) return;
  T out[kGroup];
  VectorIO::load(out, y, i, count, vector);
#pragma unroll
  for (int k = 0; k < kGroup; ++k) g[k] = act.backward(g[k], out[k]);
}

template <class T>
struct InputGradMap {
  const T *dy, *x, *mean, *invstd, *weight;
  const double *sum_dy, *sum_dy_xmu;
  const double* device_count;  // SyncBatchNorm's all-reduced count, or null: `count` holds it
  double count;
  double inv_count;  // 1 / count, set by prepared()
  T* dx;
  BatchNormActivation act;
  const T* y;  // the forward's output when act.on()
  __device__ InputGradMap prepared() const {
    InputGradMap m = *this;
    m.inv_count = 1.0 / (device_count ? *device_count : count);
    return m;
  }
  __device__ void group(int64_t i, int64_t count, const int64_t (&c)[kGroup], bool vector) const {
    T g[kGroup], v[kGroup];
    load_dy(g, dy, y, act, i, count, vector);
    VectorIO::load(v, x, i, count, vector);
    InputGradCoefficients<T> coefficients{};
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      if (k == 0 || !vector)
        coefficients = input_grad_coefficients(mean, invstd, weight, sum_dy, sum_dy_xmu, inv_count, c[k]);
      g[k] = coefficients(g[k], v[k]);
    }
    VectorIO::store(g, dx, i, count, vector);
  }
};

// Eval: mean and invstd are constants, so dx = dy * (invstd * weight).
template <class T>
struct EvalInputGradMap {
  const T *dy, *invstd, *weight;
  T* dx;
  BatchNormActivation act;
  const T* y;  // the forward's output when act.on()
  __device__ EvalInputGradMap prepared() const { return *this; }
  __device__ void group(int64_t i, int64_t count, const int64_t (&c)[kGroup], bool vector) const {
    T g[kGroup];
    load_dy(g, dy, y, act, i, count, vector);
    T a = 0;
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      if (k == 0 || !vector) a = invstd[c[k]] * (weight ? weight[c[k]] : T(1));
      g[k] *= a;
    }
    VectorIO::store(g, dx, i, count, vector);
  }
};

inline bool aligned(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (!optim_math::aligned16(p)) return false;
  return true;
}

template <class Map>
void launch_elementwise(const char* kernel, const Map& map, int64_t N, int64_t C, int64_t S, bool aligned_pointers,
                        cudaStream_t stream) {
  const int64_t total = N * C * S;
  if (total == 0) return;
  const bool vector = S % kGroup == 0 && aligned_pointers;
  elementwise_kernel<Map><<<detail::blocks_for((total + kGroup - 1) / kGroup), kThreads, 0, stream>>>(map, total, C,
                                                                                                      S, vector);
  check_launch(kernel);
}

}  // namespace nd::kernels::cuda::batch_norm_elementwise
