// GPU op microbenchmarks: our ops, called through the public engine API on CUDA tensors
// (so what is timed is what a training step gets), against the library each should
// approach, at the shapes the models use.
//   conv2d fwd / dgrad / wgrad (DCGAN D at batch 64 and 256, three ResNet 3x3 layers) and
//   conv_transpose2d fwd / dgrad / wgrad (DCGAN G)       vs cuDNN: the fastest FP32 algorithm
//       from cudnnFind*Ex, one workspace for the whole run. A transposed conv is the conv
//       with input and output swapped, so its fwd is cuDNN's BackwardData, its dgrad
//       cuDNN's Forward and its wgrad BackwardFilter of that conv.   Target ratio >= 0.9.
//       Each pass again under autocast (dtype "bf16": f32 tensors, bf16 operands on tensor
//       cores, f32 accumulation) vs cuDNN's fastest on bf16 tensors with f32 compute and
//       tensor-op math ("cudnn_bf16"), the bytes counted as for f32.
//   batch_norm training fwd+bwd      vs cuDNN (ForwardTraining + Backward, spatial) and vs
//       a device-to-device copy that moves the same bytes.         Target >= 0.8 of copy.
//   layer_norm fwd+bwd, AdamW step (10M and 100M elements) vs a copy of the same bytes.
//                                                                  Target >= 0.8 of copy.
//   attention fwd and fwd+bwd        no baseline in this binary: bench_kernels_torch.py times
//       PyTorch's SDPA at the same shapes, and `bench_kernels_torch.py --join` (run by
//       gpu_check.sh) gives each of our rows its ratio vs the PyTorch row of the same
//       (op, shape, dtype). Rows: dtype "f32", impl "nd::sdpa": f32 tensors, the SIMT
//       kernels (vs PyTorch f32, the backend it picks). dtype "bf16", impl "nd::sdpa": f32
//       tensors under autocast, so the conversions to bf16 and back are timed too.
//       dtype "bf16", impl "cuda::sdpa_bf16": the bf16 tensor-core kernel entry points called
//       directly on bf16 device buffers, the kernel-level number the targets are about:
//       forward >= 1.0, fwd+bwd >= 0.9 of PyTorch's flash SDPA on bf16 tensors. Shapes:
//       head dims 64 and 128 at S = 512 to 4096 (issue 21), and the MAE small's attention.
//       dtype "f16", impl "cuda::sdpa_f16": the same kernels with f16 operands, vs flash
//       SDPA on f16 tensors (no target; f16 autocast with GradScaler).
//   matmul                           vs raw cublasSgemm (a sanity check: ratio ~ 1).
//   copy 1 GiB                       the engine's copy_ vs cudaMemcpyAsync (the ceiling).
//   model                            the cost model's rows (cost_model_rows.h): the launchers
//                                    nanoddp_emu_cost_model estimates, at its shapes, keyed
//                                    as it keys them; bench/model_join.py puts the two side by side.
//   h2d 64 MiB                       host -> device: to(cuda) of pageable memory (staged)
//                                    and of a pinned tensor (non_blocking) vs cudaMemcpyAsync
//                                    from pinned memory.
// ratio = baseline ms / our ms (> 1: ours is faster), one row of ours per baseline.
// FLOPs: 2 N C_out OH OW C_in k k per conv pass; attention 4 B H S S D forward and 2.5x
// that backward; matmul 2 M N K. Bytes (GB/s) are what each pass must move, in f32
// (attention's bf16 rows: 2 bytes an element, as on the PyTorch side):
//   batch_norm 8 n: forward reads x for the statistics, then reads x and writes y;
//                   backward reads x, dy for the sums, then reads x, dy and writes dx.
//   layer_norm 5 n: forward reads x, writes y; backward reads x, dy, writes dx (rows stay
//                   on chip).   AdamW 7 n: reads param, grad, exp_avg, exp_avg_sq, writes
//                   the last three back.   A copy of B bytes moves 2 B (read + write), so
//                   "copy of the same bytes" copies half the counted bytes.
// Timing (the harness in cuda_timing.h): medians of back-to-back runs between CUDA events
// on the compute stream, baselines and ours alternating; backward through autograd replay.
// Output: a JSON line per row as soon as it is measured (json_line.h)
//   {"op","shape","dtype","impl","ms","gflops","gbps","baseline","ratio"} (+ "note")
// then a table. A row that could not run has "ms":null and a note: "no CUDA kernel yet:
// <the engine's message>" for an op still without one, "error: ..." otherwise.
// Usage: bench_kernels [--device cuda[:N]] [--dtype D[,D...]] [--shape REGEX] [NAME...]
//   NAME: a family of kFamilies below (default all); --dtype: only rows of these dtypes (f32,
//   bf16, f16); --shape: only rows whose shape string holds a match of REGEX (ECMAScript,
//   std::regex_search; e.g. 'D=(64|128)$', '^N=64 ', '^(?!.*fill-sms)'). A row left out is
//   not prepared (no cuDNN search, no allocation). gpu_check.sh asks for its rows this way.
// Names and flags are checked first: a bad one is an error naming what was expected and
// found, exit 2, on any machine. Without a usable GPU: "SKIPPED: no CUDA GPU (<reason>)", exit 0.
// The baselines (cuDNN, cuBLAS) are in cuda_baselines.h; this file holds the rows.
#include <nanoddp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_kernels_options.h"

