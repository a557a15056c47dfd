// Resumable checkpoints: train N steps, save, load in a fresh process, train M more
// == train N + M uninterrupted, bit for bit (models, AdamW, cosine schedule, dropout RNG).
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "harness.h"

using namespace nd;

namespace {

struct TinyNet : nn::Module {
  Tensor w1, b1, w2;
  explicit TinyNet(uint64_t seed) : nn::Module("TinyNet") {
    Generator g{seed, 0};
    w1 = register_parameter("w1", randn({4, 8}, kFloat32, &g) * 0.5);
    b1 = register_parameter("b1", zeros({8}));
    w2 = register_parameter("w2", randn({8, 2}, kFloat32, &g) * 0.5);
  }
  Tensor forward(const Tensor& x) override { return matmul(dropout(relu(matmul(x, w1) + b1), 0.25, is_training()), w2); }
};

struct Run {
  std::shared_ptr<TinyNet> net;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<optim::CosineAnnealingLR> sched;
  TrainState state;
  explicit Run(uint64_t init_seed) : net(std::make_shared<TinyNet>(init_seed)) {
    opt = std::make_unique<optim::AdamW>(net->parameters(), optim::AdamWOptions(0.05));
    sched = std::make_unique<optim::CosineAnnealingLR>(*opt, 10);
    state.modules = {{"net", net.get()}};
    state.optimizers = {{"net", opt.get()}};
    state.schedulers = {{"net", sched.get()}};
  }
  void train_until(int64_t last_step) {
    for (; state.step < last_step; ++state.step) {
      Generator data{1000 + static_cast<uint64_t>(state.step), 0};  // the batch depends only on the step
      Tensor x = randn({16, 4}, kFloat32, &data), y = randn({16, 2}, kFloat32, &data);
      opt->zero_grad();
      mse_loss(net->forward(x), y).backward();
      opt->step();
      sched->step();
    }
  }
};

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("nanoddp_" + std::to_string(getpid()) + "_" + name)).string();
}

}  // namespace

TEST_CASE("train_state: resume child" * doctest::skip()) {
  // Runs only when the parent test below starts this binary again with these set.
  const char* ckpt = std::getenv("ND_RESUME_CKPT");
  const char* out = std::getenv("ND_RESUME_OUT");
  REQUIRE((ckpt && out));
  manual_seed(999);  // a different RNG state: the checkpoint must restore it
  Run run(/*init_seed=*/555);  // different initial weights: the checkpoint must overwrite them
  load_train_state(ckpt, run.state);
  REQUIRE(run.state.step == 3);
  run.train_until(6);
  save(run.net->state_dict(), out);
}

TEST_CASE("train_state: N steps + save + load in a fresh process + M steps == N + M steps, bit for bit") {
  manual_seed(7);
  Run straight(1);
  straight.train_until(6);

  manual_seed(7);
  Run first(1);
  first.train_until(3);
  const std::string ckpt = temp_path("resume.safetensors"), out = temp_path("resumed.safetensors");
  save_train_state(ckpt, first.state, {{"note", "test"}});
  CHECK(load_metadata(ckpt).at("note") == "test");

  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string cmd = "ND_RESUME_CKPT='" + ckpt + "' ND_RESUME_OUT='" + out + "' '" + self + "' --no-skip --test-case='train_state: resume child' > /dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  TensorDict resumed = load(out);
  for (const auto& [name, t] : straight.net->state_dict()) {
    CAPTURE(name);
    CHECK(nd::testing::to_vector(resumed.at(name)) == nd::testing::to_vector(t));
  }
  // And the parameters did move: the comparison is not between two initial states.
  CHECK(nd::testing::to_vector(resumed.at("w1")) != nd::testing::to_vector(Run(1).net->w1));
  std::filesystem::remove(ckpt);
  std::filesystem::remove(out);
}

TEST_CASE("train_state: a file that is not a training checkpoint is a clear error") {
  const std::string path = temp_path("plain.safetensors");
  save({{"w", ones({2})}}, path);
  Run run(1);
  const std::string msg = nd::testing::error_message([&] { load_train_state(path, run.state); });
  CHECK(msg.find("has no 'step' metadata") != std::string::npos);
  Run other(1);
  save_train_state(path, TrainState{{{"other", other.net.get()}}, {}, {}, 0, {}, {}});
  CHECK(nd::testing::error_message([&] { load_train_state(path, run.state); }).find("holds no model 'net'") !=
        std::string::npos);
  std::filesystem::remove(path);
}

TEST_CASE("train_state: a GradScaler's scale and growth count come back, and a missing one is named") {
  const std::string path = temp_path("scaler.safetensors");
  Run run(1);
  optim::GradScaler scaler(optim::GradScalerOptions().init_scale(256.0).growth_interval(10));
  run.state.scalers = {{"net", &scaler}};
  for (int i = 0; i < 3; ++i) {  // three good steps, then one skipped: scale 128, tracker 0, then 1
    run.net->w1.set_grad(full({4, 8}, i == 2 ? std::nan("") : 1.0));
    scaler.step(*run.opt);
    scaler.update();
  }
  run.net->w1.set_grad(full({4, 8}, 1.0));
  scaler.step(*run.opt);
  scaler.update();
  REQUIRE(scaler.get_scale() == 128.0);
  REQUIRE(scaler.growth_tracker() == 1);
  save_train_state(path, run.state);
  Run back(2);
  optim::GradScaler fresh;
  back.state.scalers = {{"net", &fresh}};
  load_train_state(path, back.state);
  CHECK(fresh.get_scale() == 128.0);
  CHECK(fresh.growth_tracker() == 1);
  CHECK(fresh.state_dict().at("growth_interval").item() == 10.0);
  back.state.scalers = {{"other", &fresh}};
  CHECK(nd::testing::error_message([&] { load_train_state(path, back.state); }).find("holds no GradScaler 'other'") !=
        std::string::npos);
  std::filesystem::remove(path);
}
