// conv2d and conv_transpose2d on the GPU as implicit GEMMs (the index math, and what
// each pass's GEMM is, are in kernels/common/conv_index.h).
//
// Why one kernel serves every pass: each pass is C_g = A_g * B_g per channel group, with
// one operand gathered from an NCHW tensor (patches of x, or the dy pixels a dgrad tap
// reaches) and the other the weight. implicit_gemm_kernel is a plain 64x64x16
// shared-memory tile GEMM (256 threads, 4x4 results each) that asks the problem struct
// for every tile element instead of reading a matrix, so zero padding, stride, dilation
// and groups live in the accessors, which the CPU tests run, and not in the kernel. The
// gather costs integer divisions per element; it saves im2col's buffer (kH*kW times the
// input) and the traffic to fill it.
//
// Grid: x = row tiles, y = column tiles, z = (group, depth chunk), each walked by a
// grid-stride loop, so no size runs into gridDim.y/z <= 65535. wgrad's depth N*OH*OW is
// long against few output tiles, so it is cut into chunks (split-K) whose partial
// results go to a buffer that a second kernel sums in chunk order: no atomics, the same
// bits on every run.
#include "kernels/cuda/conv.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/common/conv_index.h"
#include "kernels/cuda/row_reduce.cuh"
#include "kernels/cuda/scratch.cuh"
#include "kernels/cuda/strided.cuh"

