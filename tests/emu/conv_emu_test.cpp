// kernels/cuda/conv.cu in the emulator against kernels/cpu/conv.cpp: all six GEMM passes
// and the bias gradient, f32 and f64 on the exact (SIMT) kernel and f32 with bf16 or f16
// operands on the mma.sync kernel (conv_tensor_core.cuh), on shapes with partial tiles in
// every GEMM dimension, groups, stride / dilation / padding, dgrad's stride phases (stride 2
// and 3, phases no tap reaches, output_padding), and depths long enough to be split
// (split-K) in every pass; and the narrow kernels of one input channel (conv_narrow.cu,
// which conv.cu's launchers choose for C_in == 1 in conv2d terms: conv2d with 1 input
// channel, conv_transpose2d with 1 output channel) and of one output channel (forward and
// wgrad at C_out == 1: DCGAN's last discriminator layer, conv_transpose2d with 1 input
// channel) on the same checks, plus bit-equal reruns.
//
// Tolerances (emu_test.h check_sum_bound): each output element is a sum of at most n
// products (+ bias) that the CPU and the CUDA kernel add in different orders, so they differ
// by at most 2 gamma_n sum|a b|. The bf16 path is held to the SAME f32 bound against the CPU
// on bf16-rounded operands: a bf16 x bf16 product is exact in f32 (8 + 8 significant bits),
// so only the order of the f32 additions differs there too; the f16 path likewise (11 + 11).
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "emu_cost.h"
#include "emu_test.h"
#include "engine/error.h"
#include "kernels/cpu/conv.h"
#include "kernels/cuda/conv.h"

