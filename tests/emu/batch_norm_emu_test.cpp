// kernels/cuda/batch_norm.cu in the emulator against kernels/cpu/batch_norm.cpp: every piece
// SyncBatchNorm uses (channel_stats, stats_to_mean_invstd, invstd, apply, backward_reduce,
// backward_elemt) and the fused forward (training, eval) and backward, f32 and f64, on the
// reduction layouts: S > 1 with one block per channel, S > 1 with a channel split over
// several blocks (the last block to finish folds their partials), and S = 1 (32 channels
// side by side in a block, the last column block partial, split over blocks too); the
// training forward in one launch where a block holds whole channels (statistics, then
// apply) and in two where they are split; and on
// the elementwise kernels' paths: float4 / double2 groups (S a multiple of 4, aligned),
// groups across channels (odd S, a partial last group), tensors off 16-byte alignment.
// Each fused call run twice gives bit-identical results (no float atomics; the block that
// finishes a split channel varies, its order of folding does not).
//
// Tolerances: the statistics are double sums of n = N*S terms in different orders:
// 2 gamma_n (u = 2^-53) of the sum of |terms|. Everything after them is a short
// per-element formula in T on inputs that agree to that accuracy: within 64 u of the
// tensor's largest |value| (u = 2^-24 for f32, 2^-53 for f64), which absorbs the handful of
// roundings (and FMA contractions) either side makes, cancellation in dx included. Where a
// fused call computes its own statistics (forward_training), the variance's error (the
// sums' gamma times E[x^2] / var, under 4 for these inputs) is added: it matters in f64.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "emu_test.h"
#include "kernels/cpu/batch_norm.h"
#include "kernels/cuda/batch_norm.h"

namespace {

using namespace nd::kernels;
using namespace nd::emu_test;

struct Shape {
  const char* name;
  int64_t N, C, S;
};

template <class T>
double unit() {
  return sizeof(T) == 4 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53);
}

