// CPU-vs-CUDA for the nn ops: softmax / log_softmax, layer_norm, dropout, embedding and the
// losses, forward and every input gradient through autograd, on odd sizes and transposed
// (non-contiguous) inputs; outputs come from poisoned allocations (cuda_compare.h). Dropout
// and embedding backward are compared bit for bit. Without a GPU those cases report
// "SKIPPED:". The host/device helpers the CUDA kernels share with the CPU
// (kernels/common/{sorted_search,loss_math,dropout_mask}.h) are tested here on the CPU.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda/cuda_compare.h"
#include "harness.h"
#include "kernels/common/dropout_mask.h"
#include "kernels/common/loss_math.h"
#include "kernels/common/sorted_search.h"

using namespace nd;
using namespace nd::testing::cuda_compare;

namespace {

// int64 indices on the device of `like`.
Tensor indices_on(const Tensor& like, const std::vector<double>& values, const Shape& shape) {
  return tensor(values, TensorOptions(kInt64).device(like.device())).reshape(shape);
}

// The same values on the CPU, compared exactly.
void check_identical(const Tensor& on_gpu, const Tensor& on_cpu, const std::string& what) {
  check_matches(on_gpu, on_cpu, what, 0.0);
  CHECK_MESSAGE(testing::to_vector(on_gpu.cpu()) == testing::to_vector(on_cpu), what, ": not bit-identical");
}

}  // namespace

// ---- the shared host/device helpers, on the CPU (run everywhere) ----

TEST_CASE("sorted_search: lower_bound agrees with std::lower_bound, repeats and ends included") {
  const std::vector<uint64_t> keys = {0, 0, 2, 3, 3, 3, 7, 9, 9};
  for (uint64_t v = 0; v <= 10; ++v) {
    const int64_t expected = std::lower_bound(keys.begin(), keys.end(), v) - keys.begin();
    CHECK(kernels::lower_bound(keys.data(), static_cast<int64_t>(keys.size()), v) == expected);
  }
  CHECK(kernels::lower_bound<uint64_t>(nullptr, 0, 5) == 0);  // empty: nothing is read
  const std::vector<uint64_t> one = {4};
  CHECK(kernels::lower_bound(one.data(), 1, uint64_t(4)) == 0);
  CHECK(kernels::lower_bound(one.data(), 1, uint64_t(5)) == 1);
}

TEST_CASE("dropout_mask: p = 0 keeps all, p = 1 drops all, the scale is 1 / (1 - p)") {
  using kernels::dropout_apply;
  using kernels::dropout_scale;
  CHECK(dropout_scale<float>(0.0) == 1.0f);
  CHECK(dropout_scale<double>(0.75) == 4.0);
  CHECK(dropout_scale<double>(1.0) == 0.0);
  int64_t dropped = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    CHECK(dropout_apply(3.0, dropout_scale<double>(0.0), 5, 11, i, 0.0) == 3.0);
    CHECK(dropout_apply(3.0, dropout_scale<double>(1.0), 5, 11, i, 1.0) == 0.0);
    const bool drop = kernels::dropout_dropped(5, 11, i, 0.5);
    CHECK(drop == (kernels::counter_uniform(5, 11 + static_cast<uint64_t>(i)) < 0.5));
    dropped += drop;
  }
  CHECK(dropped > 400);  // Binomial(1000, 0.5): sd 16
  CHECK(dropped < 600);
}