#ifdef NANODDP_WITH_CUDA
#include "cuda_baselines.h"
#include "cost_model_rows.h"
#include "cuda_timing.h"
#include "kernels/cuda/attention.h"
#endif

namespace {

struct Context;  // a run's Bench and cuDNN (below, in a build with CUDA)

#ifdef NANODDP_WITH_CUDA
using namespace nd::bench;

// The targets for ours vs a baseline (0: none): ratio >= target.
double target(const Row& r) {
  const auto is = [&](const char* prefix) { return r.op.rfind(prefix, 0) == 0; };
  if (r.baseline == "cudnn" && (is("conv2d") || is("conv_transpose2d"))) return 0.9;
  if (r.baseline == "cudaMemcpy" && is("batch_norm")) return 0.8;
  if (r.baseline == "cudaMemcpy" && (is("layer_norm") || is("adamw"))) return 0.8;
  return 0;
}

// The human table; "below" marks a ratio under the target.
void print_table(const std::vector<Row>& rows) {
  std::printf("\n%-24s %-28s %-5s %-16s %9s %9s %8s %-11s %6s\n", "op", "shape", "dtype", "impl", "ms", "GFLOP/s",
              "GB/s", "baseline", "ratio");
  for (const Row& r : rows) {
    std::printf("%-24s %-28s %-5s %-16s ", r.op.c_str(), r.shape.c_str(), r.dtype.c_str(), r.impl.c_str());
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
  if (std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.op.rfind("attention", 0) == 0; }))
    std::printf("(attention: ratios vs PyTorch's SDPA come from bench_kernels_torch.py --join, see gpu_check.sh)\n");
}

// ---- convolution ------------------------------------------------------------------------------
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
// gradient, so ConvolutionBackward computes just that one). amp: the forward under
// autocast; its backward node remembers that, as in training.
Impl our_conv(Bench& b, const ConvLayer& layer, Pass pass, bool amp) {
  return {layer.transposed ? "nd::conv_t2d" : "nd::conv2d", [&b, layer, pass, amp]() -> Run {
            const nd::Tensor x = randn(b, layer.input_shape(), pass == Pass::Dgrad);
            const nd::Tensor w = randn(b, layer.weight_shape(), pass == Pass::Wgrad);
            const auto forward = [=] {
              const nd::AutocastGuard guard(nd::kCUDA, amp);
              return layer.forward(x, w);
            };
            if (pass == Pass::Fwd) return [=] { forward(); };
            const nd::Tensor y = forward();
            return backward_replay(y, randn(b, y.sizes()), {pass == Pass::Dgrad ? x : w});
          }};
}

// ---- the row families ---------------------------------------------------------------------
struct Context {
  Bench& bench;
  const Cudnn& cudnn;
};

