#include "common/batches.h"

#include <optional>
#include <utility>

namespace app {

nd::Tensor shard_rows(const nd::Tensor& global, const World& world) {
  if (world.size == 1) return global;
  const int64_t n = global.size(0) / world.size;
  nd::Tensor idx = nd::empty({n}, nd::TensorOptions(nd::kInt64));
  for (int64_t i = 0; i < n; ++i) idx.data_ptr<int64_t>()[i] = i * world.size + world.rank;
  return global.index_select(0, idx.to(global.device()));
}

namespace {
// Batches of global_batch / W, the last partial one dropped; on a GPU the loader's threads
// pin each batch, and next() copies it without waiting.
nd::data::DataLoaderOptions rank_options(int64_t global_batch, uint64_t seed, const World& world, nd::Device device) {
  auto options = nd::data::DataLoaderOptions(global_batch / world.size).drop_last(true).seed(seed);
  if (device.is_cuda()) options.pin_memory(true).pin_memory_device(device);
  return options;
}
}  // namespace

nd::data::DataLoaderOptions BatchStream::shard_options(int64_t n, int64_t global_batch, uint64_t seed,
                                                       const World& world, nd::Device device) {
  ND_CHECK(global_batch <= n, "--batch-size ", global_batch, " exceeds the ", n, " training images");
  nd::dist::DistributedSampler sampler(n, world.size, world.rank, /*shuffle=*/true, seed, /*drop_last=*/true);
  return rank_options(global_batch, seed, world, device).sampler([sampler](int64_t epoch) {
    auto s = sampler;
    s.set_epoch(static_cast<uint64_t>(epoch));
    return s.indices();
  });
}

BatchStream::BatchStream(nd::data::Dataset dataset, int64_t global_batch, uint64_t seed, const World& world,
                         nd::Device device)
    : device_(device) {
  auto options = shard_options(dataset.labels.size(0), global_batch, seed, world, device);
  loader_ = std::make_unique<nd::data::DataLoader>(std::move(dataset), options);
  per_epoch_ = loader_->size();
}

BatchStream::BatchStream(const TrainData& data, const DataOptions& o, int64_t global_batch, uint64_t seed,
                         const World& world, nd::Device device)
    : device_(device) {
  nd::data::DataLoaderOptions options;
  if (data.shards) {
    // Each rank streams its own shards: per_rank samples an epoch in their stream order.
    ND_CHECK(global_batch / world.size <= data.per_rank, "--batch-size ", global_batch, " takes ",
             global_batch / world.size, " images a rank an epoch; each rank's shards give ", data.per_rank);
    options = rank_options(global_batch, seed, world, device)
                  .sampler(data.shards->sampler(seed, kShuffleBuffer, data.per_rank));
  } else {
    options = shard_options(data.size(), global_batch, seed, world, device);
  }
  options.num_workers(o.workers);
  if (data.is_idx()) {
    loader_ = std::make_unique<nd::data::DataLoader>(data.tensors, options);
  } else {
    loader_ = std::make_unique<nd::data::DataLoader>(data.images, options.skip_unreadable(o.skip_unreadable));
  }
  per_epoch_ = loader_->size();
}

nd::data::Batch BatchStream::next() {
  std::optional<nd::data::Batch> batch = loader_->next();
  if (!batch) batch = loader_->next();  // the end of an epoch: the next one starts
  ++consumed_;
  batch->images = batch->images.to(device_, /*non_blocking=*/true);
  batch->labels = batch->labels.to(device_, /*non_blocking=*/true);
  return std::move(*batch);
}

void BatchStream::seek(int64_t consumed) {
  loader_->seek(consumed / per_epoch_, consumed % per_epoch_);  // builds none of the batches before
  consumed_ = consumed;
}

}  // namespace app