namespace nd::kernels::cuda {

namespace {

namespace ci = kernels::conv_index;
using detail::kThreads;

constexpr int kTileM = 64, kTileN = 64, kTileK = 16;
constexpr int kMicro = 4;                                        // results per thread: kMicro x kMicro
constexpr int kGemmThreads = (kTileM / kMicro) * (kTileN / kMicro);  // 256
static_assert(kTileM / kMicro == 16 && kTileN / kMicro == 16, "the thread layout below is 16 x 16");
// wgrad split-K: no chunk shorter than this many depth elements, and enough chunks
// that about this many blocks run (an H200 has 132 SMs).
constexpr int64_t kMinChunk = 256, kTargetBlocks = 512;
constexpr int64_t kMaxGridX = int64_t(1) << 30, kMaxGridYZ = 65535;

// For every z = (group g, chunk s), column tile and row tile:
//   C_g[m, j] = sum_{k in chunk s} p.a(g, m, k) * p.b(g, k, j), stored by p.store(g, s, m, j, .).
// Thread (ty, tx) owns rows m0 + ty + 16*i and columns n0 + tx + 16*j (i, j < kMicro), so
// a warp reads consecutive shared-memory words of Bs and one or two broadcast words of As.
// Out-of-range rows, columns and depths load as 0 and are never stored.
template <class T, class Problem>
__global__ void __launch_bounds__(kGemmThreads)
    implicit_gemm_kernel(Problem p, int64_t groups, int64_t splits, int64_t chunk) {
  __shared__ T As[kTileK][kTileM];
  __shared__ T Bs[kTileK][kTileN];
  const int64_t M = p.rows(), Ncols = p.cols(), K = p.depth();
  const int64_t m_tiles = (M + kTileM - 1) / kTileM, n_tiles = (Ncols + kTileN - 1) / kTileN;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  for (int64_t z = blockIdx.z; z < groups * splits; z += gridDim.z) {
    const int64_t g = z % groups, split = z / groups;
    const int64_t k_begin = split * chunk, k_end = k_begin + chunk < K ? k_begin + chunk : K;
    for (int64_t nt = blockIdx.y; nt < n_tiles; nt += gridDim.y) {
      for (int64_t mt = blockIdx.x; mt < m_tiles; mt += gridDim.x) {
        const int64_t m0 = mt * kTileM, n0 = nt * kTileN;
        T acc[kMicro][kMicro] = {};
        for (int64_t k0 = k_begin; k0 < k_end; k0 += kTileK) {
          for (int e = tid; e < kTileM * kTileK; e += kGemmThreads) {  // row-fastest: coalesced gathers
            const int ml = e % kTileM, kl = e / kTileM;
            const int64_t m = m0 + ml, k = k0 + kl;
            As[kl][ml] = m < M && k < k_end ? p.a(g, m, k) : T(0);
          }
          for (int e = tid; e < kTileN * kTileK; e += kGemmThreads) {
            const int jl = e % kTileN, kl = e / kTileN;
            const int64_t j = n0 + jl, k = k0 + kl;
            Bs[kl][jl] = j < Ncols && k < k_end ? p.b(g, k, j) : T(0);
          }
          __syncthreads();
#pragma unroll
          for (int kk = 0; kk < kTileK; ++kk) {
            T a[kMicro], b[kMicro];
#pragma unroll
            for (int i = 0; i < kMicro; ++i) {
              a[i] = As[kk][ty + 16 * i];
              b[i] = Bs[kk][tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < kMicro; ++i)
#pragma unroll
              for (int j = 0; j < kMicro; ++j) acc[i][j] += a[i] * b[j];
          }
          __syncthreads();  // the next tile overwrites As and Bs
        }
#pragma unroll
        for (int i = 0; i < kMicro; ++i)
#pragma unroll
          for (int j = 0; j < kMicro; ++j) {
            const int64_t m = m0 + ty + 16 * i, col = n0 + tx + 16 * j;
            if (m < M && col < Ncols) p.store(g, split, m, col, acc[i][j]);
          }
      }
    }
  }
}

// One depth chunk covering all of K.
ci::SplitK whole_depth(int64_t K) { return {1, std::max<int64_t>(K, 1)}; }

template <class T, class Problem>
void launch_gemm(const char* kernel, const Problem& p, int64_t groups, ci::SplitK split, cudaStream_t stream) {
  const int64_t m_tiles = (p.rows() + kTileM - 1) / kTileM, n_tiles = (p.cols() + kTileN - 1) / kTileN;
  const dim3 grid(static_cast<unsigned>(std::min(m_tiles, kMaxGridX)),
                  static_cast<unsigned>(std::min(n_tiles, kMaxGridYZ)),
                  static_cast<unsigned>(std::min(groups * split.splits, kMaxGridYZ)));
  implicit_gemm_kernel<T, Problem><<<grid, kGemmThreads, 0, stream>>>(p, groups, split.splits, split.chunk);
  check_launch(kernel);
}

// out[i] = sum_{s < splits} partial[s*size + i], added in order s = 0, 1, ...
template <class T>
__global__ void sum_chunks_kernel(int64_t splits, int64_t size, const T* partial, T* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < size; i += int64_t(gridDim.x) * blockDim.x) {
    T acc = partial[i];
    for (int64_t s = 1; s < splits; ++s) acc += partial[s * size + i];
    out[i] = acc;
  }
}

// grad_bias[c] = sum_{n, p} dy[n, c, p]: one block per channel (grid-stride), each thread
// a strided slice in double, then the block's fixed-order shuffle reduction.
template <class T>
__global__ void bias_grad_kernel(int64_t N, int64_t C, int64_t HW, const T* dy, T* db) {
  __shared__ double smem[rows::kWarp];
  for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
    double acc = 0;
    for (int64_t i = threadIdx.x; i < N * HW; i += blockDim.x)
      acc += static_cast<double>(dy[(i / HW * C + c) * HW + i % HW]);
    const double total = rows::block_sum(acc, smem);
    if (threadIdx.x == 0) db[c] = static_cast<T>(total);
  }
}

// wgrad of the conv2d s: dw = DY^T X (conv_index.h's WgradGemm), split-K when the depth is long.
template <class T>
void wgrad(const char* kernel, const Conv2dShape& s, const T* x, const T* dy, T* dw, cudaStream_t stream) {
  ci::WgradGemm<T> p{ci::geometry(s), x, dy, dw};
  const int64_t size = p.q.C_out * p.cols();
  if (p.depth() == 0) {  // N == 0: the sum over no samples
    check(cudaMemsetAsync(dw, 0, sizeof(T) * size, stream), "cudaMemsetAsync", kernel);
    return;
  }
  const int64_t tiles = (p.rows() + kTileM - 1) / kTileM * ((p.cols() + kTileN - 1) / kTileN) * p.q.groups;
  const ci::SplitK split = ci::split_depth(p.depth(), tiles, kTileK, kMinChunk, kTargetBlocks);
  if (split.splits == 1) return launch_gemm<T>(kernel, p, p.q.groups, split, stream);
  const detail::Scratch partial(kernel, sizeof(T) * split.splits * size, stream);
  p.out = partial.as<T>();
  launch_gemm<T>(kernel, p, p.q.groups, split, stream);
  sum_chunks_kernel<T><<<detail::blocks_for(size), kThreads, 0, stream>>>(split.splits, size, partial.as<T>(), dw);
  check_launch(kernel);
}

// Forward (Gemm = ForwardGemm: out = conv(in, w) + bias) or dgrad (DgradGemm: out = the
// adjoint applied to in, + bias[channel]) of the conv2d s, the whole depth in one chunk.
template <template <class> class Gemm, class T>
void one_pass(const char* kernel, const Conv2dShape& s, const T* in, const T* w, const T* bias, T* out,
              cudaStream_t stream) {
  const Gemm<T> p{ci::geometry(s), in, w, bias, out};
  if (p.rows() == 0) return;
  launch_gemm<T>(kernel, p, p.q.groups, whole_depth(p.depth()), stream);
}

}  // namespace

