// The libraries bench_kernels compares our ops with: cuDNN (conv2d fwd / dgrad / wgrad at
// its fastest FP32 algorithm from cudnnFind*Ex, or for the autocast rows its fastest on bf16
// tensors with f32 compute and tensor-op math; batch norm training fwd + bwd) and cuBLAS
// (a bare cublasSgemm), each an Impl of the timing harness (cuda_timing.h) bound to the
// bench stream. cuDNN is compiled in only with NANODDP_BENCH_CUDNN (bench/CMakeLists.txt
// defines it when cudnn.h and libcudnn are found); without it the cuDNN rows say why.
// Only bench_kernels includes it, in a build with CUDA.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nanoddp.h>

#include <memory>
#include <string>

#include "cuda_timing.h"

#ifdef NANODDP_BENCH_CUDNN
#include <cudnn.h>
#endif

namespace nd::bench {

// ---- convolution geometry ------------------------------------------------------------------
// The forward convolution behind a row: x [N, Cx, H, H] * w [Cy, Cx, k, k] -> y [N, Cy, O, O].
struct ConvGeom {
  int64_t N, Cx, H, Cy, k, s, p;
  int64_t out() const { return (H + 2 * p - k) / s + 1; }
  double flops() const { return 2.0 * N * Cy * out() * out() * Cx * k * k; }
  double bytes() const { return 4.0 * (N * Cx * H * H + N * Cy * out() * out() + Cy * Cx * k * k); }
};

enum class Pass { Fwd, Dgrad, Wgrad };
inline const char* pass_name(Pass p) { return p == Pass::Fwd ? "fwd" : p == Pass::Dgrad ? "dgrad" : "wgrad"; }

// ---- cuBLAS ---------------------------------------------------------------------------------
// The run's cuBLAS handle on the bench stream; a failed cublasCreate fails the rows that
// need the handle, not the run.
class Cublas {
 public:
  explicit Cublas(cudaStream_t stream) {
    if (cublasCreate(&handle_) != CUBLAS_STATUS_SUCCESS)
      handle_ = nullptr;
    else
      cublasSetStream(handle_, stream);
  }
  ~Cublas() {
    if (handle_) cublasDestroy(handle_);
  }
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;

  cublasHandle_t handle() const {
    if (!handle_) throw nd::Error("cublasCreate failed");
    return handle_;
  }

 private:
  cublasHandle_t handle_ = nullptr;
};

// Row-major C [M, N] = A [M, K] B [K, N] with one cublasSgemm call.
inline Impl cublas_sgemm(Bench& b, const Cublas& blas, int64_t M, int64_t N, int64_t K) {
  return {"cublasSgemm", [&b, &blas, M, N, K]() -> Run {
            const cublasHandle_t handle = blas.handle();
            const nd::Tensor A = randn(b, {M, K}), B = randn(b, {K, N}), C = randn(b, {M, N});
            return [=] {  // row-major C = A B is column-major C^T = B^T A^T
              static const float one = 1.f, zero = 0.f;
              const cublasStatus_t st = cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M), int(K), &one,
                                                    ptr(B), int(N), ptr(A), int(K), &zero, ptr(C), int(N));
              if (st != CUBLAS_STATUS_SUCCESS)
                throw nd::Error(std::string("cublasSgemm failed: ") + cublasGetStatusString(st));
            };
          }};
}

// ---- cuDNN ----------------------------------------------------------------------------------
#ifdef NANODDP_BENCH_CUDNN
inline void check_cudnn(cudnnStatus_t status, const char* call) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw nd::Error(std::string("cuDNN baseline: ") + call + " failed: " + cudnnGetErrorString(status));
}

// The run's cuDNN handle on the bench stream, and the one workspace every algorithm gets.
class Cudnn {
 public:
  static constexpr size_t kWorkspaceBytes = size_t(512) << 20;
  explicit Cudnn(cudaStream_t stream) {
    try {
      check_cudnn(cudnnCreate(&handle_), "cudnnCreate");
      check_cudnn(cudnnSetStream(handle_, stream), "cudnnSetStream");
      check_cuda(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc (cuDNN workspace)");
    } catch (const nd::Error& e) {
      unavailable_ = e.what();
    }
  }
  ~Cudnn() {
    if (workspace_) cudaFree(workspace_);
    if (handle_) cudnnDestroy(handle_);
  }
  Cudnn(const Cudnn&) = delete;
  Cudnn& operator=(const Cudnn&) = delete;

  cudnnHandle_t handle() const {
    if (!unavailable_.empty()) throw nd::Error(unavailable_);
    return handle_;
  }
  void* workspace() const { return workspace_; }
  std::string status() const {
    return unavailable_.empty() ? "on (cuDNN " + std::to_string(cudnnGetVersion()) +
                                      ", FP32 FMA math; bf16 tensor-op math for the autocast rows)"
                                : "off: " + unavailable_;
  }

 private:
  cudnnHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::string unavailable_;
};

// NCHW descriptors of one conv with f32 compute: f32 tensors and FMA math (no TF32: our
// kernels are FP32), or bf16 tensors and tensor-op math (the autocast rows).
struct ConvDescriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;

