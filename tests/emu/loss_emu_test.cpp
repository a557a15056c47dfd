// kernels/cuda/loss.cu in the emulator against kernels/cpu/loss.cpp: mse_loss,
// binary_cross_entropy_with_logits (weight, pos_weight) and cross_entropy (weight,
// ignore_index, label smoothing, a bad target), forward and backward, with the reductions
// None, Mean and Sum, f32 and f64; n = 1000 elements (several partial-sum blocks) and
// cross-entropy rows of 10 (a partial warp) and 300 (256 threads striding) classes.
//
// Tolerance: every result is a short per-element formula (shared, kernels/common/
// loss_math.h) around sums (the reductions in double over n values, log-sum-exp over C
// classes) added in different orders; 4 (n + 16) u of the tensor's largest |value| (u of T)
// bounds the sums' 2 gamma_n and the roundings.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "emu_test.h"
#include "kernels/cpu/loss.h"
#include "kernels/cuda/loss.h"

namespace {

using namespace nd::kernels;
using namespace nd::emu_test;
using R = nd::kernels::LossReduction;

const char* name_of(R r) { return r == R::None ? "None" : r == R::Mean ? "Mean" : "Sum"; }

template <class T>
void check_pointwise_losses(R reduction) {
  INFO(std::string(name_of(reduction)), sizeof(T) == 4 ? " f32" : " f64");
  const int64_t n = 1000, C = 8;
  const auto x = cast<T>(uniform(n, 1, -4, 4)), t = cast<T>(uniform(n, 2, 0, 1)), w = cast<T>(uniform(n, 3, 0.5, 1.5)),
             pw = cast<T>(uniform(C, 4, 0.5, 3)), dout = cast<T>(uniform(n, 5));
  const int64_t out_n = reduction == R::None ? n : 1;
  const double rel = rel_for<T>(n);

  std::vector<T> o1(out_n), di1(n), dt1(n);
  auto o2 = nans<T>(out_n), di2 = nans<T>(n), dt2 = nans<T>(n);
  cpu::mse_loss_forward<T>(x.data(), t.data(), n, reduction, o1.data());
  cuda::mse_loss_forward<T>(x.data(), t.data(), n, reduction, o2.data(), nullptr);
  check_rel("mse forward", o2, o1, rel);
  cpu::mse_loss_backward<T>(dout.data(), x.data(), t.data(), n, reduction, di1.data(), dt1.data());
  cuda::mse_loss_backward<T>(dout.data(), x.data(), t.data(), n, reduction, di2.data(), dt2.data(), nullptr);
  check_rel("mse dinput", di2, di1, rel);
  check_rel("mse dtarget", dt2, dt1, rel);

  for (bool weighted : {false, true}) {
    const std::string tag = weighted ? "bce (weight, pos_weight) " : "bce ";
    const T* wp = weighted ? w.data() : nullptr;
    const T* pwp = weighted ? pw.data() : nullptr;
    o2 = nans<T>(out_n), di2 = nans<T>(n), dt2 = nans<T>(n);
    cpu::binary_cross_entropy_with_logits_forward<T>(x.data(), t.data(), wp, pwp, n, C, reduction, o1.data());
    cuda::binary_cross_entropy_with_logits_forward<T>(x.data(), t.data(), wp, pwp, n, C, reduction, o2.data(),
                                                      nullptr);
    check_rel(tag + "forward", o2, o1, rel);
    cpu::binary_cross_entropy_with_logits_backward<T>(dout.data(), x.data(), t.data(), wp, pwp, n, C, reduction,
                                                      di1.data(), dt1.data());
    cuda::binary_cross_entropy_with_logits_backward<T>(dout.data(), x.data(), t.data(), wp, pwp, n, C, reduction,
                                                       di2.data(), dt2.data(), nullptr);
    check_rel(tag + "dinput", di2, di1, rel);
    check_rel(tag + "dtarget", dt2, dt1, rel);
  }
}

template <class T>
void check_cross_entropy(int64_t N, int64_t C, R reduction, bool weighted, double smoothing) {
  INFO("N ", N, " C ", C, " ", std::string(name_of(reduction)), weighted ? " weighted" : "", " smoothing ",
       smoothing, sizeof(T) == 4 ? " f32" : " f64");
  const auto x = cast<T>(uniform(N * C, 1, -5, 5)), w = cast<T>(uniform(C, 2, 0.5, 1.5)), dout = cast<T>(uniform(N, 3));
  std::vector<int64_t> target(N);
  for (int64_t i = 0; i < N; ++i) target[i] = (i * 7) % C;
  target[1] = -100;  // ignored
  const T* wp = weighted ? w.data() : nullptr;
  const int64_t out_n = reduction == R::None ? N : 1;
  std::vector<T> o1(out_n), l1(N), d1(N * C);
  auto o2 = nans<T>(out_n), l2 = nans<T>(N), d2 = nans<T>(N * C);
  CHECK(cpu::cross_entropy_forward<T>(x.data(), target.data(), wp, N, C, -100, smoothing, reduction, o1.data(),
                                      l1.data()) == -1);
  CHECK(cuda::cross_entropy_forward<T>(x.data(), target.data(), wp, N, C, -100, smoothing, reduction, o2.data(),
                                       l2.data(), nullptr) == -1);
  const double rel = rel_for<T>(N + C);
  check_rel("cross_entropy forward", o2, o1, rel);
  check_rel("cross_entropy lse", l2, l1, rel);
  cpu::cross_entropy_backward<T>(dout.data(), x.data(), target.data(), wp, l1.data(), N, C, -100, smoothing, reduction,
                                 d1.data());
  cuda::cross_entropy_backward<T>(dout.data(), x.data(), target.data(), wp, l1.data(), N, C, -100, smoothing,
                                  reduction, d2.data(), nullptr);
  check_rel("cross_entropy backward", d2, d1, rel);
  for (int64_t c = 0; c < C; ++c) CHECK(double(d2[C + c]) == 0.0);  // the ignored sample: no gradient
}

TEST_CASE("mse and binary cross-entropy with logits, every reduction") {
  for (R r : {R::None, R::Mean, R::Sum}) {
    check_pointwise_losses<float>(r);
    check_pointwise_losses<double>(r);
  }
}

TEST_CASE("cross_entropy: weights, ignore_index, label smoothing, every reduction") {
  for (R r : {R::None, R::Mean, R::Sum}) check_cross_entropy<float>(6, 10, r, true, 0.1);
  check_cross_entropy<float>(4, 300, R::Mean, false, 0.0);
  check_cross_entropy<double>(5, 37, R::Sum, true, 0.2);
}

TEST_CASE("cross_entropy reports the first target out of range") {
  const int64_t N = 4, C = 5;
  std::vector<float> x(N * C, 0.5f), out(1), lse(N);
  const std::vector<int64_t> target = {0, 4, 5, -1};
  CHECK(cuda::cross_entropy_forward<float>(x.data(), target.data(), nullptr, N, C, -100, 0.0, R::Mean, out.data(),
                                           lse.data(), nullptr) == 2);
}

}  // namespace