template <class T>
void check_batch_norm(const Shape& sh) {
  INFO(std::string(sh.name), sizeof(T) == 4 ? " f32" : " f64");
  const int64_t N = sh.N, C = sh.C, S = sh.S, n = N * S, total = N * C * S;
  const auto x = cast<T>(uniform(total, 1, -1.0, 3.0)), dy = cast<T>(uniform(total, 2)),
             w = cast<T>(uniform(C, 3, 0.5, 1.5)), b = cast<T>(uniform(C, 4));
  const double rel = 64 * unit<T>();

  // channel_stats: sum and sumsq (double), bound from the sums of |x| and x^2.
  std::vector<double> sum1(C), sumsq1(C), sum2 = nans<double>(C), sumsq2 = nans<double>(C), abs_sum(C), sq_sum(C);
  cpu::batch_norm_channel_stats<T>(x.data(), N, C, S, sum1.data(), sumsq1.data());
  cuda::batch_norm_channel_stats<T>(x.data(), N, C, S, sum2.data(), sumsq2.data(), nullptr);
  for (int64_t i = 0; i < total; ++i) {
    const int64_t c = (i / S) % C;
    abs_sum[c] += std::abs(double(x[i]));
    sq_sum[c] += double(x[i]) * double(x[i]);
  }
  // Welford's mean/M2 on each side adds a few roundings per value over a plain sum.
  const double gamma = 2.0 * 4 * n * std::ldexp(1.0, -53);
  check_within("channel_stats sum", sum2, sum1, [&](size_t c) { return gamma * abs_sum[c]; });
  check_within("channel_stats sumsq", sumsq2, sumsq1, [&](size_t c) { return gamma * sq_sum[c]; });

  // stats_to_mean_invstd with a running-stat update, from the CPU's sums.
  std::vector<T> mean1(C), invstd1(C), rm1 = cast<T>(uniform(C, 5)), rv1 = cast<T>(uniform(C, 6, 0.5, 2.0));
  auto mean2 = nans<T>(C), invstd2 = nans<T>(C);
  auto rm2 = rm1, rv2 = rv1;
  cpu::batch_norm_stats_to_mean_invstd<T>(sum1.data(), sumsq1.data(), double(n), C, 1e-5, 0.1, mean1.data(),
                                          invstd1.data(), rm1.data(), rv1.data());
  cuda::batch_norm_stats_to_mean_invstd<T>(sum1.data(), sumsq1.data(), double(n), C, 1e-5, 0.1, mean2.data(),
                                           invstd2.data(), rm2.data(), rv2.data(), nullptr);
  check_rel("stats_to_mean_invstd mean", mean2, mean1, rel);
  check_rel("stats_to_mean_invstd invstd", invstd2, invstd1, rel);
  check_rel("stats_to_mean_invstd running_mean", rm2, rm1, rel);
  check_rel("stats_to_mean_invstd running_var", rv2, rv1, rel);
  {  // the count read on the device (SyncBatchNorm's all-reduced one), the same results
    const double device_count = double(n);
    auto mean3 = nans<T>(C), invstd3 = nans<T>(C);
    auto rm3 = rm2, rv3 = rv2, rm4 = rm2, rv4 = rv2;
    cuda::batch_norm_stats_to_mean_invstd<T>(sum1.data(), sumsq1.data(), double(n), C, 1e-5, 0.1, mean2.data(),
                                             invstd2.data(), rm3.data(), rv3.data(), nullptr);
    cuda::batch_norm_stats_to_mean_invstd<T>(sum1.data(), sumsq1.data(), &device_count, C, 1e-5, 0.1, mean3.data(),
                                             invstd3.data(), rm4.data(), rv4.data(), nullptr);
    check_equal("stats_to_mean_invstd mean, device count", mean3, mean2);
    check_equal("stats_to_mean_invstd invstd, device count", invstd3, invstd2);
    check_equal("stats_to_mean_invstd running_mean, device count", rm4, rm3);
    check_equal("stats_to_mean_invstd running_var, device count", rv4, rv3);
  }

  // invstd, in place as SyncBatchNorm's eval path may call it.
  auto var = cast<T>(uniform(C, 7, 0.1, 2.0));
  std::vector<T> inv1(C);
  cpu::batch_norm_invstd<T>(var.data(), C, 1e-5, inv1.data());
  cuda::batch_norm_invstd<T>(var.data(), C, 1e-5, var.data(), nullptr);
  check_rel("invstd (in place)", var, inv1, rel);

  // apply, with and without the affine parameters.
  std::vector<T> y1(total), y2 = nans<T>(total);
  cpu::batch_norm_apply<T>(x.data(), mean1.data(), invstd1.data(), w.data(), b.data(), N, C, S, y1.data());
  cuda::batch_norm_apply<T>(x.data(), mean1.data(), invstd1.data(), w.data(), b.data(), N, C, S, y2.data(), nullptr);
  check_rel("apply", y2, y1, rel);
  y2 = nans<T>(total);
  cpu::batch_norm_apply<T>(x.data(), mean1.data(), invstd1.data(), nullptr, nullptr, N, C, S, y1.data());
  cuda::batch_norm_apply<T>(x.data(), mean1.data(), invstd1.data(), nullptr, nullptr, N, C, S, y2.data(), nullptr);
  check_rel("apply without weight, bias", y2, y1, rel);

  // backward_reduce and backward_elemt.
  std::vector<double> sdy1(C), sdx1(C), sdy2 = nans<double>(C), sdx2 = nans<double>(C), abs_dy(C), abs_dyx(C);
  cpu::batch_norm_backward_reduce<T>(dy.data(), x.data(), mean1.data(), N, C, S, sdy1.data(), sdx1.data());
  cuda::batch_norm_backward_reduce<T>(dy.data(), x.data(), mean1.data(), N, C, S, sdy2.data(), sdx2.data(), nullptr);
  for (int64_t i = 0; i < total; ++i) {
    const int64_t c = (i / S) % C;
    abs_dy[c] += std::abs(double(dy[i]));
    abs_dyx[c] += std::abs(double(dy[i]) * (double(x[i]) - double(mean1[c])));
  }
  check_within("backward_reduce sum_dy", sdy2, sdy1, [&](size_t c) { return gamma * abs_dy[c]; });
  check_within("backward_reduce sum_dy_xmu", sdx2, sdx1, [&](size_t c) { return gamma * abs_dyx[c]; });
  std::vector<T> dx1(total), dx2 = nans<T>(total);
  cpu::batch_norm_backward_elemt<T>(dy.data(), x.data(), mean1.data(), invstd1.data(), w.data(), sdy1.data(),
                                    sdx1.data(), double(n), N, C, S, dx1.data());
  cuda::batch_norm_backward_elemt<T>(dy.data(), x.data(), mean1.data(), invstd1.data(), w.data(), sdy1.data(),
                                     sdx1.data(), double(n), N, C, S, dx2.data(), nullptr);
  check_rel("backward_elemt", dx2, dx1, rel);
  {
    const double device_count = double(n);
    auto dx3 = nans<T>(total);
    cuda::batch_norm_backward_elemt<T>(dy.data(), x.data(), mean1.data(), invstd1.data(), w.data(), sdy1.data(),
                                       sdx1.data(), &device_count, N, C, S, dx3.data(), nullptr);
    check_equal("backward_elemt, device count", dx3, dx2);
  }

  // The fused forward (training, eval) and backward (training, eval).
  const double rel_fused = rel + 4 * gamma;
  std::vector<T> sm1(C), si1(C), rmt1 = cast<T>(uniform(C, 8)), rvt1 = cast<T>(uniform(C, 9, 0.5, 2.0));
  auto sm2 = nans<T>(C), si2 = nans<T>(C);
  auto rmt2 = rmt1, rvt2 = rvt1;
  y2 = nans<T>(total);
  cpu::batch_norm_forward_training<T>(x.data(), w.data(), b.data(), rmt1.data(), rvt1.data(), N, C, S, 0.1, 1e-5,
                                      y1.data(), sm1.data(), si1.data());
  cuda::batch_norm_forward_training<T>(x.data(), w.data(), b.data(), rmt2.data(), rvt2.data(), N, C, S, 0.1, 1e-5,
                                       y2.data(), sm2.data(), si2.data(), nullptr);
  check_rel("forward_training y", y2, y1, rel_fused);
  check_rel("forward_training save_mean", sm2, sm1, rel_fused);
  check_rel("forward_training save_invstd", si2, si1, rel_fused);
  check_rel("forward_training running_mean", rmt2, rmt1, rel_fused);
  check_rel("forward_training running_var", rvt2, rvt1, rel_fused);
  y2 = nans<T>(total);
  cpu::batch_norm_forward_eval<T>(x.data(), rmt1.data(), rvt1.data(), w.data(), b.data(), N, C, S, 1e-5, y1.data());
  cuda::batch_norm_forward_eval<T>(x.data(), rmt1.data(), rvt1.data(), w.data(), b.data(), N, C, S, 1e-5, y2.data(),
                                   nullptr);
  check_rel("forward_eval y", y2, y1, rel);
  for (bool training : {true, false}) {
    const std::string mode = training ? "backward (training) " : "backward (eval) ";
    std::vector<T> gi1(total), gw1(C), gb1(C);
    auto gi2 = nans<T>(total), gw2 = nans<T>(C), gb2 = nans<T>(C);
    cpu::batch_norm_backward<T>(dy.data(), x.data(), sm1.data(), si1.data(), w.data(), N, C, S, training, gi1.data(),
                                gw1.data(), gb1.data());
    cuda::batch_norm_backward<T>(dy.data(), x.data(), sm1.data(), si1.data(), w.data(), N, C, S, training,
                                 gi2.data(), gw2.data(), gb2.data(), nullptr);
    check_rel(mode + "grad_input", gi2, gi1, rel_fused);  // grad_weight, grad_bias: sums of n terms
    check_rel(mode + "grad_weight", gw2, gw1, rel_fused);
    check_rel(mode + "grad_bias", gb2, gb1, rel_fused);
    // In place (grad_input = dy): the same bits (the fused launch rereads dy before writing dx).
    auto in_place = dy;
    cuda::batch_norm_backward<T>(in_place.data(), x.data(), sm1.data(), si1.data(), w.data(), N, C, S, training,
                                 in_place.data(), nullptr, nullptr, nullptr);
    check_equal(mode + "grad_input in place", in_place, gi2);
    // Without affine parameters: weight 1, no parameter gradients.
    gi2 = nans<T>(total);
    cpu::batch_norm_backward<T>(dy.data(), x.data(), sm1.data(), si1.data(), nullptr, N, C, S, training, gi1.data(),
                                nullptr, nullptr);
    cuda::batch_norm_backward<T>(dy.data(), x.data(), sm1.data(), si1.data(), nullptr, N, C, S, training, gi2.data(),
                                 nullptr, nullptr, nullptr);
    check_rel(mode + "grad_input without weight", gi2, gi1, rel_fused);
  }
  // The training forward without affine parameters.
  auto rmt3 = rmt2, rvt3 = rvt2, rmt4 = rmt2, rvt4 = rvt2;
  y2 = nans<T>(total);
  cpu::batch_norm_forward_training<T>(x.data(), nullptr, nullptr, rmt3.data(), rvt3.data(), N, C, S, 0.1, 1e-5,
                                      y1.data(), sm1.data(), si1.data());
  cuda::batch_norm_forward_training<T>(x.data(), nullptr, nullptr, rmt4.data(), rvt4.data(), N, C, S, 0.1, 1e-5,
                                       y2.data(), sm2.data(), si2.data(), nullptr);
  check_rel("forward_training y without weight, bias", y2, y1, rel_fused);
}

