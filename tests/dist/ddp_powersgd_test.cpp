// PowerSGD (collectives/powersgd.h), run at 1, 2 and 4 ranks on the f64 MLP (weights
// [16, 6] and [3, 16], biases): full rank reproduces the exact average (also, in f32 and
// f64, for gradients of lower rank than asked for, through Householder QR and through
// Gram-Schmidt), its orthogonalisation equals PyTorch's (tests/golden/powersgd_golden.txt,
// from make_powersgd_golden.py) and stays orthonormal on rank-deficient matrices,
// batch_tensors_with_same_shape gives the unbatched result, plain all-reduce
// before start_powerSGD_iter and for matrices too small to compress, error feedback's
// identity (reduced + new error = gradient + old error), and a save / load through the
// TrainState that continues as an uninterrupted run.
#include <filesystem>

#include "collectives/ddp.h"
#include "collectives/powersgd.h"
#include "dist/ddp_test_util.h"
#include "harness.h"

using namespace nd;
using dist::DistributedDataParallel;
using dist::PowerSGDOptions;
using dist::PowerSGDState;
using namespace nd::testing::ddp;

namespace {

size_t count_keys(const TensorDict& state, const std::string& prefix) {
  size_t n = 0;
  for (const auto& [key, t] : state) n += key.rfind(prefix, 0) == 0;
  return n;
}

// The first `cols` columns of the n x n identity.
Tensor identity(int64_t n, int64_t cols, ScalarType dtype) {
  const Tensor out = zeros({n, cols}, dtype);
  for (int64_t k = 0; k < cols; ++k) out.narrow(0, k, 1).narrow(1, k, 1).fill_(1);
  return out;
}

// |Q^T Q - I| and |Q Q^T A - A| / |A| (max norms): orthonormal columns spanning A's.
std::pair<double, double> basis_errors(const Tensor& q, const Tensor& a) {
  const double ortho = (q.t().matmul(q) - identity(q.size(1), q.size(1), kFloat64)).abs().max().item();
  const double span = (q.matmul(q.t().matmul(a)) - a).abs().max().item() / a.abs().max().item();
  return {ortho, span};
}

// One step where each rank's gradient of the bias-free Linear(in, out) has rank 1 (one
// sample), so the average has rank <= W: |reduced - exact| / |exact| (Frobenius norms).
template <class Ddp>
double one_sample_step(Ddp& ddp, nn::Linear& replica, Generator& data) {
  const Tensor x = randn({1, replica->options.in_features()}, replica->weight.dtype(), &data);
  replica->zero_grad();
  replica(x).pow(2).sum().backward();
  const Tensor exact = mean_over_ranks(replica->weight.grad());
  ddp.module()->zero_grad();
  ddp(x).pow(2).sum().backward();
  const Tensor reduced = ddp.module()->parameters()[0].grad().to(kFloat64);
  return (reduced - exact).pow(2).sum().sqrt().item() / exact.pow(2).sum().sqrt().item();
}

}  // namespace

TEST_CASE("powerSGD: at full rank it equals the exact average") {
  // r = 16 >= every dimension: P's orthonormal columns span the summed gradient's column
  // space, so P P^T M = M; min_compression_rate 0 makes both weights take the compressed path.
  nn::Sequential replica = make_mlp64(20), model = make_mlp64(20);
  DistributedDataParallel ddp(model, "mlp");
  auto state = std::make_shared<PowerSGDState>(
      PowerSGDOptions().matrix_approximation_rank(16).start_powerSGD_iter(0).min_compression_rate(0));
  ddp.register_comm_hook(state, dist::powerSGD_hook);
  Generator data{400 + static_cast<uint64_t>(rank()), 0};
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    check_against_exact(step_on_own_batch(ddp, replica, data), [](const Tensor& exact, const Tensor& abs_mean) {
      return (exact.abs() + abs_mean) * 1e-9 + 1e-13;
    });
  }
  const TensorDict saved = state->state_dict();
  CHECK(count_keys(saved, "q.") == 2);  // both weights were compressed
  CHECK(saved.at("q.mlp.0.weight").sizes() == Shape{6, 6});
  CHECK(saved.at("q.mlp.2.weight").sizes() == Shape{16, 3});
}