// Every pass in f32, then under autocast (bf16 operands) against cuDNN on bf16 tensors.
void bench_conv_layers(Context& c, const std::vector<ConvLayer>& layers) {
  for (bool amp : {false, true})
    for (const ConvLayer& layer : layers)
      for (Pass pass : {Pass::Fwd, Pass::Dgrad, Pass::Wgrad}) {
        const ConvGeom g = layer.geom();
        c.bench.compare({layer.op(pass), layer.shape(), g.flops(), g.bytes(), amp ? "bf16" : "f32"},
                        {cudnn_conv(c.bench, c.cudnn, g, layer.cudnn_pass(pass), amp)},
                        our_conv(c.bench, layer, pass, amp));
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

// Our bf16 (E = BFloat16) or f16 (E = Half) tensor-core kernels (kernels/cuda/attention.h)
// called directly on 16-bit device buffers, no engine and no autograd: the forward, or the
// forward then the backward (its delta pass and scratch included), as PyTorch's flash rows
// compute them. Scale 1/sqrt(D), no mask, not causal.
template <class E>
Impl half_kernels(Bench& b, const nd::Shape& shape, bool backward) {
  constexpr nd::ScalarType dt = nd::dtype_of<E>::value;
  return {dt == nd::kFloat16 ? "cuda::sdpa_f16" : "cuda::sdpa_bf16", [&b, shape, backward]() -> Run {
            const auto half = [&] { return randn(b, shape).to(dt); };
            const auto empty_half = [&] { return nd::empty(shape, b.options().dtype(dt)); };
            const nd::Tensor q = half(), k = half(), v = half(), dout = half(), out = empty_half(), dq = empty_half(),
                             dk = empty_half(), dv = empty_half();
            const int64_t B = shape[0], H = shape[1], S = shape[2], D = shape[3];
            const nd::Tensor lse = nd::empty({B, H, S}, b.options());
            const double scale = 1.0 / std::sqrt(double(D));
            const cudaStream_t stream = b.stream();
            const auto p = [](const nd::Tensor& t) { return t.data_ptr<E>(); };
            return [=] {
              cu::scaled_dot_product_attention_forward(p(q), p(k), p(v), {}, B, H, S, S, D, D, false, scale, {}, p(out),
                                                       lse.data_ptr<float>(), stream);
              if (backward)
                cu::scaled_dot_product_attention_backward(p(dout), p(q), p(k), p(v), {}, p(out),
                                                          lse.data_ptr<float>(), B, H, S, S, D, D, false, scale, {},
                                                          p(dq), p(dk), p(dv), stream);
            };
          }};
}

// B H S D: a long sequence, then the MAE "small" encoder (12 visible patches + cls, 192
// wide, 6 heads) and decoder (49 patches + cls, 96 wide, 3 heads) at its batch of 128.
// f32 rows: nd::sdpa on f32 tensors (the SIMT kernels). bf16 rows: nd::sdpa on f32 tensors
// under autocast (conversions to and from bf16 included), then the bf16 kernels alone
// (half_kernels above), the number the targets are about; f16 rows: the f16
// kernels alone, against PyTorch's flash SDPA on f16 tensors.
void bench_attention(Context& c) {
  // B, H, S, D: as bench_kernels_torch.py's ATTENTION.
  const int64_t shapes[][4] = {{8, 8, 1024, 64}, {8, 16, 512, 128}, {2, 16, 4096, 64}, {2, 16, 4096, 128},
                               {128, 6, 13, 32},  {128, 3, 50, 32}};
  for (const auto& s : shapes) {
    const nd::Shape shape{s[0], s[1], s[2], s[3]};
    Bench& b = c.bench;
    // bytes: forward reads q, k, v, writes out; backward also reads out, dout, writes dq, dk,
    // dv; 4 bytes an element in f32, 2 in bf16 (as bench_kernels_torch.py counts them)
    const double fwd = 4.0 * s[0] * s[1] * s[2] * s[2] * s[3], elements = double(s[0]) * s[1] * s[2] * s[3];
    const std::string name = "B=" + std::to_string(s[0]) + " H=" + std::to_string(s[1]) + " S=" + std::to_string(s[2]) +
                             " D=" + std::to_string(s[3]);
    for (bool amp : {false, true}) {
      const auto sdpa = [amp](const nd::Tensor& q, const nd::Tensor& k, const nd::Tensor& v) {
        const nd::AutocastGuard guard(nd::kCUDA, amp);
        return nd::scaled_dot_product_attention(q, k, v);
      };
      const Impl fwd_only{"nd::sdpa", [&b, shape, sdpa]() -> Run {
                            const nd::Tensor q = randn(b, shape), k = randn(b, shape), v = randn(b, shape);
                            return [=] { sdpa(q, k, v); };
                          }};
      const Impl fwd_bwd{"nd::sdpa", [&b, shape, sdpa]() -> Run {
                           const nd::Tensor q = randn(b, shape, true), k = randn(b, shape, true),
                                            v = randn(b, shape, true);
                           return forward_backward([=] { return sdpa(q, k, v); }, randn(b, shape), {q, k, v});
                         }};
      const char* dtype = amp ? "bf16" : "f32";
      const double tensor_bytes = (amp ? 2.0 : 4.0) * elements;
      const Work fwd_work{"attention_fwd", name, fwd, 4 * tensor_bytes, dtype},
          fwd_bwd_work{"attention_fwd_bwd", name, 3.5 * fwd, 12 * tensor_bytes, dtype};
      b.compare(fwd_work, {}, fwd_only);
      b.compare(fwd_bwd_work, {}, fwd_bwd);
      if (amp) {
        b.compare(fwd_work, {}, half_kernels<nd::BFloat16>(b, shape, false));
        b.compare(fwd_bwd_work, {}, half_kernels<nd::BFloat16>(b, shape, true));
        const Work f16_fwd{"attention_fwd", name, fwd, 4 * tensor_bytes, "f16"},
            f16_fwd_bwd{"attention_fwd_bwd", name, 3.5 * fwd, 12 * tensor_bytes, "f16"};
        b.compare(f16_fwd, {}, half_kernels<nd::Half>(b, shape, false));
        b.compare(f16_fwd_bwd, {}, half_kernels<nd::Half>(b, shape, true));
      }
    }
  }
}

// Our matmul (cuBLAS underneath) vs the bare cublasSgemm call: what the engine adds.
void bench_matmul(Context& c) {
  Bench& b = c.bench;
  const Cublas blas(b.stream());
  // M N K: square, then the MAE small encoder MLP (128 x 13 tokens, 192 -> 768) and decoder MLP (128 x 50, 384 -> 96).
  const int64_t shapes[][3] = {{2048, 2048, 2048}, {4096, 4096, 4096}, {1664, 768, 192}, {6400, 96, 384}};
  for (const auto& s : shapes) {
    const int64_t M = s[0], N = s[1], K = s[2];
    const Impl sgemm = cublas_sgemm(b, blas, M, N, K);
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

// 64 MiB host -> device, what a training batch's copy costs: the engine's staged copy of
// pageable memory (synchronous, through the 16 MiB pinned staging buffer) and its
// non-blocking copy of a pinned tensor, against cudaMemcpyAsync from pinned memory.
void bench_h2d(Context& c) {
  Bench& b = c.bench;
  const int64_t n = int64_t(1) << 24;  // f32 elements in 64 MiB
  const double bytes = 4.0 * n;
  const nd::Device gpu = b.options().device_;
  const Impl raw{"cudaMemcpy(pinned)", [&b, n]() -> Run {
                   const nd::Tensor src = nd::empty({n}, nd::TensorOptions().pinned_memory(true));
                   const nd::Tensor dst = nd::empty({n}, b.options());
                   const cudaStream_t stream = b.stream();
                   return [=] {
                     check_cuda(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), size_t(n) * 4,
                                                cudaMemcpyHostToDevice, stream),
                                "cudaMemcpyAsync");
                   };
                 }};
  const Impl staged{"nd::to(pageable)", [n, gpu]() -> Run {
                      const nd::Tensor src = nd::zeros({n});
                      return [=] { (void)src.to(gpu); };
                    }};
  const Impl pinned{"nd::to(pinned, non_blocking)", [n, gpu]() -> Run {
                      const nd::Tensor src = nd::zeros({n}).pin_memory();
                      return [=] { (void)src.to(gpu, /*non_blocking=*/true); };
                    }};
  b.compare({"h2d", "64 MiB", 0, bytes}, {raw}, staged);
  b.compare({"h2d", "64 MiB", 0, bytes}, {raw}, pinned);
}

#endif  // NANODDP_WITH_CUDA

// The families, in run order. A build without CUDA keeps the names only, to check them.
#ifdef NANODDP_WITH_CUDA
#define BENCH_FAMILY(name, run) {name, run}
#else
#define BENCH_FAMILY(name, run) {name, nullptr}
#endif
struct Family {
  const char* name;
  void (*run)(Context&);
};
const Family kFamilies[] = {
    BENCH_FAMILY("model", [](Context& c) { bench_model_rows(c.bench); }),  // first: small, what gpu_check joins
    BENCH_FAMILY("attention", bench_attention),
    BENCH_FAMILY("copy", bench_copy),
    BENCH_FAMILY("h2d", bench_h2d),
    BENCH_FAMILY("matmul", bench_matmul),
    BENCH_FAMILY("conv2d", bench_conv2d),
    BENCH_FAMILY("conv_transpose2d", bench_conv_transpose2d),
    BENCH_FAMILY("batch_norm", bench_batch_norm),
    BENCH_FAMILY("layer_norm", bench_layer_norm),
    BENCH_FAMILY("adamw", bench_adamw),
};
#undef BENCH_FAMILY
std::vector<std::string> family_names() {
  std::vector<std::string> names;
  for (const Family& f : kFamilies) names.push_back(f.name);
  return names;
}

#ifdef NANODDP_WITH_CUDA
int run_benchmarks(int device, const nd::bench::KernelsOptions& options) {
  Bench bench(device);
  bench.set_filter([&options](const Work& w) { return options.keeps(w.shape, w.dtype); });
  Cudnn cudnn(bench.stream());
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  std::printf("bench_kernels: cuda:%d %s (%d SMs, %.0f GiB); cuDNN baselines %s; TF32 off\n", device, prop.name,
              prop.multiProcessorCount, double(prop.totalGlobalMem) / (1 << 30), cudnn.status().c_str());
  std::printf("bench_kernels: ratio = baseline ms / our ms; medians of back-to-back runs between CUDA events\n");
  std::fflush(stdout);
  Context context{bench, cudnn};
  for (const Family& f : kFamilies)
    if (options.runs(f.name)) {
      std::fprintf(stderr, "bench_kernels: %s\n", f.name);
      f.run(context);
    }
  print_table(bench.rows());
  return 0;
}
#endif  // NANODDP_WITH_CUDA

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf(
          "usage: bench_kernels [--device cuda[:N]] [--dtype D[,D...]] [--shape REGEX] [NAME...]\n"
          "Times our CUDA ops against cuDNN / cuBLAS / cudaMemcpy; prints JSON lines and a table.\n"
          "NAME: %s (default: all)\n"
          "--dtype: rows of these dtypes only (f32, bf16, f16); --shape: rows whose shape matches REGEX\n",
          nd::bench::joined(family_names(), " ").c_str());
      return 0;
    }
  nd::bench::KernelsOptions options;
  try {
    options = nd::bench::KernelsOptions::parse(argc, argv, family_names());
  } catch (const nd::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  try {
    const nd::Device dev(options.device);
    if (!dev.is_cuda())
      throw nd::Error("bench_kernels times CUDA ops: expected --device cuda or cuda:N, found " + options.device);
    try {
      nd::cuda::check_device(dev);
    } catch (const nd::Error& e) {
      std::printf("SKIPPED: no CUDA GPU (%s)\n", e.what());
      return 0;
    }
#ifdef NANODDP_WITH_CUDA
    return run_benchmarks(dev.index, options);
#else
    return 0;  // check_device refuses every CUDA device in a build without CUDA
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 1;
  }
}