// Runs the fused forward and backward twice on the same input, then twice with x, y, dy and
// dx one element off 16-byte alignment (the value-by-value walks and elementwise path): each
// pair bit for bit alike. The misaligned run adds in another order (one value per load, not
// four), so it matches the aligned one within check_batch_norm's fused tolerance.
template <class T>
void check_fused_repeatable(const Shape& sh) {
  INFO(std::string(sh.name), sizeof(T) == 4 ? " f32" : " f64", ": repeated, then misaligned");
  const int64_t N = sh.N, C = sh.C, S = sh.S, total = N * C * S;
  const auto w = cast<T>(uniform(C, 3, 0.5, 1.5)), b = cast<T>(uniform(C, 4));
  struct Outputs {
    std::vector<T> y, mean, invstd, rm, rv, dx, dw, db;
  };
  auto run = [&](int64_t shift) {
    auto x = cast<T>(uniform(total, 1, -1.0, 3.0)), dy = cast<T>(uniform(total, 2));
    x.insert(x.begin(), shift, T(0));
    dy.insert(dy.begin(), shift, T(0));
    Outputs o{nans<T>(total + shift), nans<T>(C), nans<T>(C), cast<T>(uniform(C, 8)), cast<T>(uniform(C, 9, 0.5, 2.0)),
              nans<T>(total + shift), nans<T>(C), nans<T>(C)};
    cuda::batch_norm_forward_training<T>(x.data() + shift, w.data(), b.data(), o.rm.data(), o.rv.data(), N, C, S, 0.1,
                                         1e-5, o.y.data() + shift, o.mean.data(), o.invstd.data(), nullptr);
    cuda::batch_norm_backward<T>(dy.data() + shift, x.data() + shift, o.mean.data(), o.invstd.data(), w.data(), N, C,
                                 S, true, o.dx.data() + shift, o.dw.data(), o.db.data(), nullptr);
    o.y.erase(o.y.begin(), o.y.begin() + shift);
    o.dx.erase(o.dx.begin(), o.dx.begin() + shift);
    return o;
  };
  const double rel = 64 * unit<T>() + 4 * 2.0 * 4 * double(N * S) * std::ldexp(1.0, -53);
  const Outputs aligned = run(0);
  for (int64_t shift : {0, 1}) {
    const Outputs first = shift == 0 ? aligned : run(shift), again = run(shift);
    const std::string at = shift == 0 ? "" : " (misaligned)";
    check_equal("y" + at, again.y, first.y);
    check_equal("save_mean" + at, again.mean, first.mean);
    check_equal("save_invstd" + at, again.invstd, first.invstd);
    check_equal("running_mean" + at, again.rm, first.rm);
    check_equal("running_var" + at, again.rv, first.rv);
    check_equal("grad_input" + at, again.dx, first.dx);
    check_equal("grad_weight" + at, again.dw, first.dw);
    check_equal("grad_bias" + at, again.db, first.db);
    if (shift == 0) continue;
    check_rel("y, misaligned against aligned", first.y, aligned.y, rel);
    check_rel("save_mean, misaligned against aligned", first.mean, aligned.mean, rel);
    check_rel("save_invstd, misaligned against aligned", first.invstd, aligned.invstd, rel);
    check_rel("grad_input, misaligned against aligned", first.dx, aligned.dx, rel);
    check_rel("grad_weight, misaligned against aligned", first.dw, aligned.dw, rel);
    check_rel("grad_bias, misaligned against aligned", first.db, aligned.db, rel);
  }
}

