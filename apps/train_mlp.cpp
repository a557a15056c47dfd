// train_mlp: a 784-256-10 MLP (ReLU) trained on Fashion-MNIST with plain mini-batch SGD,
// written directly against the engine: parameters are named leaf tensors, the update runs
// under NoGradGuard and labels itself "SGD.step" for version errors. It is the smallest
// end-to-end job (data -> forward -> backward -> step -> eval) and shows what nn modules
// and optimizers do for the other apps. Prints the loss every --log-every steps and the
// final test accuracy.
#include <nanoddp.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>


namespace {

const char* kUsage = R"(Usage: train_mlp [options]
Trains a 784-256-10 MLP (ReLU) on Fashion-MNIST with mini-batch SGD, printing the
training loss as it goes and the test-set accuracy at the end.

Options:
  --steps N         SGD steps (default 500)
  --batch-size N    images per step (default 64)
  --lr X            learning rate (default 0.1)
  --seed N          seed for the initial weights and the batch order (default 0)
  --data DIR        directory holding the Fashion-MNIST IDX files
                    (default /usr/share/datasets/fashion-mnist, Debian's dataset-fashion-mnist)
  --device D        cpu, cuda or cuda:N (default cpu)
  --log-every N     print the mean training loss every N steps (default 50)
  --help            print this help and exit
)";

struct Options {
  int64_t steps = 500;
  int64_t batch_size = 64;
  double lr = 0.1;
  uint64_t seed = 0;
  std::string data = nd::data::kFashionMnistDir;
  std::string device = "cpu";
  int64_t log_every = 50;
};

// A bad command line: main prints the message and exits with status 2.
struct UsageError {
  std::string message;
};

int64_t parse_positive_int(const std::string& flag, const std::string& text) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v <= 0)
    throw UsageError{flag + " expects a positive integer, got '" + text + "'"};
  return v;
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    std::string value;
    if (const size_t eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
    } else {
      const bool known = flag == "--steps" || flag == "--batch-size" || flag == "--lr" || flag == "--seed" ||
                         flag == "--data" || flag == "--device" || flag == "--log-every";
      if (!known) throw UsageError{"unknown option '" + flag + "'"};
      if (i + 1 >= argc) throw UsageError{flag + " needs a value"};
      value = argv[++i];
    }
    if (flag == "--steps") {
      o.steps = parse_positive_int(flag, value);
    } else if (flag == "--batch-size") {
      o.batch_size = parse_positive_int(flag, value);
    } else if (flag == "--log-every") {
      o.log_every = parse_positive_int(flag, value);
    } else if (flag == "--seed") {
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), o.seed);
      if (ec != std::errc() || end != value.data() + value.size())
        throw UsageError{"--seed expects a non-negative integer, got '" + value + "'"};
    } else if (flag == "--lr") {
      char* end = nullptr;
      o.lr = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(o.lr > 0) || !std::isfinite(o.lr))
        throw UsageError{"--lr expects a positive number, got '" + value + "'"};
    } else if (flag == "--data") {
      if (value.empty()) throw UsageError{"--data needs a directory"};
      o.data = value;
    } else if (flag == "--device") {
      try {
        nd::Device parsed(value);
      } catch (const nd::Error& e) {
        throw UsageError{std::string("--device: ") + e.what()};
      }
      o.device = value;
    } else {
      throw UsageError{"unknown option '" + flag + "'"};
    }
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
// so a model that stopped training shows up in the log (USER_STORIES.md, story 9).
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

  nd::Generator gen{o.seed, 0};
  Mlp model(device, gen);
  const std::vector<nd::Tensor> params = model.parameters();

  // Epochs visit the training set in a seeded shuffled order; the last partial batch is dropped.
  std::mt19937_64 rng(o.seed);
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
  Options options;
  try {
    options = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "train_mlp: " << e.message << "\nRun 'train_mlp --help' for the options.\n";
    return 2;
  }
  try {
    return train(options);
  } catch (const nd::Error& e) {
    std::cerr << "train_mlp: error: " << e.what() << "\n";
    return 1;
  }
}