TEST_CASE("powerSGD: at full rank it equals the exact average for gradients of lower rank than asked for") {
  // Rank 16 on [24, 20] (Householder QR) and rank 2 on [2, 40] (Gram-Schmidt), each
  // rank's gradient of rank 1: P = M Q has rank <= W, and P's further columns must
  // complete an orthonormal basis (normalised rounding noise left full rank 0.0066 off).
  for (ScalarType dtype : {kFloat32, kFloat64}) {
    for (auto [in, out, r] : {std::tuple<int64_t, int64_t, int64_t>{20, 24, 16}, {40, 2, 2}}) {
      CAPTURE(std::string(dtype_name(dtype)));
      CAPTURE(r);
      auto make = [&] {
        manual_seed(30);
        nn::Linear m(nn::LinearOptions(in, out).bias(false));
        m->to(dtype);
        return m;
      };
      nn::Linear replica = make(), model = make();
      DistributedDataParallel ddp(model, "lin");
      auto state = std::make_shared<PowerSGDState>(
          PowerSGDOptions().matrix_approximation_rank(r).start_powerSGD_iter(0).min_compression_rate(0));
      ddp.register_comm_hook(state, dist::powerSGD_hook);
      Generator data{800 + static_cast<uint64_t>(rank()), 0};
      for (int step = 0; step < 3; ++step) {  // fresh Q, then warm-started ones
        CAPTURE(step);
        CHECK(one_sample_step(ddp, replica, data) <= (dtype == kFloat32 ? 1e-6 : 1e-13));
      }
      CHECK(count_keys(state->state_dict(), "q.") == 1);  // it was compressed
    }
  }
}

TEST_CASE("powerSGD: batch_tensors_with_same_shape gives the unbatched result, and the same saved state") {
  // Three [8, 8] weights and a [4, 8] one: one batch of three and one of one. Rank 2 with
  // warm start and error feedback over 3 steps, f64.
  auto make = [] {
    manual_seed(40);
    nn::Sequential m(nn::Linear(nn::LinearOptions(8, 8)), nn::Tanh(), nn::Linear(nn::LinearOptions(8, 8)), nn::Tanh(),
                     nn::Linear(nn::LinearOptions(8, 8)), nn::Tanh(), nn::Linear(nn::LinearOptions(8, 4)));
    m->to(kFloat64);
    return m;
  };
  std::vector<TensorDict> states;
  std::vector<std::vector<Tensor>> grads;
  for (bool batched : {false, true}) {
    CAPTURE(batched);
    nn::Sequential model = make();
    DistributedDataParallel ddp(model, "mlp");
    auto state = std::make_shared<PowerSGDState>(PowerSGDOptions()
                                                     .matrix_approximation_rank(2)
                                                     .start_powerSGD_iter(0)
                                                     .min_compression_rate(1)
                                                     .batch_tensors_with_same_shape(batched));
    ddp.register_comm_hook(state, dist::powerSGD_hook);
    Generator data{900 + static_cast<uint64_t>(rank()), 0};
    std::vector<Tensor> seen;
    for (int step = 0; step < 3; ++step) {
      const Tensor x = randn({5, 8}, kFloat64, &data);
      ddp.module()->zero_grad();
      ddp(x).pow(2).sum().backward();
      for (const Tensor& p : model->parameters()) seen.push_back(p.grad().clone());
    }
    grads.push_back(seen);
    states.push_back(state->state_dict());
  }
  REQUIRE(grads[0].size() == grads[1].size());
  for (size_t k = 0; k < grads[0].size(); ++k) nd::testing::check_close(grads[1][k], grads[0][k], 1e-13, 1e-11, "grad");
  REQUIRE(states[0].size() == states[1].size());
  CHECK(count_keys(states[1], "q.") == 4);
  for (const auto& [key, t] : states[0]) nd::testing::check_close(states[1].at(key), t, 1e-13, 1e-11, key);
}

