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
// Output: a human table on stdout, then one JSON line per row (json_line.h)
//   {"op","shape","dtype","impl","ms","gflops","gbps","baseline","ratio"}.
// Timing: warm-up, then baseline and ours alternately, median of each (steady_clock), so
// load from other processes hits both alike; threads as OMP_NUM_THREADS sets them.
// Usage: bench_cpu_ops [NAME...]  runs only the kBenches entries named (default: all).
// To add an op: write `void bench_<op>(Report&)` and append it to kBenches at the bottom.
// GCC 12 false positives inside Eigen's AVX-512 code (see kernels/cpu/matmul.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Core>
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "json_line.h"
#include "kernels/cpu/attention.h"
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

// One side of a comparison: a name and a callable that owns its buffers.
struct Timed {
  std::string impl;
  std::function<void()> run;
};

double elapsed_ms(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

struct Report {
  std::vector<Row> rows;
  // Times baseline and ours alternately, one run each per round, so both see the same
  // machine load (this box is shared); median of each over ~0.6 s after a warm-up.
  // Adds both rows, ratio = ours / baseline in GFLOP/s.
  void pair(const std::string& op, const std::string& shape, double flops, double bytes, const Timed& base,
            const Timed& ours) {
    base.run();
    ours.run();
    const double first = elapsed_ms(base.run) + elapsed_ms(ours.run);
    const int rounds = std::clamp(int(600.0 / std::max(first, 1e-3)), 5, 200);
    std::vector<double> tb, to;
    for (int r = 0; r < rounds; ++r) {
      tb.push_back(elapsed_ms(base.run));
      to.push_back(elapsed_ms(ours.run));
    }
    auto row = [&](const Timed& t, double ms) {
      Row r;
      r.op = op;
      r.shape = shape;
      r.dtype = "f32";
      r.impl = t.impl;
      r.ms = ms;
      r.gflops = flops / (ms * 1e6);
      r.gbps = bytes / (ms * 1e6);
      return r;
    };
    Row b = row(base, median(tb)), o = row(ours, median(to));
    o.baseline = b.impl;
    o.ratio = o.gflops / b.gflops;
    rows.push_back(b);
    rows.push_back(o);
  }
};

std::vector<float> random_vec(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(gen);
  return v;
}

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Bare Eigen C = A * B on its own row-major matrices: the baseline for gemm.
Timed eigen_gemm(int64_t M, int64_t N, int64_t K) {
  auto m = std::make_shared<std::array<RowMat, 3>>();
  (*m)[0] = RowMat::Random(M, K);
  (*m)[1] = RowMat::Random(K, N);
  (*m)[2].resize(M, N);
  return {"eigen", [m] { (*m)[2].noalias() = (*m)[0] * (*m)[1]; }};
}

// Our gemm, C[M, N] = A[M, K] B[K, N] (beta = 0, no transposes).
Timed our_gemm(int64_t M, int64_t N, int64_t K, const std::string& impl = "nd::gemm") {
  auto a = std::make_shared<std::vector<float>>(random_vec(M * K, 1));
  auto b = std::make_shared<std::vector<float>>(random_vec(K * N, 2));
  auto c = std::make_shared<std::vector<float>>(static_cast<size_t>(M * N));
  return {impl, [=] { cpu::gemm(false, false, M, N, K, 1.f, a->data(), K, b->data(), N, 0.f, c->data(), N); }};
}

double gemm_flops(int64_t M, int64_t N, int64_t K) { return 2.0 * M * N * K; }
double gemm_bytes(int64_t M, int64_t N, int64_t K) { return 4.0 * (M * K + K * N + M * N); }

std::string mnk(int64_t M, int64_t N, int64_t K) {
  return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
}

void bench_matmul(Report& rep) {
  const int64_t shapes[][3] = {{256, 256, 256}, {512, 512, 512},  {1024, 1024, 1024},
                               {2048, 2048, 2048}, {64, 6272, 100},  // DCGAN G's Linear(100, 128*7*7), batch 64
                               {64, 1, 6272}};                       // DCGAN D's last Linear(6272, 1)
  for (auto& s : shapes)
    rep.pair("matmul", mnk(s[0], s[1], s[2]), gemm_flops(s[0], s[1], s[2]), gemm_bytes(s[0], s[1], s[2]),
             eigen_gemm(s[0], s[1], s[2]), our_gemm(s[0], s[1], s[2]));
}

// bmm: batch threading (ours decides) vs a serial loop of bare Eigen products, each using
// Eigen's threads. Attention-like small matrices and a few large ones.
void bench_bmm(Report& rep) {
  const int64_t shapes[][4] = {{256, 50, 50, 16},    // batch*heads, seq x seq scores, head dim 16
                               {256, 50, 16, 50},    // probs * V
                               {8, 512, 512, 512}};
  for (auto& s : shapes) {
    const int64_t B = s[0], M = s[1], N = s[2], K = s[3];
    auto a = std::make_shared<std::vector<float>>(random_vec(B * M * K, 3));
    auto b = std::make_shared<std::vector<float>>(random_vec(B * K * N, 4));
    auto c = std::make_shared<std::vector<float>>(static_cast<size_t>(B * M * N));
    const Timed base{"eigen_loop", [=] {
                       for (int64_t i = 0; i < B; ++i) {
                         Eigen::Map<const RowMat> x(a->data() + i * M * K, M, K), y(b->data() + i * K * N, K, N);
                         Eigen::Map<RowMat> z(c->data() + i * M * N, M, N);
                         z.noalias() = x * y;
                       }
                     }};
    const Timed ours{"nd::bmm", [=] {
                       cpu::bmm(false, false, B, M, N, K, 1.f, a->data(), K, M * K, b->data(), N, K * N, 0.f,
                                c->data(), N, M * N);
                     }};
    rep.pair("bmm", "B=" + std::to_string(B) + " " + mnk(M, N, K), B * gemm_flops(M, N, K),
             B * gemm_bytes(M, N, K), base, ours);
  }
}

std::string conv_name(const cpu::Conv2dShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "N=%ld %ld->%ld k%ld s%ld p%ld %ldx%ld", long(s.N), long(s.C_in),
                long(s.C_out), long(s.kH), long(s.stride[0]), long(s.padding[0]), long(s.H), long(s.W));
  return buf;
}

