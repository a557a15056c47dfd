// The image apps' --data: a CIFAR-10 folder and an image folder detected, at their size
// and channels (train_mae, train_joint; train_gan under mpirun: tests/dist/apps_dist_test),
// and every bad --data / --image-size combination as one clear line.
#include <filesystem>
#include <fstream>
#include <string>

#include "apps/app_runner.h"
#include "data/data_test_util.h"

using namespace nd;
using namespace nd::testing;

namespace {

// cifar-10-batches-bin with 4 records in each of the five training batches and the test
// batch: label i % 10, pixels a gradient.
fs::path make_cifar10(const fs::path& root) {
  const fs::path dir = root / "cifar-10-batches-bin";
  for (const char* name : {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                           "data_batch_5.bin", "test_batch.bin"}) {
    Bytes bytes;
    for (int i = 0; i < 4; ++i) {
      bytes.push_back(static_cast<uint8_t>(i % 10));
      for (int p = 0; p < 3072; ++p) bytes.push_back(static_cast<uint8_t>((p * 7 + i * 31) % 256));
    }
    write_bytes((dir / name).string(), bytes);
  }
  return root;
}

// dir/train-0.tar, dir/train-1.tar: 5 samples each, a 20 x 24 PNG of seeded random pixels
// and a .cls.
fs::path make_tar_shards(const fs::path& dir) {
  Generator gen{11, 0};
  for (int s = 0; s < 2; ++s) {
    std::vector<TarMember> members;
    for (int i = 0; i < 5; ++i) {
      const std::string key = "img" + std::to_string(s * 5 + i);
      const std::string png = encode_png(randint(0, 256, {3, 20, 24}, TensorOptions(kInt64), &gen).to(kUInt8));
      members.push_back({key + ".png", Bytes(png.begin(), png.end())});
      members.push_back({key + ".cls", text_bytes(std::to_string(i % 3))});
    }
    write_bytes((dir / ("train-" + std::to_string(s) + ".tar")).string(), make_tar(members));
  }
  return dir;
}

const std::string kTiny = " --steps 2 --batch-size 4 --log-every 1 --sample-every 2 --ckpt-every 2 --no-tensorboard";

}  // namespace

TEST_CASE("apps --data: train_mae on CIFAR-10 binaries trains on 32x32 RGB (in_chans 3)") {
  const fs::path cifar = make_cifar10(temp_dir("cifar"));
  const fs::path out = temp_dir("mae_cifar");
  const Run r = run_app("train_mae", "--data " + cifar.string() + " --workers 2 --out " + out.string() + kTiny);
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(contains(r.output, "CIFAR-10 in " + cifar.string() + " (20 images) at 32x32x3"));
  const TensorDict ckpt = load((out / "ckpt" / "latest.safetensors").string());
  CHECK(ckpt.at("model.MAE.patch_embed.proj.weight").sizes() == Shape{64, 3, 4, 4});
  CHECK(ckpt.at("model.MAE.decoder_pred.weight").sizes() == Shape{4 * 4 * 3, 32});
  // The test batch's 4 images as 12 tiles of 32 px: 2 rows of 6.
  CHECK(png_size(out / "samples_000002.png") == std::make_pair(6 * 34 + 2, 2 * 34 + 2));
}

TEST_CASE("apps --data: train_joint on an image folder at --image-size 16: G, D and the MAE on RGB") {
  const fs::path images = temp_dir("joint_images");
  make_image_folder(images, 10);
  const fs::path out = temp_dir("joint_folder");
  const Run r = run_app("train_joint", "--data " + images.string() + " --image-size 16 --out " + out.string() + kTiny);
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(contains(r.output, "ImageFolder in " + images.string() + " (12 images, 2 classes) at 16x16x3"));
  const TensorDict ckpt = load((out / "ckpt" / "latest.safetensors").string());
  CHECK(ckpt.at("model.G.net.0.weight").sizes() == Shape{16, 3, 3, 3});
  CHECK(ckpt.at("model.D.main.0.weight").sizes() == Shape{32, 3, 4, 4});
  CHECK(ckpt.at("model.MAE.patch_embed.proj.weight").sizes() == Shape{64, 3, 4, 4});
  // 12 images, 4 tiles each: 6 rows of 8 tiles of 16 px.
  CHECK(png_size(out / "samples_000002.png") == std::make_pair(8 * 18 + 2, 6 * 18 + 2));
}