TEST_CASE("powerSGD: orthogonalize equals PyTorch's and completes an orthonormal basis for rank-deficient matrices") {
  const auto golden = nd::testing::read_golden_table(std::string(NANODDP_SOURCE_DIR) +
                                                     "/tests/golden/powersgd_golden.txt");
  for (const char* name : {"gram_schmidt_1", "gram_schmidt_2", "qr_3", "qr_4", "qr_square", "qr_negative_first"}) {
    CAPTURE(name);
    const std::vector<double>& shape = golden.at(std::string(name) + ".shape");
    const Shape sizes{static_cast<int64_t>(shape[0]), static_cast<int64_t>(shape[1])};
    const Tensor a = tensor(golden.at(std::string(name) + ".a"), kFloat64).reshape(sizes);
    const Tensor q = a.clone();
    dist::orthogonalize(q, 0);
    nd::testing::check_close(q, tensor(golden.at(std::string(name) + ".q"), kFloat64).reshape(sizes), 1e-13, 1e-12,
                             name);
  }
  // Rank 2 in 5 columns, rank 1 in 2 columns, and zeros.
  Generator gen{31, 0};
  const Tensor u = randn({9, 2}, kFloat64, &gen), v = randn({2, 5}, kFloat64, &gen);
  for (ScalarType dtype : {kFloat32, kFloat64}) {
    CAPTURE(std::string(dtype_name(dtype)));
    const double tol = dtype == kFloat32 ? 1e-6 : 1e-14;
    for (const Tensor& a : {u.matmul(v), u.narrow(1, 0, 1).matmul(v.narrow(0, 0, 1).narrow(1, 0, 2))}) {
      CAPTURE(a.describe());
      const Tensor q = a.to(dtype);
      dist::orthogonalize(q, 0);
      const auto [ortho, span] = basis_errors(q.to(kFloat64), a);
      CHECK(ortho <= tol);
      CHECK(span <= tol);
    }
    const Tensor qr_zero = zeros({4, 3}, dtype), gs_zero = zeros({4, 2}, dtype);
    dist::orthogonalize(qr_zero, 0);  // the reflections of nothing: I's first columns
    CHECK(nd::testing::bitwise_equal(qr_zero, identity(4, 3, dtype)));
    dist::orthogonalize(gs_zero, 0);  // Gram-Schmidt keeps a zero column zero, not NaN
    CHECK(gs_zero.abs().max().item() == 0);
  }
  CHECK(nd::testing::error_message([] { dist::orthogonalize(zeros({2, 3}), 0); }) ==
        "orthogonalize: expected a matrix [rows, cols] with cols <= rows, found [cpu f32 [2, 3]]");
}

TEST_CASE("powerSGD: plain all-reduce before start_powerSGD_iter and for matrices compression would not shrink") {
  for (int64_t rank_r : {1, 4}) {
    // Rank 1: (16 + 6) * 1 * 2 < 96 and (3 + 16) * 1 * 2 < 48, both weights compress.
    // Rank 4 (min(n, m, 4)): 176 >= 96 and 114 >= 48 at the default min_compression_rate 2: neither does.
    CAPTURE(rank_r);
    nn::Sequential replica = make_mlp64(21), model = make_mlp64(21);
    DistributedDataParallel ddp(model, "mlp");
    auto state = std::make_shared<PowerSGDState>(
        PowerSGDOptions().matrix_approximation_rank(rank_r).start_powerSGD_iter(2));
    ddp.register_comm_hook(state, dist::powerSGD_hook);
    Generator data{500 + static_cast<uint64_t>(rank()), 0};
    for (int step = 0; step < 4; ++step) {
      CAPTURE(step);
      const HookStep s = step_on_own_batch(ddp, replica, data);
      CHECK(state->iter() == step + 1);
      const TensorDict saved = state->state_dict();
      if (step < 2 || rank_r == 4) {
        check_against_exact(s, rounding_only);
        CHECK(count_keys(saved, "q.") == 0);
      } else {
        // A rank-1 approximation of a rank-6 gradient is far from it.
        CHECK(check_against_exact(s, [](const Tensor& exact, const Tensor&) { return exact.abs() * 0 + 1e9; }) > 1e-3);
        CHECK(count_keys(saved, "q.") == 2);
      }
      // Error feedback starts with compression (biases included: their error is local - average).
      CHECK(count_keys(saved, "error.") == (step < 2 ? 0u : 4u));
    }
  }
}

