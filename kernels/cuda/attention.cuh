// Internal to kernels/cuda/attention.cu (the f32/f64 SIMT kernels) and attention_tc_forward.cu,
// attention_tc_backward.cu (the bf16 and f16 tensor-core kernels): what both need. The problem a kernel takes by value
// (Problem) and one head's slice of it, the mask's included (Head); storage and compute
// types; the delta pass D_i = dout_i . out_i that both backwards run first (f32 sums for
// bf16); the head-dim dispatch, the grid helpers and the entry points around the launchers.
//
// Why a header and not a third .cu: the kernels are templates instantiated by each file's
// launchers, and all of this sits in an anonymous namespace, as it did when the two files
// were one: each .cu compiles its own internal copy, nothing is shared at link time.
//
// Flash-style throughout: the scores of a query tile against a key tile are a tile x tile
// block that lives only in shared memory, so memory stays O(S) per head whatever the
// sequence length. The online-softmax update and tile bounds are
// kernels/common/online_softmax.h (CPU-tested). Twin: kernels/cpu/attention.cpp. Test:
// tests/cuda/cuda_attention_test.cpp (and tests/emu/attention_emu_test.cpp, both files).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include <string>
#include <type_traits>

#include "kernels/common/float16.h"
#include "kernels/common/online_softmax.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/scratch.cuh"

namespace nd::kernels::cuda {

namespace {

constexpr int kThreads = 128;

// Storage type S (in global memory) and arithmetic type compute_t<S> (shared memory,
// registers, logsumexp and delta): the same for f32 and f64; f32 for bf16.
template <class S>
struct ComputeType {
  using type = S;
};
template <>
struct ComputeType<BFloat16> {
  using type = float;
};
template <>
struct ComputeType<Half> {
  using type = float;
};
template <class S>
using compute_t = typename ComputeType<S>::type;

template <class T>
__device__ T to_compute(T x) {
  return x;
}
__device__ float to_compute(BFloat16 x) { return __bfloat162float(__ushort_as_bfloat16(x.bits)); }
__device__ float to_compute(Half x) { return __half2float(__ushort_as_half(x.bits)); }
template <class T>
__device__ void store(T* p, T v) {
  *p = v;
}
__device__ void store(BFloat16* p, float v) { p->bits = __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
__device__ void store(Half* p, float v) { p->bits = __half_as_ushort(__float2half_rn(v)); }

// Everything a kernel needs, by value.
template <class S>
struct Problem {
  using T = compute_t<S>;
  const S *q, *k, *v, *out, *dout;
  const T *lse, *delta;
  AttentionMask<S> mask;
  int64_t H, Sq, Sk, E, Ev;
  bool is_causal;
  T scale;
  AttentionDropout dropout;

  // Z_ij of head bh (kernels/common/dropout_mask.h): 0 or 1 / (1 - p); 1 without dropout.
  __device__ T dropout_factor(int64_t bh, int64_t i, int64_t j) const {
    return dropout.template factor<T>(bh, Sq, Sk, i, j);
  }
};

// One head's slice of the arrays and of the mask (base == nullptr: no mask).
template <class S>
struct Head {
  using T = compute_t<S>;
  const S *q, *k, *v, *out, *dout, *mask;
  const T *lse, *delta;
  __device__ Head(const Problem<S>& p, int64_t bh) {
    const int64_t b = bh / p.H, h = bh % p.H;
    q = p.q + bh * p.Sq * p.E;
    k = p.k + bh * p.Sk * p.E;
    v = p.v + bh * p.Sk * p.Ev;
    out = p.out ? p.out + bh * p.Sq * p.Ev : nullptr;
    lse = p.lse ? p.lse + bh * p.Sq : nullptr;
    dout = p.dout ? p.dout + bh * p.Sq * p.Ev : nullptr;
    delta = p.delta ? p.delta + bh * p.Sq : nullptr;
    mask = p.mask.data ? p.mask.data + b * p.mask.stride_b + h * p.mask.stride_h : nullptr;
  }
};

// lse and delta of query rows [i0, i0 + rows) into the first `tile` entries of lse_out and
// delta_out; padding rows get lse = -inf (so their P is 0) and delta = 0.
template <class S, class T = compute_t<S>>
__device__ void load_row_stats(T* lse_out, T* delta_out, int tile, const Head<S>& hd, int64_t i0, int64_t rows) {
  for (int r = threadIdx.x; r < tile; r += kThreads) {
    lse_out[r] = r < rows ? hd.lse[i0 + r] : -static_cast<T>(INFINITY);
    delta_out[r] = r < rows ? hd.delta[i0 + r] : T(0);
  }
}

// delta_i = dout_i . out_i, one warp per row (a fixed shuffle tree: deterministic).
template <class S, class T = compute_t<S>>
__global__ void __launch_bounds__(kThreads) delta_kernel(int64_t rows, int64_t Ev, const S* dout, const S* out,
                                                         T* delta) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t row = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32; row < rows;
       row += int64_t(gridDim.x) * kWarps) {
    T sum = 0;
    for (int64_t e = lane; e < Ev; e += 32) sum += to_compute(dout[row * Ev + e]) * to_compute(out[row * Ev + e]);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) delta[row] = sum;
  }
}

