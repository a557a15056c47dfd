// bench_kernels' "model" family: the rows of the emulator's cost model
// (bench/cost_model_row_list.h, estimated by tests/emu/cost_model.cpp, nanoddp_emu_cost_model)
// timed on the GPU, so that each estimate has a measurement beside it. Same launchers
// (nd::kernels::cuda, called directly on device buffers, no engine), and the list's shapes,
// FLOP and byte counts and row keys (op, shape, dtype): bench/model_join.py joins the two sides
// (impl "model" there, "cuda::kernels" here) and gpu_check.sh prints the measured / model table.
// Only bench_kernels includes it, in a build with CUDA.
#pragma once

#include <cmath>
#include <string>
#include <variant>
#include <vector>

#include "cost_model_row_list.h"
#include "cuda_timing.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/batch_norm.h"
#include "kernels/cuda/conv.h"
#include "kernels/cuda/conv_narrow.cuh"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/layer_norm.h"
#include "kernels/cuda/optim.h"
#include "kernels/cuda/softmax.h"

namespace nd::bench {

namespace model_rows {

inline const char* const kImpl = "cuda::kernels";

inline Work work(const cost_rows::Key& k) { return {k.op, k.shape, k.flops, k.bytes, k.dtype}; }

inline void run(Bench& b, const cost_rows::CopyRow& r) {
  const int64_t n = r.n;
  b.compare(work(cost_rows::key(r)), {},
            {kImpl, [&b, n]() -> Run {
               const nd::Tensor src = randn(b, {n}), dst = nd::empty({n}, b.options());
               const cudaStream_t stream = b.stream();
               return [=] {
                 const int64_t shape[] = {n}, strides[] = {1};
                 cu::copy_strided<float, float>(1, shape, ptr(src), strides, ptr(dst), strides, stream);
               };
             }});
}

inline void run(Bench& b, const cost_rows::AdamwRow& r) {
  const int tensors = r.tensors;
  const int64_t each = r.each;
  b.compare(work(cost_rows::key(r)), {},
            {kImpl, [&b, tensors, each]() -> Run {
               std::vector<nd::Tensor> keep;  // p, g, m, v of each tensor
               std::vector<nd::kernels::AdamTensor<float>> list;
               for (int t = 0; t < tensors; ++t) {
                 const nd::Tensor p = randn(b, {each}), g = randn(b, {each}) * 0.01, m = full(b, {each}, 0),
                                  v = full(b, {each}, 0);
                 keep.insert(keep.end(), {p, g, m, v});
                 list.push_back({each, ptr(p), ptr(g), ptr(m), ptr(v), nullptr, 1});
               }
               nd::kernels::AdamParams hp;
               hp.lr = 1e-3, hp.weight_decay = 0.01, hp.decoupled_weight_decay = true;
               const int device = b.device();
               const cudaStream_t stream = b.stream();
               return [=] {
                 (void)keep;
                 cu::adam_step<float>(device, list, hp, stream);
               };
             }});
}

// The training forward, or the training backward with both parameter gradients (reads dy and
// x, writes dx).
inline void run(Bench& b, const cost_rows::BatchNormRow& r) {
  const int64_t N = r.N, C = r.C, S = r.S;
  if (!r.backward) {
    b.compare(work(cost_rows::key(r)), {}, {kImpl, [&b, N, C, S]() -> Run {
                const nd::Tensor x = randn(b, {N, C, S}), weight = full(b, {C}, 1), bias = full(b, {C}, 0),
                                 rm = full(b, {C}, 0), rv = full(b, {C}, 1), y = nd::empty({N, C, S}, b.options()),
                                 mean = nd::empty({C}, b.options()), invstd = nd::empty({C}, b.options());
                const cudaStream_t stream = b.stream();
                return [=] {
                  cu::batch_norm_forward_training<float>(ptr(x), ptr(weight), ptr(bias), ptr(rm), ptr(rv), N, C, S,
                                                         0.1, 1e-5, ptr(y), ptr(mean), ptr(invstd), stream);
                };
              }});
    return;
  }
  b.compare(work(cost_rows::key(r)), {}, {kImpl, [&b, N, C, S]() -> Run {
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

// One conv row's launch under the split rule `split` (conv.h ConvSplit), named `name`.
inline Impl conv_impl(Bench& b, const cost_rows::ConvRow& r, const char* name, cu::ConvSplit split) {
  const nd::kernels::Conv2dShape s = r.shape();
  const std::string pass = r.pass;
  const auto operands = r.bf16 ? cu::ConvOperands::kBf16 : cu::ConvOperands::kExact;
  return {name, [&b, s, pass, operands, split]() -> Run {
            const nd::Tensor x = randn(b, {s.N, s.C_in, s.H, s.W}), w = randn(b, {s.C_out, s.C_in, s.kH, s.kW}),
                             y = randn(b, {s.N, s.C_out, s.out_h(), s.out_w()});
            const cudaStream_t stream = b.stream();
            return [=] {
              const cu::ConvSplit before = cu::set_conv_split(split);  // read when the launcher runs
              if (pass == "fwd")
                cu::conv2d_forward<float>(s, ptr(x), ptr(w), nullptr, ptr(y), stream, operands);
              else if (pass == "dgrad")
                cu::conv2d_backward_input<float>(s, ptr(y), ptr(w), ptr(x), stream, operands);
              else
                cu::conv2d_backward_weight<float>(s, ptr(x), ptr(y), ptr(w), stream, operands);
              cu::set_conv_split(before);
            };
          }};
}

// The row; then the batch-64 rows under ConvSplit::kFillSms against the default, sampled in
// turn ("ratio" = default ms / fill ms: above 1 where covering every SM with more split-K
// chunks pays, below where their partial sums cost more; 1 within noise where the rule
// changes nothing, as on passes that fill the SMs already). Their shape ends in "fill-sms",
// so model_join.py's measured-vs-model table leaves them out.
inline void run(Bench& b, const cost_rows::ConvRow& r) {
  b.compare(work(cost_rows::key(r)), {}, conv_impl(b, r, kImpl, cu::ConvSplit::kBusiestSm));
  if (r.N < 64 || cu::narrow::applies(r.shape())) return;  // the narrow kernels (conv_narrow.cu) have no such rule
  Work fill = work(cost_rows::key(r));
  fill.shape += " fill-sms";
  b.compare(fill, {conv_impl(b, r, "cuda::kernels busiest-sm", cu::ConvSplit::kBusiestSm)},
            conv_impl(b, r, "cuda::kernels fill-sms", cu::ConvSplit::kFillSms));
}

inline void run(Bench& b, const cost_rows::AttentionRow& r) {
  const int64_t BH = r.BH, S = r.S, D = r.D;
  const bool backward = r.backward, causal = r.causal;
  b.compare(work(cost_rows::key(r)),
            {}, {kImpl, [&b, BH, S, D, backward, causal]() -> Run {
                   const nd::Shape shape{1, BH, S, D};
                   const auto half = [&] { return randn(b, shape).to(nd::kBFloat16); };
                   const nd::Tensor q = half(), k = half(), v = half(), dout = half(), out = half(), dq = half(),
                                    dk = half(), dv = half(), lse = nd::empty({1, BH, S}, b.options());
                   const double scale = 1.0 / std::sqrt(double(D));
                   const cudaStream_t stream = b.stream();
                   const auto p = [](const nd::Tensor& t) { return t.data_ptr<nd::BFloat16>(); };
                   return [=] {
                     cu::scaled_dot_product_attention_forward(p(q), p(k), p(v), {}, 1, BH, S, S, D, D, causal, scale,
                                                              {}, p(out), ptr(lse), stream);
                     if (backward)
                       cu::scaled_dot_product_attention_backward(p(dout), p(q), p(k), p(v), {}, p(out), ptr(lse), 1, BH,
                                                                 S, S, D, D, causal, scale, {}, p(dq), p(dk), p(dv),
                                                                 stream);
                   };
                 }});
}

// The training backward with dx, dweight and dbias (reads dy and x, writes dx).
inline void run(Bench& b, const cost_rows::LayerNormRow& r) {
  const int64_t M = r.M, D = r.D;
  b.compare(work(cost_rows::key(r)), {}, {kImpl, [&b, M, D]() -> Run {
              const nd::Tensor x = randn(b, {M, D}), dy = randn(b, {M, D}) * 0.01, weight = full(b, {D}, 1),
                               mean = full(b, {M}, 0), rstd = full(b, {M}, 1), dx = nd::empty({M, D}, b.options()),
                               dweight = nd::empty({D}, b.options()), dbias = nd::empty({D}, b.options());
              const cudaStream_t stream = b.stream();
              return [=] {
                cu::layer_norm_backward<float>(ptr(dy), ptr(x), ptr(mean), ptr(rstd), ptr(weight), M, D, ptr(dx),
                                               ptr(dweight), ptr(dbias), stream);
              };
            }});
}

inline void run(Bench& b, const cost_rows::SoftmaxRow& r) {
  const int64_t M = r.M, D = r.D;
  const bool log = r.log;
  b.compare(work(cost_rows::key(r)), {}, {kImpl, [&b, M, D, log]() -> Run {
              const nd::Tensor x = randn(b, {M, D}) * 5.0, y = nd::empty({M, D}, b.options());
              const cudaStream_t stream = b.stream();
              return [=] {
                if (log) cu::log_softmax_forward<float>(ptr(x), M, D, ptr(y), stream);
                else cu::softmax_forward<float>(ptr(x), M, D, ptr(y), stream);
              };
            }});
}

}  // namespace model_rows

// Every row of bench/cost_model_row_list.h, in its order (the tool emulates the BH=64 attention
// rows as BH=2 times 32; here they run whole).
inline void bench_model_rows(Bench& b) {
  for (const cost_rows::Row& r : cost_rows::rows()) std::visit([&b](const auto& x) { model_rows::run(b, x); }, r);
}

}  // namespace nd::bench
