#pragma once
// The emulator's warp-level PTX: kernels/cuda/warp_mma.cuh's functions (mma.sync m16n8k16,
// ldmatrix, cp.async) without asm, for kernels run on CPU threads (tests/emu/README.md).
// include/kernels/cuda/warp_ptx.cuh, first on the emulated builds' include path, brings these
// in place of the inline PTX of kernels/cuda/warp_ptx.cuh; the layouts are documented in warp_mma.cuh.
//
// What is emulated:
// - mma_m16n8k16 and ldmatrix are warp collectives: all 32 lanes of a full warp must reach
//   the same call (else the divergent-barrier abort of emu_core.h; a partial warp aborts).
//   Each lane publishes its registers (or its row address) through the warp exchange; every
//   lane rebuilds the operands from the 32 lanes' registers with the PTX ISA's lane map and
//   computes its own result registers from the same map. So a kernel that puts A[1][0] where
//   the instruction expects A[0][1] gets a wrong product here, as on the GPU.
// - mma: f32 accumulation of the exact products (bf16 x bf16 and f16 x f16 are exact in
//   f32), k in order with fma, starting from C. The hardware's order of additions is not
//   documented; results agree to the rounding of a 17-term f32 sum, not bit for bit.
//   mma_executed() is the one place a warp's mma is counted (the cost model's hook).
// - ldmatrix: each lane's row address (lanes 0..8 Num - 1) must be 16-byte aligned, else an
//   "EMU ldmatrix" abort naming the lane. Each lane reads its own 4 bytes (2 x 2 with .trans)
//   as ordinary shared-memory reads, so the sanitizer sees them: a row another lane wrote
//   without a __syncwarp is a race, a row nobody wrote an uninitialised read. Like the
//   shuffles it does not order shared memory (only __syncwarp and __syncthreads do).
// - cp.async: a copy is queued per thread; commit_group closes a group; wait_group<N>
//   performs the copies of all but the newest N groups, in the issuing thread at that point
//   (the sanitizer sees a read of the source and a write of the destination there). From
//   the issue to the wait the destination holds poison (0xff bytes: NaN for floats), so a
//   missing wait reads NaN, and with the sanitizer on a never-written destination read
//   before its wait is an uninitialised read. __syncthreads does not complete copies (as on
//   the GPU). A thread that ends the kernel with copies not waited for aborts. Addresses
//   must be aligned to the copy's size (16 for .cg), else an "EMU cp.async" abort.
// What is NOT emulated: timing and the asynchrony itself (nothing overlaps), the register
// file, the source read at any time before the wait (it is read at the wait), whether an
// address is in shared memory (ldmatrix and cp.async destinations are not checked to be),
// .ca versus .cg caching, the hardware's order of additions inside an mma.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "emu_core.h"
#include "emu_cost.h"

// The sanitizer's entry points (emu_access_hooks.cpp): a cp.async's copy reported as the
// instrumented code's accesses would be.
extern "C" void __tsan_read_range(void* p, unsigned long n);
extern "C" void __tsan_write_range(void* p, unsigned long n);

namespace emu_ptx {

// One warp executed one mma.sync m16n8k16 (called once per warp, by lane 0): the cost model
// counts its tensor-core work.
inline void mma_executed(int64_t flops) { emu_cost::count_mma(flops); }

// ex2.approx.ftz.f32: 2^x with subnormal inputs and results flushed to 0. Emulated as the
// correctly rounded 2^x: the device's approximation (relative error below 2^-22) is not.
inline float ex2_approx_ftz(float x) {
  if (std::fpclassify(x) == FP_SUBNORMAL) x = 0.0f;
  const float y = std::exp2(x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}

template <class T>
float from_bits(uint32_t bits) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(__ushort_as_half(uint16_t(bits)));
  else return __bfloat162float(__ushort_as_bfloat16(uint16_t(bits)));
}

template <class T>
EMU_UNCHECKED void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "mma_m16n8k16: bf16 or f16 inputs");
  const char* call = std::is_same_v<T, __half> ? "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
                                               : "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32";
  const uint64_t mine[3] = {a[0] | uint64_t(a[1]) << 32, a[2] | uint64_t(a[3]) << 32, b[0] | uint64_t(b[1]) << 32};
  const uint64_t* all = emu_warp_gather(mine, 3, call);
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const uint64_t* w = all + size_t(l) * kEmuExchangeWords;
    const int g = l / 4, t = l % 4;
    for (int r = 0; r < 4; ++r) {  // a[r]: row g (+8 for odd r), columns 2t, 2t+1 (+8 for r >= 2)
      const uint32_t reg = uint32_t(w[r / 2] >> (32 * (r % 2)));
      const int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
      A[row][col] = from_bits<T>(reg & 0xffffu);
      A[row][col + 1] = from_bits<T>(reg >> 16);
    }
    for (int r = 0; r < 2; ++r) {  // b[r]: rows k = 2t, 2t+1 (+8 for r = 1), column g
      const uint32_t reg = uint32_t(w[2] >> (32 * r));
      B[2 * t + 8 * r][g] = from_bits<T>(reg & 0xffffu);
      B[2 * t + 8 * r + 1][g] = from_bits<T>(reg >> 16);
    }
  }
  const int lane = emu_lane(), g = lane / 4, t = lane % 4;
  float out[4];
  for (int i = 0; i < 4; ++i) {  // c[i], d[i]: row g (+8 for i >= 2), column 2t + (i & 1)
    const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
    float acc = c[i];
    for (int k = 0; k < 16; ++k) acc = std::fma(A[row][k], B[k][col], acc);
    out[i] = acc;
  }
  for (int i = 0; i < 4; ++i) d[i] = out[i];  // d may be c
  if (lane == 0) mma_executed(2 * 16 * 8 * 16);
}