// One block per channel (N*S = 1400 values: one chunk of 4096).
const Shape kPlanes{"[2, 5, 700]", 2, 5, 700};
// N*S = 10000 values: three chunks per channel, combined by the second kernel.
const Shape kSplit{"[4, 3, 2500]", 4, 3, 2500};
// S % 4 != 0 with channels split over two blocks (5005 values): the value-by-value walk.
const Shape kSplitOdd{"[5, 2, 1001]", 5, 2, 1001};
// S = 1: 40 channels in two column blocks (the second partial), 300 rows in 3 chunks of 128.
const Shape kColumns{"[300, 40, 1]", 300, 40, 1};
// S = 1 with rows that fit one block (50 <= 128): the forward's statistics kernel applies
// them too, column by column (37 channels: the second column block partial).
const Shape kFewRows{"[50, 37, 1]", 50, 37, 1};
// Odd S: groups of 4 consecutive elements span two or three channels; 105 elements, so the
// last group holds one.
const Shape kOdd{"[3, 5, 7]", 3, 5, 7};
// S = 2 and S = 3: a group of 4 wraps a plane twice or more.
const Shape kTiny{"[7, 3, 2]", 7, 3, 2};
const Shape kThree{"[5, 2, 3]", 5, 2, 3};

TEST_CASE("batch_norm f32: every piece on the three reduction layouts and odd planes") {
  for (const Shape& s : {kPlanes, kSplit, kSplitOdd, kColumns, kFewRows, kOdd, kTiny, kThree})
    check_batch_norm<float>(s);
}

