// train_mlp: a 784-256-10 MLP (ReLU) trained on Fashion-MNIST with plain mini-batch SGD,
// written directly against the engine: parameters are named leaf tensors, the update runs
// under NoGradGuard and labels itself "SGD.step" for version errors. It is the smallest
// end-to-end job (data -> forward -> backward -> step -> eval) and shows what nn modules
// and optimizers do for the other apps. Prints the loss every --log-every steps and the
// final test accuracy.
#include <nanoddp.h>

#include "common/flags.h"
#include "common/run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

struct Options {
  int64_t steps = 500;
  int64_t batch_size = 64;
  double lr = 0.1;
  int64_t seed = 0;
  std::string data = nd::data::kFashionMnistDir;
  std::string device = "cpu";
  int64_t log_every = 50;
};

Options parse_args(int argc, char** argv) {
  Options o;
  app::Flags flags("train_mlp",
                   "Trains a 784-256-10 MLP (ReLU) on Fashion-MNIST with mini-batch SGD, printing the\n"
                   "training loss as it goes and the test-set accuracy at the end.");
  flags.add("--steps", &o.steps, "SGD steps");
  flags.add("--batch-size", &o.batch_size, "images per step");
  flags.add("--lr", &o.lr, "learning rate");
  flags.add("--seed", &o.seed, "seed for the initial weights and the batch order", 0);
  flags.add("--data", &o.data, "directory holding the Fashion-MNIST IDX files", "DIR");
  flags.add("--device", &o.device, "cpu, cuda or cuda:N", "D");
  flags.add("--log-every", &o.log_every, "print the mean training loss every N steps");
  flags.parse(argc, argv);
  try {
    nd::Device parsed(o.device);
  } catch (const nd::Error& e) {
    throw app::UsageError{std::string("--device: ") + e.what()};
  }
  return o;
}

// PyTorch's nn.Linear initialisation: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)).
nd::Tensor uniform_param(const std::string& name, const nd::Shape& shape, int64_t fan_in, nd::Device device,
                         nd::Generator& gen) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  nd::Tensor p = (nd::rand(shape, {}, &gen) * (2 * bound) - bound).to(device);
  p.set_name(name);
  p.requires_grad_(true);
  return p;
}

struct Mlp {
  nd::Tensor fc1_weight, fc1_bias, fc2_weight, fc2_bias;

  Mlp(nd::Device device, nd::Generator& gen)
      : fc1_weight(uniform_param("fc1.weight", {256, 784}, 784, device, gen)),
        fc1_bias(uniform_param("fc1.bias", {256}, 784, device, gen)),
        fc2_weight(uniform_param("fc2.weight", {10, 256}, 256, device, gen)),
        fc2_bias(uniform_param("fc2.bias", {10}, 256, device, gen)) {}

  std::vector<nd::Tensor> parameters() const { return {fc1_weight, fc1_bias, fc2_weight, fc2_bias}; }

  // x: [N, 1, 28, 28] -> logits [N, 10]
  nd::Tensor forward(const nd::Tensor& x) const {
    nd::Tensor h = nd::matmul(x.reshape({x.size(0), 784}), fc1_weight.t()) + fc1_bias;
    return nd::matmul(h.relu(), fc2_weight.t()) + fc2_bias;
  }
};

// One SGD step, p -= lr * grad, then clears the gradients. Returns the update's L2 norm,
// so a model that stopped training shows up in the log (docs/traps.md, trap 9).
double sgd_step(const std::vector<nd::Tensor>& params, double lr) {
  nd::NoGradGuard no_grad;
  nd::ops::InplaceOpLabel label("SGD.step");
  double sq = 0;
  for (const nd::Tensor& p : params) {
    const nd::Tensor g = p.grad();  // throws, naming p, if no gradient arrived
    sq += g.mul(g).sum().item();
    p.sub_(g, lr);
    p.set_grad(nd::Tensor());
  }
  return lr * std::sqrt(sq);
}