// Lanes 0..8 Num - 1 give row addresses; each lane reads its share of every matrix.
template <int Num>
void ldmatrix_impl(uint32_t (&r)[Num], const void* row, bool trans, const char* call) {
  static_assert(Num == 1 || Num == 2 || Num == 4, "ldmatrix: .x1, .x2 or .x4");
  const int lane = emu_lane();
  const uintptr_t address = reinterpret_cast<uintptr_t>(row);
  if (lane < 8 * Num && address % 16 != 0) {
    std::fprintf(stderr, "EMU ldmatrix: %s: lane %d of warp %d gives row address %p, not 16-byte aligned (%u mod 16)\n",
                 call, lane, emu_warp(), row, unsigned(address % 16));
    emu_die("aborting");
  }
  const uint64_t mine[1] = {address};
  const uint64_t* all = emu_warp_gather(mine, 1, call);
  auto row_of = [&](int matrix, int i) {
    return reinterpret_cast<const unsigned char*>(all[size_t(8 * matrix + i) * kEmuExchangeWords]);
  };
  for (int m = 0; m < Num; ++m) {
    uint16_t lo, hi;
    if (!trans) {  // M[lane / 4][2 (lane % 4)], M[lane / 4][2 (lane % 4) + 1]
      const unsigned char* p = row_of(m, lane / 4) + 4 * (lane % 4);
      std::memcpy(&lo, p, 2);
      std::memcpy(&hi, p + 2, 2);
    } else {  // M[2 (lane % 4)][lane / 4], M[2 (lane % 4) + 1][lane / 4]
      std::memcpy(&lo, row_of(m, 2 * (lane % 4)) + 2 * (lane / 4), 2);
      std::memcpy(&hi, row_of(m, 2 * (lane % 4) + 1) + 2 * (lane / 4), 2);
    }
    r[m] = uint32_t(lo) | uint32_t(hi) << 16;
  }
}
template <int Num>
void ldmatrix(uint32_t (&r)[Num], const void* row) {
  ldmatrix_impl(r, row, false,
                Num == 1 ? "ldmatrix.sync.aligned.m8n8.x1.shared.b16"
                : Num == 2 ? "ldmatrix.sync.aligned.m8n8.x2.shared.b16" : "ldmatrix.sync.aligned.m8n8.x4.shared.b16");
}
template <int Num>
void ldmatrix_trans(uint32_t (&r)[Num], const void* row) {
  ldmatrix_impl(r, row, true,
                Num == 1 ? "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16"
                : Num == 2 ? "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16"
                           : "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16");
}

// ---- cp.async: per-thread queues of copies, performed at the wait -----------------------
struct CpAsyncCopy {
  void* dst;
  const void* src;
  int bytes, src_bytes;
};
// Fixed thread-local arrays, not heap containers: a heap block allocated by a kernel thread
// is tracked by the sanitizer as device memory (emu_stubs.cpp's operator new), so a queue
// on the heap was counted as global traffic by the cost model and, freed and reused during
// a launch, reported as a write conflict.
constexpr int kCpAsyncMaxCopies = 256, kCpAsyncMaxGroups = 32;  // per thread, in flight
struct CpAsyncQueue {
  CpAsyncCopy copies[kCpAsyncMaxCopies];  // in issue order; committed ones first
  int group_end[kCpAsyncMaxGroups];       // group g is copies [group_end[g - 1], group_end[g]), oldest first
  int copies_queued = 0, groups = 0;
};
inline thread_local CpAsyncQueue cp_async_queue;