// The compiled head dim for E and Ev: 32, 64 or 128 (nd::Error above 128).
int head_dim_for(const char* kernel, int64_t E, int64_t Ev) {
  const int64_t d = E > Ev ? E : Ev;
  require(E >= 0 && Ev >= 0 && d <= kAttentionMaxHeadDim, kernel,
          "expected head dims E and Ev of at most " + std::to_string(kAttentionMaxHeadDim) + ", found E = " +
              std::to_string(E) + ", Ev = " + std::to_string(Ev));
  return d <= 32 ? 32 : d <= 64 ? 64 : 128;
}

// Blocks of a 1-D grid over n_tiles tiles of each of BH heads (gridDim.x <= 2^31 - 1).
unsigned grid_for(const char* kernel, int64_t BH, int64_t n_tiles) {
  const int64_t blocks = BH * n_tiles;
  require(blocks <= int64_t(0x7fffffff), kernel,
          "at most 2^31 - 1 (head, tile) blocks per launch, found " + std::to_string(blocks));
  return static_cast<unsigned>(blocks);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// delta_i = dout_i . out_i for each of `rows` query rows (none when rows == 0).
template <class S>
void launch_delta(int64_t rows, int64_t Ev, const S* dout, const S* out, compute_t<S>* delta, cudaStream_t stream) {
  if (rows == 0) return;
  const int64_t warps = kThreads / 32, blocks = ceil_div(rows, warps);
  delta_kernel<S><<<static_cast<unsigned>(blocks < (1 << 20) ? blocks : (1 << 20)), kThreads, 0, stream>>>(
      rows, Ev, dout, out, delta);
  check_launch("attention backward delta");
}

// launch(D, p, BH) with D the compiled head dim d as a std::integral_constant.
template <class S, class Launch>
void launch_for_head_dim(int d, Launch& launch, const Problem<S>& p, int64_t BH) {
  if (d == 32) launch(std::integral_constant<int, 32>{}, p, BH);
  else if (d == 64) launch(std::integral_constant<int, 64>{}, p, BH);
  else launch(std::integral_constant<int, 128>{}, p, BH);
}

// The entry points' body for every storage type S, around the launchers `launch` (attention.cu's
// SIMT ones for f32 and f64, attention_tc_*.cu's tensor-core ones for bf16 and f16): the head-dim
// check, the empty cases, the backward's delta, the head-dim dispatch. `name` labels errors.
template <class S, class Launch>
void run_forward(const char* name, const S* q, const S* k, const S* v, AttentionMask<S> mask, int64_t B, int64_t H,
                 int64_t Sq, int64_t Sk, int64_t E, int64_t Ev, bool is_causal, double scale,
                 const AttentionDropout& dropout, Launch launch) {
  const int d = head_dim_for(name, E, Ev);
  const int64_t BH = B * H;
  if (BH == 0 || Sq == 0) return;
  const Problem<S> p{q, k, v, nullptr, nullptr, nullptr, nullptr, mask, H, Sq, Sk, E, Ev, is_causal,
                     static_cast<compute_t<S>>(scale), dropout};
  launch_for_head_dim(d, launch, p, BH);
}

template <class S, class Launch>
void run_backward(const char* name, const S* dout, const S* q, const S* k, const S* v, AttentionMask<S> mask,
                  const S* out, const compute_t<S>* lse, int64_t B, int64_t H, int64_t Sq, int64_t Sk, int64_t E,
                  int64_t Ev, bool is_causal, double scale, const AttentionDropout& dropout, cudaStream_t stream,
                  Launch launch) {
  using T = compute_t<S>;
  const int d = head_dim_for(name, E, Ev);
  const int64_t BH = B * H;
  if (BH == 0 || (Sq == 0 && Sk == 0)) return;
  // delta_i = dout_i . out_i for every query row, computed once (FlashAttention-2).
  const detail::Scratch delta(name, static_cast<size_t>(BH * Sq) * sizeof(T), stream);
  launch_delta<S>(BH * Sq, Ev, dout, out, delta.as<T>(), stream);
  const Problem<S> p{q, k, v, out, dout, lse, delta.as<T>(), mask, H, Sq, Sk, E, Ev, is_causal,
                     static_cast<T>(scale), dropout};
  launch_for_head_dim(d, launch, p, BH);
}

}  // namespace

}  // namespace nd::kernels::cuda
