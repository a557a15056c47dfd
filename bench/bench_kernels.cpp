// GPU op microbenchmarks: our ops, called through the public engine API on CUDA tensors
// (so what is timed is what a training step gets), against the library each should
// approach, at the shapes the models use.
//   conv2d fwd / dgrad / wgrad (DCGAN D at batch 64 and 256, three ResNet 3x3 layers) and
//   conv_transpose2d fwd / dgrad / wgrad (DCGAN G)       vs cuDNN: the fastest FP32 algorithm
//       from cudnnFind*Ex, one workspace for the whole run. A transposed conv is the conv
//       with input and output swapped, so its fwd is cuDNN's BackwardData, its dgrad
//       cuDNN's Forward and its wgrad BackwardFilter of that conv.   Target ratio >= 0.8.
//   batch_norm training fwd+bwd      vs cuDNN (ForwardTraining + Backward, spatial) and vs
//       a device-to-device copy that moves the same bytes.         Target >= 0.75 of copy.
//   layer_norm fwd+bwd, AdamW step (10M and 100M elements) vs a copy of the same bytes.
//                                                                  Target >= 0.8 of copy.
//   attention fwd and fwd+bwd, f32  GFLOP/s only (PyTorch side: bench_kernels_torch.py).
//   matmul                           vs raw cublasSgemm (a sanity check: ratio ~ 1).
//   copy 1 GiB                       the engine's copy_ vs cudaMemcpyAsync (the ceiling).
// ratio = baseline ms / our ms (> 1: ours is faster), one row of ours per baseline.
// FLOPs: 2 N C_out OH OW C_in k k per conv pass; attention 4 B H S S D forward and 2.5x
// that backward; matmul 2 M N K. Bytes (GB/s) are what each pass must move, in f32:
//   batch_norm 8 n: forward reads x for the statistics, then reads x and writes y;
//                   backward reads x, dy for the sums, then reads x, dy and writes dx.
//   layer_norm 5 n: forward reads x, writes y; backward reads x, dy, writes dx (rows stay
//                   on chip).   AdamW 7 n: reads param, grad, exp_avg, exp_avg_sq, writes
//                   the last three back.   A copy of B bytes moves 2 B (read + write), so
//                   "copy of the same bytes" copies half the counted bytes.
// Timing: everything runs on the device's compute stream (cuDNN and cuBLAS are bound to
// it). After a warm-up, each sample is `reps` back-to-back runs between two CUDA events,
// reps chosen so a sample lasts about 1 ms: the host runs ahead of the GPU, so the
// engine's host work (checks, allocation, autograd graph) shows only where it is slower
// than the kernels. Samples of the baselines and ours alternate; each row is the median.
// Caches stay warm, as in a training loop. Backward passes run through autograd: the
// graph is built once and replayed with retain_graph, the leaves' .grad cleared first.
// Output: a JSON line per row as soon as it is measured
//   {"op","shape","dtype","impl","ms","gflops","gbps","baseline","ratio"} (+ "note")
// then a table. A row that could not run has "ms":null and a note: "no CUDA kernel yet:
// <the engine's message>" for an op still without one, "error: ..." otherwise.
// Usage: bench_kernels [--device cuda[:N]] [NAME...]   NAME: a family of kFamilies below
// (default all). Without a usable GPU: "SKIPPED: no CUDA GPU (<reason>)", exit 0.
#include <nanoddp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/stream.h"

#ifdef NANODDP_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#ifdef NANODDP_BENCH_CUDNN
#include <cudnn.h>
#endif
#endif

namespace {

#ifdef NANODDP_WITH_CUDA
namespace cu = nd::kernels::cuda;

// ---- rows and output ------------------------------------------------------------------
struct Row {
  std::string op, shape, impl;
  double ms = 0, gflops = 0, gbps = 0;  // 0: not measured / not meaningful (null in JSON)
  std::string baseline;                 // impl of the row this one is compared to
  double ratio = 0;
  std::string note;  // why there is no time
};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\')
      out += {'\\', c};
    else if (static_cast<unsigned char>(c) < 0x20)
      out += ' ';
    else
      out += c;
  }
  return out + "\"";
}

