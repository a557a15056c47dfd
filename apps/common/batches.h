#pragma once
// A rank's share of the data: its rows of a tensor drawn for the global batch, and a
// stream of its batches that can seek (exact resume). Tests: tests/apps/apps_test.cpp,
// tests/dist/apps_dist_test.cpp.
#include <cstdint>
#include <memory>
#include <vector>

#include <nanoddp.h>

#include "common/data.h"
#include "common/options.h"

namespace app {

// Rows rank, rank + W, rank + 2W, ... of a tensor drawn for the whole global batch:
// this rank's part, in the order DistributedSampler interleaves samples, so that N
// ranks see the same noise per sample as one process.
nd::Tensor shard_rows(const nd::Tensor& global, const World& world);

// This rank's batches, forever: a DistributedSampler shard (shuffled per epoch from the
// seed) cut into batches of global_batch / W, last partial batch dropped. The k-th
// batches of N ranks together are the k-th batch of one process. Tar shards instead
// stream this rank's own shards (TarShards::sampler: shards shuffled, then a shuffle
// buffer of kShuffleBuffer samples), so W ranks see other batches than one process.
// Its position is the number of batches consumed, so a checkpoint stores one integer.
class BatchStream {
 public:
  static constexpr int64_t kShuffleBuffer = 1000;  // WebDataset's usual shuffle(1000)
  BatchStream(nd::data::Dataset dataset, int64_t global_batch, uint64_t seed, const World& world,
              nd::Device device);
  // --data's training set (load_train_data), image data read by --workers threads.
  BatchStream(const TrainData& data, const DataOptions& options, int64_t global_batch, uint64_t seed,
              const World& world, nd::Device device);
  nd::data::Batch next();
  // Restarts so that the next batch is number `consumed` (counting from 0 at epoch 0).
  void seek(int64_t consumed);
  int64_t consumed() const { return consumed_; }
  int64_t epoch() const { return consumed_ / per_epoch_; }
  // The files --skip-unreadable left out so far (this rank's).
  std::vector<nd::data::SkippedSample> skipped() const { return loader_->skipped(); }

 private:
  // The rank's loader options: a DistributedSampler shard of n samples, batches of global_batch / W.
  static nd::data::DataLoaderOptions shard_options(int64_t n, int64_t global_batch, uint64_t seed, const World& world,
                                                   nd::Device device);
  std::unique_ptr<nd::data::DataLoader> loader_;
  nd::Device device_;
  int64_t per_epoch_ = 1, consumed_ = 0;
};

}  // namespace app
