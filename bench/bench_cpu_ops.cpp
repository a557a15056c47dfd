// CPU op microbenchmarks: our kernels in kernels/cpu against the baseline each should
// approach, at the shapes the models use.
//   matmul / bmm   vs a bare Eigen product of the same size (our gemm is Eigen under Maps,
//                  so ratio ~ 1 says the wrapper costs nothing; bmm's batch threading
//                  vs Eigen's own threads inside each product).
//   conv2d fwd / dgrad / wgrad, conv_transpose2d fwd
//                  vs one plain gemm of the equivalent GEMM shape over the whole batch
//                  (M = C_out, N = batch*OH*OW, K = C_in*kH*kW for the forward), i.e. the
//                  ceiling for im2col + GEMM. Target: ratio >= 0.6.
// ratio = our GFLOP/s / baseline GFLOP/s (> 1: faster than the baseline).
// Output: a human table on stdout, then one JSON line per row
//   {"op","shape","dtype","impl","ms","gflops","gbps","baseline","ratio"}.
// Timing: warm-up, then the median of several runs (steady_clock); Eigen/OpenMP threads
// as the environment sets them (OMP_NUM_THREADS).
// Usage: bench_cpu_ops [NAME...]  runs only the kBenches entries named (default: all).
// To add an op: write `void bench_<op>(Report&)` and append it to kBenches at the bottom.
// GCC 12 false positives inside Eigen's AVX-512 code (see kernels/cpu/matmul.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Core>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/conv.h"
#include "kernels/cpu/matmul.h"

namespace cpu = nd::kernels::cpu;