  ConvDescriptors(const ConvGeom& g, bool bf16) {
    check_cudnn(cudnnCreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateTensorDescriptor(&y), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateFilterDescriptor(&w), "cudnnCreateFilterDescriptor");
    check_cudnn(cudnnCreateConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor");
    const auto data = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    const int o = int(g.out());
    check_cudnn(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, data, int(g.N), int(g.Cx), int(g.H), int(g.H)),
                "cudnnSetTensor4dDescriptor");
    check_cudnn(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, data, int(g.N), int(g.Cy), o, o),
                "cudnnSetTensor4dDescriptor");
    check_cudnn(cudnnSetFilter4dDescriptor(w, data, CUDNN_TENSOR_NCHW, int(g.Cy), int(g.Cx), int(g.k), int(g.k)),
                "cudnnSetFilter4dDescriptor");
    check_cudnn(cudnnSetConvolution2dDescriptor(conv, int(g.p), int(g.p), int(g.s), int(g.s), 1, 1,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                "cudnnSetConvolution2dDescriptor");
    check_cudnn(cudnnSetConvolutionMathType(conv, bf16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH),
                "cudnnSetConvolutionMathType");
  }
  ~ConvDescriptors() {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
  ConvDescriptors(const ConvDescriptors&) = delete;
  ConvDescriptors& operator=(const ConvDescriptors&) = delete;
};

// The fastest successful result (cudnnFind* sorts by time); for f32 data, among the
// non-tensor-op ones.
template <class Perf>
inline Perf fastest(const Perf* perf, int n, const char* call, bool tensor_ops) {
  for (int i = 0; i < n; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS &&
        (tensor_ops || (perf[i].mathType != CUDNN_TENSOR_OP_MATH &&
                        perf[i].mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)))
      return perf[i];
  throw nd::Error(std::string("cuDNN baseline: ") + call + " found no " + (tensor_ops ? "bf16" : "FP32") +
                  " algorithm within the " + std::to_string(Cudnn::kWorkspaceBytes >> 20) + " MiB workspace (" +
                  std::to_string(n) + " tried)");
}

// Runs cuDNN's benchmark `find(perf, kAlgos, &n)` and returns the closure that launches
// the fastest algorithm it found: launch(best).
template <class Perf, class Find, class Launch>
inline Run find_fastest(const char* find_call, bool tensor_ops, Find&& find, Launch launch) {
  constexpr int kAlgos = 16;
  Perf perf[kAlgos];
  int n = 0;
  check_cudnn(find(perf, kAlgos, &n), find_call);
  const Perf best = fastest(perf, n, find_call, tensor_ops);
  return [=] { launch(best); };
}

// bf16: the tensors are bf16 and cuDNN computes in f32 on tensor cores (what torch.autocast
// runs), the baseline of our autocast rows.
inline Impl cudnn_conv(Bench& b, const Cudnn& dnn, const ConvGeom& g, Pass pass, bool bf16 = false) {
  return {bf16 ? "cudnn_bf16" : "cudnn", [&b, &dnn, g, pass, bf16]() -> Run {
            const cudnnHandle_t h = dnn.handle();
            const auto d = std::make_shared<ConvDescriptors>(g, bf16);
            const auto data = [&](const nd::Shape& shape) {
              const nd::Tensor t = randn(b, shape);
              return bf16 ? t.to(nd::kBFloat16) : t;
            };
            const nd::Tensor x = data({g.N, g.Cx, g.H, g.H}), w = data({g.Cy, g.Cx, g.k, g.k}),
                             y = data({g.N, g.Cy, g.out(), g.out()});
            const auto ptr = [](const nd::Tensor& t) { return t.data_ptr(); };  // f32 or bf16
            void* ws = dnn.workspace();
            const size_t ws_bytes = Cudnn::kWorkspaceBytes;
            static const float one = 1.f, zero = 0.f;
            switch (pass) {
              case Pass::Fwd:  // y = conv(x, w)
                return find_fastest<cudnnConvolutionFwdAlgoPerf_t>(
                    "cudnnFindConvolutionForwardAlgorithmEx", bf16,
                    [&](auto* perf, int count, int* n) {
                      return cudnnFindConvolutionForwardAlgorithmEx(h, d->x, ptr(x), d->w, ptr(w), d->conv, d->y,
                                                                    ptr(y), count, n, perf, ws, ws_bytes);
                    },
                    [=](const auto& best) {
                      check_cudnn(cudnnConvolutionForward(h, &one, d->x, ptr(x), d->w, ptr(w), d->conv, best.algo, ws,
                                                          best.memory, &zero, d->y, ptr(y)),
                                  "cudnnConvolutionForward");
                    });
              case Pass::Dgrad:  // x = dgrad(y, w)
                return find_fastest<cudnnConvolutionBwdDataAlgoPerf_t>(
                    "cudnnFindConvolutionBackwardDataAlgorithmEx", bf16,
                    [&](auto* perf, int count, int* n) {
                      return cudnnFindConvolutionBackwardDataAlgorithmEx(h, d->w, ptr(w), d->y, ptr(y), d->conv, d->x,
                                                                         ptr(x), count, n, perf, ws, ws_bytes);
                    },
                    [=](const auto& best) {
                      check_cudnn(cudnnConvolutionBackwardData(h, &one, d->w, ptr(w), d->y, ptr(y), d->conv, best.algo,
                                                               ws, best.memory, &zero, d->x, ptr(x)),
                                  "cudnnConvolutionBackwardData");
                    });
              case Pass::Wgrad:  // w = wgrad(x, y)
                break;
            }
            return find_fastest<cudnnConvolutionBwdFilterAlgoPerf_t>(
                "cudnnFindConvolutionBackwardFilterAlgorithmEx", bf16,
                [&](auto* perf, int count, int* n) {
                  return cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d->x, ptr(x), d->y, ptr(y), d->conv, d->w,
                                                                       ptr(w), count, n, perf, ws, ws_bytes);
                },
                [=](const auto& best) {
                  check_cudnn(cudnnConvolutionBackwardFilter(h, &one, d->x, ptr(x), d->y, ptr(y), d->conv, best.algo,
                                                             ws, best.memory, &zero, d->w, ptr(w)),
                              "cudnnConvolutionBackwardFilter");
                });
          }};
}