// The rows of `data` listed in order[begin, begin + n), on `device`.
nd::Tensor gather(const nd::Tensor& data, const std::vector<int64_t>& order, size_t begin, int64_t n,
                  nd::Device device) {
  nd::Tensor idx = nd::empty({n}, nd::TensorOptions(nd::kInt64));
  std::copy_n(order.begin() + static_cast<ptrdiff_t>(begin), n, idx.data_ptr<int64_t>());
  return data.index_select(0, idx).to(device);
}

double test_accuracy(const Mlp& model, const nd::data::Dataset& test, nd::Device device) {
  nd::NoGradGuard no_grad;
  const int64_t n = test.labels.size(0), chunk = 1000;
  int64_t correct = 0;
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    nd::Tensor logits = model.forward(test.images.narrow(0, start, len).to(device));
    const nd::Tensor pred = logits.argmax(1).cpu().contiguous();
    const nd::Tensor truth = test.labels.narrow(0, start, len).contiguous();
    const int64_t* p = pred.data_ptr<int64_t>();
    const int64_t* t = truth.data_ptr<int64_t>();
    for (int64_t i = 0; i < len; ++i) correct += p[i] == t[i];
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

int train(const Options& o) {
  const nd::Device device(o.device);
  nd::cuda::check_device(device);  // a clear error when CUDA or the GPU is missing
  const nd::data::Dataset train = nd::data::load_fashion_mnist(o.data, true);
  const nd::data::Dataset test = nd::data::load_fashion_mnist(o.data, false);
  const int64_t n_train = train.labels.size(0);
  if (o.batch_size > n_train)
    throw nd::Error("--batch-size " + std::to_string(o.batch_size) + " exceeds the " + std::to_string(n_train) +
                    " training images");
  std::printf("train_mlp: %lld train / %lld test images from %s, device %s, %lld steps of batch %lld, lr %g\n",
              static_cast<long long>(n_train), static_cast<long long>(test.labels.size(0)), o.data.c_str(),
              device.str().c_str(), static_cast<long long>(o.steps), static_cast<long long>(o.batch_size), o.lr);

  nd::Generator gen{static_cast<uint64_t>(o.seed), 0};
  Mlp model(device, gen);
  const std::vector<nd::Tensor> params = model.parameters();

  // Epochs visit the training set in a seeded shuffled order; the last partial batch is dropped.
  std::mt19937_64 rng(static_cast<uint64_t>(o.seed));
  std::vector<int64_t> order(static_cast<size_t>(n_train));
  size_t cursor = order.size();
  double loss_sum = 0, update_norm = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 1; step <= o.steps; ++step) {
    if (cursor + static_cast<size_t>(o.batch_size) > order.size()) {
      for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
      for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng() % (i + 1)]);
      cursor = 0;
    }
    const nd::Tensor x = gather(train.images, order, cursor, o.batch_size, device);
    const nd::Tensor y = gather(train.labels, order, cursor, o.batch_size, device);
    cursor += static_cast<size_t>(o.batch_size);

    const nd::Tensor loss = nd::cross_entropy(model.forward(x), y);
    loss.backward();
    update_norm = sgd_step(params, o.lr);
    loss_sum += loss.item();

    if (step % o.log_every == 0 || step == o.steps) {
      const int64_t window = step % o.log_every == 0 ? o.log_every : step % o.log_every;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("step %6lld/%lld  loss %.4f  |update| %.3e  %.1fs\n", static_cast<long long>(step),
                  static_cast<long long>(o.steps), loss_sum / static_cast<double>(window), update_norm, secs);
      std::fflush(stdout);
      loss_sum = 0;
    }
  }
  std::printf("test accuracy: %.2f%% (%lld images)\n", 100 * test_accuracy(model, test, device),
              static_cast<long long>(test.labels.size(0)));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return app::run_main("train_mlp", [&] { return train(parse_args(argc, argv)); });
}
