#pragma once
// Emulator stand-in for <mma.h> (nvcuda::wmma). The hardware's per-lane fragment layout is
// opaque, so here every lane holds the WHOLE tile (row-major in x[]): code that uses the
// API as documented cannot tell, but code that reads frag.x[i] by position (other than a
// uniform operation over all i < num_elements) is wrong on the GPU even if it passes here.
// Checks: every call is a warp barrier (.sync: all 32 lanes must reach the same call, else
// abort); loads and stores check the 256-bit pointer alignment and that ldm is a multiple of
// 16 bytes; stores are done by lane 0 only, so a missing __syncwarp()/__syncthreads()
// before other lanes read the stored tile is a race (-fsanitize=thread reports it, and it
// often gives wrong values). mma_sync accumulates in float with fma, k in order (the
// hardware's order within a 16-deep step is unspecified). precision::tf32 fragments keep
// the full f32 value (TF32 rounding is not emulated).
// Cost model (emu_cost.h): lane 0 counts each load or store once as a tile and each mma_sync
// as 2 M N K flops; the lanes' own copies of the tile are not counted (emu_cost::Quiet).
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "emu_core.h"

namespace nvcuda::wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };
namespace precision {
struct tf32 {};
}  // namespace precision

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static constexpr int R = std::is_same_v<Use, matrix_a> ? M : std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int C = std::is_same_v<Use, matrix_a> ? K : N;
  using storage = std::conditional_t<std::is_same_v<T, precision::tf32>, float, T>;
  static constexpr int num_elements = R * C;
  storage x[R * C];  // the whole tile, row-major (emulation only)
};

inline void emu_wmma_check(const void* p, unsigned ldm, size_t element_bytes, const char* call) {
  if (reinterpret_cast<uintptr_t>(p) % 32) {
    std::fprintf(stderr, "EMU: %s: pointer %p not 256-bit aligned\n", call, p);
    emu_die("aborting");
  }
  const unsigned multiple = 16 / unsigned(element_bytes);  // 8 for 16-bit, 4 for 32-bit elements
  if (ldm % multiple) {
    std::fprintf(stderr, "EMU: %s: ldm %u not a multiple of %u elements\n", call, ldm, multiple);
    emu_die("aborting");
  }
}

template <class Use, int M, int N, int K, class T, class L, class P>
void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const P* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "accumulator loads take a layout_t");
  emu_warp_sync("wmma::load_matrix_sync");
  emu_wmma_check(p, ldm, sizeof(P), "wmma::load_matrix_sync");
  using F = fragment<Use, M, N, K, T, L>;
  constexpr bool rows = std::is_same_v<L, row_major>;
  if (emu_lane() == 0)
    emu_cost::count_tile(p, rows ? F::R : F::C, int((rows ? F::C : F::R) * sizeof(P)), ldm * sizeof(P), false);
  emu_cost::Quiet quiet;
  for (int r = 0; r < F::R; ++r)
    for (int c = 0; c < F::C; ++c)
      f.x[r * F::C + c] = std::is_same_v<L, row_major> ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
  emu_warp_sync("wmma::load_matrix_sync");  // no lane overwrites the source before all have read it
}
template <int M, int N, int K, class T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm, layout_t layout) {
  emu_warp_sync("wmma::load_matrix_sync(accumulator)");
  emu_wmma_check(p, ldm, sizeof(T), "wmma::load_matrix_sync(accumulator)");
  if (emu_lane() == 0)
    emu_cost::count_tile(p, layout == mem_row_major ? M : N, int((layout == mem_row_major ? N : M) * sizeof(T)),
                         ldm * sizeof(T), false);
  emu_cost::Quiet quiet;
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      f.x[r * N + c] = layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
  emu_warp_sync("wmma::load_matrix_sync(accumulator)");
}
template <int M, int N, int K, class T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t layout) {
  emu_warp_sync("wmma::store_matrix_sync");
  emu_wmma_check(p, ldm, sizeof(T), "wmma::store_matrix_sync");
  if (emu_lane() != 0) return;
  emu_cost::count_tile(p, layout == mem_row_major ? M : N, int((layout == mem_row_major ? N : M) * sizeof(T)),
                       ldm * sizeof(T), true);
  emu_cost::Quiet quiet;
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      (layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r]) = f.x[r * N + c];
}
template <class Use, int M, int N, int K, class T, class L, class V>
void fill_fragment(fragment<Use, M, N, K, T, L>& f, V v) {
  emu_warp_sync("wmma::fill_fragment");
  for (auto& e : f.x) e = v;
}
template <int M, int N, int K, class TA, class LA, class LB, class TC>
void mma_sync(fragment<accumulator, M, N, K, TC>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TA, LB>& b, const fragment<accumulator, M, N, K, TC>& c) {
  emu_warp_sync("wmma::mma_sync");
  if (emu_lane() == 0) emu_cost::count_mma(int64_t(2) * M * N * K);
  TC out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float acc = float(c.x[i * N + j]);
      for (int k = 0; k < K; ++k) acc = std::fma(float(a.x[i * K + k]), float(b.x[k * N + j]), acc);
      out[i * N + j] = TC(acc);
    }
  for (int i = 0; i < M * N; ++i) d.x[i] = out[i];
}

}  // namespace nvcuda::wmma