TEST_CASE("apps --data: train_gan on tar shards (a brace pattern, a folder of .tar files, 2 ranks) at 16x16") {
  const fs::path shards = make_tar_shards(temp_dir("gan_shards"));
  const std::string pattern = (shards / "train-{0..1}.tar").string();  // quoted below: the shell expands braces
  const fs::path out = temp_dir("gan_shards_out");
  Run r = run_app("train_gan", "--data '" + pattern + "' --image-size 16 --workers 2 --out " + out.string() + kTiny);
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(contains(r.output, "WebDataset tar shards in " + pattern + " (2 shards, 10 images) at 16x16x3"));
  const TensorDict ckpt = load((out / "ckpt" / "latest.safetensors").string());
  CHECK(ckpt.at("model.D.main.0.weight").size(1) == 3);

  r = run_app("train_gan", "--data " + shards.string() + " --image-size 16 --overwrite --out " + out.string() + kTiny);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "WebDataset tar shards in " + shards.string() + " (2 shards, 10 images) at 16x16x3"));
  if (mpirun_missing()) return;
  r = run_logged("OMP_NUM_THREADS=1 mpirun " + mpirun_test_options() + " -np 2 " + (apps_dir() / "train_gan").string() +
                     " --data '" + pattern + "' --image-size 16 --overwrite --out " + out.string() + kTiny,
                 temp_dir("logs") / "train_gan_shards_2.log");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "WebDataset tar shards in " + pattern +
                               " (2 shards, 10 images) at 16x16x3, each of 2 ranks streams its own shards: 5 images "
                               "an epoch"));
  // Each rank reads only its own shards: 3 ranks need 3 shards.
  r = run_logged("OMP_NUM_THREADS=1 mpirun " + mpirun_test_options() + " -np 3 " + (apps_dir() / "train_gan").string() +
                     " --data '" + pattern + "' --image-size 16 --overwrite --out " + out.string() + kTiny +
                     " --batch-size 3",
                 temp_dir("logs") / "train_gan_shards_3.log");
  INFO(r.output);
  CHECK(r.status != 0);
  CHECK(contains(r.output, "train_gan: error: TarShards: 2 shards for 3 ranks"));
}

// Mid-epoch: 10 samples are 2 batches of 4 an epoch, so step 3 stops inside epoch 1.
TEST_CASE("apps --data: train_gan on tar shards resumed mid-epoch equals the uninterrupted run, bit for bit") {
  const fs::path shards = make_tar_shards(temp_dir("resume_shards"));
  const fs::path whole = temp_dir("shards_whole"), parts = temp_dir("shards_parts");
  const std::string args = "--data " + shards.string() +
                           " --image-size 16 --workers 2 --steps 5 --batch-size 4 --log-every 1 --sample-every 1000 "
                           "--ckpt-every 2 --no-tensorboard";
  const std::string env = "OMP_NUM_THREADS=1";
  REQUIRE(run_app("train_gan", args + " --out " + whole.string(), env).status == 0);
  REQUIRE(run_app("train_gan", args + " --exit-after 3 --out " + parts.string(), env).status == 0);
  const Run r = run_app("train_gan", args + " --workers 1 --resume --out " + parts.string(), env);
  INFO(r.output);
  REQUIRE(r.status == 0);
  check_same_training(whole, parts, 5);
}

