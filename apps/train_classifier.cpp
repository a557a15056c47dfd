// train_classifier: the small CNN of models/classifier.h on Fashion-MNIST with Adam and
// cross-entropy, under DistributedDataParallel with default options. At the end it
// reports the test accuracy (stdout and metrics.jsonl) and saves the weights to
// DIR/classifier.safetensors: the feature network of train_gan --eval (FID).
#include <algorithm>
#include <string>

#include "common/flags.h"
#include "common/run.h"

namespace {

using nd::Tensor;
namespace models = nd::models;

// Fraction of the test set classified correctly (eval mode, no communication).
// (the first n test images).
double test_accuracy(models::Classifier& model, const nd::data::Dataset& test, int64_t n, nd::Device device) {
  model->eval();
  const Tensor logits =
      app::map_chunks(test.images.narrow(0, 0, n), 1000, device, [&](const Tensor& x) { return model->forward(x); });
  model->train();
  const Tensor correct = logits.argmax(1).eq(test.labels.narrow(0, 0, n)).to(nd::kFloat64).sum();
  return correct.item() / static_cast<double>(n);
}

struct Options : app::CommonOptions {
  int64_t test_images = 10000;
};

int train(Options& o) {
  app::Run run("train_classifier", o);
  const nd::data::Dataset train_set = nd::data::load_fashion_mnist(o.data, true);
  const nd::data::Dataset test_set = nd::data::load_fashion_mnist(o.data, false);
  o.test_images = std::min(o.test_images, test_set.labels.size(0));

  nd::manual_seed(static_cast<uint64_t>(o.seed));
  models::Classifier C;
  if (o.sync_bn) nd::nn::convert_sync_batchnorm(C.ptr());
  C->to(run.device);
  auto c = run.wrap<nd::optim::Adam>("classifier", C, nd::optim::AdamOptions(o.lr));
  const int64_t start = run.start(train_set);

  app::Logger& log = run.log();
  log.say("train_classifier: " + std::to_string(run.world.size) + " rank(s), device " + run.device.str() +
          ", global batch " + std::to_string(o.batch_size) + ", steps " + std::to_string(start + 1) + ".." +
          std::to_string(o.steps) + ", output " + o.out);
  for (int64_t step = start + 1; step <= o.steps; ++step) {
    const nd::data::Batch batch = run.batches().next();
    c.optimizer->zero_grad();
    const Tensor logits = c(batch.images);
    const Tensor loss = nd::cross_entropy(logits, batch.labels);
    const double norm = c.step(loss);
    run.scaler.update();
    const double accuracy = logits.argmax(1).eq(batch.labels).to(nd::kFloat64).mean().item();
    log.step(step, {{"loss", loss.item()}}, {{"classifier", norm}}, {{"batch_accuracy", accuracy}});
    if (const auto status = run.end_of_step(step)) return *status;
  }
  if (run.world.rank0()) {
    log.record(std::max(start, o.steps), {{"test_accuracy", test_accuracy(C, test_set, o.test_images, run.device)}});
    nd::save(C->state_dict(), o.out + "/classifier.safetensors",
             {{"width", std::to_string(C->width)}, {"feature_dim", std::to_string(C->feature_dim)}});
    log.say("wrote " + o.out + "/classifier.safetensors");
  }
  log.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return app::run_main("train_classifier", [&] {
    Options o;
    o.steps = 1500;
    o.batch_size = 128;
    o.lr = 1e-3;
    app::Flags flags("train_classifier",
                     "Trains the Fashion-MNIST CNN classifier (the FID feature network); alone or under mpirun.\n"
                     "Writes classifier.safetensors, metrics.jsonl, loss_curve.png and ckpt/ to --out.");
    app::add_common_flags(flags, o, /*has_batch_norm=*/true);
    flags.add("--test-images", &o.test_images, "test images for the final accuracy (the first N)");
    flags.parse(argc, argv);
    return train(o);
  });
}
