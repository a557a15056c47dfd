#pragma once
// DataLoader: batches of a dataset, tensors in memory (data/data.h) or image files
// (data/datasets.h), optionally restricted to an index list (a DistributedSampler's
// shard), shuffled per epoch from a seed, built by worker threads while the caller trains.
// Tests: tests/data/data_loader_test.cpp, tests/data/image_loader_test.cpp,
// tests/data/tar_shards_test.cpp, tests/dist/image_loader_dist_test.cpp.
//
// Why the batch sequence does not depend on the workers: each worker builds whole batches
// (PyTorch's choice), the caller takes them in order from a reorder buffer, and sample i of
// epoch e draws its augmentation from sample_generator(seed, e, sample_id(i)) (i, or a
// TarShards sample's shard and position), whichever thread runs it. So the batches are a
// pure function of (dataset, indices or sampler, seed, epoch): bit-identical at any
// num_workers, and a run resumed at batch k of epoch e (seek) gets exactly the batches the
// uninterrupted run got, without building the k before it.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "data/data.h"
#include "data/datasets.h"
#include "engine/nn/module.h"  // ND_ARG

namespace nd::data {

struct Batch {
  Tensor images;  // [B, C, H, W]: IDX f32 [B, 1, 28, 28]; images as the transform ends (f32 after ToTensor)
  Tensor labels;  // [B] i64
  std::vector<int64_t> indices;  // the dataset index of each row
};

struct DataLoaderOptions {
  DataLoaderOptions(int64_t batch_size = 1) : batch_size_(batch_size) {}
  ND_ARG(int64_t, batch_size);
  // Reshuffle every epoch: epoch e's order is a function of (seed, e) only.
  ND_ARG(bool, shuffle) = false;
  // The shuffle's seed, and the seed of every sample's augmentation (sample_generator).
  ND_ARG(uint64_t, seed) = 0;
  // Drop the last batch when it is smaller than batch_size.
  ND_ARG(bool, drop_last) = false;
  // The samples to iterate (a rank's shard); empty = all of the dataset, in order.
  ND_ARG(std::vector<int64_t>, indices);
  // Instead of `indices`: the samples of each epoch, e.g. a DistributedSampler's
  //   [s](int64_t e) { auto r = s; r.set_epoch(e); return r.indices(); }
  // (so N ranks' k-th batches together are the k-th batch of one process). Called from
  // the worker threads and from size(): it must be a pure function of the epoch.
  ND_ARG(std::function<std::vector<int64_t>(int64_t epoch)>, sampler);
  // Threads building batches (>= 1), each a whole batch at a time: reading, decoding and
  // transforming an image dataset's samples in parallel.
  ND_ARG(int64_t, num_workers) = 1;
  // Batches each worker prepares ahead of the caller (>= 1; PyTorch's prefetch_factor):
  // at most prefetch * num_workers batches are being built or waiting.
  ND_ARG(int64_t, prefetch) = 2;
  // An image dataset's sample that cannot be read or decoded (a corrupt or cut-off file, not
  // an image) is left out of its batch and listed in skipped(), instead of being an error.
  ND_ARG(bool, skip_unreadable) = false;
  // Applied to each batch in the worker thread (augmentation, a move to the GPU); an
  // exception it throws reaches the caller from next().
  ND_ARG(std::function<Batch(Batch)>, transform);
  // Each batch's CPU tensors (after transform) in pinned host memory, so that
  // `to(cuda, /*non_blocking=*/true)` copies them asynchronously. Needs a CUDA GPU.
  ND_ARG(bool, pin_memory) = false;
  // The GPU the batches go to: the workers make it current before pinning, so that rank k
  // of a node does not also open a CUDA context on cuda:0 (PyTorch's pin_memory_device).
  ND_ARG(Device, pin_memory_device) = Device(kCUDA, 0);
};

// A sample skip_unreadable left out: its dataset index and the error (which names the file).
struct SkippedSample {
  int64_t index = 0;
  std::string error;
};

// Epochs start at 0. next() returns the current epoch's batches, then std::nullopt
// once, and the call after that starts the next epoch. `for (auto& batch : loader)`
// runs one whole epoch; a range-for begun mid-epoch starts the next epoch instead.
class DataLoader {
 public:
  // Tensors in memory: a batch is images.index_select(0, its indices) and the same of labels.
  // Throws nd::Error on a bad dataset or option, or an index out of range.
  DataLoader(Dataset dataset, DataLoaderOptions options);
  // Image files: a batch stacks dataset->get(i, sample_generator(seed, epoch,
  // dataset->sample_id(i))) of its indices i into [B, C, H, W] (every sample must come out the same shape: an nd::Error
  // naming both samples otherwise) and their targets into [B].
  DataLoader(std::shared_ptr<const ImageDataset> dataset, DataLoaderOptions options);
  // Stops and joins the workers (also mid-epoch).
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next batch in order. An error in a worker (a corrupt file, a failing transform) is
  // rethrown here, in the caller's thread; the call after it builds that batch again.
  std::optional<Batch> next();
  // Restarts at the first batch of `epoch` (resuming, or DistributedSampler.set_epoch).
  void set_epoch(int64_t epoch) { seek(epoch, 0); }
  // Restarts at batch `batch` (0 .. size()) of `epoch`: the batches the loader would have
  // served from there, without building the ones before (resuming mid-epoch).
  void seek(int64_t epoch, int64_t batch);
  // The epoch next() is serving.
  int64_t epoch() const;
  // Batches and samples (after drop_last) in the current epoch.
  int64_t size() const;
  int64_t num_samples() const;
  // Samples in the dataset.
  int64_t dataset_size() const;
  // The sample order of `epoch` (before batching): its index list, shuffled if asked.
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  // With skip_unreadable: every sample left out so far, once each, by index.
  std::vector<SkippedSample> skipped() const;