template <class T>
void conv2d_forward(const Conv2dShape& s, const T* input, const T* weight, const T* bias, T* output,
                    cudaStream_t stream) {
  one_pass<ci::ForwardGemm>("conv2d_forward", s, input, weight, bias, output, stream);
}

template <class T>
void conv2d_backward_input(const Conv2dShape& s, const T* grad_output, const T* weight, T* grad_input,
                           cudaStream_t stream) {
  one_pass<ci::DgradGemm>("conv2d_backward_input", s, grad_output, weight, static_cast<const T*>(nullptr),
                          grad_input, stream);
}

template <class T>
void conv2d_backward_weight(const Conv2dShape& s, const T* input, const T* grad_output, T* grad_weight,
                            cudaStream_t stream) {
  wgrad("conv2d_backward_weight", s, input, grad_output, grad_weight, stream);
}

template <class T>
void conv2d_backward_bias(int64_t N, int64_t C, int64_t HW, const T* grad_output, T* grad_bias,
                          cudaStream_t stream) {
  if (C == 0) return;
  bias_grad_kernel<T><<<rows::blocks_for(C), rows::threads_for(N * HW), 0, stream>>>(N, C, HW, grad_output, grad_bias);
  check_launch("conv2d_backward_bias");
}

template <class T>
void conv_transpose2d_forward(const ConvTranspose2dShape& s, const T* input, const T* weight, const T* bias,
                              T* output, cudaStream_t stream) {
  one_pass<ci::DgradGemm>("conv_transpose2d_forward", s.as_conv(), input, weight, bias, output, stream);
}

template <class T>
void conv_transpose2d_backward_input(const ConvTranspose2dShape& s, const T* grad_output, const T* weight,
                                     T* grad_input, cudaStream_t stream) {
  one_pass<ci::ForwardGemm>("conv_transpose2d_backward_input", s.as_conv(), grad_output, weight,
                            static_cast<const T*>(nullptr), grad_input, stream);
}

template <class T>
void conv_transpose2d_backward_weight(const ConvTranspose2dShape& s, const T* input, const T* grad_output,
                                      T* grad_weight, cudaStream_t stream) {
  wgrad("conv_transpose2d_backward_weight", s.as_conv(), grad_output, input, grad_weight, stream);
}

#define ND_INSTANTIATE_CONV(T)                                                                                  \
  template void conv2d_forward<T>(const Conv2dShape&, const T*, const T*, const T*, T*, cudaStream_t);          \
  template void conv2d_backward_input<T>(const Conv2dShape&, const T*, const T*, T*, cudaStream_t);             \
  template void conv2d_backward_weight<T>(const Conv2dShape&, const T*, const T*, T*, cudaStream_t);            \
  template void conv2d_backward_bias<T>(int64_t, int64_t, int64_t, const T*, T*, cudaStream_t);                 \
  template void conv_transpose2d_forward<T>(const ConvTranspose2dShape&, const T*, const T*, const T*, T*,      \
                                            cudaStream_t);                                                      \
  template void conv_transpose2d_backward_input<T>(const ConvTranspose2dShape&, const T*, const T*, T*,         \
                                                   cudaStream_t);                                               \
  template void conv_transpose2d_backward_weight<T>(const ConvTranspose2dShape&, const T*, const T*, T*,        \
                                                    cudaStream_t);
ND_INSTANTIATE_CONV(float)
ND_INSTANTIATE_CONV(double)
#undef ND_INSTANTIATE_CONV

}  // namespace nd::kernels::cuda
