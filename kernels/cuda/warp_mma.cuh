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
// Compiled by nvcc (sm_80 and newer; nanoddp builds sm_90) these are one instruction each.
// Compiled without nvcc the header is the CPU emulator's (tests/emu, whose include/ comes
// first): the same functions from tests/emu/include/emu_ptx.h, which gathers the 32 lanes'
// registers and addresses and applies the layouts above, so a kernel with a wrong lane map
// fails its emulation test; cp.async copies only at the wait (before it, poison).
// Checked: every function compiles for sm_90 (tests/emu/warp_mma_kernels.cu, built by nvcc in
// CUDA builds) and the emulator's version against plain matrix products
// (tests/emu/warp_mma_selftest.cpp).
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#if !defined(__CUDACC__)
#include "emu_ptx.h"
#endif

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

#if !defined(__CUDACC__)
using emu_ptx::cp_async_ca;
using emu_ptx::cp_async_ca_zfill;
using emu_ptx::cp_async_cg_16;
using emu_ptx::cp_async_cg_16_zfill;
using emu_ptx::cp_async_commit_group;
using emu_ptx::cp_async_wait_all;
using emu_ptx::cp_async_wait_group;
using emu_ptx::ldmatrix;
using emu_ptx::ldmatrix_trans;
using emu_ptx::mma_m16n8k16;
#else

// D = A B + C, m16n8k16, T = __nv_bfloat16 or __half inputs, f32 accumulation. d may be c.
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                             const float (&c)[4]) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "mma_m16n8k16: bf16 or f16 inputs");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
}

// Num (1, 2, 4) 8x8 matrices of 16-bit values from shared memory; `row` is this lane's row
// address (lanes 0..8 Num - 1 are read). The "memory" clobber keeps shared stores before it.
template <int Num>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[Num], const void* row) {
  static_assert(Num == 1 || Num == 2 || Num == 4, "ldmatrix: .x1, .x2 or .x4");
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (Num == 1) asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(s) : "memory");
  if constexpr (Num == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s) : "memory");
  if constexpr (Num == 4)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s) : "memory");
}
template <int Num>
__device__ __forceinline__ void ldmatrix_trans(uint32_t (&r)[Num], const void* row) {
  static_assert(Num == 1 || Num == 2 || Num == 4, "ldmatrix_trans: .x1, .x2 or .x4");
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (Num == 1)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(s) : "memory");
  if constexpr (Num == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s) : "memory");
  if constexpr (Num == 4)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s) : "memory");
}

// 16 bytes global -> shared, cached in L2 only (.cg): streamed tiles.
__device__ __forceinline__ void cp_async_cg_16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(__cvta_generic_to_global(gmem)) : "memory");
}
// The src-size form: src_bytes (0..16) from gmem, zeros for the rest; 0 reads nothing.
__device__ __forceinline__ void cp_async_cg_16_zfill(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(__cvta_generic_to_global(gmem)),
               "r"(src_bytes)
               : "memory");
}
// Bytes = 4, 8 or 16, cached in L1 and L2 (.ca).
template <int Bytes>
__device__ __forceinline__ void cp_async_ca(void* smem, const void* gmem) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async.ca copies 4, 8 or 16 bytes");
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(__cvta_generic_to_global(gmem)), "n"(Bytes)
               : "memory");
}
// The src-size form of .ca: src_bytes (0..Bytes) from gmem, zeros for the rest; 0 reads
// nothing (a padded or out-of-range element without a branch around the copy).
template <int Bytes>
__device__ __forceinline__ void cp_async_ca_zfill(void* smem, const void* gmem, int src_bytes) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async.ca copies 4, 8 or 16 bytes");
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(__cvta_generic_to_global(gmem)),
               "n"(Bytes), "r"(src_bytes)
               : "memory");
}
// Closes the group of this thread's copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Commits what is pending and waits for every copy.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

#endif

}  // namespace nd::kernels::cuda