TEST_CASE("batch_norm f64: every piece on the three reduction layouts and odd planes") {
  for (const Shape& s : {kPlanes, kSplit, kSplitOdd, kColumns, kFewRows, kOdd, kTiny, kThree})
    check_batch_norm<double>(s);
}

TEST_CASE("batch_norm fused forward and backward: bit-identical when repeated, and off 16-byte alignment") {
  for (const Shape& s : {kPlanes, kSplit, kSplitOdd, kColumns, kFewRows, kOdd}) {
    check_fused_repeatable<float>(s);
    check_fused_repeatable<double>(s);
  }
}

// Where a block holds whole channels (N*S <= 4096; N <= 128 rows when S = 1) the training
// forward and backward are one launch each; split channels take two (the statistics or
// sums, then the elementwise pass). The memset of a split reduction's tickets is no launch.
TEST_CASE("batch_norm fused forward and backward: one launch each where a block holds whole channels") {
  for (const auto& [sh, launches] : {std::pair{kPlanes, 1}, std::pair{kFewRows, 1}, std::pair{kOdd, 1},
                                     std::pair{kSplit, 2}, std::pair{kSplitOdd, 2}, std::pair{kColumns, 2}}) {
    INFO(sh.name);
    const int64_t total = sh.N * sh.C * sh.S;
    const auto x = cast<float>(uniform(total, 1)), dy = cast<float>(uniform(total, 2)),
               w = cast<float>(uniform(sh.C, 3));
    auto y = nans<float>(total), dx = nans<float>(total), mean = nans<float>(sh.C), invstd = nans<float>(sh.C),
         dw = nans<float>(sh.C), db = nans<float>(sh.C);
    long before = emu_launches;
    cuda::batch_norm_forward_training<float>(x.data(), w.data(), w.data(), nullptr, nullptr, sh.N, sh.C, sh.S, 0.1,
                                             1e-5, y.data(), mean.data(), invstd.data(), nullptr);
    CHECK(emu_launches - before == launches);
    before = emu_launches;
    cuda::batch_norm_backward<float>(dy.data(), x.data(), mean.data(), invstd.data(), w.data(), sh.N, sh.C, sh.S, true,
                                     dx.data(), dw.data(), db.data(), nullptr);
    CHECK(emu_launches - before == launches);
  }
}

