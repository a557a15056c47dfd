// The CUDA timing harness of bench_kernels: rows, the Bench that times one side against
// its baselines, the inputs, and what the passes are timed through (autograd replay, a
// copy of the same bytes). Only bench_kernels includes it, in a build with CUDA.
// Timing: everything runs on the device's compute stream (cuDNN and cuBLAS are bound to
// it). After a warm-up, each sample is `reps` back-to-back runs between two CUDA events,
// reps chosen so a sample lasts about 1 ms: the host runs ahead of the GPU, so the
// engine's host work (checks, allocation, autograd graph) shows only where it is slower
// than the kernels. Samples of the baselines and ours alternate; each row is the median.
// Caches stay warm, as in a training loop. Backward passes run through autograd: the
// graph is built once and replayed with retain_graph, the leaves' .grad cleared first.
#pragma once

#include <cuda_runtime.h>
#include <nanoddp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "json_line.h"
#include "kernels/cuda/stream.h"

namespace nd::bench {

namespace cu = nd::kernels::cuda;

// ---- rows and output ------------------------------------------------------------------
struct Row {
  std::string op, shape, dtype = "f32", impl;
  double ms = 0, gflops = 0, gbps = 0;  // 0: not measured / not meaningful (null in JSON)
  std::string baseline;                 // impl of the row this one is compared to
  double ratio = 0;
  std::string note;  // why there is no time
};

// The row's JSON line, printed as soon as it is measured (a phase timeout must not lose
// the rows already measured): unmeasured numbers are null, "note" only when there is one.
inline void print_json(const Row& r) {
  JsonLine line = JsonLine::row(r.op, r.shape, r.dtype, r.impl)
                      .positive_or_null("ms", r.ms, "%.5f")
                      .positive_or_null("gflops", r.gflops, "%.2f")
                      .positive_or_null("gbps", r.gbps, "%.2f")
                      .text_or_null("baseline", r.baseline)
                      .positive_or_null("ratio", r.ratio, "%.3f");
  if (!r.note.empty()) line.text("note", r.note);
  line.print();
}

// A failed row's note, on one line.
inline std::string note_for(std::string what) {
  std::replace_if(
      what.begin(), what.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; }, ' ');
  return (what.find("no CUDA kernel") != std::string::npos ? "no CUDA kernel yet: " : "error: ") + what;
}

inline void check_cuda(cudaError_t status, const char* call) { cu::check(status, call, "bench_kernels"); }

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
// dtype: the precision of the products, "f32", or "bf16" for autocast rows (f32 tensors,
// bf16 operands) and for kernels called on bf16 buffers (attention's "cuda::sdpa_bf16").
struct Work {
  std::string op, shape;
  double flops = 0, bytes = 0;
  std::string dtype = "f32";
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
  int device() const { return device_; }
  nd::TensorOptions options() const { return nd::TensorOptions(nd::Device(nd::kCUDA, device_)); }
  const std::vector<Row>& rows() const { return rows_; }

  // Rows to time (bench_kernels' --dtype and --shape): compare() leaves out, unprepared,
  // every row `keep` refuses. Default: all.
  void set_filter(std::function<bool(const Work&)> keep) { keep_ = std::move(keep); }

  // Times `ours` against each baseline (none: ours alone). Adds the baselines' rows, then
  // ours once per baseline that ran (with the ratio), or once alone.
  void compare(const Work& work, const std::vector<Impl>& baselines, const Impl& ours) {
    if (keep_ && !keep_(work)) return;
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
    r.dtype = work.dtype;
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
  std::function<bool(const Work&)> keep_;
};

// ---- inputs -------------------------------------------------------------------------------
// N(0, 1) values: one block of at most 1M drawn on the host, repeated on the device (the
// host's generator needs seconds for the 100M-element inputs; the kernels do not care).
inline nd::Tensor randn(const Bench& b, const nd::Shape& shape, bool requires_grad = false) {
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
inline nd::Tensor full(const Bench& b, const nd::Shape& shape, double value, bool requires_grad = false) {
  nd::Tensor t = nd::empty(shape, b.options());
  t.fill_(value);
  t.requires_grad_(requires_grad);
  return t;
}
inline float* ptr(const nd::Tensor& t) { return t.data_ptr<float>(); }

// ---- what is timed: our passes through autograd, the copy baseline ----------------------------
// Replays backward from `out` (graph kept) after clearing the leaves' .grad, so that
// AccumulateGrad takes the fresh gradient instead of adding into an old one.
inline Run backward_replay(const nd::Tensor& out, const nd::Tensor& grad, const std::vector<nd::Tensor>& leaves) {
  return [=] {
    for (const nd::Tensor& t : leaves) t.set_grad(nd::Tensor());
    out.backward(grad, /*retain_graph=*/true);
  };
}

// A whole training pass: forward (recording the graph), then backward.
inline Run forward_backward(const std::function<nd::Tensor()>& forward, const nd::Tensor& grad,
                     const std::vector<nd::Tensor>& leaves) {
  return [=] {
    for (const nd::Tensor& t : leaves) t.set_grad(nd::Tensor());
    forward().backward(grad);
  };
}

// cudaMemcpyAsync of half of `bytes` (each byte is read and written): the ceiling for a
// pass that must move `bytes`.
inline Impl copy_of(Bench& b, double bytes) {
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

}  // namespace nd::bench