  class Iterator {
   public:
    Iterator() = default;
    explicit Iterator(DataLoader* loader) : loader_(loader), batch_(loader->next()) {}
    Batch& operator*() { return *batch_; }
    Batch* operator->() { return &*batch_; }
    Iterator& operator++() {
      batch_ = loader_->next();
      return *this;
    }
    bool operator==(const Iterator& other) const { return !batch_ && !other.batch_; }

   private:
    DataLoader* loader_ = nullptr;
    std::optional<Batch> batch_;
  };
  Iterator begin();
  Iterator end() { return Iterator(); }

 private:
  // A position: batch `batch` of `epoch`; batch == batches in the epoch is its end.
  using Position = std::pair<int64_t, int64_t>;
  // A finished position: a batch, the end of its epoch (neither set), or an error.
  struct Item {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  void start_workers();
  void run_worker();
  Batch make_batch(const std::vector<int64_t>& order, int64_t first, int64_t epoch);
  Batch gather_images(const std::vector<int64_t>& indices, int64_t epoch);
  // The index list of `epoch` (options' indices, the sampler's, or all), range-checked.
  std::vector<int64_t> epoch_indices(int64_t epoch) const;
  // Batches for n samples, after drop_last.
  int64_t batches_for(int64_t n) const;
  // Under the lock: drops what the workers built and restarts them and the caller at `at`.
  void restart_locked(Position at);

  Dataset dataset_;                              // tensors in memory, or
  std::shared_ptr<const ImageDataset> images_;   // image files
  DataLoaderOptions options_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool stop_ = false;
  uint64_t generation_ = 0;  // bumped by every restart: what workers finish for an older one is dropped
  Position produce_{0, 0};   // the next position a worker takes
  Position consume_{0, 0};   // the next position next() returns
  int64_t ahead_ = 0;        // positions taken by workers and not yet returned by next()
  bool stalled_ = false;     // the sampler failed at produce_: workers wait for a restart
  std::map<Position, Item> ready_;
  // Epoch orders the workers use (computed once per epoch, under the lock).
  std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> orders_;
  bool mid_epoch_ = false;   // a batch of consume_'s epoch was returned
  std::map<int64_t, std::string> skipped_;
  std::vector<std::thread> workers_;
};

}  // namespace nd::data