TEST_CASE("loss_math: closed forms, no overflow, derivatives match finite differences") {
  namespace lm = kernels::loss_math;
  CHECK(lm::softplus(1000.0) == 1000.0);
  CHECK(lm::softplus(-1000.0) == 0.0);
  CHECK(lm::softplus(0.0) == doctest::Approx(std::log(2.0)));
  CHECK(lm::sigmoid(-1000.0) == 0.0);
  CHECK(lm::sigmoid(1000.0) == 1.0);
  CHECK(lm::sigmoid(0.0) == 0.5);
  const double h = 1e-6;
  for (double x : {-3.0, -0.4, 0.0, 0.7, 2.5}) {
    for (double t : {0.0, 0.3, 1.0}) {
      const double w = 1.7, pw = 2.5;
      const double fd_x = (lm::bce_with_logits_loss(x + h, t, w, pw) - lm::bce_with_logits_loss(x - h, t, w, pw)) / (2 * h);
      const double fd_t = (lm::bce_with_logits_loss(x, t + h, w, pw) - lm::bce_with_logits_loss(x, t - h, w, pw)) / (2 * h);
      CHECK(lm::bce_with_logits_dinput(x, t, w, pw) == doctest::Approx(fd_x).epsilon(1e-7));
      CHECK(lm::bce_with_logits_dtarget(x, w, pw) == doctest::Approx(fd_t).epsilon(1e-7));
      const double fd_mse = (lm::mse_loss(x + h, t) - lm::mse_loss(x - h, t)) / (2 * h);
      CHECK(lm::mse_dinput(x, t) == doctest::Approx(fd_mse).epsilon(1e-7));
    }
  }
  // Incoming gradient per reduction.
  const double dout[3] = {2.0, 5.0, 7.0};
  CHECK(lm::grad_of(dout, 2, kernels::LossReduction::None, 4.0) == 7.0);
  CHECK(lm::grad_of(dout, 2, kernels::LossReduction::Sum, 4.0) == 2.0);
  CHECK(lm::grad_of(dout, 2, kernels::LossReduction::Mean, 4.0) == 0.5);
  // cross_entropy of logits (0, ln 3) with target 1: lse = ln 4, l = ln 4 - ln 3; its
  // gradient is p - onehot = (1/4, -1/4).
  const double lse = std::log(4.0), x1 = std::log(3.0);
  CHECK(lm::cross_entropy_loss(lse, x1, 1.0, 0.0, 2, 2.0, 0.0) == doctest::Approx(std::log(4.0 / 3.0)));
  CHECK(lm::cross_entropy_dlogit(0.25, false, 1.0, 1.0, 0.0, 2, 2.0) == doctest::Approx(0.25));
  CHECK(lm::cross_entropy_dlogit(0.75, true, 1.0, 1.0, 0.0, 2, 2.0) == doctest::Approx(-0.25));
}

// ---- CPU vs CUDA ----

TEST_CASE("cuda nn ops: softmax and log_softmax match the CPU for rows of any length") {
  if (skip_without_gpu()) return;
  std::vector<Case> cases;
  for (int64_t D : {1, 31, 33, 1000, 4097}) {
    const std::string d = std::to_string(D);
    cases.push_back({"softmax D=" + d, {{5, D}}, [](const V& x) { return softmax(x[0], -1); }, -4, 4});
    cases.push_back({"log_softmax D=" + d, {{3, D}}, [](const V& x) { return log_softmax(x[0], -1); }, -4, 4});
  }
  cases.push_back({"softmax dim 0", {{37, 6}}, [](const V& x) { return softmax(x[0], 0); }, -4, 4});
  cases.push_back({"log_softmax middle dim", {{3, 33, 5}}, [](const V& x) { return log_softmax(x[0], 1); }, -4, 4});
  cases.push_back({"softmax large logits", {{7, 65}}, [](const V& x) { return softmax(x[0] * 200.0, -1); }});
  cases.push_back({"softmax f64", {{9, 129}},
                   [](const V& x) { return softmax(x[0].to(kFloat64), -1).to(kFloat32); }, -4, 4});
  cases.push_back({"log_softmax f64", {{9, 33}},
                   [](const V& x) { return log_softmax(x[0].to(kFloat64), -1).to(kFloat32); }, -4, 4});
  run_table(cases);
}

TEST_CASE("cuda nn ops: softmax edge rows (-inf, empty) match the CPU") {
  if (skip_without_gpu()) return;
  const double inf = INFINITY;
  // Row 0 has -inf entries (they get probability 0); row 1 is all -inf (NaN, as on the CPU).
  const Tensor x = tensor({0.5, -inf, 1.5, -inf, -inf, -inf, -inf, -inf}).reshape({2, 4});
  const Tensor cpu = softmax(x, -1), gpu = softmax(x.to(kGpu), -1);
  const std::vector<double> a = testing::to_vector(gpu.cpu()), b = testing::to_vector(cpu);
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(std::isnan(a[i]) == std::isnan(b[i]));
    if (!std::isnan(b[i])) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-6));
  }
  CHECK(softmax(zeros({0, 5}).to(kGpu), -1).sizes() == Shape{0, 5});
}

TEST_CASE("cuda nn ops: layer_norm forward and every gradient match the CPU") {
  if (skip_without_gpu()) return;
  std::vector<Case> cases;
  for (int64_t D : {1, 31, 33, 1000, 4097}) {
    const std::string d = std::to_string(D);
    cases.push_back({"layer_norm affine D=" + d, {{6, D}, {D}, {D}},
                     [D](const V& x) { return layer_norm(x[0], {D}, x[1], x[2], 1e-5); }, -2, 3});
  }
  cases.push_back({"layer_norm no affine", {{37, 65}}, [](const V& x) { return layer_norm(x[0], {65}); }});
  cases.push_back({"layer_norm weight only, 2-D normalized_shape", {{5, 3, 7}, {3, 7}},
                   [](const V& x) { return layer_norm(x[0], {3, 7}, x[1]); }});
  cases.push_back({"layer_norm many rows (dweight column sums)", {{1031, 9}, {9}, {9}},
                   [](const V& x) { return layer_norm(x[0], {9}, x[1], x[2]); }});
  cases.push_back({"layer_norm f64", {{7, 45}, {45}, {45}},
                   [](const V& x) {
                     return layer_norm(x[0].to(kFloat64), {45}, x[1].to(kFloat64), x[2].to(kFloat64)).to(kFloat32);
                   }});
  run_table(cases);
}

