#pragma once
// The warp-level PTX instructions behind kernels/cuda/warp_mma.cuh (whose comment documents
// their fragment layouts): mma.sync m16n8k16, ldmatrix and cp.async as inline asm, for nvcc.
// The CPU emulator replaces this header through its include path with
// tests/emu/include/kernels/cuda/warp_ptx.cuh (the same functions, emulated).
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace nd::kernels::cuda {

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

// 2^x in one MUFU.EX2 (ex2.approx.ftz.f32: relative error below 2^-22, subnormal inputs and
// results flushed to 0), where exp2f adds three instructions to handle subnormal results: the
// attention forward's weights, which a bf16 rounding follows.
__device__ __forceinline__ float ex2_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
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

}  // namespace nd::kernels::cuda