// Buffers for one conv shape, shared by the timed closures.
struct ConvData {
  std::vector<float> x, w, b, y, dy, dx, dw;
};

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
    const int64_t nx = s.N * s.C_in * s.H * s.W, ny = s.N * s.C_out * OHW, nw = s.C_out * Kc;
    const double flops = gemm_flops(s.C_out, cols, Kc), bytes = 4.0 * (nx + ny + nw);
    auto d = std::make_shared<ConvData>(ConvData{random_vec(nx, 5), random_vec(nw, 6), random_vec(s.C_out, 8),
                                                 std::vector<float>(static_cast<size_t>(ny)), random_vec(ny, 7),
                                                 std::vector<float>(static_cast<size_t>(nx)),
                                                 std::vector<float>(static_cast<size_t>(nw))});
    const std::string name = conv_name(s);
    rep.pair("conv2d_fwd", name, flops, bytes, our_gemm(s.C_out, cols, Kc, "gemm_equiv"),
             {"nd::im2col_gemm", [=] { cpu::conv2d_forward(s, d->x.data(), d->w.data(), d->b.data(), d->y.data()); }});
    rep.pair("conv2d_dgrad", name, flops, bytes, our_gemm(Kc, cols, s.C_out, "gemm_equiv"),
             {"nd::im2col_gemm", [=] { cpu::conv2d_backward_input(s, d->dy.data(), d->w.data(), d->dx.data()); }});
    rep.pair("conv2d_wgrad", name, flops, bytes, our_gemm(s.C_out, Kc, cols, "gemm_equiv"),
             {"nd::im2col_gemm", [=] { cpu::conv2d_backward_weight(s, d->x.data(), d->dy.data(), d->dw.data()); }});
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
    const int64_t nx = s.N * s.C_in * HW, ny = s.N * s.C_out * OHW, nw = s.C_in * Kc;
    auto d = std::make_shared<ConvData>();
    d->x = random_vec(nx, 9);
    d->w = random_vec(nw, 10);
    d->b = random_vec(s.C_out, 11);
    d->y.resize(static_cast<size_t>(ny));
    char name[160];
    std::snprintf(name, sizeof name, "N=%ld %ld->%ld k4 s2 p1 %ldx%ld", long(s.N), long(s.C_in),
                  long(s.C_out), long(s.H), long(s.W));
    rep.pair("conv_transpose2d_fwd", name, gemm_flops(Kc, s.N * HW, s.C_in), 4.0 * (nx + ny + nw),
             our_gemm(Kc, s.N * HW, s.C_in, "gemm_equiv"),
             {"nd::im2col_gemm",
              [=] { cpu::conv_transpose2d_forward(s, d->x.data(), d->w.data(), d->b.data(), d->y.data()); }});
  }
}