TEST_CASE("cuda nn ops: dropout draws the CPU's mask bit for bit, p = 0 and p = 1 included") {
  if (skip_without_gpu()) return;
  PoisonAllocations poison;
  for (double p : {0.0, 0.3, 0.5, 1.0}) {
    for (const Shape& shape : {Shape{1}, Shape{33, 65}, Shape{4097}}) {
      CAPTURE(p);
      CAPTURE(shape_str(shape));
      const Tensor x = testing::random_input(shape, 3, false, 0.5, 1.5).to(kFloat32);
      const Tensor xc = x.detach().requires_grad_(), xg = x.to(kGpu).detach().requires_grad_();
      manual_seed(1234);
      const Tensor first_cpu = dropout(xc, p, true), second_cpu = dropout(xc, p, true);  // offset advances
      manual_seed(1234);
      const Tensor first_gpu = dropout(xg, p, true), second_gpu = dropout(xg, p, true);
      check_identical(first_gpu, first_cpu, "dropout, first call");
      check_identical(second_gpu, second_cpu, "dropout, second call (later offset)");
      const Tensor w = testing::random_input(shape, 4).to(kFloat32);
      (first_cpu * w).sum().backward();
      (first_gpu * w.to(kGpu)).sum().backward();
      check_identical(xg.grad(), xc.grad(), "dropout backward");
      int64_t dropped = 0;
      for (double v : testing::to_vector(first_cpu)) dropped += v == 0.0;
      if (p == 0.0) CHECK(dropped == 0);
      if (p == 1.0) CHECK(dropped == x.numel());
      if (p == 0.5 && x.numel() > 1000) CHECK((dropped > x.numel() / 4 && dropped < 3 * x.numel() / 4));
    }
  }
  // f64 and a transposed input.
  const Tensor x = testing::random_input({17, 9}, 5, true, 0.5, 1.5);
  manual_seed(9);
  const Tensor cpu = dropout(x, 0.4, true);
  manual_seed(9);
  check_identical(dropout(x.to(kGpu), 0.4, true), cpu, "dropout f64 non-contiguous");
}

TEST_CASE("cuda nn ops: embedding forward and backward (repeats, padding_idx) match the CPU bit for bit") {
  if (skip_without_gpu()) return;
  const std::vector<double> repeated = {3, 0, 3, 6, 2, 3, 3, 0, 6, 1, 3};
  std::vector<double> many(4099);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<double>((i * 7919) % 37);
  std::vector<Case> cases = {
      {"embedding repeats", {{7, 5}}, [&](const V& x) { return embedding(x[0], indices_on(x[0], repeated, {11})); }},
      {"embedding padding_idx 3", {{7, 33}},
       [&](const V& x) { return embedding(x[0], indices_on(x[0], repeated, {11}), 3); }},
      {"embedding 2-D indices, D = 1", {{7, 1}},
       [&](const V& x) { return embedding(x[0], indices_on(x[0], {1, 1, 6, 0, 1, 2}, {2, 3})); }},
      {"embedding 4099 indices, wide rows", {{37, 257}},
       [&](const V& x) { return embedding(x[0], indices_on(x[0], many, {4099}), 0); }},
      {"embedding f64", {{7, 9}},
       [&](const V& x) { return embedding(x[0].to(kFloat64), indices_on(x[0], repeated, {11}), 6).to(kFloat32); }},
  };
  for (Case& c : cases) c.rel = 0.0;  // same additions in the same order: identical
  run_table(cases);

  // Repeated runs give identical gradients; int32 and empty index tensors work.
  const Tensor w = testing::random_input({37, 65}, 6).to(kFloat32).to(kGpu);
  auto grad_of_weight = [&] {
    const Tensor wg = w.detach().requires_grad_();
    embedding(wg, indices_on(w, many, {4099})).sum().backward();
    return wg.grad();
  };
  check_identical(grad_of_weight(), grad_of_weight().cpu(), "embedding backward run twice");
  const Tensor idx32 = tensor({1, 2}, TensorOptions(kInt32).device(kGpu));
  check_identical(embedding(w, idx32), embedding(w.cpu(), tensor({1, 2}, kInt32)), "int32 indices");
  CHECK(embedding(w, indices_on(w, {}, {0})).sizes() == Shape{0, 65});
}