TEST_CASE("apps --data: what the data cannot do is one clear line") {
  const fs::path images = temp_dir("bad_images");
  make_image_folder(images, 4);
  const std::string out = " --out " + temp_dir("bad_out").string() + " --steps 1";
  struct Case {
    const char* app;
    std::string args, message;
    int status;
  };
  const fs::path flat = temp_dir("flat");
  write_bytes((flat / "x.png").string(), data::read_file(golden_image("rgb8.png")));
  std::vector<Case> cases = {
      {"train_gan", "--data " + images.string() + " --image-size 30",
       "train_gan: --image-size 30: DCGANConfig: image_size must be 4 * 2^k or 7 * 2^k with k >= 1 (28, 32, 64, ...), "
       "got 30",
       2},
      {"train_gan", "--data " + images.string() + " --eval",
       "train_gan: --eval: FID uses the features of a Fashion-MNIST classifier; --data " + images.string() +
           " holds ImageFolder images",
       2},
      {"train_mae", "--data " + images.string() + " --image-size 30",
       "train_mae: --image-size 30 is not a multiple of the MAE's patch size 4", 2},
      {"train_mae", "--data " + images.string() + " --probe",
       "train_mae: --probe: the linear probe uses Fashion-MNIST's labelled test set; --data " + images.string() +
           " holds ImageFolder images",
       2},
      {"train_joint", "--data " + flat.string(),
       "train_joint: error: --data: found nothing to train on in '" + flat.string() +
           "': expected Fashion-MNIST/MNIST IDX files (train-images-idx3-ubyte[.gz]), a CIFAR-10/100 binary folder "
           "(data_batch_1.bin or train.bin), an image folder with one subfolder per class or .tar shards",
       1},
  };
  const fs::path shards = temp_dir("bad_shards");
  write_bytes((shards / "train-0.tar").string(), make_tar({{"a.png", data::read_file(golden_image("rgb8.png"))}}));
  cases.push_back({"train_gan", "--data '" + (shards / "train-{0..2}.tar").string() + "'",
                   "train_gan: error: TarShards: the shard '" + (shards / "train-1.tar").string() + "' does not exist",
                   1});
  cases.push_back({"train_gan", "--data " + (shards / "none.tar").string(),
                   "train_gan: error: TarShards: '" + (shards / "none.tar").string() +
                       "' names 1 file, which does not exist",
                   1});
  cases.push_back({"train_gan", "--data " + (shards / "train-0.tar").string() + " --batch-size 4",
                   "train_gan: error: --batch-size 4 takes 4 images a rank an epoch; each rank's shards give 1", 1});
  for (const Case& c : cases) {
    CAPTURE(c.args);
    const Run r = run_app(c.app, c.args + out);
    CHECK(r.status == c.status);
    CHECK(contains(r.output, c.message));
  }
  // A bad sample stops the run at its batch (after the run's folder was made).
  const Run bad_sample = run_app("train_gan", "--data " + shards.string() + " --batch-size 1 --steps 1 --out " +
                                                  temp_dir("bad_sample_out").string());
  CHECK(bad_sample.status == 1);
  CHECK(contains(bad_sample.output, "train_gan: error: TarShards: shard '" + (shards / "train-0.tar").string() +
                                        "': sample 'a': no class member (a.cls)"));
  // IDX images are 28x28 (when Debian's Fashion-MNIST is installed: the apps' default --data).
  if (!fs::exists(std::string(data::kFashionMnistDir) + "/train-images-idx3-ubyte.gz")) {
    MESSAGE("SKIPPED: no Fashion-MNIST in " << data::kFashionMnistDir);
    return;
  }
  const Run r = run_app("train_gan", "--image-size 32" + out);
  CHECK(r.status == 2);
  CHECK(contains(r.output, "train_gan: --image-size 32: the IDX images in " + std::string(data::kFashionMnistDir) +
                               " are 28x28 (an image folder or CIFAR can be resized)"));
}
