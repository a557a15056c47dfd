// bench_kernels' "model" family: the rows of the emulator's cost model
// (tests/emu/cost_model.cpp, nanoddp_emu_cost_model) timed on the GPU, so that each
// estimate has a measurement beside it. Same launchers (nd::kernels::cuda, called directly on
// device buffers, no engine), same shapes, same FLOP and byte counts, and the same row keys
// (op, shape, dtype) as the tool prints them: bench/model_join.py joins the two sides (impl
// "model" there, "cuda::kernels" here) and gpu_check.sh prints the measured / model table.
// A row added to the tool without its twin here shows as "not measured" in that table.
// Only bench_kernels includes it, in a build with CUDA.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "cuda_timing.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/batch_norm.h"
#include "kernels/cuda/conv.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/optim.h"

namespace nd::bench {

namespace model_rows {

namespace kcpu = nd::kernels::cpu;

inline const char* const kImpl = "cuda::kernels";

inline void copy(Bench& b, int64_t n) {
  b.compare({"copy", "n=" + std::to_string(n), 0, 8.0 * double(n)}, {},
            {kImpl, [&b, n]() -> Run {
               const nd::Tensor src = randn(b, {n}), dst = nd::empty({n}, b.options());
               const cudaStream_t stream = b.stream();
               return [=] {
                 const int64_t shape[] = {n}, strides[] = {1};
                 cu::copy_strided<float, float>(1, shape, ptr(src), strides, ptr(dst), strides, stream);
               };
             }});
}

inline void adamw(Bench& b, int tensors, int64_t each) {
  const double n = double(tensors) * double(each);
  b.compare({"adamw", std::to_string(tensors) + " x " + std::to_string(each), 0, 4.0 * n * 7}, {},
            {kImpl, [&b, tensors, each]() -> Run {
               std::vector<nd::Tensor> keep;  // p, g, m, v of each tensor
               std::vector<kcpu::AdamTensor<float>> list;
               for (int t = 0; t < tensors; ++t) {
                 const nd::Tensor p = randn(b, {each}), g = randn(b, {each}) * 0.01, m = full(b, {each}, 0),
                                  v = full(b, {each}, 0);
                 keep.insert(keep.end(), {p, g, m, v});
                 list.push_back({each, ptr(p), ptr(g), ptr(m), ptr(v), nullptr, 1});
               }
               kcpu::AdamParams hp;
               hp.lr = 1e-3, hp.weight_decay = 0.01, hp.decoupled_weight_decay = true;
               const int device = b.device();
               const cudaStream_t stream = b.stream();
               return [=] {
                 (void)keep;
                 cu::adam_step<float>(device, list, hp, stream);
               };
             }});
}

inline void batch_norm_fwd(Bench& b, int64_t N, int64_t C, int64_t S) {
  b.compare({"batch_norm_fwd", "N=" + std::to_string(N) + " C=" + std::to_string(C) + " S=" + std::to_string(S), 0,
             8.0 * double(N * C * S)},
            {}, {kImpl, [&b, N, C, S]() -> Run {
                   const nd::Tensor x = randn(b, {N, C, S}), weight = full(b, {C}, 1), bias = full(b, {C}, 0),
                                    rm = full(b, {C}, 0), rv = full(b, {C}, 1), y = nd::empty({N, C, S}, b.options()),
                                    mean = nd::empty({C}, b.options()), invstd = nd::empty({C}, b.options());
                   const cudaStream_t stream = b.stream();
                   return [=] {
                     cu::batch_norm_forward_training<float>(ptr(x), ptr(weight), ptr(bias), ptr(rm), ptr(rv), N, C, S,
                                                            0.1, 1e-5, ptr(y), ptr(mean), ptr(invstd), stream);
                   };
                 }});
}

// The training backward with both parameter gradients (reads dy and x, writes dx).
inline void batch_norm_bwd(Bench& b, int64_t N, int64_t C, int64_t S) {
  b.compare({"batch_norm_bwd", "N=" + std::to_string(N) + " C=" + std::to_string(C) + " S=" + std::to_string(S), 0,
             12.0 * double(N * C * S)},
            {}, {kImpl, [&b, N, C, S]() -> Run {
                   const nd::Tensor x = randn(b, {N, C, S}), dy = randn(b, {N, C, S}) * 0.01, weight = full(b, {C}, 1),
                                    mean = full(b, {C}, 0), invstd = full(b, {C}, 1),
                                    dx = nd::empty({N, C, S}, b.options()), dweight = nd::empty({C}, b.options()),
                                    dbias = nd::empty({C}, b.options());
                   const cudaStream_t stream = b.stream();
                   return [=] {
                     cu::batch_norm_backward<float>(ptr(dy), ptr(x), ptr(mean), ptr(invstd), ptr(weight), N, C, S, true,
                                                    ptr(dx), ptr(dweight), ptr(dbias), stream);
                   };
                 }});
}

// conv2d "fwd", "dgrad" or "wgrad" on [N, C_in, HW, HW], f32 tensors, bf16 operands (autocast's conv) or
// exact f32 (the SIMT kernel).
inline void conv(Bench& b, const std::string& pass, int64_t N, int64_t C_in, int64_t C_out, int64_t HW, int64_t k,
                 int64_t stride, int64_t pad, cu::ConvOperands operands = cu::ConvOperands::kBf16) {
  kcpu::Conv2dShape s;
  s.N = N, s.C_in = C_in, s.H = s.W = HW, s.C_out = C_out, s.kH = s.kW = k;
  s.stride = {stride, stride}, s.padding = {pad, pad};
  const std::string shape = "N=" + std::to_string(N) + " " + std::to_string(C_in) + "x" + std::to_string(HW) +
                            "^2->" + std::to_string(C_out) + " k" + std::to_string(k) + "s" + std::to_string(stride);
  const double flops = 2.0 * double(N * C_out * s.out_h() * s.out_w() * C_in * k * k);
  const double bytes = 4.0 * double(N * C_in * HW * HW + C_out * C_in * k * k + N * C_out * s.out_h() * s.out_w());
  const bool bf16 = operands == cu::ConvOperands::kBf16;
  b.compare({"conv2d_" + pass, shape, flops, bytes, bf16 ? "bf16" : "f32"}, {},
            {kImpl, [&b, s, pass, operands]() -> Run {
               const nd::Tensor x = randn(b, {s.N, s.C_in, s.H, s.W}), w = randn(b, {s.C_out, s.C_in, s.kH, s.kW}),
                                y = randn(b, {s.N, s.C_out, s.out_h(), s.out_w()});
               const cudaStream_t stream = b.stream();
               if (pass == "fwd")
                 return [=] { cu::conv2d_forward<float>(s, ptr(x), ptr(w), nullptr, ptr(y), stream, operands); };
               if (pass == "dgrad")
                 return [=] { cu::conv2d_backward_input<float>(s, ptr(y), ptr(w), ptr(x), stream, operands); };
               return [=] { cu::conv2d_backward_weight<float>(s, ptr(x), ptr(y), ptr(w), stream, operands); };
             }});
}

// bf16 attention on [1, BH, S, D] (no mask, not causal, scale 1/sqrt(D)): the forward, or the
// forward then the backward.
inline void attention(Bench& b, int64_t BH, int64_t S, int64_t D, bool backward) {
  const double fwd = 4.0 * double(BH) * double(S) * double(S) * double(D);
  b.compare({backward ? "attention_fwd_bwd" : "attention_fwd",
             "BH=" + std::to_string(BH) + " S=" + std::to_string(S) + " D=" + std::to_string(D),
             backward ? 3.5 * fwd : fwd, double(BH * S * D) * 2 * (backward ? 8 : 4), "bf16"},
            {}, {kImpl, [&b, BH, S, D, backward]() -> Run {
                   const nd::Shape shape{1, BH, S, D};
                   const auto half = [&] { return randn(b, shape).to(nd::kBFloat16); };
                   const nd::Tensor q = half(), k = half(), v = half(), dout = half(), out = half(), dq = half(),
                                    dk = half(), dv = half(), lse = nd::empty({1, BH, S}, b.options());
                   const double scale = 1.0 / std::sqrt(double(D));
                   const cudaStream_t stream = b.stream();
                   const auto p = [](const nd::Tensor& t) { return t.data_ptr<nd::BFloat16>(); };
                   return [=] {
                     cu::scaled_dot_product_attention_forward(p(q), p(k), p(v), {}, 1, BH, S, S, D, D, false, scale, {},
                                                              p(out), ptr(lse), stream);
                     if (backward)
                       cu::scaled_dot_product_attention_backward(p(dout), p(q), p(k), p(v), {}, p(out), ptr(lse), 1, BH,
                                                                 S, S, D, D, false, scale, {}, p(dq), p(dk), p(dv),
                                                                 stream);
                   };
                 }});
}

}  // namespace model_rows

// The tool's rows (tests/emu/cost_model.cpp, rows()), in its order. The BH=64 attention rows
// are emulated there as BH=2 times 32; here they run whole.
inline void bench_model_rows(Bench& b) {
  model_rows::copy(b, int64_t(1) << 21);
  model_rows::adamw(b, 4, int64_t(1) << 16);
  model_rows::batch_norm_fwd(b, 16, 64, 256);
  model_rows::batch_norm_bwd(b, 16, 64, 256);
  model_rows::batch_norm_fwd(b, 32, 16, 1024);  // channels split over 8 blocks each
  model_rows::batch_norm_bwd(b, 32, 16, 1024);
  model_rows::conv(b, "fwd", 2, 64, 128, 14, 4, 2, 1);
  model_rows::conv(b, "dgrad", 2, 64, 128, 14, 4, 2, 1);
  model_rows::conv(b, "fwd", 2, 1, 64, 28, 4, 2, 1);  // DCGAN D.main.0 (1 input channel: conv_narrow.cu)
  model_rows::conv(b, "wgrad", 2, 1, 64, 28, 4, 2, 1);
  model_rows::conv(b, "dgrad", 2, 1, 64, 28, 4, 2, 1);  // = G.main.6's forward
  model_rows::conv(b, "fwd", 2, 64, 128, 14, 4, 2, 1, cu::ConvOperands::kExact);  // the f32 SIMT kernel
  model_rows::conv(b, "dgrad", 2, 64, 128, 14, 4, 2, 1, cu::ConvOperands::kExact);
  model_rows::conv(b, "fwd", 64, 128, 1, 7, 7, 1, 0);  // DCGAN D.main.5 at batch 64 (1 output channel)
  model_rows::conv(b, "wgrad", 64, 128, 1, 7, 7, 1, 0);
  model_rows::conv(b, "fwd", 64, 32, 64, 14, 4, 2, 1);  // train_gan's D.main.2 (ndf 32) at batch 64
  model_rows::conv(b, "wgrad", 64, 32, 64, 14, 4, 2, 1);
  model_rows::conv(b, "wgrad", 64, 1, 64, 28, 4, 2, 1);  // D.main.0's weight gradient at batch 64
  model_rows::attention(b, 2, 256, 64, false);
  model_rows::attention(b, 64, 256, 64, false);
  model_rows::attention(b, 64, 256, 128, false);
  model_rows::attention(b, 64, 256, 64, true);
}

}  // namespace nd::bench