// Attention, forward and backward: our flash-style kernel (no Sq x Sk matrix) against
// the unfused computation with Eigen, which materialises S = QK^T per (b, h):
//   forward  S = scale QK^T, P = softmax(S), O = PV                (2 GEMMs)
//   backward dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)),
//            dQ = scale dS K, dK = scale dS^T Q                      (4 GEMMs)
// FLOPs counted as the GEMMs: 4 B H Sq Sk E forward; 8 (baseline) and 10 (ours, which
// recomputes S) B H Sq Sk E backward -- both rows report the baseline's 8 so the
// ratio is a plain time ratio.
void bench_attention(Report& rep) {
  const int64_t shapes[][4] = {{64, 4, 13, 16},   // MAE tiny encoder: 12 visible patches + cls, batch 64
                               {64, 4, 50, 8},    // MAE tiny decoder: 49 patches + cls
                               {4, 8, 512, 64}};  // a longer sequence
  for (auto& s : shapes) {
    const int64_t B = s[0], H = s[1], S = s[2], E = s[3], n = B * H * S * E;
    const double scale = 1.0 / std::sqrt(double(E));
    auto q = std::make_shared<std::vector<float>>(random_vec(n, 5));
    auto k = std::make_shared<std::vector<float>>(random_vec(n, 6));
    auto v = std::make_shared<std::vector<float>>(random_vec(n, 7));
    auto dout = std::make_shared<std::vector<float>>(random_vec(n, 8));
    auto out = std::make_shared<std::vector<float>>(n), lse = std::make_shared<std::vector<float>>(B * H * S);
    auto dq = std::make_shared<std::vector<float>>(n), dk = std::make_shared<std::vector<float>>(n),
         dv = std::make_shared<std::vector<float>>(n);
    auto pm = std::make_shared<std::vector<RowMat>>(B * H);  // the baseline's P per (b, h)
    auto eigen_fwd = [=] {
#pragma omp parallel for schedule(static)
      for (int64_t bh = 0; bh < B * H; ++bh) {
        Eigen::Map<const RowMat> Q(q->data() + bh * S * E, S, E), K(k->data() + bh * S * E, S, E),
            V(v->data() + bh * S * E, S, E);
        Eigen::Map<RowMat> O(out->data() + bh * S * E, S, E);
        RowMat& P = (*pm)[bh];
        P.noalias() = (Q * K.transpose()) * float(scale);
        for (int64_t i = 0; i < S; ++i) {
          auto row = P.row(i);
          row = (row.array() - row.maxCoeff()).exp();
          row /= row.sum();
        }
        O.noalias() = P * V;
      }
    };
    auto eigen_bwd = [=] {
#pragma omp parallel for schedule(static)
      for (int64_t bh = 0; bh < B * H; ++bh) {
        Eigen::Map<const RowMat> Q(q->data() + bh * S * E, S, E), K(k->data() + bh * S * E, S, E),
            V(v->data() + bh * S * E, S, E), dO(dout->data() + bh * S * E, S, E);
        Eigen::Map<RowMat> dQ(dq->data() + bh * S * E, S, E), dK(dk->data() + bh * S * E, S, E),
            dV(dv->data() + bh * S * E, S, E);
        const RowMat& P = (*pm)[bh];
        dV.noalias() = P.transpose() * dO;
        RowMat dS = dO * V.transpose();
        for (int64_t i = 0; i < S; ++i) {
          const float d = dS.row(i).dot(P.row(i));
          dS.row(i) = (P.row(i).array() * (dS.row(i).array() - d)).matrix();
        }
        dQ.noalias() = (dS * K) * float(scale);
        dK.noalias() = (dS.transpose() * Q) * float(scale);
      }
    };
    const cpu::AttentionMask<float> none{};
    auto ours_fwd = [=] {
      cpu::scaled_dot_product_attention_forward(q->data(), k->data(), v->data(), none, B, H, S, S, E, E, false,
                                                scale, {}, out->data(), lse->data());
    };
    auto ours_bwd = [=] {
      cpu::scaled_dot_product_attention_backward(dout->data(), q->data(), k->data(), v->data(), none, out->data(),
                                                 lse->data(), B, H, S, S, E, E, false, scale, {}, dq->data(),
                                                 dk->data(), dv->data());
    };
    eigen_fwd();  // the baseline's backward reads its P
    ours_fwd();   // ours reads out and lse
    const std::string shape = "B=" + std::to_string(B) + " H=" + std::to_string(H) + " S=" + std::to_string(S) +
                              " E=" + std::to_string(E);
    const double sse = double(B) * H * S * S * E, bytes = 4.0 * 4 * n;
    rep.pair("attention_fwd", shape, 4 * sse, bytes, Timed{"eigen_unfused", eigen_fwd}, Timed{"nd::sdpa", ours_fwd});
    rep.pair("attention_bwd", shape, 8 * sse, 2 * bytes, Timed{"eigen_unfused", eigen_bwd},
             Timed{"nd::sdpa", ours_bwd});
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
    {"attention", bench_attention},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::printf("usage: bench_cpu_ops [NAME...]\nCPU op microbenchmarks against their baselines; NAME runs only that one:");
    for (const auto& bench : kBenches) std::printf(" %s", bench.name);
    std::printf(" (default: all).\n");
    return 0;
  }
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
    auto line = nd::bench::JsonLine::row(r.op, r.shape, r.dtype, r.impl)
                    .number("ms", r.ms, "%.4f")
                    .number("gflops", r.gflops, "%.2f")
                    .number("gbps", r.gbps, "%.3f")
                    .text_or_null("baseline", r.baseline);
    if (r.baseline.empty()) line.null("ratio");
    else line.number("ratio", r.ratio, "%.3f");
    line.print();
  }
  return 0;
}
