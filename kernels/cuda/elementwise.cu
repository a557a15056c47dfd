// Elementwise CUDA kernels: one thread per output element (grid-stride), operands read
// through their strides, so broadcasting (stride 0) and views cost no copy. The scalar
// math is kernels/common/elementwise_math.h, shared with kernels/cpu/elementwise.cpp;
// tests/cuda/cuda_ops_test.cpp compares the two on random data.
#include "kernels/cuda/elementwise.h"

#include "kernels/cuda/strided.cuh"

namespace nd::kernels::cuda {

namespace {

using detail::Indexer;
using detail::kThreads;

using math::apply_binary;
using math::apply_compare;
using math::apply_unary;
using math::derivative;

template <class T>
__global__ void unary_kernel(UnaryOp op, UnaryParams p, int64_t n, Indexer<2> ix, const T* x, T* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    out[off[1]] = apply_unary(op, p, x[off[0]]);
  }
}

template <class T>
__global__ void unary_backward_kernel(UnaryOp op, UnaryParams p, int64_t n, const T* x, const T* y, const T* dy,
                                      T* dx) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = dy[i] * derivative(op, p, x[i], y[i]);
}

template <class T>
__global__ void binary_kernel(BinaryOp op, T alpha, int64_t n, Indexer<3> ix, const T* a, const T* b, T* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[3];
    ix.offsets(i, off);
    out[off[2]] = apply_binary(op, alpha, a[off[0]], b[off[1]]);
  }
}

template <class T>
__global__ void binary_scalar_kernel(BinaryOp op, int64_t n, Indexer<2> ix, const T* a, T s, bool scalar_first,
                                     T* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    const T av = a[off[0]];
    out[off[1]] = scalar_first ? apply_binary(op, T(1), s, av) : apply_binary(op, T(1), av, s);
  }
}

template <class T>
__global__ void compare_kernel(CompareOp op, int64_t n, Indexer<2> ix, const T* a, const T* b, bool* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    out[i] = apply_compare(op, a[off[0]], b[off[1]]);
  }
}

}  // namespace

template <class T>
void unary(UnaryOp op, UnaryParams p, int64_t ndim, const int64_t* shape, const T* x, const int64_t* x_strides,
           T* out, const int64_t* out_strides, cudaStream_t stream) {
  const int64_t n = detail::numel(ndim, shape);
  if (n == 0) return;
  const auto ix = detail::make_indexer<2>("unary", ndim, shape, {x_strides, out_strides});
  unary_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(op, p, n, ix, x, out);
  check_launch("unary");
}

template <class T>
void unary_backward(UnaryOp op, UnaryParams p, int64_t n, const T* x, const T* y, const T* dy, T* dx,
                    cudaStream_t stream) {
  if (n == 0) return;
  unary_backward_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(op, p, n, x, y, dy, dx);
  check_launch("unary_backward");
}

template <class T>
void binary(BinaryOp op, T alpha, int64_t ndim, const int64_t* shape, const T* a, const int64_t* a_strides,
            const T* b, const int64_t* b_strides, T* out, const int64_t* out_strides, cudaStream_t stream) {
  const int64_t n = detail::numel(ndim, shape);
  if (n == 0) return;
  const auto ix = detail::make_indexer<3>("binary", ndim, shape, {a_strides, b_strides, out_strides});
  binary_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(op, alpha, n, ix, a, b, out);
  check_launch("binary");
}

template <class T>
void binary_scalar(BinaryOp op, int64_t ndim, const int64_t* shape, const T* a, const int64_t* a_strides, T s,
                   bool scalar_first, T* out, const int64_t* out_strides, cudaStream_t stream) {
  const int64_t n = detail::numel(ndim, shape);
  if (n == 0) return;
  const auto ix = detail::make_indexer<2>("binary_scalar", ndim, shape, {a_strides, out_strides});
  binary_scalar_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(op, n, ix, a, s, scalar_first, out);
  check_launch("binary_scalar");
}

template <class T>
void compare(CompareOp op, int64_t ndim, const int64_t* shape, const T* a, const int64_t* a_strides, const T* b,
             const int64_t* b_strides, bool* out, cudaStream_t stream) {
  const int64_t n = detail::numel(ndim, shape);
  if (n == 0) return;
  const auto ix = detail::make_indexer<2>("compare", ndim, shape, {a_strides, b_strides});
  compare_kernel<T><<<detail::blocks_for(n), kThreads, 0, stream>>>(op, n, ix, a, b, out);
  check_launch("compare");
}

#define ND_FLOAT(T)                                                                                          \
  template void unary<T>(UnaryOp, UnaryParams, int64_t, const int64_t*, const T*, const int64_t*, T*,        \
                         const int64_t*, cudaStream_t);                                                      \
  template void unary_backward<T>(UnaryOp, UnaryParams, int64_t, const T*, const T*, const T*, T*,           \
                                  cudaStream_t);                                                             \
  template void binary<T>(BinaryOp, T, int64_t, const int64_t*, const T*, const int64_t*, const T*,          \
                          const int64_t*, T*, const int64_t*, cudaStream_t);                         \
  template void binary_scalar<T>(BinaryOp, int64_t, const int64_t*, const T*, const int64_t*, T, bool, T*,   \
                                 const int64_t*, cudaStream_t);
#define ND_COMPARE(T)                                                                                        \
  template void compare<T>(CompareOp, int64_t, const int64_t*, const T*, const int64_t*, const T*,           \
                           const int64_t*, bool*, cudaStream_t);
ND_FLOAT(float)
ND_FLOAT(double)
ND_COMPARE(float)
ND_COMPARE(double)
ND_COMPARE(int64_t)
ND_COMPARE(int32_t)
ND_COMPARE(uint8_t)
ND_COMPARE(bool)

}  // namespace nd::kernels::cuda
