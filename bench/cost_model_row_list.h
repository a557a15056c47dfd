// The rows of the cost model, one list for both of its sides: nanoddp_emu_cost_model
// (tests/emu/cost_model.cpp) estimates each row in the emulator, bench_kernels' "model" family
// (bench/cost_model_rows.h) times the same row on a GPU, and bench/model_join.py joins the two
// on the key (op, shape, dtype) that key() gives here, with the FLOP and byte counts that both
// report. A row is added here only; each side says how to run its kind. Host-only C++ (no
// CUDA, no engine; kernels/cpu/conv.h for the conv shape): the emulator's tool and
// bench_kernels both include it.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "kernels/cpu/conv.h"

namespace nd::bench::cost_rows {

struct CopyRow {
  int64_t n;  // f32 elements, contiguous
};
struct AdamwRow {
  int tensors;
  int64_t each;  // f32 elements per tensor
};
struct BatchNormRow {
  bool backward;  // the training backward with both parameter gradients, else the training forward
  int64_t N, C, S;
};
// conv2d on [N, C_in, HW, HW] of f32 tensors: pass "fwd" (conv2d_forward), "dgrad"
// (conv2d_backward_input, the GEMM conv_transpose2d's forward also runs) or "wgrad"; bf16
// operands (autocast's conv, the tensor cores) or exact f32 (the SIMT kernel).
struct ConvRow {
  const char* pass;
  int64_t N, C_in, C_out, HW, k, stride, pad;
  bool bf16 = true;
  kernels::cpu::Conv2dShape shape() const {
    kernels::cpu::Conv2dShape s;
    s.N = N, s.C_in = C_in, s.H = s.W = HW, s.C_out = C_out, s.kH = s.kW = k;
    s.stride = {stride, stride}, s.padding = {pad, pad};
    return s;
  }
};
// bf16 attention on [1, BH, S, D], no mask, scale 1/sqrt(D), causal or not: the forward, or
// the forward then the backward.
struct AttentionRow {
  int64_t BH, S, D;
  bool backward;
  bool causal = false;
};
// f32 layer norm's training backward on [M, D] (dx, dweight and dbias; with weight).
struct LayerNormRow {
  int64_t M, D;
};
// f32 softmax (log_softmax when log) forward over rows of D.
struct SoftmaxRow {
  int64_t M, D;
  bool log = false;
};
using Row = std::variant<CopyRow, AdamwRow, BatchNormRow, ConvRow, AttentionRow, LayerNormRow, SoftmaxRow>;

struct Key {
  std::string op, shape, dtype;
  double flops, bytes;  // the op's arithmetic and its minimal memory traffic
};

inline Key key(const CopyRow& r) { return {"copy", "n=" + std::to_string(r.n), "f32", 0, 8.0 * double(r.n)}; }

inline Key key(const AdamwRow& r) {  // reads p g m v, writes p m v
  return {"adamw", std::to_string(r.tensors) + " x " + std::to_string(r.each), "f32", 0,
          4.0 * 7 * double(r.tensors) * double(r.each)};
}

inline Key key(const BatchNormRow& r) {  // forward: reads x, writes y; backward: reads dy x, writes dx
  return {r.backward ? "batch_norm_bwd" : "batch_norm_fwd",
          "N=" + std::to_string(r.N) + " C=" + std::to_string(r.C) + " S=" + std::to_string(r.S), "f32", 0,
          (r.backward ? 12.0 : 8.0) * double(r.N * r.C * r.S)};
}

inline Key key(const ConvRow& r) {
  const kernels::cpu::Conv2dShape s = r.shape();
  const int64_t out_pixels = r.N * s.out_h() * s.out_w();
  return {std::string("conv2d_") + r.pass,
          "N=" + std::to_string(r.N) + " " + std::to_string(r.C_in) + "x" + std::to_string(r.HW) + "^2->" +
              std::to_string(r.C_out) + " k" + std::to_string(r.k) + "s" + std::to_string(r.stride),
          r.bf16 ? "bf16" : "f32", 2.0 * double(out_pixels * r.C_out * r.C_in * r.k * r.k),
          4.0 * double(r.N * r.C_in * r.HW * r.HW + r.C_out * r.C_in * r.k * r.k + out_pixels * r.C_out)};
}

// The backward counted as 2.5 forwards, as bench_kernels does; causal as half the flops
// (FlashAttention's convention: the allowed half).
inline Key key(const AttentionRow& r) {
  const double fwd = (r.causal ? 2.0 : 4.0) * double(r.BH) * double(r.S) * double(r.S) * double(r.D);
  return {r.backward ? "attention_fwd_bwd" : "attention_fwd",
          "BH=" + std::to_string(r.BH) + " S=" + std::to_string(r.S) + " D=" + std::to_string(r.D) +
              (r.causal ? " causal" : ""),
          "bf16",
          r.backward ? 3.5 * fwd : fwd, double(r.BH * r.S * r.D) * 2 * (r.backward ? 8 : 4)};
}

inline Key key(const LayerNormRow& r) {  // reads dy x, writes dx
  return {"layer_norm_bwd", "M=" + std::to_string(r.M) + " D=" + std::to_string(r.D), "f32", 0,
          12.0 * double(r.M * r.D)};
}

inline Key key(const SoftmaxRow& r) {  // reads x, writes y
  return {r.log ? "log_softmax_fwd" : "softmax_fwd", "M=" + std::to_string(r.M) + " D=" + std::to_string(r.D), "f32",
          0, 8.0 * double(r.M * r.D)};
}

inline Key key(const Row& r) {
  return std::visit([](const auto& x) { return key(x); }, r);
}

// The rows, in the order both sides print them.
inline std::vector<Row> rows() {
  return {CopyRow{int64_t(1) << 21},
          AdamwRow{4, int64_t(1) << 16},
          BatchNormRow{false, 16, 64, 256},
          BatchNormRow{true, 16, 64, 256},
          BatchNormRow{false, 32, 16, 1024},  // channels split over 8 blocks each
          BatchNormRow{true, 32, 16, 1024},
          ConvRow{"fwd", 2, 64, 128, 14, 4, 2, 1},    // DCGAN D.main.2 at batch 2
          ConvRow{"dgrad", 2, 64, 128, 14, 4, 2, 1},  // its input gradient
          ConvRow{"wgrad", 2, 64, 128, 14, 4, 2, 1},  // its weight gradient
          ConvRow{"fwd", 2, 1, 64, 28, 4, 2, 1},      // DCGAN D.main.0 at batch 2 (1 input channel: conv_narrow.cu)
          ConvRow{"wgrad", 2, 1, 64, 28, 4, 2, 1},    // its weight gradient
          ConvRow{"dgrad", 2, 1, 64, 28, 4, 2, 1},    // G.main.6's forward (ConvTranspose2d(64, 1, 4, 2, 1))
          ConvRow{"fwd", 2, 64, 128, 14, 4, 2, 1, false},  // the f32 SIMT kernel
          ConvRow{"dgrad", 2, 64, 128, 14, 4, 2, 1, false},
          ConvRow{"fwd", 64, 128, 1, 7, 7, 1, 0},    // DCGAN D.main.5 at batch 64 (1 output channel: conv_narrow.cu)
          ConvRow{"wgrad", 64, 128, 1, 7, 7, 1, 0},  // its weight gradient
          ConvRow{"dgrad", 64, 128, 1, 7, 7, 1, 0},  // its input gradient (an outer product: depth 1)
          ConvRow{"fwd", 64, 32, 64, 14, 4, 2, 1},   // train_gan's D.main.2 (ndf 32) at batch 64
          ConvRow{"wgrad", 64, 32, 64, 14, 4, 2, 1},
          ConvRow{"wgrad", 64, 64, 64, 7, 7, 1, 0},  // train_gan's G.main.0 (nz 64, ngf 32) weight gradient: depth 64
          ConvRow{"wgrad", 64, 1, 64, 28, 4, 2, 1},  // D.main.0's weight gradient at batch 64 (conv_narrow.cu)
          AttentionRow{2, 256, 64, false},
          AttentionRow{64, 256, 64, false},
          AttentionRow{64, 256, 128, false},
          AttentionRow{64, 256, 64, true},
          AttentionRow{64, 256, 128, true},
          AttentionRow{64, 256, 64, true, true},
          LayerNormRow{1600, 192},  // MAE small's width over 32 images x 50 tokens
          LayerNormRow{1600, 64},   // MAE tiny's
          SoftmaxRow{512, 1000},
          SoftmaxRow{512, 1000, true}};
}

}  // namespace nd::bench::cost_rows