// The activation applied in the same pass (ReLU, LeakyReLU(0.2)) against the unfused pair
// on the same side: forward, then the activation by its formula; the activation's gradient
// by its formula (from the output y: slope where y <= 0), then the plain backward. Bit for
// bit on the CPU and on the emulated GPU (the fused kernels round as the pair), within the
// fused tolerance across the two; the fused calls launch as many kernels as the plain ones.
template <class T>
void check_activation(const Shape& sh, BatchNormActivation act, int launches) {
  const bool relu = act.kind == BatchNormActivation::Kind::relu;
  INFO(std::string(sh.name), sizeof(T) == 4 ? " f32" : " f64", relu ? " relu" : " leaky_relu");
  const int64_t N = sh.N, C = sh.C, S = sh.S, total = N * C * S;
  const auto x = cast<T>(uniform(total, 1, -1.0, 3.0)), dy = cast<T>(uniform(total, 2)),
             w = cast<T>(uniform(C, 3, 0.5, 1.5)), b = cast<T>(uniform(C, 4));
  const T slope = relu ? T(0) : T(act.negative_slope);
  auto activate = [&](std::vector<T> v) {
    for (T& e : v) e = e > T(0) ? e : (relu ? T(0) : e * slope);
    return v;
  };
  auto through = [&](const std::vector<T>& g, const std::vector<T>& y) {
    std::vector<T> out(total);
    for (int64_t i = 0; i < total; ++i) out[i] = g[i] * (y[i] > T(0) ? T(1) : slope);
    return out;
  };
  struct Side {
    std::vector<T> y, mean, invstd, rm, rv, dx, dw, db;
  };
  // One side's training forward, eval forward and both backwards, fused (act) or not.
  auto run = [&](bool gpu, BatchNormActivation a) {
    Side o{nans<T>(total), nans<T>(C), nans<T>(C), cast<T>(uniform(C, 8)), cast<T>(uniform(C, 9, 0.5, 2.0)),
           nans<T>(total), nans<T>(C), nans<T>(C)};
    long before = emu_launches;
    if (gpu) {
      cuda::batch_norm_forward_training<T>(x.data(), w.data(), b.data(), o.rm.data(), o.rv.data(), N, C, S, 0.1,
                                           1e-5, o.y.data(), o.mean.data(), o.invstd.data(), nullptr, a);
      CHECK(emu_launches - before == launches);
    } else {
      cpu::batch_norm_forward_training<T>(x.data(), w.data(), b.data(), o.rm.data(), o.rv.data(), N, C, S, 0.1, 1e-5,
                                          o.y.data(), o.mean.data(), o.invstd.data(), a);
    }
    return o;
  };
  auto backward = [&](bool gpu, const Side& f, const std::vector<T>& g, BatchNormActivation a, bool training,
                      Side& o) {
    o.dx = nans<T>(total), o.dw = nans<T>(C), o.db = nans<T>(C);
    const long before = emu_launches;
    if (gpu) {
      cuda::batch_norm_backward<T>(g.data(), x.data(), f.mean.data(), f.invstd.data(), w.data(), N, C, S, training,
                                   o.dx.data(), o.dw.data(), o.db.data(), nullptr, a, f.y.data());
      if (training) CHECK(emu_launches - before == launches);
    } else {
      cpu::batch_norm_backward<T>(g.data(), x.data(), f.mean.data(), f.invstd.data(), w.data(), N, C, S, training,
                                  o.dx.data(), o.dw.data(), o.db.data(), a, f.y.data());
    }
  };
  const double rel = 64 * unit<T>() + 4 * 2.0 * 4 * double(N * S) * std::ldexp(1.0, -53);
  Side sides[2];
  for (bool gpu : {false, true}) {
    const std::string at = gpu ? " (emulated CUDA)" : " (CPU)";
    Side plain = run(gpu, {}), fused = run(gpu, act);
    check_equal("y" + at, fused.y, activate(plain.y));
    check_equal("save_mean" + at, fused.mean, plain.mean);
    check_equal("save_invstd" + at, fused.invstd, plain.invstd);
    check_equal("running_mean" + at, fused.rm, plain.rm);
    check_equal("running_var" + at, fused.rv, plain.rv);
    for (bool training : {true, false}) {
      const std::string mode = (training ? " training" : " eval") + at;
      backward(gpu, fused, through(dy, fused.y), {}, training, plain);
      backward(gpu, fused, dy, act, training, fused);
      check_equal("grad_input" + mode, fused.dx, plain.dx);
      check_equal("grad_weight" + mode, fused.dw, plain.dw);
      check_equal("grad_bias" + mode, fused.db, plain.db);
    }
    if (gpu) {  // in place (grad_input = dy), training
      auto in_place = dy;
      cuda::batch_norm_backward<T>(in_place.data(), x.data(), fused.mean.data(), fused.invstd.data(), w.data(), N, C,
                                   S, true, in_place.data(), nullptr, nullptr, nullptr, act, fused.y.data());
      backward(gpu, fused, dy, act, true, fused);
      check_equal("grad_input in place" + at, in_place, fused.dx);
    }
    // The eval forward: the running statistics, then the activation.
    auto ye_plain = nans<T>(total), ye_fused = nans<T>(total);
    if (gpu) {
      cuda::batch_norm_forward_eval<T>(x.data(), fused.rm.data(), fused.rv.data(), w.data(), b.data(), N, C, S, 1e-5,
                                       ye_plain.data(), nullptr);
      cuda::batch_norm_forward_eval<T>(x.data(), fused.rm.data(), fused.rv.data(), w.data(), b.data(), N, C, S, 1e-5,
                                       ye_fused.data(), nullptr, act);
    } else {
      cpu::batch_norm_forward_eval<T>(x.data(), fused.rm.data(), fused.rv.data(), w.data(), b.data(), N, C, S, 1e-5,
                                      ye_plain.data());
      cpu::batch_norm_forward_eval<T>(x.data(), fused.rm.data(), fused.rv.data(), w.data(), b.data(), N, C, S, 1e-5,
                                      ye_fused.data(), act);
    }
    check_equal("eval y" + at, ye_fused, activate(ye_plain));
    backward(gpu, fused, dy, act, true, fused);
    sides[gpu] = fused;
  }
  check_rel("y, emulated CUDA against CPU", sides[1].y, sides[0].y, rel);
  check_rel("grad_input, emulated CUDA against CPU", sides[1].dx, sides[0].dx, rel);
  check_rel("grad_weight, emulated CUDA against CPU", sides[1].dw, sides[0].dw, rel);
  check_rel("grad_bias, emulated CUDA against CPU", sides[1].db, sides[0].db, rel);
}

