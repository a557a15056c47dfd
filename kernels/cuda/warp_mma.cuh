#pragma once
// Warp-level matrix instructions through inline PTX: what fast tensor-core kernels (CUTLASS,
// FlashAttention-2) use instead of WMMA, because their fragment layouts are documented (PTX
// ISA, "Matrix Fragments for mma.m16n8k16" and "ldmatrix"), so a kernel can keep a tile in
// registers across steps (softmax on the accumulator, the accumulator reused as the next
// A operand) where WMMA's fragments are opaque.
//
// Fragment layouts (lane = 4 * group + tid_in_group, group = lane / 4, t = lane % 4; a .b32
// register holds two 16-bit values, the lower column / lower k in its low half):
//   A, 16x16 row-major (rows m, columns k), 4 registers:
//     a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
//     a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   B, 16x8 (rows k, columns n), 2 registers:  b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
//   C and D, 16x8 f32, 4 registers:  c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
//   ldmatrix .x1/.x2/.x4: lanes 8i..8i+7 give the shared-memory addresses of rows 0..7 of
//     matrix i (8 x 16-bit values, 16 bytes, 16-byte aligned); register i of lane l receives
//     M_i[l/4][2(l%4), 2(l%4)+1], or with .trans M_i[2(l%4), 2(l%4)+1][l/4]. So .x4 from
//     row (l % 16), column 8 (l / 16) of a row-major 16x16 tile is exactly A's fragment, .x2
//     .trans from rows k = l % 16 of a row-major [k][n] tile is B's, and .x2 (no .trans) from
//     rows n of an [n][k] tile (K stored as in attention's S = Q K^T) is B's too.
//   cp.async: a copy from global to shared memory that completes only at the matching
//     cp.async.wait_group (not at __syncthreads); .cg (16 bytes, L2 only) or .ca (4, 8 or 16
//     bytes); the src-size form (cp_async_cg_16_zfill, cp_async_ca_zfill) copies src_bytes and
//     fills the rest of the copy with zeros (a padded tile edge without a branch). Both addresses aligned to the copy's size. The data
//     is visible to the issuing thread after its wait; other threads need a __syncthreads.
//
// The instructions themselves are kernels/cuda/warp_ptx.cuh: inline PTX, one instruction each
// (sm_80 and newer; nanoddp builds sm_90). The CPU emulator (tests/emu) puts its own
// kernels/cuda/warp_ptx.cuh first on the include path: the same functions, which gather the
// 32 lanes' registers and addresses and apply the layouts above, so a kernel with a wrong
// lane map fails its emulation test; cp.async copies only at the wait (before it, poison).
// Checked: every function compiles for sm_90 (tests/emu/warp_mma_kernels.cu, built by nvcc in
// CUDA builds) and the emulator's version against plain matrix products
// (tests/emu/warp_mma_selftest.cpp).
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/warp_ptx.cuh"

namespace nd::kernels::cuda {

// Two 16-bit values in one .b32 register: lo in bits 0-15 (the lower column or k).
template <class T>
__device__ __forceinline__ uint32_t pack2(T lo, T hi) {
  static_assert(sizeof(T) == 2, "pack2 packs two 16-bit values (__nv_bfloat16 or __half)");
  uint16_t l, h;
  if constexpr (std::is_same_v<T, __half>) {
    l = __half_as_ushort(lo);
    h = __half_as_ushort(hi);
  } else {
    l = __bfloat16_as_ushort(lo);
    h = __bfloat16_as_ushort(hi);
  }
  return uint32_t(l) | uint32_t(h) << 16;
}

}  // namespace nd::kernels::cuda