inline void cp_async_check_none_left() {
  const size_t left = size_t(cp_async_queue.copies_queued);
  if (left == 0) return;
  std::fprintf(stderr,
               "EMU cp.async: thread (%u,%u,%u) of block (%u,%u,%u) ends the kernel with %zu cp.async copies never "
               "waited for (cp.async.wait_group / wait_all): their shared memory never received the data\n",
               threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z, left);
  emu_die("aborting");
}

EMU_UNCHECKED inline void cp_async(void* dst, const void* src, int bytes, int src_bytes, const char* call) {
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (d % unsigned(bytes) != 0 || (src_bytes > 0 && s % unsigned(bytes) != 0)) {
    std::fprintf(stderr,
                 "EMU cp.async: %s: thread (%u,%u,%u) of block (%u,%u,%u) copies %d bytes from %p to %p; both must be "
                 "%d-byte aligned\n",
                 call, threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z, bytes, src, dst, bytes);
    emu_die("aborting");
  }
  if (src_bytes < 0 || src_bytes > bytes) {
    std::fprintf(stderr, "EMU cp.async: %s: src-size %d outside 0..%d\n", call, src_bytes, bytes);
    emu_die("aborting");
  }
  CpAsyncQueue& q = cp_async_queue;
  if (q.copies_queued == kCpAsyncMaxCopies) {
    std::fprintf(stderr, "EMU cp.async: %s: thread (%u,%u,%u) has %d copies in flight, the emulator's limit\n", call,
                 threadIdx.x, threadIdx.y, threadIdx.z, kCpAsyncMaxCopies);
    emu_die("aborting");
  }
  std::memset(dst, 0xff, size_t(bytes));  // poison until the wait (not a write the sanitizer sees)
  q.copies[q.copies_queued++] = CpAsyncCopy{dst, src, bytes, src_bytes};
  emu_thread_exit_check = cp_async_check_none_left;
}
inline void cp_async_cg_16(void* smem, const void* gmem) { cp_async(smem, gmem, 16, 16, "cp.async.cg.shared.global 16"); }
inline void cp_async_cg_16_zfill(void* smem, const void* gmem, int src_bytes) {
  cp_async(smem, gmem, 16, src_bytes, "cp.async.cg.shared.global 16 with src-size");
}
template <int Bytes>
void cp_async_ca(void* smem, const void* gmem) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async.ca copies 4, 8 or 16 bytes");
  cp_async(smem, gmem, Bytes, Bytes, "cp.async.ca.shared.global");
}
template <int Bytes>
void cp_async_ca_zfill(void* smem, const void* gmem, int src_bytes) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async.ca copies 4, 8 or 16 bytes");
  cp_async(smem, gmem, Bytes, src_bytes, "cp.async.ca.shared.global with src-size");
}
inline void cp_async_commit_group() {
  CpAsyncQueue& q = cp_async_queue;
  if (q.groups == kCpAsyncMaxGroups) {
    std::fprintf(stderr, "EMU cp.async: thread (%u,%u,%u) has %d groups in flight, the emulator's limit\n", threadIdx.x,
                 threadIdx.y, threadIdx.z, kCpAsyncMaxGroups);
    emu_die("aborting");
  }
  q.group_end[q.groups++] = q.copies_queued;  // an empty group is a group too, as in PTX
}
EMU_UNCHECKED inline void cp_async_wait_pending(size_t newest_left) {
  CpAsyncQueue& q = cp_async_queue;
  if (size_t(q.groups) <= newest_left) return;
  const int done_groups = q.groups - int(newest_left), done = q.group_end[done_groups - 1];
  for (int i = 0; i < done; ++i) {
    const CpAsyncCopy& c = q.copies[i];
    if (c.src_bytes > 0) __tsan_read_range(const_cast<void*>(c.src), unsigned(c.src_bytes));
    __tsan_write_range(c.dst, unsigned(c.bytes));
    if (c.src_bytes > 0) std::memcpy(c.dst, c.src, size_t(c.src_bytes));  // src may be null at 0
    std::memset(static_cast<unsigned char*>(c.dst) + c.src_bytes, 0, size_t(c.bytes - c.src_bytes));
  }
  // The groups still in flight, and the copies not yet committed, move to the front.
  std::memmove(q.copies, q.copies + done, size_t(q.copies_queued - done) * sizeof(CpAsyncCopy));
  q.copies_queued -= done;
  for (int g = done_groups; g < q.groups; ++g) q.group_end[g - done_groups] = q.group_end[g] - done;
  q.groups -= done_groups;
}
template <int N>
void cp_async_wait_group() {
  static_assert(N >= 0, "cp.async.wait_group N >= 0");
  cp_async_wait_pending(size_t(N));
}
inline void cp_async_wait_all() {
  cp_async_commit_group();
  cp_async_wait_pending(0);
}

}  // namespace emu_ptx