std::string json_number(double v, const char* fmt) {
  if (v <= 0 || !std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

void print_json(const Row& r) {
  std::printf(
      "{\"op\":%s,\"shape\":%s,\"dtype\":\"f32\",\"impl\":%s,\"ms\":%s,\"gflops\":%s,\"gbps\":%s,"
      "\"baseline\":%s,\"ratio\":%s%s}\n",
      json_string(r.op).c_str(), json_string(r.shape).c_str(), json_string(r.impl).c_str(),
      json_number(r.ms, "%.5f").c_str(), json_number(r.gflops, "%.2f").c_str(), json_number(r.gbps, "%.2f").c_str(),
      r.baseline.empty() ? "null" : json_string(r.baseline).c_str(), json_number(r.ratio, "%.3f").c_str(),
      r.note.empty() ? "" : (",\"note\":" + json_string(r.note)).c_str());
  std::fflush(stdout);  // a phase timeout must not lose the rows already measured
}

// The targets for ours vs a baseline (0: none): ratio >= target.
double target(const Row& r) {
  const auto is = [&](const char* prefix) { return r.op.rfind(prefix, 0) == 0; };
  if (r.baseline == "cudnn" && (is("conv2d") || is("conv_transpose2d"))) return 0.8;
  if (r.baseline == "cudaMemcpy" && is("batch_norm")) return 0.75;
  if (r.baseline == "cudaMemcpy" && (is("layer_norm") || is("adamw"))) return 0.8;
  return 0;
}

// The human table; "below" marks a ratio under the target.
void print_table(const std::vector<Row>& rows) {
  std::printf("\n%-24s %-28s %-16s %9s %9s %8s %-11s %6s\n", "op", "shape", "impl", "ms", "GFLOP/s", "GB/s", "baseline",
              "ratio");
  for (const Row& r : rows) {
    std::printf("%-24s %-28s %-16s ", r.op.c_str(), r.shape.c_str(), r.impl.c_str());
    if (!r.note.empty()) {
      std::printf("%s\n", r.note.substr(0, 160).c_str());
      continue;
    }
    std::printf("%9.4f %9.1f %8.1f %-11s ", r.ms, r.gflops, r.gbps, r.baseline.empty() ? "-" : r.baseline.c_str());
    if (r.baseline.empty())
      std::printf("%6s\n", "-");
    else if (r.ratio < target(r))
      std::printf("%6.2f below the target %.2f\n", r.ratio, target(r));
    else
      std::printf("%6.2f\n", r.ratio);
  }
}

// A failed row's note, on one line.
std::string note_for(std::string what) {
  std::replace_if(
      what.begin(), what.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; }, ' ');
  return (what.find("no CUDA kernel") != std::string::npos ? "no CUDA kernel yet: " : "error: ") + what;
}

void check_cuda(cudaError_t status, const char* call) { cu::check(status, call, "bench_kernels"); }

// ---- the timing harness -----------------------------------------------------------------
using Run = std::function<void()>;

// One side of a comparison. prepare() allocates the inputs (and builds the autograd graph
// that the run replays) and returns the closure to time; it throws (nd::Error) when the
// side cannot run: an op without a CUDA kernel yet, cuDNN missing.
struct Impl {
  std::string name;
  std::function<Run()> prepare;
};

// What a row computes: GFLOP/s = flops / time, GB/s = bytes / time (0: not reported).
struct Work {
  std::string op, shape;
  double flops = 0, bytes = 0;
};

class Bench {
 public:
  static constexpr double kSampleMs = 1.0;   // one sample: back-to-back runs for about this long
  static constexpr double kCompareMs = 250;  // samples of all sides of one comparison
  static constexpr int kMinSamples = 3, kMaxSamples = 30, kMaxReps = 200;

  explicit Bench(int device) : device_(device), stream_(cu::use_device(device)) {
    check_cuda(cudaEventCreate(&start_), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~Bench() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;

  cudaStream_t stream() const { return stream_; }
  nd::TensorOptions options() const { return nd::TensorOptions(nd::Device(nd::kCUDA, device_)); }
  const std::vector<Row>& rows() const { return rows_; }

  // Times `ours` against each baseline (none: ours alone). Adds the baselines' rows, then
  // ours once per baseline that ran (with the ratio), or once alone.
  void compare(const Work& work, const std::vector<Impl>& baselines, const Impl& ours) {
    std::vector<Side> sides;
    for (const Impl& b : baselines) sides.push_back(start(b));
    sides.push_back(start(ours));
    double round_ms = 0;
    for (const Side& s : sides) round_ms += s.run ? s.reps * s.first_ms : 0;
    const int samples = std::clamp(int(kCompareMs / std::max(round_ms, 1e-3)), kMinSamples, kMaxSamples);
    for (int i = 0; i < samples; ++i)
      for (Side& s : sides) sample(s);
    const Side& us = sides.back();
    for (size_t i = 0; i + 1 < sides.size(); ++i) add(row(work, sides[i]));
    bool compared = false;
    for (size_t i = 0; i + 1 < sides.size() && us.run; ++i) {
      if (!sides[i].run) continue;
      Row r = row(work, us);
      r.baseline = sides[i].impl->name;
      r.ratio = median(sides[i].ms) / median(us.ms);
      add(r);
      compared = true;
    }
    if (!compared) add(row(work, us));
  }

 private:
  struct Side {
    const Impl* impl = nullptr;
    Run run;  // empty once the side failed
    std::string note;
    double first_ms = 0;
    int reps = 1;
    std::vector<double> ms;
  };

  // prepare, two warm-up runs, one timed run that sets reps.
  Side start(const Impl& impl) {
    Side s;
    s.impl = &impl;
    try {
      s.run = impl.prepare();
      s.run();
      s.run();
      s.first_ms = time_ms(s.run, 1);
      s.reps = std::clamp(int(std::ceil(kSampleMs / std::max(s.first_ms, 1e-4))), 1, kMaxReps);
    } catch (const std::exception& e) {
      fail(s, e.what());
    }
    return s;
  }

  void sample(Side& s) {
    if (!s.run) return;
    try {
      s.ms.push_back(time_ms(s.run, s.reps) / s.reps);
    } catch (const std::exception& e) {
      fail(s, e.what());
    }
  }

  void fail(Side& s, const std::string& what) {
    s.run = nullptr;
    s.note = note_for(what);
    cudaStreamSynchronize(stream_);  // let work queued before the failure finish
  }

  double time_ms(const Run& run, int reps) {
    check_cuda(cudaEventRecord(start_, stream_), "cudaEventRecord");
    for (int i = 0; i < reps; ++i) run();
    check_cuda(cudaEventRecord(stop_, stream_), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms;
  }

  static double median(std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  }

  static Row row(const Work& work, const Side& s) {
    Row r;
    r.op = work.op;
    r.shape = work.shape;
    r.impl = s.impl->name;
    if (!s.run) {
      r.note = s.note;
      return r;
    }
    r.ms = median(s.ms);
    r.gflops = work.flops / (r.ms * 1e6);
    r.gbps = work.bytes / (r.ms * 1e6);
    return r;
  }

  void add(const Row& r) {
    rows_.push_back(r);
    print_json(r);
  }

  int device_;
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  std::vector<Row> rows_;
};

// ---- inputs -------------------------------------------------------------------------------
// N(0, 1) values: one block of at most 1M drawn on the host, repeated on the device (the
// host's generator needs seconds for the 100M-element inputs; the kernels do not care).
nd::Tensor randn(const Bench& b, const nd::Shape& shape, bool requires_grad = false) {
  const int64_t n = nd::shape_numel(shape), block = std::min<int64_t>(n, int64_t(1) << 20);
  nd::Tensor t = n <= block ? nd::randn(shape, b.options())
                            : nd::randn({1, block}, b.options())
                                  .expand({(n + block - 1) / block, block})
                                  .contiguous()
                                  .flatten()
                                  .narrow(0, 0, n)
                                  .reshape(shape)
                                  .clone();
  t.requires_grad_(requires_grad);
  return t;
}
nd::Tensor full(const Bench& b, const nd::Shape& shape, double value, bool requires_grad = false) {
  nd::Tensor t = nd::empty(shape, b.options());
  t.fill_(value);
  t.requires_grad_(requires_grad);
  return t;
}
float* ptr(const nd::Tensor& t) { return t.data_ptr<float>(); }

// ---- what is timed: our passes through autograd, the copy baseline ----------------------------
// Replays backward from `out` (graph kept) after clearing the leaves' .grad, so that
// AccumulateGrad takes the fresh gradient instead of adding into an old one.
Run backward_replay(const nd::Tensor& out, const nd::Tensor& grad, const std::vector<nd::Tensor>& leaves) {
  return [=] {
    for (const nd::Tensor& t : leaves) t.set_grad(nd::Tensor());
    out.backward(grad, /*retain_graph=*/true);
  };
}

// A whole training pass: forward (recording the graph), then backward.
Run forward_backward(const std::function<nd::Tensor()>& forward, const nd::Tensor& grad,
                     const std::vector<nd::Tensor>& leaves) {
  return [=] {
    for (const nd::Tensor& t : leaves) t.set_grad(nd::Tensor());
    forward().backward(grad);
  };
}

// cudaMemcpyAsync of half of `bytes` (each byte is read and written): the ceiling for a
// pass that must move `bytes`.
Impl copy_of(Bench& b, double bytes) {
  return {"cudaMemcpy", [&b, bytes]() -> Run {
            const int64_t n = std::max<int64_t>(int64_t(bytes / 8), 1);  // f32 elements in bytes / 2
            const nd::Tensor src = nd::empty({n}, b.options()), dst = nd::empty({n}, b.options());
            const cudaStream_t stream = b.stream();
            return [=] {
              check_cuda(
                  cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), size_t(n) * 4, cudaMemcpyDeviceToDevice, stream),
                  "cudaMemcpyAsync");
            };
          }};
}

// ---- convolution ------------------------------------------------------------------------------
// The forward convolution behind a row: x [N, Cx, H, H] * w [Cy, Cx, k, k] -> y [N, Cy, O, O].
struct ConvGeom {
  int64_t N, Cx, H, Cy, k, s, p;
  int64_t out() const { return (H + 2 * p - k) / s + 1; }
  double flops() const { return 2.0 * N * Cy * out() * out() * Cx * k * k; }
  double bytes() const { return 4.0 * (N * Cx * H * H + N * Cy * out() * out() + Cy * Cx * k * k); }
};

enum class Pass { Fwd, Dgrad, Wgrad };
const char* pass_name(Pass p) { return p == Pass::Fwd ? "fwd" : p == Pass::Dgrad ? "dgrad" : "wgrad"; }

// A model's layer as the user writes it: Conv2d(C_in, C_out, k, s, p) or
// ConvTranspose2d(C_in, C_out, k, s, p) on [N, C_in, HW, HW] (square, no bias).
struct ConvLayer {
  int64_t N, C_in, C_out, HW, k, s, p;
  bool transposed;

  nd::Shape input_shape() const { return {N, C_in, HW, HW}; }
  nd::Shape weight_shape() const { return transposed ? nd::Shape{C_in, C_out, k, k} : nd::Shape{C_out, C_in, k, k}; }
  nd::Tensor forward(const nd::Tensor& x, const nd::Tensor& w) const {
    return transposed ? nd::conv_transpose2d(x, w, {}, {s}, {p}) : nd::conv2d(x, w, {}, {s}, {p});
  }
  // The conv whose dgrad this layer's forward is, when transposed (output_padding 0).
  ConvGeom geom() const {
    return transposed ? ConvGeom{N, C_out, (HW - 1) * s - 2 * p + k, C_in, k, s, p}
                      : ConvGeom{N, C_in, HW, C_out, k, s, p};
  }
  // The cuDNN pass that computes this layer's pass.
  Pass cudnn_pass(Pass pass) const {
    if (!transposed || pass == Pass::Wgrad) return pass;
    return pass == Pass::Fwd ? Pass::Dgrad : Pass::Fwd;
  }
  std::string op(Pass pass) const {
    return std::string(transposed ? "conv_transpose2d_" : "conv2d_") + pass_name(pass);
  }
  std::string shape() const {
    char buf[96];
    std::snprintf(buf, sizeof buf, "N=%ld %ld->%ld k%ld s%ld p%ld %ldx%ld", long(N), long(C_in), long(C_out), long(k),
                  long(s), long(p), long(HW), long(HW));
    return buf;
  }
};

// Ours: the forward op, or one backward pass through autograd (only x or only w needs a
// gradient, so ConvolutionBackward computes just that one).
Impl our_conv(Bench& b, const ConvLayer& layer, Pass pass) {
  return {layer.transposed ? "nd::conv_t2d" : "nd::conv2d", [&b, layer, pass]() -> Run {
            const nd::Tensor x = randn(b, layer.input_shape(), pass == Pass::Dgrad);
            const nd::Tensor w = randn(b, layer.weight_shape(), pass == Pass::Wgrad);
            if (pass == Pass::Fwd) return [=] { layer.forward(x, w); };
            const nd::Tensor y = layer.forward(x, w);
            return backward_replay(y, randn(b, y.sizes()), {pass == Pass::Dgrad ? x : w});
          }};
}

#ifdef NANODDP_BENCH_CUDNN
void check_cudnn(cudnnStatus_t status, const char* call) {
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
    return unavailable_.empty() ? "on (cuDNN " + std::to_string(cudnnGetVersion()) + ", FP32 FMA math)"
                                : "off: " + unavailable_;
  }

 private:
  cudnnHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::string unavailable_;
};

// NCHW f32 descriptors of one conv, FMA math (no TF32: our kernels are FP32).
struct ConvDescriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;

  explicit ConvDescriptors(const ConvGeom& g) {
    check_cudnn(cudnnCreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateTensorDescriptor(&y), "cudnnCreateTensorDescriptor");
    check_cudnn(cudnnCreateFilterDescriptor(&w), "cudnnCreateFilterDescriptor");
    check_cudnn(cudnnCreateConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor");
    const auto f32 = CUDNN_DATA_FLOAT;
    const int o = int(g.out());
    check_cudnn(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, f32, int(g.N), int(g.Cx), int(g.H), int(g.H)),
                "cudnnSetTensor4dDescriptor");
    check_cudnn(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, f32, int(g.N), int(g.Cy), o, o),
                "cudnnSetTensor4dDescriptor");
    check_cudnn(cudnnSetFilter4dDescriptor(w, f32, CUDNN_TENSOR_NCHW, int(g.Cy), int(g.Cx), int(g.k), int(g.k)),
                "cudnnSetFilter4dDescriptor");
    check_cudnn(cudnnSetConvolution2dDescriptor(conv, int(g.p), int(g.p), int(g.s), int(g.s), 1, 1,
                                                CUDNN_CROSS_CORRELATION, f32),
                "cudnnSetConvolution2dDescriptor");
    check_cudnn(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH), "cudnnSetConvolutionMathType");
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

