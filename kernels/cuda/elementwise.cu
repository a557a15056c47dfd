// Elementwise CUDA kernels: one thread per output element (grid-stride), operands read
// through their strides, so broadcasting (stride 0) and views cost no copy. The math
// mirrors kernels/cpu/elementwise.cpp line for line; tests/cuda/cuda_ops_test.cpp
// compares the two on random data.
#include "kernels/cuda/elementwise.h"

#include "kernels/cuda/strided.cuh"

namespace nd::kernels::cuda {

namespace {

using detail::Indexer;
using detail::kThreads;

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kSqrt2_Pi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

template <class T>
__device__ T apply_unary(UnaryOp op, UnaryParams p, T x) {
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return exp(x);
    case UnaryOp::log: return log(x);
    case UnaryOp::sqrt: return sqrt(x);
    case UnaryOp::rsqrt: return T(1) / sqrt(x);
    case UnaryOp::abs: return fabs(x);
    case UnaryOp::tanh: return tanh(x);
    case UnaryOp::sigmoid: return T(1) / (T(1) + exp(-x));
    case UnaryOp::relu: return x > T(0) ? x : T(0);
    case UnaryOp::leaky_relu: return x > T(0) ? x : x * T(p.a);
    case UnaryOp::gelu: return x * T(0.5) * (T(1) + erf(x * T(kSqrt1_2)));
    case UnaryOp::gelu_tanh: return T(0.5) * x * (T(1) + tanh(T(kSqrt2_Pi) * (x + T(0.044715) * x * x * x)));
    case UnaryOp::clamp: {  // min(max(x, a), b) as std::min/std::max: NaN stays NaN
      const T lo = x < T(p.a) ? T(p.a) : x;
      return T(p.b) < lo ? T(p.b) : lo;
    }
  }
  return x;
}

// d op(x) / dx, given x and y = op(x).
template <class T>
__device__ T derivative(UnaryOp op, UnaryParams p, T x, T y) {
  switch (op) {
    case UnaryOp::neg: return T(-1);
    case UnaryOp::exp: return y;
    case UnaryOp::log: return T(1) / x;
    case UnaryOp::sqrt: return T(0.5) / y;
    case UnaryOp::rsqrt: return T(-0.5) * y * y * y;
    case UnaryOp::abs: return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
    case UnaryOp::tanh: return T(1) - y * y;
    case UnaryOp::sigmoid: return y * (T(1) - y);
    case UnaryOp::relu: return x > T(0) ? T(1) : T(0);
    case UnaryOp::leaky_relu: return x > T(0) ? T(1) : T(p.a);
    case UnaryOp::gelu: {  // Phi(x) + x * phi(x)
      const T cdf = T(0.5) * (T(1) + erf(x * T(kSqrt1_2)));
      const T pdf = exp(T(-0.5) * x * x) * T(kInvSqrt2Pi);
      return cdf + x * pdf;
    }
    case UnaryOp::gelu_tanh: {
      const T u = T(kSqrt2_Pi) * (x + T(0.044715) * x * x * x);
      const T th = tanh(u);
      const T du = T(kSqrt2_Pi) * (T(1) + T(3 * 0.044715) * x * x);
      return T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du;
    }
    case UnaryOp::clamp: return (x >= T(p.a) && x <= T(p.b)) ? T(1) : T(0);
  }
  return T(1);
}

template <class T>
__device__ T apply_binary(BinaryOp op, T alpha, T a, T b) {
  switch (op) {
    case BinaryOp::add: return a + alpha * b;
    case BinaryOp::sub: return a - alpha * b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::pow: return pow(a, b);
    case BinaryOp::maximum: return (a != a || a > b) ? a : b;  // NaN propagates
    case BinaryOp::minimum: return (a != a || a < b) ? a : b;
  }
  return a;
}

template <class T>
__device__ bool apply_compare(CompareOp op, T a, T b) {
  switch (op) {
    case CompareOp::eq: return a == b;
    case CompareOp::ne: return a != b;
    case CompareOp::lt: return a < b;
    case CompareOp::le: return a <= b;
    case CompareOp::gt: return a > b;
    case CompareOp::ge: return a >= b;
  }
  return false;
}

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
                          const int64_t*, T*, const int64_t*, cudaStream_t);
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