TEST_CASE("batch_norm with ReLU / LeakyReLU in the same pass: bit for bit the unfused pair, no launch more") {
  using Kind = BatchNormActivation::Kind;
  for (const auto& [sh, launches] : {std::pair{kPlanes, 1}, std::pair{kFewRows, 1}, std::pair{kOdd, 1},
                                     std::pair{kSplit, 2}, std::pair{kSplitOdd, 2}, std::pair{kColumns, 2}}) {
    for (BatchNormActivation act : {BatchNormActivation{Kind::relu, 0}, BatchNormActivation{Kind::leaky_relu, 0.2}}) {
      check_activation<float>(sh, act, launches);
      check_activation<double>(sh, act, launches);
    }
  }
}

TEST_CASE("batch_norm statistics of an empty batch are zero") {
  std::vector<double> sum = nans<double>(4), sumsq = nans<double>(4), sdy = nans<double>(4), sdx = nans<double>(4);
  std::vector<float> mean(4, 0.5f);
  cuda::batch_norm_channel_stats<float>(nullptr, 0, 4, 5, sum.data(), sumsq.data(), nullptr);
  cuda::batch_norm_backward_reduce<float>(nullptr, nullptr, mean.data(), 0, 4, 5, sdy.data(), sdx.data(), nullptr);
  const std::vector<double> zeros(4, 0.0);
  check_equal("sum", sum, zeros);
  check_equal("sumsq", sumsq, zeros);
  check_equal("sum_dy", sdy, zeros);
  check_equal("sum_dy_xmu", sdx, zeros);
}

}  // namespace