TEST_CASE("powerSGD: error feedback keeps what compression lost: reduced + new error = gradient + old error") {
  nn::Sequential replica = make_mlp64(22), model = make_mlp64(22);
  DistributedDataParallel ddp(model, "mlp");
  auto state = std::make_shared<PowerSGDState>(PowerSGDOptions().start_powerSGD_iter(0));
  ddp.register_comm_hook(state, dist::powerSGD_hook);
  Generator data{600 + static_cast<uint64_t>(rank()), 0};
  // This rank's row of each saved error ([world size, numel]), shaped as the parameter.
  auto errors = [&] {
    const TensorDict saved = state->state_dict();
    std::vector<Tensor> out;
    for (const auto& [name, p] : model->named_parameters()) {
      auto it = saved.find("error.mlp." + name);
      out.push_back(it == saved.end() ? zeros(p.sizes(), kFloat64) : it->second.select(0, rank()).view(p.sizes()));
    }
    return out;
  };
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    const std::vector<Tensor> before = errors();
    const HookStep s = step_on_own_batch(ddp, replica, data);
    const std::vector<Tensor> after = errors();
    for (size_t k = 0; k < s.local.size(); ++k) {
      CAPTURE(s.names[k]);
      const Tensor input = s.local[k] + before[k];
      nd::testing::check_close(s.reduced[k] + after[k], input, 1e-13, 1e-12, s.names[k]);
    }
    CHECK(after[0].abs().max().item() > 1e-6);  // the rank-1 first weight did lose something
  }
}

TEST_CASE("powerSGD: its state saved in the TrainState and loaded into a fresh model continues the run exactly") {
  const auto options = PowerSGDOptions().start_powerSGD_iter(1);  // compression from the second step
  const std::string path = (std::filesystem::temp_directory_path() / "nanoddp_powersgd_resume.safetensors").string();
  // Trains `steps` of the run from `first` on, after loading `path` when first > 0; saves
  // to `path` after `save_after` steps when that is positive. Returns the parameters.
  auto run = [&](int first, int steps, int save_after) {
    nn::Sequential model = make_mlp64(23);
    DistributedDataParallel ddp(model, "mlp");
    auto state = std::make_shared<PowerSGDState>(options);
    ddp.register_comm_hook(state, dist::powerSGD_hook);
    optim::Adam opt(model->parameters(), optim::AdamOptions(0.01));
    TrainState train{{{"mlp", model.get()}}, {{"mlp", &opt}}, {}, 0, {}, {{"powersgd", state.get()}}};
    if (first > 0) {
      load_train_state(path, train);
      CHECK(train.step == first);
      CHECK(state->iter() == first);
    }
    Generator data{700 + static_cast<uint64_t>(rank()), 0};
    for (int step = 0; step < first + steps; ++step) {
      const Tensor x = randn({8, 6}, kFloat64, &data), y = randn({8, 3}, kFloat64, &data);
      if (step < first) continue;  // the batches the saved run consumed
      opt.zero_grad();
      mse_loss(ddp(x), y).backward();
      opt.step();
      train.step = step + 1;
      if (train.step == save_after) {
        const TensorDict collected = train_state_dict(train);  // every rank: PowerSGD gathers its errors
        if (rank() == 0) save_train_state(path, collected, train, {}, world_size());
        dist::world()->barrier()->wait();
      }
    }
    std::vector<Tensor> params;
    for (const Tensor& p : model->parameters()) params.push_back(p.detach().clone());
    return params;
  };
  const std::vector<Tensor> uninterrupted = run(0, 5, 0);
  run(0, 2, 2);
  const std::vector<Tensor> resumed = run(2, 3, 0);
  REQUIRE(resumed.size() == uninterrupted.size());
  for (size_t k = 0; k < resumed.size(); ++k) nd::testing::check_close(resumed[k], uninterrupted[k], 1e-13, 0, "param");
  dist::world()->barrier()->wait();
  if (rank() == 0) std::filesystem::remove(path);
}