namespace {

struct Row {
  std::string op, shape, dtype, impl;
  double ms = 0, gflops = 0, gbps = 0;
  std::string baseline;  // impl name of the row this one is compared to ("" for a baseline)
  double ratio = 0;
};

struct Report {
  std::vector<Row> rows;
  // Adds the baseline row and ours, ratio = ours / baseline in GFLOP/s.
  void pair(const std::string& op, const std::string& shape, Row base, Row ours) {
    base.op = ours.op = op;
    base.shape = ours.shape = shape;
    ours.baseline = base.impl;
    ours.ratio = ours.gflops / base.gflops;
    rows.push_back(base);
    rows.push_back(ours);
  }
};

// Median wall time in ms of fn() after warm-up; enough repetitions for ~0.3 s per case.
double time_ms(const std::function<void()>& fn) {
  using clock = std::chrono::steady_clock;
  fn();
  const auto t0 = clock::now();
  fn();
  const double first = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  const int reps = std::clamp(int(300.0 / std::max(first, 1e-3)), 5, 200);
  std::vector<double> t(static_cast<size_t>(reps));
  for (auto& x : t) {
    const auto a = clock::now();
    fn();
    x = std::chrono::duration<double, std::milli>(clock::now() - a).count();
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[size_t(reps / 2)];
}

Row measure(const std::string& impl, double flops, double bytes, const std::function<void()>& fn) {
  Row r;
  r.dtype = "f32";
  r.impl = impl;
  r.ms = time_ms(fn);
  r.gflops = flops / (r.ms * 1e6);
  r.gbps = bytes / (r.ms * 1e6);
  return r;
}

std::vector<float> random_vec(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(gen);
  return v;
}

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Bare Eigen C = A * B on its own row-major matrices: the baseline for gemm.
Row eigen_gemm_row(int64_t M, int64_t N, int64_t K) {
  RowMat a = RowMat::Random(M, K), b = RowMat::Random(K, N), c(M, N);
  return measure("eigen", 2.0 * M * N * K, 4.0 * (M * K + K * N + M * N),
                 [&] { c.noalias() = a * b; });
}

// Our gemm with beta = 0, no transposes.
Row our_gemm_row(int64_t M, int64_t N, int64_t K, const std::string& impl = "nd::gemm") {
  auto a = random_vec(M * K, 1), b = random_vec(K * N, 2);
  std::vector<float> c(size_t(M * N));
  return measure(impl, 2.0 * M * N * K, 4.0 * (M * K + K * N + M * N), [&] {
    cpu::gemm(false, false, M, N, K, 1.f, a.data(), K, b.data(), N, 0.f, c.data(), N);
  });
}

std::string mnk(int64_t M, int64_t N, int64_t K) {
  return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
}

void bench_matmul(Report& rep) {
  const int64_t shapes[][3] = {{256, 256, 256}, {512, 512, 512},  {1024, 1024, 1024},
                               {2048, 2048, 2048}, {64, 6272, 100},  // DCGAN G's Linear(100, 128*7*7), batch 64
                               {64, 1, 6272}};                       // DCGAN D's last Linear(6272, 1)
  for (auto& s : shapes)
    rep.pair("matmul", mnk(s[0], s[1], s[2]), eigen_gemm_row(s[0], s[1], s[2]),
             our_gemm_row(s[0], s[1], s[2]));
}

// bmm: batch threading (ours decides) vs a serial loop of bare Eigen products, each using
// Eigen's threads. Attention-like small matrices and a few large ones.
void bench_bmm(Report& rep) {
  const int64_t shapes[][4] = {{256, 50, 50, 16},    // batch*heads, seq x seq scores, head dim 16
                               {256, 50, 16, 50},    // probs * V
                               {8, 512, 512, 512}};
  for (auto& s : shapes) {
    const int64_t B = s[0], M = s[1], N = s[2], K = s[3];
    const double flops = 2.0 * B * M * N * K, bytes = 4.0 * B * (M * K + K * N + M * N);
    auto a = random_vec(B * M * K, 3), b = random_vec(B * K * N, 4);
    std::vector<float> c(size_t(B * M * N));
    Row base = measure("eigen_loop", flops, bytes, [&] {
      for (int64_t i = 0; i < B; ++i) {
        Eigen::Map<const RowMat> x(a.data() + i * M * K, M, K), y(b.data() + i * K * N, K, N);
        Eigen::Map<RowMat> z(c.data() + i * M * N, M, N);
        z.noalias() = x * y;
      }
    });
    Row ours = measure("nd::bmm", flops, bytes, [&] {
      cpu::bmm(false, false, B, M, N, K, 1.f, a.data(), K, M * K, b.data(), N, K * N, 0.f,
               c.data(), N, M * N);
    });
    rep.pair("bmm", "B=" + std::to_string(B) + " " + mnk(M, N, K), base, ours);
  }
}

std::string conv_name(const cpu::Conv2dShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "N=%ld %ld->%ld k%ld s%ld p%ld %ldx%ld", long(s.N), long(s.C_in),
                long(s.C_out), long(s.kH), long(s.stride[0]), long(s.padding[0]), long(s.H), long(s.W));
  return buf;
}

// conv2d fwd / dgrad / wgrad vs the equivalent whole-batch GEMM (groups = 1).
void bench_conv2d(Report& rep) {
  auto conv = [](int64_t N, int64_t C_in, int64_t C_out, int64_t HW, int64_t k, int64_t st, int64_t pad) {
    return cpu::Conv2dShape{N, C_in, HW, HW, C_out, k, k, {st, st}, {pad, pad}, {1, 1}, 1};
  };
  const cpu::Conv2dShape shapes[] = {
      conv(64, 1, 64, 28, 4, 2, 1),    // DCGAN D layer 1 on 28x28 Fashion-MNIST
      conv(64, 64, 128, 14, 4, 2, 1),  // DCGAN D layer 2
      conv(8, 64, 64, 56, 3, 1, 1),    // ResNet basic block
  };
  for (const auto& s : shapes) {
    const int64_t OHW = s.out_h() * s.out_w(), Kc = s.C_in * s.kH * s.kW, cols = s.N * OHW;
    const double flops = 2.0 * s.C_out * cols * Kc;
    const int64_t nx = s.N * s.C_in * s.H * s.W, ny = s.N * s.C_out * OHW, nw = s.C_out * Kc;
    const double bytes = 4.0 * (nx + ny + nw);
    auto x = random_vec(nx, 5), w = random_vec(nw, 6), dy = random_vec(ny, 7), b = random_vec(s.C_out, 8);
    std::vector<float> y(static_cast<size_t>(ny)), dx(static_cast<size_t>(nx)), dw(static_cast<size_t>(nw));
    const std::string name = conv_name(s);
    rep.pair("conv2d_fwd", name, our_gemm_row(s.C_out, cols, Kc, "gemm_equiv"),
             measure("nd::im2col_gemm", flops, bytes,
                     [&] { cpu::conv2d_forward(s, x.data(), w.data(), b.data(), y.data()); }));
    rep.pair("conv2d_dgrad", name, our_gemm_row(Kc, cols, s.C_out, "gemm_equiv"),
             measure("nd::im2col_gemm", flops, bytes,
                     [&] { cpu::conv2d_backward_input(s, dy.data(), w.data(), dx.data()); }));
    rep.pair("conv2d_wgrad", name, our_gemm_row(s.C_out, Kc, cols, "gemm_equiv"),
             measure("nd::im2col_gemm", flops, bytes,
                     [&] { cpu::conv2d_backward_weight(s, x.data(), dy.data(), dw.data()); }));
  }
}

// conv_transpose2d forward at the DCGAN generator's shapes (it is conv2d's dgrad).
void bench_conv_transpose2d(Report& rep) {
  auto tconv = [](int64_t N, int64_t C_in, int64_t C_out, int64_t HW) {
    cpu::ConvTranspose2dShape s{N, C_in, HW, HW, C_out, 4, 4};
    s.stride = {2, 2};
    s.padding = {1, 1};
    return s;
  };
  const cpu::ConvTranspose2dShape shapes[] = {tconv(64, 128, 64, 7), tconv(64, 64, 1, 14)};
  for (const auto& s : shapes) {
    const int64_t OHW = s.out_h() * s.out_w(), HW = s.H * s.W, Kc = s.C_out * s.kH * s.kW;
    const double flops = 2.0 * s.C_in * s.N * HW * Kc;
    const int64_t nx = s.N * s.C_in * HW, ny = s.N * s.C_out * OHW, nw = s.C_in * Kc;
    auto x = random_vec(nx, 9), w = random_vec(nw, 10), b = random_vec(s.C_out, 11);
    std::vector<float> y(static_cast<size_t>(ny));
    char name[160];
    std::snprintf(name, sizeof name, "N=%ld %ld->%ld k4 s2 p1 %ldx%ld", long(s.N), long(s.C_in),
                  long(s.C_out), long(s.H), long(s.W));
    rep.pair("conv_transpose2d_fwd", name, our_gemm_row(Kc, s.N * HW, s.C_in, "gemm_equiv"),
             measure("nd::im2col_gemm", flops, 4.0 * (nx + ny + nw),
                     [&] { cpu::conv_transpose2d_forward(s, x.data(), w.data(), b.data(), y.data()); }));
  }
}

// ---- the benchmark list: add a row family here ----------------------------------------
struct Bench {
  const char* name;
  void (*run)(Report&);
};
const Bench kBenches[] = {
    {"matmul", bench_matmul},
    {"bmm", bench_bmm},
    {"conv2d", bench_conv2d},
    {"conv_transpose2d", bench_conv_transpose2d},
};

}  // namespace

