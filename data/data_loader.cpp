#include "data/data_loader.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"

namespace nd::data {

DataLoader::DataLoader(Dataset dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  ND_CHECK(dataset_.images.defined() && dataset_.labels.defined() && dataset_.images.dim() >= 1 &&
               dataset_.labels.dim() == 1 && dataset_.images.size(0) == dataset_.labels.size(0),
           "DataLoader: expected images [N, ...] and labels [N] with the same N, found ",
           dataset_.images.defined() ? shape_str(dataset_.images.sizes()) : "undefined images", " and ",
           dataset_.labels.defined() ? shape_str(dataset_.labels.sizes()) : "undefined labels");
  ND_CHECK(options_.batch_size() >= 1, "DataLoader: batch_size must be at least 1, got ", options_.batch_size());
  ND_CHECK(options_.prefetch() >= 1, "DataLoader: prefetch must be at least 1, got ", options_.prefetch());
  ND_CHECK(!options_.sampler() || options_.indices().empty(),
           "DataLoader: give either indices or a sampler, not both");
  if (options_.pin_memory()) {
    cuda::check_pinned_memory("DataLoader (pin_memory)");
    ND_CHECK(options_.pin_memory_device().is_cuda(), "DataLoader: pin_memory_device must be a CUDA device, found ",
             options_.pin_memory_device().str());
    cuda::check_device(options_.pin_memory_device());
  }
  if (!options_.sampler()) epoch_indices(0);  // a bad index list is an error here, not at the first batch
  worker_ = std::thread([this] { run_worker(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

std::vector<int64_t> DataLoader::epoch_indices(int64_t epoch) const {
  const int64_t n = dataset_.images.size(0);
  std::vector<int64_t> indices = options_.sampler() ? options_.sampler()(epoch) : options_.indices();
  if (!options_.sampler() && indices.empty()) {
    indices.resize(n);
    std::iota(indices.begin(), indices.end(), 0);
  }
  for (int64_t i : indices)
    ND_CHECK(i >= 0 && i < n, "DataLoader: index ", i, " is out of range for a dataset of ", n, " samples");
  return indices;
}

int64_t DataLoader::batches_for(int64_t n) const {
  return options_.drop_last() ? n / options_.batch_size() : (n + options_.batch_size() - 1) / options_.batch_size();
}

int64_t DataLoader::num_samples() const {
  const auto n = static_cast<int64_t>(epoch_indices(epoch()).size());
  return std::min(n, batches_for(n) * options_.batch_size());
}

int64_t DataLoader::size() const { return batches_for(static_cast<int64_t>(epoch_indices(epoch()).size())); }

int64_t DataLoader::epoch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return consume_epoch_;
}

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order = epoch_indices(epoch);
  if (!options_.shuffle()) return order;
  // Fisher-Yates, draw i of epoch e at counter (e << 32) + i: epochs get disjoint streams.
  const uint64_t base = static_cast<uint64_t>(epoch) << 32;
  for (size_t i = order.size(); i > 1; --i) {
    const uint64_t j = random_bits(options_.seed(), base + i) % i;
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

Batch DataLoader::make_batch(const std::vector<int64_t>& order, int64_t first) const {
  const int64_t count = std::min<int64_t>(options_.batch_size(), static_cast<int64_t>(order.size()) - first);
  Tensor index = empty({count}, kInt64);
  std::copy_n(order.begin() + first, count, index.data_ptr<int64_t>());
  Batch batch{dataset_.images.index_select(0, index), dataset_.labels.index_select(0, index)};
  if (options_.transform()) batch = options_.transform()(std::move(batch));
  if (options_.pin_memory()) {
    for (Tensor* t : {&batch.images, &batch.labels})
      if (t->defined() && t->is_cpu()) *t = t->pin_memory();
  }
  return batch;
}

void DataLoader::run_worker() {
  NoGradGuard no_grad;  // batches are data, never part of a graph
  if (options_.pin_memory()) cuda::set_device(options_.pin_memory_device());
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < options_.prefetch(); });
    if (stop_) return;
    const uint64_t generation = generation_;
    Item item;
    item.epoch = produce_epoch_;
    const int64_t batch_index = produce_batch_;
    lock.unlock();
    try {
      if (order_epoch != item.epoch) {
        order = epoch_order(item.epoch);
        order_epoch = item.epoch;
      }
      if (batch_index < batches_for(static_cast<int64_t>(order.size())))
        item.batch = make_batch(order, batch_index * options_.batch_size());
    } catch (...) {
      item.error = std::current_exception();
    }
    lock.lock();
    if (generation != generation_) continue;  // set_epoch moved on while we worked
    if (item.batch) {
      ++produce_batch_;
    } else if (!item.error) {
      ++produce_epoch_;
      produce_batch_ = 0;
    }
    const bool failed = item.error != nullptr;
    queue_.push_back(std::move(item));
    changed_.notify_all();
    if (failed) {  // stay idle until set_epoch or destruction
      changed_.wait(lock, [&] { return stop_ || generation != generation_; });
      if (stop_) return;
    }
  }
}

std::optional<Batch> DataLoader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !queue_.empty(); });
  Item item = std::move(queue_.front());
  queue_.pop_front();
  changed_.notify_all();
  if (item.error) {
    // The worker waits at the failed batch; wake it so the next call retries that batch.
    ++generation_;
    changed_.notify_all();
    std::rethrow_exception(item.error);
  }
  if (!item.batch) {
    consume_epoch_ = item.epoch + 1;
    mid_epoch_ = false;
    return std::nullopt;
  }
  mid_epoch_ = true;
  return std::move(item.batch);
}

void DataLoader::set_epoch(int64_t epoch) {
  ND_CHECK(epoch >= 0, "DataLoader::set_epoch: expected epoch >= 0, got ", epoch);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++generation_;
    queue_.clear();
    produce_epoch_ = consume_epoch_ = epoch;
    produce_batch_ = 0;
    mid_epoch_ = false;
  }
  changed_.notify_all();
}

DataLoader::Iterator DataLoader::begin() {
  bool restart = false;
  int64_t next_epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    restart = mid_epoch_;
    next_epoch = consume_epoch_ + 1;
  }
  if (restart) set_epoch(next_epoch);
  return Iterator(this);
}

}  // namespace nd::data