// The fastest successful non-tensor-op result (cudnnFind* sorts by time).
template <class Perf>
Perf fastest(const Perf* perf, int n, const char* call) {
  for (int i = 0; i < n; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].mathType != CUDNN_TENSOR_OP_MATH &&
        perf[i].mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
      return perf[i];
  throw nd::Error(std::string("cuDNN baseline: ") + call + " found no FP32 algorithm within the " +
                  std::to_string(Cudnn::kWorkspaceBytes >> 20) + " MiB workspace (" + std::to_string(n) + " tried)");
}

// Runs cuDNN's benchmark `find(perf, kAlgos, &n)` and returns the closure that launches
// the fastest algorithm it found: launch(best).
template <class Perf, class Find, class Launch>
Run find_fastest(const char* find_call, Find&& find, Launch launch) {
  constexpr int kAlgos = 16;
  Perf perf[kAlgos];
  int n = 0;
  check_cudnn(find(perf, kAlgos, &n), find_call);
  const Perf best = fastest(perf, n, find_call);
  return [=] { launch(best); };
}

Impl cudnn_conv(Bench& b, const Cudnn& dnn, const ConvGeom& g, Pass pass) {
  return {"cudnn", [&b, &dnn, g, pass]() -> Run {
            const cudnnHandle_t h = dnn.handle();
            const auto d = std::make_shared<ConvDescriptors>(g);
            const nd::Tensor x = randn(b, {g.N, g.Cx, g.H, g.H}), w = randn(b, {g.Cy, g.Cx, g.k, g.k}),
                             y = randn(b, {g.N, g.Cy, g.out(), g.out()});
            void* ws = dnn.workspace();
            const size_t ws_bytes = Cudnn::kWorkspaceBytes;
            static const float one = 1.f, zero = 0.f;
            switch (pass) {
              case Pass::Fwd:  // y = conv(x, w)
                return find_fastest<cudnnConvolutionFwdAlgoPerf_t>(
                    "cudnnFindConvolutionForwardAlgorithmEx",
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
                    "cudnnFindConvolutionBackwardDataAlgorithmEx",
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
                "cudnnFindConvolutionBackwardFilterAlgorithmEx",
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
Impl cudnn_batch_norm(Bench& b, const Cudnn& dnn, int64_t N, int64_t C, int64_t HW) {
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
Impl cudnn_missing() {
  return {"cudnn", []() -> Run { throw nd::Error(Cudnn::kWhy); }};
}
Impl cudnn_conv(Bench&, const Cudnn&, const ConvGeom&, Pass) { return cudnn_missing(); }
Impl cudnn_batch_norm(Bench&, const Cudnn&, int64_t, int64_t, int64_t) { return cudnn_missing(); }
#endif

// ---- the row families ---------------------------------------------------------------------
struct Context {
  Bench& bench;
  const Cudnn& cudnn;
};

void bench_conv_layers(Context& c, const std::vector<ConvLayer>& layers) {
  for (const ConvLayer& layer : layers)
    for (Pass pass : {Pass::Fwd, Pass::Dgrad, Pass::Wgrad}) {
      const ConvGeom g = layer.geom();
      c.bench.compare({layer.op(pass), layer.shape(), g.flops(), g.bytes()},
                      {cudnn_conv(c.bench, c.cudnn, g, layer.cudnn_pass(pass))}, our_conv(c.bench, layer, pass));
    }
}

// DCGAN D (ndf 64) at batch 64 and 256, then ResNet basic-block convs at batch 32.
void bench_conv2d(Context& c) {
  std::vector<ConvLayer> layers;
  for (int64_t N : {64, 256}) {
    layers.push_back({N, 1, 64, 28, 4, 2, 1, false});    // D.main.0
    layers.push_back({N, 64, 128, 14, 4, 2, 1, false});  // D.main.2
    layers.push_back({N, 128, 1, 7, 7, 1, 0, false});    // D.main.5
  }
  layers.push_back({32, 64, 64, 56, 3, 1, 1, false});
  layers.push_back({32, 128, 128, 28, 3, 1, 1, false});
  layers.push_back({32, 256, 256, 14, 3, 1, 1, false});
  bench_conv_layers(c, layers);
}

// DCGAN G (nz 100, ngf 64) at batch 64 and 256.
void bench_conv_transpose2d(Context& c) {
  std::vector<ConvLayer> layers;
  for (int64_t N : {64, 256}) {
    layers.push_back({N, 100, 128, 1, 7, 1, 0, true});  // G.main.0 on z [N, 100, 1, 1]
    layers.push_back({N, 128, 64, 7, 4, 2, 1, true});   // G.main.3
    layers.push_back({N, 64, 1, 14, 4, 2, 1, true});    // G.main.6
  }
  bench_conv_layers(c, layers);
}

void bench_batch_norm(Context& c) {
  const int64_t shapes[][3] = {{256, 64, 14}, {64, 128, 7}, {256, 128, 7}, {32, 64, 56}};
  for (const auto& s : shapes) {
    const int64_t N = s[0], C = s[1], HW = s[2];
    Bench& b = c.bench;
    const double bytes = 8.0 * 4 * N * C * HW * HW;
    const Impl ours{"nd::batch_norm", [&b, N, C, HW]() -> Run {
                      const nd::Tensor x = randn(b, {N, C, HW, HW}, true), w = full(b, {C}, 1, true),
                                       bias = full(b, {C}, 0, true), rm = full(b, {C}, 0), rv = full(b, {C}, 1);
                      return forward_backward([=] { return nd::batch_norm(x, rm, rv, w, bias, /*training=*/true); },
                                              randn(b, x.sizes()), {x, w, bias});
                    }};
    const std::string shape =
        "N=" + std::to_string(N) + " C=" + std::to_string(C) + " " + std::to_string(HW) + "x" + std::to_string(HW);
    b.compare({"batch_norm_fwd_bwd", shape, 0, bytes}, {cudnn_batch_norm(b, c.cudnn, N, C, HW), copy_of(b, bytes)},
              ours);
  }
}

void bench_layer_norm(Context& c) {
  for (int64_t rows : {10240, 102400}) {  // x [rows, 1024]: 10M and 100M elements
    const int64_t D = 1024;
    Bench& b = c.bench;
    const double bytes = 5.0 * 4 * rows * D;
    const Impl ours{
        "nd::layer_norm", [&b, rows, D]() -> Run {
          const nd::Tensor x = randn(b, {rows, D}, true), w = full(b, {D}, 1, true), bias = full(b, {D}, 0, true);
          return forward_backward([=] { return nd::layer_norm(x, {D}, w, bias); }, randn(b, x.sizes()), {x, w, bias});
        }};
    b.compare({"layer_norm_fwd_bwd", "[" + std::to_string(rows) + ", 1024]", 0, bytes}, {copy_of(b, bytes)}, ours);
  }
}

void bench_adamw(Context& c) {
  for (int64_t n : {10'000'000, 100'000'000}) {
    Bench& b = c.bench;
    const double bytes = 7.0 * 4 * n;
    const Impl ours{"nd::AdamW", [&b, n]() -> Run {
                      const nd::Tensor p = full(b, {n}, 0.5, true);
                      p.set_grad(full(b, {n}, 1e-2));
                      auto opt =
                          std::make_shared<nd::optim::AdamW>(std::vector<nd::Tensor>{p}, nd::optim::AdamWOptions(1e-3));
                      return [opt] { opt->step(); };
                    }};
    b.compare({"adamw_step", "params=" + std::to_string(n), 0, bytes}, {copy_of(b, bytes)}, ours);
  }
}

// B H S D: a long sequence, then the MAE "small" encoder (12 visible patches + cls, 192
// wide, 6 heads) and decoder (49 patches + cls, 96 wide, 3 heads) at its batch of 128.
void bench_attention(Context& c) {
  const int64_t shapes[][4] = {{8, 8, 1024, 64}, {128, 6, 13, 32}, {128, 3, 50, 32}};
  for (const auto& s : shapes) {
    const nd::Shape shape{s[0], s[1], s[2], s[3]};
    Bench& b = c.bench;
    // bytes: forward reads q, k, v, writes out; backward also reads out, dout, writes dq, dk, dv
    const double fwd = 4.0 * s[0] * s[1] * s[2] * s[2] * s[3], tensor_bytes = 4.0 * s[0] * s[1] * s[2] * s[3];
    const std::string name = "B=" + std::to_string(s[0]) + " H=" + std::to_string(s[1]) + " S=" + std::to_string(s[2]) +
                             " D=" + std::to_string(s[3]);
    const Impl fwd_only{"nd::sdpa", [&b, shape]() -> Run {
                          const nd::Tensor q = randn(b, shape), k = randn(b, shape), v = randn(b, shape);
                          return [=] { nd::scaled_dot_product_attention(q, k, v); };
                        }};
    const Impl fwd_bwd{"nd::sdpa", [&b, shape]() -> Run {
                         const nd::Tensor q = randn(b, shape, true), k = randn(b, shape, true),
                                          v = randn(b, shape, true);
                         return forward_backward([=] { return nd::scaled_dot_product_attention(q, k, v); },
                                                 randn(b, shape), {q, k, v});
                       }};
    b.compare({"attention_fwd", name, fwd, 4 * tensor_bytes}, {}, fwd_only);
    b.compare({"attention_fwd_bwd", name, 3.5 * fwd, 12 * tensor_bytes}, {}, fwd_bwd);
  }
}

// Our matmul (cuBLAS underneath) vs the bare cublasSgemm call: what the engine adds.
void bench_matmul(Context& c) {
  Bench& b = c.bench;
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) handle = nullptr;
  std::unique_ptr<cublasContext, void (*)(cublasHandle_t)> guard(handle, [](cublasHandle_t h) { cublasDestroy(h); });
  if (handle) cublasSetStream(handle, b.stream());
  // M N K: square, then the MAE small encoder MLP (128 x 13 tokens, 192 -> 768) and decoder MLP (128 x 50, 384 -> 96).
  const int64_t shapes[][3] = {{2048, 2048, 2048}, {4096, 4096, 4096}, {1664, 768, 192}, {6400, 96, 384}};
  for (const auto& s : shapes) {
    const int64_t M = s[0], N = s[1], K = s[2];
    const Impl sgemm{"cublasSgemm", [&b, handle, M, N, K]() -> Run {
                       if (!handle) throw nd::Error("cublasCreate failed");
                       const nd::Tensor A = randn(b, {M, K}), B = randn(b, {K, N}), C = randn(b, {M, N});
                       return [=] {  // row-major C = A B is column-major C^T = B^T A^T
                         static const float one = 1.f, zero = 0.f;
                         const cublasStatus_t st =
                             cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M), int(K), &one, ptr(B), int(N),
                                         ptr(A), int(K), &zero, ptr(C), int(N));
                         if (st != CUBLAS_STATUS_SUCCESS)
                           throw nd::Error(std::string("cublasSgemm failed: ") + cublasGetStatusString(st));
                       };
                     }};
    const Impl ours{"nd::matmul", [&b, M, N, K]() -> Run {
                      const nd::Tensor A = randn(b, {M, K}), B = randn(b, {K, N});
                      return [=] { A.matmul(B); };
                    }};
    b.compare({"matmul", "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K),
               2.0 * M * N * K, 4.0 * (M * K + K * N + M * N)},
              {sgemm}, ours);
  }
}

// 1 GiB device-to-device: the bandwidth every GB/s row is compared to.
void bench_copy(Context& c) {
  Bench& b = c.bench;
  const int64_t n = int64_t(1) << 28;  // f32 elements in 1 GiB
  const double bytes = 2.0 * 4 * n;
  const Impl ours{"nd::copy_", [&b, n]() -> Run {
                    const nd::Tensor src = nd::empty({n}, b.options()), dst = nd::empty({n}, b.options());
                    return [=] { dst.copy_(src); };
                  }};
  b.compare({"copy", "1 GiB", 0, bytes}, {copy_of(b, bytes)}, ours);
}

struct Family {
  const char* name;
  void (*run)(Context&);
};
const Family kFamilies[] = {
    {"copy", bench_copy},
    {"matmul", bench_matmul},
    {"conv2d", bench_conv2d},
    {"conv_transpose2d", bench_conv_transpose2d},
    {"batch_norm", bench_batch_norm},
    {"layer_norm", bench_layer_norm},
    {"adamw", bench_adamw},
    {"attention", bench_attention},
};

int run_benchmarks(int device, const std::vector<std::string>& names) {
  for (const std::string& name : names)
    if (std::none_of(std::begin(kFamilies), std::end(kFamilies), [&](const Family& f) { return name == f.name; })) {
      std::fprintf(stderr, "bench_kernels: unknown benchmark '%s'; expected one of:", name.c_str());
      for (const Family& f : kFamilies) std::fprintf(stderr, " %s", f.name);
      std::fprintf(stderr, "\n");
      return 2;
    }
  Bench bench(device);
  Cudnn cudnn(bench.stream());
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  std::printf("bench_kernels: cuda:%d %s (%d SMs, %.0f GiB); cuDNN baselines %s; TF32 off\n", device, prop.name,
              prop.multiProcessorCount, double(prop.totalGlobalMem) / (1 << 30), cudnn.status().c_str());
  std::printf("bench_kernels: ratio = baseline ms / our ms; medians of back-to-back runs between CUDA events\n");
  std::fflush(stdout);
  Context context{bench, cudnn};
  for (const Family& f : kFamilies)
    if (names.empty() || std::find(names.begin(), names.end(), f.name) != names.end()) {
      std::fprintf(stderr, "bench_kernels: %s\n", f.name);
      f.run(context);
    }
  print_table(bench.rows());
  return 0;
}
#endif  // NANODDP_WITH_CUDA

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cuda";
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf(
          "usage: bench_kernels [--device cuda[:N]] [NAME...]\n"
          "Times our CUDA ops against cuDNN / cuBLAS / cudaMemcpy; prints JSON lines and a table.\n"
          "NAME: copy matmul conv2d conv_transpose2d batch_norm layer_norm adamw attention (default: all)\n");
      return 0;
    }
    if (arg == "--device" && i + 1 < argc)
      device = argv[++i];
    else
      names.push_back(arg);
  }
  try {
    const nd::Device dev(device);
    if (!dev.is_cuda())
      throw nd::Error("bench_kernels times CUDA ops: expected --device cuda or cuda:N, found " + device);
    try {
      nd::cuda::check_device(dev);
    } catch (const nd::Error& e) {
      std::printf("SKIPPED: no CUDA GPU (%s)\n", e.what());
      return 0;
    }
#ifdef NANODDP_WITH_CUDA
    return run_benchmarks(dev.index, names);
#else
    return 0;  // check_device refuses every CUDA device in a build without CUDA
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 1;
  }
}