int main(int argc, char** argv) {
  Report rep;
  for (const auto& bench : kBenches) {
    bool wanted = argc == 1;
    for (int i = 1; i < argc; ++i) wanted = wanted || std::string(argv[i]) == bench.name;
    if (wanted) bench.run(rep);
  }
  std::printf("bench_cpu_ops: %d OpenMP threads; ratio = our GFLOP/s / baseline GFLOP/s\n",
              omp_get_max_threads());
  std::printf("%-22s %-28s %-16s %10s %9s %8s %7s\n", "op", "shape", "impl", "ms", "GFLOP/s",
              "GB/s", "ratio");
  for (const auto& r : rep.rows) {
    std::printf("%-22s %-28s %-16s %10.3f %9.1f %8.2f ", r.op.c_str(), r.shape.c_str(),
                r.impl.c_str(), r.ms, r.gflops, r.gbps);
    if (r.baseline.empty()) std::printf("%7s\n", "-");
    else std::printf("%7.2f\n", r.ratio);
  }
  for (const auto& r : rep.rows) {
    std::printf("{\"op\":\"%s\",\"shape\":\"%s\",\"dtype\":\"%s\",\"impl\":\"%s\",\"ms\":%.4f,"
                "\"gflops\":%.2f,\"gbps\":%.3f,\"baseline\":",
                r.op.c_str(), r.shape.c_str(), r.dtype.c_str(), r.impl.c_str(), r.ms, r.gflops, r.gbps);
    if (r.baseline.empty()) std::printf("null,\"ratio\":null}\n");
    else std::printf("\"%s\",\"ratio\":%.3f}\n", r.baseline.c_str(), r.ratio);
  }
  return 0;
}
