#include "common/data.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

namespace app {

namespace fs = std::filesystem;
namespace T = nd::data::transforms;

void add_data_flags(Flags& flags, DataOptions& o) {
  flags.add("--image-size", &o.image_size,
            "side S of the square training images: image data is resized and center-cropped to S x S "
            "(default: 28 IDX, 32 CIFAR, 64 an image folder or tar shards; IDX is always 28)",
            0);
  flags.add("--workers", &o.workers, "threads reading, decoding and transforming the training images");
  flags.add("--skip-unreadable", &o.skip_unreadable,
            "leave out image files that cannot be read or decoded (listed at the end) instead of stopping");
}

namespace {

bool exists_any(const fs::path& dir, std::initializer_list<const char*> names) {
  std::error_code ec;
  for (const char* name : names)
    if (fs::exists(dir / name, ec)) return true;
  return false;
}

bool is_tar(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".tar";
}

// The .tar files directly in `dir`, sorted (WebDataset shards), when it has no subfolder.
std::vector<std::string> tar_files_in(const fs::path& dir) {
  std::vector<std::string> tars;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_directory()) return {};
    if (is_tar(entry.path())) tars.push_back(entry.path().string());
  }
  std::sort(tars.begin(), tars.end());
  return tars;
}

T::AnyTransform image_transform(int64_t size) {
  return T::Compose({T::Resize({size}), T::CenterCrop({size}), T::ToTensor(),
                     T::Normalize({0.5, 0.5, 0.5}, {0.5, 0.5, 0.5})});
}

}  // namespace

std::string TrainData::describe() const {
  const int64_t classes = images ? static_cast<int64_t>(images->classes().size()) : 10;
  const size_t n_shards = shards ? shards->all_shards().size() : 0;
  return kind + " in " + dir + " (" +
         (shards ? std::to_string(n_shards) + (n_shards == 1 ? " shard, " : " shards, ") : std::string()) +
         std::to_string(size()) + " images" +
         (classes ? ", " + std::to_string(classes) + " classes" : std::string()) + ") at " +
         std::to_string(image_size) + "x" + std::to_string(image_size) + "x" + std::to_string(channels) +
         (shards && world_size > 1 ? ", each of " + std::to_string(world_size) + " ranks streams its own shards: " +
                                         std::to_string(per_rank) + " images an epoch"
                                   : std::string());
}

TrainData load_train_data(const std::string& dir, const DataOptions& o, const World& world) {
  TrainData data;
  data.dir = dir;
  std::error_code ec;
  const fs::path root(dir);
  // Tar shards: a brace pattern or a .tar file, or (below) a folder holding .tar files and no
  // subfolder. Each rank indexes only its own shards.
  const bool tar_pattern = dir.find('{') != std::string::npos || is_tar(root);
  ND_CHECK(tar_pattern || fs::is_directory(dir, ec), "--data: '", dir,
           "' is not a folder (expected Fashion-MNIST/MNIST IDX files, a CIFAR-10/100 binary folder, an image folder "
           "with one subfolder per class, or tar shards: a .tar file, a brace pattern of them or a folder of them)");
  if (exists_any(root, {"train-images-idx3-ubyte.gz", "train-images-idx3-ubyte"})) {
    if (o.image_size != 0 && o.image_size != 28)
      throw UsageError{"--image-size " + std::to_string(o.image_size) + ": the IDX images in " + dir +
                       " are 28x28 (an image folder or CIFAR can be resized)"};
    data.kind = "Fashion-MNIST/MNIST IDX";
    data.tensors = nd::data::load_fashion_mnist(dir, true);
    return data;
  }
  data.channels = 3;
  const bool cifar10 = exists_any(root, {"data_batch_1.bin", "cifar-10-batches-bin"});
  const bool cifar100 = !cifar10 && exists_any(root, {"train.bin", "cifar-100-binary"});
  data.image_size = o.image_size ? o.image_size : cifar10 || cifar100 ? 32 : 64;
  const T::AnyTransform transform = image_transform(data.image_size);
  const std::vector<std::string> tars =
      tar_pattern || cifar10 || cifar100 ? std::vector<std::string>{} : tar_files_in(root);
  if (tar_pattern || !tars.empty()) {
    data.kind = "WebDataset tar shards";
    const auto options =
        nd::data::TarShardsOptions().transform(transform).rank(world.rank).world_size(world.size);
    const auto shards = tar_pattern ? std::make_shared<const nd::data::TarShards>(dir, options)
                                    : std::make_shared<const nd::data::TarShards>(tars, options);
    data.images = shards;
    data.shards = shards.get();
    data.shard_total = world.sum(shards->size());
    data.per_rank = world.min(shards->size());
    data.world_size = world.size;
  } else if (cifar10) {
    data.kind = "CIFAR-10";
    data.images = std::make_shared<const nd::data::CIFAR10>(dir, true, transform);
  } else if (cifar100) {
    data.kind = "CIFAR-100";
    data.images = std::make_shared<const nd::data::CIFAR100>(dir, true, transform);
  } else {
    data.kind = "ImageFolder";
    bool has_subfolder = false;
    for (const auto& entry : fs::directory_iterator(root, ec)) has_subfolder = has_subfolder || entry.is_directory();
    ND_CHECK(has_subfolder, "--data: found nothing to train on in '", dir,
             "': expected Fashion-MNIST/MNIST IDX files (train-images-idx3-ubyte[.gz]), a CIFAR-10/100 binary folder "
             "(data_batch_1.bin or train.bin), an image folder with one subfolder per class or .tar shards");
    data.images =
        std::make_shared<const nd::data::ImageFolder>(dir, nd::data::ImageFolderOptions().transform(transform));
  }
  return data;
}

nd::Tensor eval_images(const TrainData& data, int64_t n) {
  if (data.is_idx()) {
    const nd::data::Dataset test = nd::data::load_fashion_mnist(data.dir, false);
    ND_CHECK(n <= test.images.size(0), "the test set in ", data.dir, " has ", test.images.size(0), " images, ", n,
             " asked");
    return test.images.narrow(0, 0, n);
  }
  std::shared_ptr<const nd::data::ImageDataset> source = data.images;
  const T::AnyTransform transform = image_transform(data.image_size);
  if (data.kind == "CIFAR-10") source = std::make_shared<const nd::data::CIFAR10>(data.dir, false, transform);
  if (data.kind == "CIFAR-100") source = std::make_shared<const nd::data::CIFAR100>(data.dir, false, transform);
  const int64_t total = source->size();
  n = std::min(n, total);
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < n; ++i) indices.push_back(data.kind == "ImageFolder" ? i * total / n : i);
  nd::data::DataLoader loader(source, nd::data::DataLoaderOptions(n).indices(indices));
  return loader.next()->images;
}

}  // namespace app
