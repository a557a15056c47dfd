// Internal to the bf16/f16 attention kernels (attention_tc_forward.cu, attention_tc_backward.cu):
// what both need. The 16-bit device types (Tc16, Dev), the shared-memory carver, the tile
// load (cp.async; plain stores for rows that are not 16-byte aligned), the score of one
// (query, key) pair with its mask (tc_score), the host's choice of the instantiation with or
// without mask and dropout (with_mask_dropout), the 16-wide block count that skips padding,
// and the request for more than 48 KiB of dynamic shared memory. Like attention.cuh,
// everything sits in an anonymous namespace: each .cu compiles its own copy.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "kernels/common/float16.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/warp_mma.cuh"

namespace nd::kernels::cuda {

namespace {

// The device type of a 16-bit storage type S (BFloat16 or Half), and rounding to it: the
// kernels below are written once for both, bf16 and f16 fragments having the same shapes,
// layouts and ldm rules.
template <class S>
struct Tc16;
template <>
struct Tc16<BFloat16> {
  using dev = __nv_bfloat16;
  static __device__ dev round(float v) { return __float2bfloat16_rn(v); }
  static __device__ dev from_bits(uint16_t b) { return __ushort_as_bfloat16(b); }
};
template <>
struct Tc16<Half> {
  using dev = __half;
  static __device__ dev round(float v) { return __float2half_rn(v); }
  static __device__ dev from_bits(uint16_t b) { return __ushort_as_half(b); }
};
template <class S>
using Dev = typename Tc16<S>::dev;

constexpr float kLog2e = 1.4426950408889634f;

// Carves consecutive regions out of the dynamic shared memory.
struct SharedCarver {
  unsigned char* next;
  template <class T>
  __device__ T* take(size_t bytes) {
    T* p = reinterpret_cast<T*>(next);
    next += bytes;
    return p;
  }
};

// The loads' path for rows that are not all 16-byte aligned (width % 8 != 0 or a misaligned
// base): dst[r * (D + 8) + e] = src[(row0 + r) * width + e] for r < rows, e < width, 0 for the
// rest of the [tile_rows][D] tile, element by element over `threads` threads.
template <class S, int D>
__device__ void tile_load_plain(Dev<S>* dst, const S* src, int64_t row0, int64_t rows, int64_t width, int tile_rows,
                                int threads) {
  for (int idx = threadIdx.x; idx < tile_rows * D; idx += threads) {
    const int r = idx / D, e = idx % D;
    dst[r * (D + 8) + e] = Tc16<S>::from_bits(r < rows && e < width ? src[(row0 + r) * width + e].bits : 0);
  }
}

// dst[r * (D + 8) + e] = src[(row0 + r) * width + e] for r < rows, e < width, 0 for the rest of
// the [tile_rows][D] tile (padding enters the products: it must be 0, not stale). With every
// row 16-byte aligned through cp.async (16 bytes, zero-filled past the data; complete at this
// thread's cp_async_wait_group, visible to the block after the __syncthreads that follows),
// else plain stores (visible after that same __syncthreads). `threads` threads share the work.
template <class S, int D>
__device__ void tile_load_async(Dev<S>* dst, const S* src, int64_t row0, int64_t rows, int64_t width, int tile_rows,
                                int threads) {
  constexpr int ld = D + 8;
  if (width % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    constexpr int kChunks = D / 8;
    for (int idx = threadIdx.x; idx < tile_rows * kChunks; idx += threads) {
      const int r = idx / kChunks, e = idx % kChunks * 8;
      const bool in = r < rows && e < width;
      cp_async_cg_16_zfill(dst + r * ld + e, in ? src + (row0 + r) * width + e : src, in ? 16 : 0);
    }
  } else {
    tile_load_plain<S, D>(dst, src, row0, rows, width, tile_rows, threads);
  }
}

// unit (scale dot + mask_ij) where the element is allowed (the caller's compare of its column
// with the row's range: causality and padding), else -inf. unit = 1 (the backward) or log2(e)
// (the forward's exp2): the caller passes scale_unit = unit * scale. kMaskDropout == false
// (no mask: with_mask_dropout): the mask is not read, i and j go unused.
template <bool kMaskDropout, class S>
__device__ float tc_score(const Problem<S>& p, const Head<S>& hd, float scale_unit, float unit, float dot, bool allowed,
                          int64_t i, int64_t j) {
  if (!allowed) return -INFINITY;
  const float s = scale_unit * dot;
  if constexpr (kMaskDropout)
    return hd.mask ? s + unit * to_compute(hd.mask[i * p.mask.stride_q + j * p.mask.stride_k]) : s;
  else
    return s;
}

// launch(std::bool_constant<kMaskDropout>) with kMaskDropout whether the launch has an additive
// mask or dropout: the kernels are compiled twice per head dim, and the common launches (no mask,
// no dropout; causal or not) run the copy whose per-element work is one compare of a column with
// the row's range, without the mask's 64-bit address or the dropout hash (registers: the files'
// comments). The other copy tests the mask pointer and p per element, as one kernel did before.
template <class S, class Launch>
void with_mask_dropout(const Problem<S>& p, Launch launch) {
  if (p.mask.data || p.dropout.p != 0.0) launch(std::true_type{});
  else launch(std::false_type{});
}

// 16-wide blocks with a real row or column: work on padding is skipped block-uniformly (so
// every mma.sync and ldmatrix stays warp-uniform): a tile's rows past the sequence's end and
// head-dim columns past E or Ev are zero in shared memory, so their products add nothing;
// score columns past the tile's last key (or query) get P = dS = 0, and whole 16-column
// blocks of them are skipped. The MAE's short sequences (13 and 50 rows) gain most.
__host__ __device__ constexpr int frags16(int64_t n) { return static_cast<int>((n + 15) / 16); }

// The tensor-core kernels may take more than the default 48 KiB of dynamic shared memory
// (FwdLayout: 30-102 KiB; BwdLayout: 30-103 KiB), which sm_90 grants on request. The grant
// is a property of the kernel on the current device and each instantiation's size is a
// constant, so it is asked for once per kernel and device, not at every launch (a host call
// into the driver each time).
template <auto Kernel>
void allow_shared(size_t bytes, const char* name) {
  static std::mutex mutex;
  static std::vector<bool> granted;  // by device
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice", name);
  const std::lock_guard<std::mutex> lock(mutex);
  if (size_t(device) < granted.size() && granted[device]) return;
  check(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)", name);
  if (granted.size() <= size_t(device)) granted.resize(device + 1, false);
  granted[device] = true;
}
}  // namespace

}  // namespace nd::kernels::cuda
