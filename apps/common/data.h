#pragma once
// The apps' training data: what --data holds, detected (Fashion-MNIST / MNIST IDX files, a
// CIFAR-10 or CIFAR-100 binary folder, an ImageFolder root, WebDataset tar shards: a .tar
// file, a brace pattern, a folder of .tar files), at --image-size, decoded by
// --workers threads; the images the apps sample and evaluate on. Tests: tests/apps/apps_data_test.cpp, tests/dist/apps_dist_test.cpp.
#include <cstdint>
#include <memory>
#include <string>

#include <nanoddp.h>

#include "common/flags.h"
#include "common/model_select.h"
#include "common/options.h"

namespace app {

struct DataOptions {
  int64_t image_size = 0;        // --image-size: 0 = the data's own (28 IDX, 32 CIFAR, 64 a folder or shards)
  int64_t workers = 1;           // --workers: threads decoding and transforming
  bool skip_unreadable = false;  // --skip-unreadable
};

// Adds --image-size --workers --skip-unreadable.
void add_data_flags(Flags& flags, DataOptions& options);

// The training set --data names. Image data (a folder, CIFAR, shards) goes through
// Resize(S) + CenterCrop(S) + ToTensor + Normalize(0.5, 0.5): [3, S, S] in [-1, 1], the
// range of the IDX images and of the generators' tanh.
struct TrainData {
  std::string dir, kind;  // kind: "Fashion-MNIST/MNIST IDX", "ImageFolder", "CIFAR-10", "CIFAR-100",
                          // "WebDataset tar shards"
  int64_t channels = 1, image_size = 28;
  nd::data::Dataset tensors;                             // IDX: in memory
  std::shared_ptr<const nd::data::ImageDataset> images;  // the others (tar shards: this rank's)
  // Tar shards are streamed: each rank reads only its own shards (shard i is rank
  // i % W's) in their stream order, and takes the same number of samples an epoch,
  // the smallest rank's count; the others are sampled over the whole set.
  const nd::data::TarShards* shards = nullptr;  // into images
  int64_t shard_total = 0, per_rank = 0;        // all shards' images; what each rank streams an epoch
  int world_size = 1;
  bool is_idx() const { return images == nullptr; }
  int64_t size() const { return shards ? shard_total : images ? images->size() : tensors.images.size(0); }
  ImageShape shape() const { return {channels, image_size}; }  // what the model configs take
  // "CIFAR-10 in data/cifar (50000 images, 10 classes) at 32x32x3",
  // "WebDataset tar shards in data/train-{0..7}.tar (8 shards, 8000 images) at 64x64x3", with
  // ", each of 2 ranks streams its own shards: 4000 images an epoch" on several ranks
  std::string describe() const;
};

// Detects what `dir` holds and loads its training set (every rank calls it: tar shards
// agree on their epoch size through an all-reduce). Throws UsageError for an
// --image-size the data cannot have (IDX is 28x28) and nd::Error for data that is not
// there or not readable, naming what --data accepts.
TrainData load_train_data(const std::string& dir, const DataOptions& options, const World& world);

// n images [n, C, S, S] f32 in [-1, 1] to sample and evaluate on: the first n of the
// test set (IDX, CIFAR), or n evenly spaced images of a folder (which has no test split);
// all of them when there are fewer (image data).
nd::Tensor eval_images(const TrainData& data, int64_t n);

}  // namespace app