namespace {

using namespace nd::kernels;
using namespace nd::emu_test;
using Op = cuda::ConvOperands;

// One pass of shape s: `cpu` writes the CPU kernel's result on the reference operands,
// `bound` the same kernel in double on their absolute values (sum |a b|), `cuda` the emulated
// CUDA kernel's (its output poisoned with NaN first); compared within the summation bound of
// `terms` products.
template <class T, class Cpu, class Bound, class Cuda>
void check_pass(const std::string& what, size_t n, int64_t terms, Cpu cpu_pass, Bound bound_pass, Cuda cuda_pass) {
  std::vector<T> ref(n, T(0)), got = nans<T>(n);
  std::vector<double> bound(n, 0.0);
  cpu_pass(ref.data());
  bound_pass(bound.data());
  cuda_pass(got.data());
  check_sum_bound(what, got, ref, bound, terms);
}

// The names of the kernels run() launches, one a line (int64_t is `long` there, int32_t `int`).
template <class Run>
std::string kernels_run(Run&& run) {
  std::string names;
  for (const auto& launch : launches_of(run)) names += launch.kernel + "\n";
  return names;
}

// Constant operands of conv2d s (x 1, w 0.5, y 0.25) for the cases that read which kernels
// ran, not what they computed.
struct Buffers {
  std::vector<float> x, w, y;
  explicit Buffers(const cpu::Conv2dShape& s)
      : x(s.N * s.C_in * s.H * s.W, 1.0f), w(s.C_out * s.C_in / s.groups * s.kH * s.kW, 0.5f),
        y(s.N * s.C_out * s.out_h() * s.out_w(), 0.25f) {}
};

// The operands of one conv check: x, w, b, dy; the CPU reference's xr, wr, dyr (rounded
// to bf16 for Op::kBf16, f16 for Op::kF16: the CUDA kernel rounds them itself); their absolute values for the
// bound; and the tag naming the case and precision.
template <class T>
struct ConvData {
  std::vector<T> x, w, b, dy, xr, wr, dyr;
  std::vector<double> ax, aw, ab, ady;
  std::string tag;
  ConvData(const std::string& name, size_t nx, size_t nw, size_t nb, size_t ny, Op op, unsigned seed) {
    const auto x0 = uniform(nx, seed), w0 = uniform(nw, seed + 1), b0 = uniform(nb, seed + 2),
               dy0 = uniform(ny, seed + 3);
    x = cast<T>(x0), w = cast<T>(w0), b = cast<T>(b0), dy = cast<T>(dy0);
    auto r = [&](const std::vector<float>& v, const std::vector<T>& exact) {
      return op == Op::kBf16 ? cast<T>(rounded_bf16(v)) : op == Op::kF16 ? cast<T>(rounded_f16(v)) : exact;
    };
    xr = r(x0, x), wr = r(w0, w), dyr = r(dy0, dy);
    ax = abs_values(xr), aw = abs_values(wr), ab = abs_values(b), ady = abs_values(dyr);
    tag = name + (op == Op::kBf16 ? " bf16" : op == Op::kF16 ? " f16" : sizeof(T) == 4 ? " f32" : " f64");
  }
};

// conv2d forward, dgrad, wgrad and the bias gradient of shape s, CUDA (emulated) vs CPU.
template <class T>
void check_conv2d(const std::string& name, const cpu::Conv2dShape& s, Op op, unsigned seed) {
  const int64_t OH = s.out_h(), OW = s.out_w(), cig = s.C_in / s.groups, cog = s.C_out / s.groups;
  const size_t nx = s.N * s.C_in * s.H * s.W, nw = s.C_out * cig * s.kH * s.kW, ny = s.N * s.C_out * OH * OW;
  const ConvData<T> d(name, nx, nw, s.C_out, ny, op, seed);

  check_pass<T>(d.tag + " forward", ny, cig * s.kH * s.kW + 1,
                [&](T* ref) { cpu::conv2d_forward<T>(s, d.xr.data(), d.wr.data(), d.b.data(), ref); },
                [&](double* bound) { cpu::conv2d_forward<double>(s, d.ax.data(), d.aw.data(), d.ab.data(), bound); },
                [&](T* got) { cuda::conv2d_forward<T>(s, d.x.data(), d.w.data(), d.b.data(), got, nullptr, op); });

  check_pass<T>(d.tag + " dgrad", nx, cog * s.kH * s.kW,
                [&](T* ref) { cpu::conv2d_backward_input<T>(s, d.dyr.data(), d.wr.data(), ref); },
                [&](double* bound) { cpu::conv2d_backward_input<double>(s, d.ady.data(), d.aw.data(), bound); },
                [&](T* got) { cuda::conv2d_backward_input<T>(s, d.dy.data(), d.w.data(), got, nullptr, op); });

  check_pass<T>(d.tag + " wgrad", nw, s.N * OH * OW,
                [&](T* ref) { cpu::conv2d_backward_weight<T>(s, d.xr.data(), d.dyr.data(), ref); },
                [&](double* bound) { cpu::conv2d_backward_weight<double>(s, d.ax.data(), d.ady.data(), bound); },
                [&](T* got) { cuda::conv2d_backward_weight<T>(s, d.x.data(), d.dy.data(), got, nullptr, op); });

  if (op != Op::kExact) return;  // the bias gradient has no bf16 / f16 variant
  // Both accumulate in double and round once: equal unless the double sums round apart.
  check_pass<T>(d.tag + " bias grad", s.C_out, 2,
                [&](T* ref) { cpu::conv2d_backward_bias<T>(s.N, s.C_out, OH * OW, d.dy.data(), ref); },
                [&](double* bound) { cpu::conv2d_backward_bias<double>(s.N, s.C_out, OH * OW, d.ady.data(), bound); },
                [&](T* got) { cuda::conv2d_backward_bias<T>(s.N, s.C_out, OH * OW, d.dy.data(), got, nullptr); });
}

template <class T>
void check_conv_transpose2d(const std::string& name, const cpu::ConvTranspose2dShape& s, Op op, unsigned seed) {
  const int64_t OH = s.out_h(), OW = s.out_w(), cig = s.C_in / s.groups, cog = s.C_out / s.groups;
  const size_t nx = s.N * s.C_in * s.H * s.W, nw = s.C_in * cog * s.kH * s.kW, ny = s.N * s.C_out * OH * OW;
  const ConvData<T> d(name, nx, nw, s.C_out, ny, op, seed);

  check_pass<T>(d.tag + " transpose forward", ny, cig * s.kH * s.kW + 1,
                [&](T* ref) { cpu::conv_transpose2d_forward<T>(s, d.xr.data(), d.wr.data(), d.b.data(), ref); },
                [&](double* bound) { cpu::conv_transpose2d_forward<double>(s, d.ax.data(), d.aw.data(), d.ab.data(), bound); },
                [&](T* got) { cuda::conv_transpose2d_forward<T>(s, d.x.data(), d.w.data(), d.b.data(), got, nullptr, op); });

  check_pass<T>(d.tag + " transpose dgrad", nx, cog * s.kH * s.kW,
                [&](T* ref) { cpu::conv_transpose2d_backward_input<T>(s, d.dyr.data(), d.wr.data(), ref); },
                [&](double* bound) { cpu::conv_transpose2d_backward_input<double>(s, d.ady.data(), d.aw.data(), bound); },
                [&](T* got) { cuda::conv_transpose2d_backward_input<T>(s, d.dy.data(), d.w.data(), got, nullptr, op); });

  check_pass<T>(d.tag + " transpose wgrad", nw, s.N * s.H * s.W,
                [&](T* ref) { cpu::conv_transpose2d_backward_weight<T>(s, d.xr.data(), d.dyr.data(), ref); },
                [&](double* bound) { cpu::conv_transpose2d_backward_weight<double>(s, d.ax.data(), d.ady.data(), bound); },
                [&](T* got) { cuda::conv_transpose2d_backward_weight<T>(s, d.x.data(), d.dy.data(), got, nullptr, op); });
}

// Groups, stride 2 x 1, padding, dilation 1 x 2, kernel 3 x 2: 70 pixel rows (two row
// tiles, the second partial), 5 channels per group, depth 18 (partial depth steps).
cpu::Conv2dShape grouped() {
  cpu::Conv2dShape s;
  s.N = 2, s.C_in = 6, s.H = 9, s.W = 7, s.C_out = 10, s.kH = 3, s.kW = 2;
  s.stride = {2, 1}, s.padding = {1, 1}, s.dilation = {1, 2}, s.groups = 2;
  return s;
}
// Wide channels: 70 output channels (two column tiles), depth 360 / 630, 3 x 3 padding 1.
cpu::Conv2dShape wide() {
  cpu::Conv2dShape s;
  s.N = 1, s.C_in = 40, s.H = 6, s.W = 6, s.C_out = 70, s.kH = 3, s.kW = 3;
  s.padding = {1, 1};
  return s;
}
// wgrad depth N*OH*OW = 1058 against one output tile: split into 8 chunks (7 in bf16), the last partial.
cpu::Conv2dShape long_depth() {
  cpu::Conv2dShape s;
  s.N = 2, s.C_in = 3, s.H = 23, s.W = 23, s.C_out = 5, s.kH = 3, s.kW = 3;
  s.padding = {1, 1};
  return s;
}
// Whole tiles: forward and dgrad rows N*8*8 = 128 (two full 64-row tiles), 64 channels
// (one full column tile): every cell of a tile is stored.
cpu::Conv2dShape full_tiles() {
  cpu::Conv2dShape s;
  s.N = 2, s.C_in = 64, s.H = 8, s.W = 8, s.C_out = 64, s.kH = 3, s.kW = 3;
  s.padding = {1, 1};
  return s;
}
// dgrad's phases (conv_index.h DgradPhase): stride 3 x 2, dilation 2 x 1, kernel 5 x 1,
// odd sizes, padding, groups: in h the phases hold 1, 2 and 2 taps 3 apart (reading output
// rows 2 apart); in w the odd phase has none (kernel 1 against stride 2) and stores zeros.
cpu::Conv2dShape phases() {
  cpu::Conv2dShape s;
  s.N = 2, s.C_in = 4, s.H = 13, s.W = 9, s.C_out = 6, s.kH = 5, s.kW = 1;
  s.stride = {3, 2}, s.padding = {1, 0}, s.dilation = {2, 1}, s.groups = 2;
  return s;
}
cpu::ConvTranspose2dShape transposed() {
  cpu::ConvTranspose2dShape s;
  s.N = 2, s.C_in = 6, s.H = 5, s.W = 4, s.C_out = 4, s.kH = 3, s.kW = 2;
  s.stride = {2, 2}, s.padding = {1, 0}, s.output_padding = {1, 1}, s.groups = 2;
  return s;
}

// Stride 3 with dilation 2 and output_padding 2: phases of 1 and 2 taps, odd output sizes.
cpu::ConvTranspose2dShape transposed_stride3() {
  cpu::ConvTranspose2dShape s;
  s.N = 1, s.C_in = 3, s.H = 4, s.W = 5, s.C_out = 5, s.kH = 3, s.kW = 4;
  s.stride = {3, 3}, s.padding = {1, 2}, s.output_padding = {2, 1}, s.dilation = {2, 1};
  return s;
}

// DCGAN's generator layer with few pixels: transposed forward (a dgrad GEMM) of depth 128
// channels x 4 taps per phase = 512 split into 4 chunks, the bias added in chunk 0 only.
cpu::ConvTranspose2dShape transposed_split() {
  cpu::ConvTranspose2dShape s;
  s.N = 1, s.C_in = 128, s.H = 3, s.W = 3, s.C_out = 8, s.kH = 4, s.kW = 4;
  s.stride = {2, 2}, s.padding = {1, 1};
  return s;
}

// The narrow kernels (conv_narrow.cu). DCGAN D.main.0 at batch 2: Conv2d(1, 64, 4, 2, 1) on
// 28 x 28: forward 392 pixels (7 x 4 blocks), dgrad 4 phases of 196 pixels and 4 taps,
// wgrad depth 392 in one chunk over 4 channel tiles.
cpu::Conv2dShape dcgan_d0() {
  cpu::Conv2dShape s;
  s.N = 2, s.C_in = 1, s.H = 28, s.W = 28, s.C_out = 64, s.kH = 4, s.kW = 4;
  s.stride = {2, 2}, s.padding = {1, 1};
  return s;
}
// DCGAN G.main.6 at batch 2: ConvTranspose2d(64, 1, 4, 2, 1), 14 x 14 -> 28 x 28 (its
// forward is the narrow dgrad with the bias, its input gradient the narrow forward).
cpu::ConvTranspose2dShape dcgan_g6() {
  cpu::ConvTranspose2dShape s;
  s.N = 2, s.C_in = 64, s.H = 14, s.W = 14, s.C_out = 1, s.kH = 4, s.kW = 4;
  s.stride = {2, 2}, s.padding = {1, 1};
  return s;
}
// Odd sizes: 20 channels (a partial forward channel block), kernel 3 x 5, stride 1 x 2,
// padding, dilation 2 x 1, 3 samples.
cpu::Conv2dShape narrow_odd() {
  cpu::Conv2dShape s;
  s.N = 3, s.C_in = 1, s.H = 9, s.W = 11, s.C_out = 20, s.kH = 3, s.kW = 5;
  s.stride = {1, 2}, s.padding = {1, 2}, s.dilation = {2, 1};
  return s;
}
// More than one stage everywhere: 81 taps (forward stages of 64, dgrad's of 16, 6 wgrad tap
// tiles), 70 channels (two dgrad channel stages, 5 wgrad channel tiles, the last partial).
cpu::Conv2dShape narrow_many_taps() {
  cpu::Conv2dShape s;
  s.N = 1, s.C_in = 1, s.H = 10, s.W = 10, s.C_out = 70, s.kH = 9, s.kW = 9;
  s.padding = {4, 4};
  return s;
}
// wgrad depth 3 x 30 x 30 = 2700 in 10 chunks (the last shorter), summed by chunk_sum.cuh.
cpu::Conv2dShape narrow_chunked() {
  cpu::Conv2dShape s;
  s.N = 3, s.C_in = 1, s.H = 30, s.W = 30, s.C_out = 5, s.kH = 3, s.kW = 3;
  s.padding = {1, 1};
  return s;
}
// Stride 3 x 2 against kernel 2 x 4 with dilation 1 x 2: phases of 1 tap and phases of none
// (they store the bias only), output_padding, odd sizes.
cpu::ConvTranspose2dShape narrow_transposed_stride3() {
  cpu::ConvTranspose2dShape s;
  s.N = 2, s.C_in = 5, s.H = 4, s.W = 5, s.C_out = 1, s.kH = 2, s.kW = 4;
  s.stride = {3, 2}, s.padding = {0, 1}, s.output_padding = {2, 1}, s.dilation = {1, 2};
  return s;
}

// One output channel (conv_narrow.cu's one_output kernels: forward, dgrad and wgrad).
// DCGAN D.main.5: Conv2d(128, 1, 7) on 7 x 7, one output pixel per sample, forward depth
// 6272 (25 threads' strides of 256 per pixel); its dgrad is an outer product (one tap
// reaches each input pixel), 8 blocks of 16 channels.
cpu::Conv2dShape dcgan_d5(int64_t N) {
  cpu::Conv2dShape s;
  s.N = N, s.C_in = 128, s.H = 7, s.W = 7, s.C_out = 1, s.kH = 7, s.kW = 7;
  return s;
}
// Odd: kernel 3 x 2, stride 2 x 1, padding, dilation 1 x 2, 3 samples, depth 30 (one
// partial warp of taps per pixel); dgrad: phases of 1 and 2 taps in h, 5 of 16 channels.
cpu::Conv2dShape one_output_odd() {
  cpu::Conv2dShape s;
  s.N = 3, s.C_in = 5, s.H = 9, s.W = 8, s.C_out = 1, s.kH = 3, s.kW = 2;
  s.stride = {2, 1}, s.padding = {1, 1}, s.dilation = {1, 2};
  return s;
}
// Depth 37 x 9 = 333: a thread adds two taps 256 apart, the second past the end for most;
// dgrad: 9 taps reach the middle pixels, 37 channels (three channel blocks, the last partial).
cpu::Conv2dShape one_output_deep() {
  cpu::Conv2dShape s;
  s.N = 1, s.C_in = 37, s.H = 5, s.W = 5, s.C_out = 1, s.kH = 3, s.kW = 3;
  return s;
}
// wgrad over 2 x 24 x 24 = 1152 pixels against one block of taps: 4 chunks of 288.
cpu::Conv2dShape one_output_chunked() {
  cpu::Conv2dShape s;
  s.N = 2, s.C_in = 3, s.H = 24, s.W = 24, s.C_out = 1, s.kH = 3, s.kW = 3;
  s.padding = {1, 1};
  return s;
}
// conv_transpose2d with ONE input channel: its forward (with the bias), input gradient and
// weight gradient are the dgrad, forward and wgrad of a conv2d with one output channel (as_conv).
cpu::ConvTranspose2dShape one_output_transposed() {
  cpu::ConvTranspose2dShape s;
  s.N = 2, s.C_in = 1, s.H = 5, s.W = 4, s.C_out = 6, s.kH = 3, s.kW = 3;
  s.stride = {2, 2}, s.padding = {1, 0}, s.output_padding = {1, 1};
  return s;
}
// Stride 3 x 2 against kernel 2 x 4, dilation 1 x 2, output_padding: the forward's phases of
// 1 and 2 taps and phases of none (they store the bias only); 20 output channels (a partial
// second channel block).
cpu::ConvTranspose2dShape one_output_transposed_stride3() {
  cpu::ConvTranspose2dShape s;
  s.N = 2, s.C_in = 1, s.H = 4, s.W = 5, s.C_out = 20, s.kH = 2, s.kW = 4;
  s.stride = {3, 2}, s.padding = {0, 1}, s.output_padding = {2, 1}, s.dilation = {1, 2};
  return s;
}

TEST_CASE("narrow kernels (1 output channel): DCGAN D.main.5 at batch 2 and 64, f32, f64, bf16, f16") {
  check_conv2d<float>("DCGAN D.main.5 N=2", dcgan_d5(2), Op::kExact, 110);
  check_conv2d<double>("DCGAN D.main.5 N=2", dcgan_d5(2), Op::kExact, 111);
  check_conv2d<float>("DCGAN D.main.5 N=2", dcgan_d5(2), Op::kBf16, 112);
  check_conv2d<float>("DCGAN D.main.5 N=2", dcgan_d5(2), Op::kF16, 113);
  check_conv2d<float>("DCGAN D.main.5 N=64", dcgan_d5(64), Op::kBf16, 114);
}

TEST_CASE("narrow kernels (1 output channel): odd sizes, dilation, long depth, chunks, conv_transpose2d") {
  check_conv2d<float>("one output odd", one_output_odd(), Op::kExact, 120);
  check_conv2d<double>("one output odd", one_output_odd(), Op::kExact, 121);
  check_conv2d<float>("one output odd", one_output_odd(), Op::kBf16, 122);
  check_conv2d<float>("one output deep", one_output_deep(), Op::kExact, 123);
  check_conv2d<float>("one output deep", one_output_deep(), Op::kF16, 124);
  check_conv2d<float>("one output chunked", one_output_chunked(), Op::kExact, 125);
  check_conv2d<float>("one output chunked", one_output_chunked(), Op::kBf16, 126);
  check_conv_transpose2d<float>("one output transposed", one_output_transposed(), Op::kExact, 127);
  check_conv_transpose2d<double>("one output transposed", one_output_transposed(), Op::kExact, 128);
  check_conv_transpose2d<float>("one output transposed", one_output_transposed(), Op::kBf16, 129);
  check_conv_transpose2d<float>("one output transposed stride 3", one_output_transposed_stride3(), Op::kExact, 130);
  check_conv_transpose2d<double>("one output transposed stride 3", one_output_transposed_stride3(), Op::kExact, 131);
  check_conv_transpose2d<float>("one output transposed stride 3", one_output_transposed_stride3(), Op::kF16, 132);
}

// The kernels each narrow shape launches, read from the cost model's launch names: with one
// output channel every pass leaves the 64 x 64 tiles (the dgrad, an outer product there, ran
// on them before), and a conv with more channels both ways stays on them.
TEST_CASE("narrow kernels: which kernels the passes of one input or output channel launch") {
  const auto launched = [](const cpu::Conv2dShape& s, Op op) {
    Buffers b(s);
    auto &x = b.x, &w = b.w, &y = b.y;
    return kernels_run([&] {
      cuda::conv2d_forward<float>(s, x.data(), w.data(), nullptr, y.data(), nullptr, op);
      cuda::conv2d_backward_input<float>(s, y.data(), w.data(), x.data(), nullptr, op);
      cuda::conv2d_backward_weight<float>(s, x.data(), y.data(), w.data(), nullptr, op);
    });
  };
  for (const Op op : {Op::kExact, Op::kBf16}) {
    const std::string one_output = launched(dcgan_d5(2), op);
    CHECK_MESSAGE(one_output.find("one_output_forward_kernel<") != std::string::npos, one_output);
    CHECK_MESSAGE(one_output.find("one_output_dgrad_kernel<") != std::string::npos, one_output);
    CHECK_MESSAGE(one_output.find("one_output_wgrad_kernel<") != std::string::npos, one_output);
    CHECK_MESSAGE(one_output.find("gemm_kernel<") == std::string::npos, one_output);
    const std::string one_input = launched(dcgan_d0(), op);
    CHECK_MESSAGE(one_input.find("gemm_kernel<") == std::string::npos, one_input);
    CHECK_MESSAGE(one_input.find("one_output_") == std::string::npos, one_input);
    const std::string tiles = launched(grouped(), op);
    CHECK_MESSAGE(tiles.find(op == Op::kExact ? "implicit_gemm_kernel<" : "tensor_core_gemm_kernel<") !=
                      std::string::npos,
                  tiles);
  }
}

TEST_CASE("narrow kernels (1 channel): DCGAN's layers at batch 2, f32, f64, bf16, f16") {
  check_conv2d<float>("DCGAN D.main.0", dcgan_d0(), Op::kExact, 80);
  check_conv2d<double>("DCGAN D.main.0", dcgan_d0(), Op::kExact, 81);
  check_conv2d<float>("DCGAN D.main.0", dcgan_d0(), Op::kBf16, 82);
  check_conv2d<float>("DCGAN D.main.0", dcgan_d0(), Op::kF16, 83);
  check_conv_transpose2d<float>("DCGAN G.main.6", dcgan_g6(), Op::kExact, 84);
  check_conv_transpose2d<double>("DCGAN G.main.6", dcgan_g6(), Op::kExact, 85);
  check_conv_transpose2d<float>("DCGAN G.main.6", dcgan_g6(), Op::kBf16, 86);
  check_conv_transpose2d<float>("DCGAN G.main.6", dcgan_g6(), Op::kF16, 87);
}

TEST_CASE("narrow kernels (1 channel): odd sizes, dilation, several stages, chunks, phases without taps") {
  check_conv2d<float>("narrow odd", narrow_odd(), Op::kExact, 90);
  check_conv2d<double>("narrow odd", narrow_odd(), Op::kExact, 91);
  check_conv2d<float>("narrow odd", narrow_odd(), Op::kBf16, 92);
  check_conv2d<float>("narrow many taps", narrow_many_taps(), Op::kExact, 93);
  check_conv2d<float>("narrow many taps", narrow_many_taps(), Op::kF16, 94);
  check_conv2d<float>("narrow chunked", narrow_chunked(), Op::kExact, 99);
  check_conv2d<float>("narrow chunked", narrow_chunked(), Op::kBf16, 100);
  check_conv_transpose2d<float>("narrow transposed stride 3", narrow_transposed_stride3(), Op::kExact, 95);
  check_conv_transpose2d<double>("narrow transposed stride 3", narrow_transposed_stride3(), Op::kExact, 96);
  check_conv_transpose2d<float>("narrow transposed stride 3", narrow_transposed_stride3(), Op::kBf16, 97);
}

// The same bits on a second run of every narrow pass (wgrad's chunks summed in chunk order),
// one input channel and one output channel.
TEST_CASE("narrow kernels (1 channel): reruns give the same bits (f32, bf16)") {
  for (const auto& [name, s] : {std::pair{"narrow chunked rerun", narrow_chunked()},
                                std::pair{"one output chunked rerun", one_output_chunked()},
                                std::pair{"one output deep rerun", one_output_deep()}}) {
    const size_t nx = s.N * s.C_in * s.H * s.W, nw = s.C_out * s.C_in * s.kH * s.kW,
                 ny = s.N * s.C_out * s.out_h() * s.out_w();
    for (const Op op : {Op::kExact, Op::kBf16}) {
      const ConvData<float> d(name, nx, nw, s.C_out, ny, op, 98);
      const auto twice = [&](const std::string& what, size_t n, auto pass) {
        std::vector<float> first = nans<float>(n), second = nans<float>(n);
        pass(first.data());
        pass(second.data());
        check_equal(d.tag + " " + what, second, first);
      };
      twice("forward", ny,
            [&](float* out) { cuda::conv2d_forward<float>(s, d.x.data(), d.w.data(), d.b.data(), out, nullptr, op); });
      twice("dgrad", nx,
            [&](float* out) { cuda::conv2d_backward_input<float>(s, d.dy.data(), d.w.data(), out, nullptr, op); });
      twice("wgrad", nw,
            [&](float* out) { cuda::conv2d_backward_weight<float>(s, d.x.data(), d.dy.data(), out, nullptr, op); });
    }
  }
}

TEST_CASE("conv2d dgrad phases: stride 3 x 2, dilation, phases without taps (f32, bf16, f64)") {
  check_conv2d<float>("phases", phases(), Op::kExact, 70);
  check_conv2d<float>("phases", phases(), Op::kBf16, 71);
  check_conv2d<double>("phases", phases(), Op::kExact, 72);
}

TEST_CASE("conv2d f32 exact kernel: grouped, strided, dilated, padded, partial and full tiles") {
  check_conv2d<float>("grouped", grouped(), Op::kExact, 10);
  check_conv2d<float>("wide", wide(), Op::kExact, 20);
  check_conv2d<float>("full tiles", full_tiles(), Op::kExact, 25);
}

TEST_CASE("conv2d bf16 operands on the tensor-core kernel") {
  check_conv2d<float>("grouped", grouped(), Op::kBf16, 10);
  check_conv2d<float>("wide", wide(), Op::kBf16, 20);
  check_conv2d<float>("full tiles", full_tiles(), Op::kBf16, 25);
}

TEST_CASE("conv2d f16 operands on the tensor-core kernel") {
  check_conv2d<float>("grouped", grouped(), Op::kF16, 11);
  check_conv2d<float>("full tiles", full_tiles(), Op::kF16, 26);
}

TEST_CASE("conv2d wgrad split-K (f32, bf16, f16) and f64") {
  check_conv2d<float>("long depth", long_depth(), Op::kExact, 30);
  check_conv2d<float>("long depth", long_depth(), Op::kBf16, 30);
  check_conv2d<float>("long depth", long_depth(), Op::kF16, 31);
  check_conv2d<double>("grouped", grouped(), Op::kExact, 40);
}

TEST_CASE("conv_transpose2d f32, bf16, f16 and f64") {
  check_conv_transpose2d<float>("transposed", transposed(), Op::kExact, 50);
  check_conv_transpose2d<float>("transposed", transposed(), Op::kBf16, 50);
  check_conv_transpose2d<float>("transposed", transposed(), Op::kF16, 51);
  check_conv_transpose2d<double>("transposed", transposed(), Op::kExact, 60);
  check_conv_transpose2d<float>("transposed stride 3", transposed_stride3(), Op::kExact, 61);
  check_conv_transpose2d<float>("transposed stride 3", transposed_stride3(), Op::kF16, 62);
  check_conv_transpose2d<float>("transposed split-K", transposed_split(), Op::kExact, 63);
  check_conv_transpose2d<float>("transposed split-K", transposed_split(), Op::kBf16, 64);
}

// The kernels' walks in int64_t (conv.h set_conv_index_width), which only tensors past 2^31
// elements would reach otherwise: every pass of the SIMT kernel (f32, f64) and of the
// tensor-core kernel (bf16, f16), with groups, phases and split-K. Which instantiations ran
// is read from the cost model's launch names (int64_t is `long` there, int32_t `int`).
TEST_CASE("conv2d and conv_transpose2d on 64-bit index walks (forced), and the walks that ran") {
  struct Restore {
    ~Restore() { cuda::set_conv_index_width(cuda::ConvIndexWidth::kAuto); }
  } restore;
  const auto s = grouped();
  Buffers b(s);
  auto &x = b.x, &w = b.w, &y = b.y;
  const auto forward = [&](Op op) {
    return kernels_run([&] { cuda::conv2d_forward<float>(s, x.data(), w.data(), nullptr, y.data(), nullptr, op); });
  };
  CHECK_MESSAGE(forward(Op::kExact).find("implicit_gemm_kernel<float, int, ") != std::string::npos,
                forward(Op::kExact));
  CHECK(forward(Op::kBf16).find("tensor_core_gemm_kernel<__nv_bfloat16, int, ") != std::string::npos);

  CHECK(cuda::set_conv_index_width(cuda::ConvIndexWidth::kInt64) == cuda::ConvIndexWidth::kAuto);
  CHECK_MESSAGE(forward(Op::kExact).find("implicit_gemm_kernel<float, long, ") != std::string::npos,
                forward(Op::kExact));
  CHECK_MESSAGE(forward(Op::kF16).find("tensor_core_gemm_kernel<__half, long, ") != std::string::npos,
                forward(Op::kF16));
  check_conv2d<float>("grouped (int64)", grouped(), Op::kExact, 80);
  check_conv2d<double>("phases (int64)", phases(), Op::kExact, 81);
  check_conv2d<float>("phases (int64)", phases(), Op::kBf16, 82);
  check_conv2d<float>("long depth (int64)", long_depth(), Op::kF16, 83);
  check_conv_transpose2d<float>("transposed split-K (int64)", transposed_split(), Op::kExact, 84);
  check_conv_transpose2d<float>("transposed (int64)", transposed(), Op::kBf16, 85);
}

// ConvSplit::kFillSms (conv.h): the depth cut finer until the blocks cover 132 SMs or a
// chunk is one k-tile. full_tiles' forward (2 tiles, depth 576): 4 chunks of 144 -> 36 of 16
// (18 of 32 in bf16); its wgrad (9 tiles, depth 128): none -> 8 chunks of 16. The results
// stay within the same bound of the CPU's and the same bits run to run; the launches have
// more blocks than under the default.
TEST_CASE("conv2d with ConvSplit::kFillSms: more chunks, the same results (f32, bf16)") {
  struct Restore {
    ~Restore() { cuda::set_conv_split(cuda::ConvSplit::kBusiestSm); }
  } restore;
  const auto s = full_tiles();
  Buffers b(s);
  auto &x = b.x, &w = b.w, &y = b.y;
  // The gemm kernel's blocks in one forward and one wgrad.
  const auto gemm_blocks = [&](Op op) {
    int64_t blocks = 0;
    for (const auto& launch : launches_of([&] {
           cuda::conv2d_forward<float>(s, x.data(), w.data(), nullptr, y.data(), nullptr, op);
           cuda::conv2d_backward_weight<float>(s, x.data(), y.data(), w.data(), nullptr, op);
         }))
      if (launch.kernel.find("gemm_kernel<") != std::string::npos) blocks += launch.blocks;
    return blocks;
  };
  for (const Op op : {Op::kExact, Op::kBf16}) {
    CAPTURE(int(op));
    const int64_t busiest = gemm_blocks(op);
    CHECK(cuda::set_conv_split(cuda::ConvSplit::kFillSms) == cuda::ConvSplit::kBusiestSm);
    const int64_t filled = gemm_blocks(op);
    CHECK(filled == (op == Op::kExact ? 2 * 36 + 9 * 8 : 2 * 18 + 9 * 4));
    CHECK(busiest == (op == Op::kExact ? 2 * 4 + 9 : 2 * 4 + 9));
    check_conv2d<float>("full tiles (fill SMs)", s, op, 27);
    const ConvData<float> d("full tiles (fill SMs) rerun", x.size(), w.size(), s.C_out, y.size(), op, 28);
    std::vector<float> first = nans<float>(y.size()), second = nans<float>(y.size());
    cuda::conv2d_forward<float>(s, d.x.data(), d.w.data(), d.b.data(), first.data(), nullptr, op);
    cuda::conv2d_forward<float>(s, d.x.data(), d.w.data(), d.b.data(), second.data(), nullptr, op);
    check_equal(d.tag + " forward", second, first);
    CHECK(cuda::set_conv_split(cuda::ConvSplit::kBusiestSm) == cuda::ConvSplit::kFillSms);
  }
}

TEST_CASE("conv2d bf16 operands on f64 tensors are an nd::Error") {
  const auto s = grouped();
  std::vector<double> x(s.N * s.C_in * s.H * s.W), w(s.C_out * s.C_in / s.groups * s.kH * s.kW),
      y(s.N * s.C_out * s.out_h() * s.out_w());
  CHECK_THROWS_WITH_AS(cuda::conv2d_forward<double>(s, x.data(), w.data(), nullptr, y.data(), nullptr, Op::kBf16),
                       doctest::Contains("expected f32 tensors for bf16 or f16 operands"), nd::Error);
  CHECK_THROWS_WITH_AS(cuda::conv2d_forward<double>(s, x.data(), w.data(), nullptr, y.data(), nullptr, Op::kF16),
                       doctest::Contains("expected f32 tensors for bf16 or f16 operands"), nd::Error);
  // The narrow kernels' shapes (1 input channel) are checked before the dispatch too.
  const auto n = dcgan_d0();
  std::vector<double> nx(n.N * n.H * n.W), nw(n.C_out * n.kH * n.kW), ny(n.N * n.C_out * n.out_h() * n.out_w());
  CHECK_THROWS_WITH_AS(cuda::conv2d_backward_weight<double>(n, nx.data(), ny.data(), nw.data(), nullptr, Op::kBf16),
                       doctest::Contains("expected f32 tensors for bf16 or f16 operands"), nd::Error);
  CHECK_THROWS_WITH_AS(cuda::conv2d_backward_input<double>(n, ny.data(), nw.data(), nx.data(), nullptr, Op::kF16),
                       doctest::Contains("expected f32 tensors for bf16 or f16 operands"), nd::Error);
}

}  // namespace
