// Classifier: names, counts, shapes, and learning on real Fashion-MNIST images.
#include <filesystem>

#include "harness.h"

using namespace nd;

TEST_CASE("Classifier: state_dict names, parameter count, shapes") {
  models::Classifier net;  // width 32, feature_dim 128
  std::vector<std::string> names;
  for (const auto& [k, v] : net->state_dict()) names.push_back(k);
  // From PyTorch, the same tree (docs/models.md), sorted.
  std::vector<std::string> expected{
      "conv.0.weight",       "conv.1.weight",         "conv.1.bias",        "conv.1.running_mean",
      "conv.1.running_var",  "conv.1.num_batches_tracked", "conv.3.weight", "conv.4.weight",
      "conv.4.bias",         "conv.4.running_mean",   "conv.4.running_var", "conv.4.num_batches_tracked",
      "conv.6.weight",       "conv.7.weight",         "conv.7.bias",        "conv.7.running_mean",
      "conv.7.running_var",  "conv.7.num_batches_tracked", "fc.weight",     "fc.bias",
      "head.weight",         "head.bias"};
  std::sort(expected.begin(), expected.end());
  CHECK(names == expected);
  int64_t count = 0;
  for (const Tensor& p : net->parameters()) count += p.numel();
  CHECK(count == 968810);

  models::Classifier small(4, 16);
  Tensor x = randn({3, 1, 28, 28});
  CHECK(small(x).sizes() == Shape{3, 10});
  CHECK(small->features(x).sizes() == Shape{3, 16});
  CHECK(nd::testing::to_vector(small->features(x).detach().clamp(-1e9, 0)) == std::vector<double>(48, 0.0));
}

TEST_CASE("Classifier: learns real Fashion-MNIST images in a few dozen steps") {
  if (!std::filesystem::exists(std::string(data::kFashionMnistDir) + "/train-images-idx3-ubyte.gz")) {
    MESSAGE("SKIPPED: Fashion-MNIST is not installed in ", data::kFashionMnistDir);
    return;
  }
  manual_seed(0);
  const data::Dataset train = data::load_fashion_mnist();
  std::vector<int64_t> first(512);
  for (int64_t i = 0; i < 512; ++i) first[i] = i;
  data::DataLoader loader(train, data::DataLoaderOptions(64).indices(first).shuffle(true).seed(1));
  models::Classifier net(8, 32);
  optim::Adam opt(net->parameters(), optim::AdamOptions(3e-3));
  // Accuracy on the 512 training images, in eval mode.
  auto accuracy = [&] {
    NoGradGuard no_grad;
    net->eval();
    data::DataLoader all(train, data::DataLoaderOptions(512).indices(first));
    const data::Batch b = *all.next();
    const Tensor correct = net(b.images).argmax(1).eq(b.labels).to(kFloat32).mean();
    net->train();
    return correct.item();
  };
  const double before = accuracy();
  double first_loss = 0, last_loss = 0;
  for (int epoch = 0; epoch < 5; ++epoch)
    for (auto& batch : loader) {
      Tensor loss = cross_entropy(net(batch.images), batch.labels);
      opt.zero_grad();
      loss.backward();
      opt.step();
      if (first_loss == 0) first_loss = loss.item();
      last_loss = loss.item();
    }
  const double after = accuracy();
  MESSAGE("classifier: loss ", first_loss, " -> ", last_loss, ", train accuracy ", before, " -> ", after);
  CHECK(last_loss < 0.5 * first_loss);
  CHECK(after > 0.75);
}