// cuDNN batch norm, spatial mode: ForwardTraining (updates running stats, saves mean and
// inverse std) then Backward (dx, dscale, dbias) on x [N, C, HW, HW].
inline Impl cudnn_batch_norm(Bench& b, const Cudnn& dnn, int64_t N, int64_t C, int64_t HW) {
  return {"cudnn", [&b, &dnn, N, C, HW]() -> Run {
            const cudnnHandle_t h = dnn.handle();
            struct Descriptors {
              cudnnTensorDescriptor_t x = nullptr, bn = nullptr;
              ~Descriptors() {
                if (bn) cudnnDestroyTensorDescriptor(bn);
                if (x) cudnnDestroyTensorDescriptor(x);
              }
            };
            const auto d = std::make_shared<Descriptors>();
            const auto mode = CUDNN_BATCHNORM_SPATIAL;
            check_cudnn(cudnnCreateTensorDescriptor(&d->x), "cudnnCreateTensorDescriptor");
            check_cudnn(cudnnCreateTensorDescriptor(&d->bn), "cudnnCreateTensorDescriptor");
            check_cudnn(
                cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(N), int(C), int(HW), int(HW)),
                "cudnnSetTensor4dDescriptor");
            check_cudnn(cudnnDeriveBNTensorDescriptor(d->bn, d->x, mode), "cudnnDeriveBNTensorDescriptor");
            const nd::Shape shape{N, C, HW, HW};
            const nd::Tensor x = randn(b, shape), y = randn(b, shape), dy = randn(b, shape), dx = randn(b, shape);
            const nd::Tensor scale = full(b, {C}, 1), bias = full(b, {C}, 0), mean = full(b, {C}, 0),
                             var = full(b, {C}, 1), saved_mean = full(b, {C}, 0), saved_invstd = full(b, {C}, 1),
                             dscale = full(b, {C}, 0), dbias = full(b, {C}, 0);
            static const float one = 1.f, zero = 0.f;
            return [=] {
              check_cudnn(cudnnBatchNormalizationForwardTraining(h, mode, &one, &zero, d->x, ptr(x), d->x, ptr(y),
                                                                 d->bn, ptr(scale), ptr(bias), 0.1, ptr(mean), ptr(var),
                                                                 1e-5, ptr(saved_mean), ptr(saved_invstd)),
                          "cudnnBatchNormalizationForwardTraining");
              check_cudnn(cudnnBatchNormalizationBackward(h, mode, &one, &zero, &one, &zero, d->x, ptr(x), d->x,
                                                          ptr(dy), d->x, ptr(dx), d->bn, ptr(scale), ptr(dscale),
                                                          ptr(dbias), 1e-5, ptr(saved_mean), ptr(saved_invstd)),
                          "cudnnBatchNormalizationBackward");
            };
          }};
}
#else
// Built without cuDNN: the baseline rows say so.
class Cudnn {
 public:
  explicit Cudnn(cudaStream_t) {}
  std::string status() const { return "off: " + std::string(kWhy); }
  static constexpr const char* kWhy =
      "cuDNN baseline not built (cudnn.h or libcudnn not found when bench/ was configured)";
};
inline Impl cudnn_missing(const char* name = "cudnn") {
  return {name, []() -> Run { throw nd::Error(Cudnn::kWhy); }};
}
inline Impl cudnn_conv(Bench&, const Cudnn&, const ConvGeom&, Pass, bool bf16 = false) {
  return cudnn_missing(bf16 ? "cudnn_bf16" : "cudnn");
}
inline Impl cudnn_batch_norm(Bench&, const Cudnn&, int64_t, int64_t, int64_t) { return cudnn_missing(); }
#endif

}  // namespace nd::bench
