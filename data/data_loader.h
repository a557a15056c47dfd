#pragma once
// DataLoader: batches of a Dataset (data/data.h), optionally restricted to an index
// list (a DistributedSampler's shard), shuffled per epoch from a seed, prepared by a
// background thread while the caller trains. Tests: tests/data/data_loader_test.cpp.
//
// Why one producer thread and a small queue: building a batch is a gather of a few
// hundred images (fast, but not free next to a small model's step on 2 cores); one
// thread that stays `prefetch` batches ahead hides it without reordering anything, so
// the batch sequence is a pure function of (dataset, indices, seed, epoch).
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "data/data.h"
#include "engine/nn/module.h"  // ND_ARG

namespace nd::data {

struct Batch {
  Tensor images;  // [B, 1, 28, 28] f32
  Tensor labels;  // [B] i64
};

struct DataLoaderOptions {
  DataLoaderOptions(int64_t batch_size = 1) : batch_size_(batch_size) {}
  ND_ARG(int64_t, batch_size);
  // Reshuffle every epoch: epoch e's order is a function of (seed, e) only.
  ND_ARG(bool, shuffle) = false;
  ND_ARG(uint64_t, seed) = 0;
  // Drop the last batch when it is smaller than batch_size.
  ND_ARG(bool, drop_last) = false;
  // The samples to iterate (a rank's shard); empty = all of the dataset, in order.
  ND_ARG(std::vector<int64_t>, indices);
  // Instead of `indices`: the samples of each epoch, e.g. a DistributedSampler's
  //   [s](int64_t e) { auto r = s; r.set_epoch(e); return r.indices(); }
  // (so N ranks' k-th batches together are the k-th batch of one process). Called from
  // the background thread and from size(): it must be a pure function of the epoch.
  ND_ARG(std::function<std::vector<int64_t>(int64_t epoch)>, sampler);
  // Batches the background thread prepares ahead of the caller (>= 1).
  ND_ARG(int64_t, prefetch) = 2;
  // Applied to each batch in the background thread (augmentation, a move to the GPU);
  // an exception it throws reaches the caller from next().
  ND_ARG(std::function<Batch(Batch)>, transform);
  // Each batch's CPU tensors (after transform) in pinned host memory, so that
  // `to(cuda, /*non_blocking=*/true)` copies them asynchronously. Needs a CUDA GPU.
  ND_ARG(bool, pin_memory) = false;
  // The GPU the batches go to: the background thread makes it current before pinning, so
  // that rank k of a node does not also open a CUDA context on cuda:0 (PyTorch's
  // pin_memory_device).
  ND_ARG(Device, pin_memory_device) = Device(kCUDA, 0);
};

// Epochs start at 0. next() returns the current epoch's batches, then std::nullopt
// once, and the call after that starts the next epoch. `for (auto& batch : loader)`
// runs one whole epoch; a range-for begun mid-epoch starts the next epoch instead.
class DataLoader {
 public:
  // Throws nd::Error on a bad dataset, batch size, prefetch or an index out of range.
  DataLoader(Dataset dataset, DataLoaderOptions options);
  // Stops and joins the background thread (also mid-epoch).
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  std::optional<Batch> next();
  // Restarts at the first batch of `epoch` (resuming, or DistributedSampler.set_epoch).
  void set_epoch(int64_t epoch);
  // The epoch next() is serving.
  int64_t epoch() const;
  // Batches and samples (after drop_last) in the current epoch.
  int64_t size() const;
  int64_t num_samples() const;
  const Dataset& dataset() const { return dataset_; }
  // The sample order of `epoch` (before batching): its index list, shuffled if asked.
  std::vector<int64_t> epoch_order(int64_t epoch) const;

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
  // One queue entry: a batch of `epoch`, the end of `epoch`, or an error.
  struct Item {
    int64_t epoch = 0;
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  void run_worker();
  Batch make_batch(const std::vector<int64_t>& order, int64_t first) const;
  // The index list of `epoch` (options' indices, the sampler's, or all), range-checked.
  std::vector<int64_t> epoch_indices(int64_t epoch) const;
  // Batches for n samples, after drop_last.
  int64_t batches_for(int64_t n) const;

  Dataset dataset_;
  DataLoaderOptions options_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Item> queue_;
  bool stop_ = false;
  uint64_t generation_ = 0;   // bumped by set_epoch: items of an older generation are dropped
  int64_t produce_epoch_ = 0, produce_batch_ = 0;  // the worker's position
  int64_t consume_epoch_ = 0;                      // the caller's epoch
  bool mid_epoch_ = false;                         // a batch of consume_epoch_ was returned
  std::thread worker_;
};

}  // namespace nd::data