TEST_CASE("cuda nn ops: every loss and reduction matches the CPU") {
  if (skip_without_gpu()) return;
  const std::vector<std::pair<Reduction, std::string>> reductions = {
      {Reduction::None, "none"}, {Reduction::Mean, "mean"}, {Reduction::Sum, "sum"}};
  const std::vector<double> targets = {3, 0, -100, 6, 2, 3, 1, 0, 6, 5, 4};  // -100: the default ignore_index
  std::vector<Case> cases;
  for (const auto& [r, name] : reductions) {
    cases.push_back({"mse_loss " + name, {{37, 29}, {37, 29}}, [r](const V& x) { return mse_loss(x[0], x[1], r); }});
    cases.push_back({"mse_loss 1-D " + name, {{4097}, {4097}}, [r](const V& x) { return mse_loss(x[0], x[1], r); }});
    // Targets in [0, 1] (with their gradient); weight and pos_weight need none.
    cases.push_back({"bce_with_logits " + name, {{33, 7}, {33, 7}},
                     [r](const V& x) {
                       return binary_cross_entropy_with_logits(x[0] * 4.0, (x[1] + 1.0) * 0.5, {}, {}, r);
                     }});
    cases.push_back({"bce_with_logits weight, pos_weight " + name, {{33, 7}, {33, 7}, {33, 1}, {7}},
                     [r](const V& x) {
                       return binary_cross_entropy_with_logits(x[0] * 4.0, (x[1] + 1.0) * 0.5, x[2].detach() + 1.5,
                                                               x[3].detach() + 2.0, r);
                     }});
    cases.push_back({"cross_entropy " + name, {{11, 7}},
                     [&, r](const V& x) { return cross_entropy(x[0] * 3.0, indices_on(x[0], targets, {11}), {}, r); }});
    cases.push_back({"cross_entropy weight, ignore_index, smoothing " + name, {{11, 7}, {7}},
                     [&, r](const V& x) {
                       return cross_entropy(x[0] * 3.0, indices_on(x[0], targets, {11}), x[1].detach() + 1.5, r,
                                            -100, 0.1);
                     }});
    cases.push_back({"cross_entropy [N, C, d] wide classes " + name, {{2, 1000, 3}},
                     [&, r](const V& x) {
                       return cross_entropy(x[0] * 3.0, indices_on(x[0], {0, 999, 5, 17, 500, 3}, {2, 3}), {}, r, 5,
                                            0.2);
                     }});
    cases.push_back({"cross_entropy f64 " + name, {{11, 33}, {33}},
                     [&, r](const V& x) {
                       return cross_entropy(x[0].to(kFloat64), indices_on(x[0], targets, {11}),
                                            x[1].detach().to(kFloat64) + 1.5, r, -100, 0.05)
                           .to(kFloat32);
                     }});
  }
  cases.push_back({"cross_entropy 1-D input", {{9}},
                   [](const V& x) { return cross_entropy(x[0], indices_on(x[0], {4}, {})); }});
  run_table(cases);
}

TEST_CASE("cuda nn ops: losses over empty or fully ignored batches, and bad indices, behave as on the CPU") {
  if (skip_without_gpu()) return;
  const Tensor logits = testing::random_input({3, 4}, 8).to(kFloat32);
  const Tensor ignored = tensor({-100, -100, -100}, kInt64);
  // Mean over no counted sample is NaN on both devices; Sum is 0.
  CHECK(std::isnan(cross_entropy(logits.to(kGpu), ignored.to(kGpu)).cpu().item()));
  CHECK(cross_entropy(logits.to(kGpu), ignored.to(kGpu), {}, Reduction::Sum).cpu().item() == 0.0);
  CHECK(mse_loss(zeros({0}).to(kGpu), zeros({0}).to(kGpu), Reduction::Sum).cpu().item() == 0.0);
  CHECK(std::isnan(mse_loss(zeros({0}).to(kGpu), zeros({0}).to(kGpu)).cpu().item()));

  // The CUDA forward finds the first bad index and reports it as the CPU does.
  const std::string ce_cpu = testing::error_message([&] { (void)cross_entropy(logits, tensor({1, 9, -3}, kInt64)); });
  const std::string ce_gpu = testing::error_message(
      [&] { (void)cross_entropy(logits.to(kGpu), tensor({1, 9, -3}, kInt64).to(kGpu)); });
  CHECK(ce_cpu.find("target 9 is out of bounds") != std::string::npos);
  CHECK(ce_gpu.find("target 9 is out of bounds") != std::string::npos);
  CHECK(ce_gpu.find("flat position 1") != std::string::npos);
  const Tensor w = ones({10, 3}).to(kGpu);
  const std::string emb = testing::error_message([&] { (void)embedding(w, tensor({1, 2, 12, -1}, kInt64).to(kGpu)); });
  CHECK_MESSAGE(emb.find("embedding: index 12 out of range for weight [cuda:0 f32 [10, 3]]") != std::string::npos, emb);
  CHECK_MESSAGE(emb.find("found it at flat position 2") != std::string::npos, emb);
}
