#include "data/data_loader.h"

#include <algorithm>
#include <cstring>
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
  start_workers();
}

DataLoader::DataLoader(std::shared_ptr<const ImageDataset> dataset, DataLoaderOptions options)
    : images_(std::move(dataset)), options_(std::move(options)) {
  ND_CHECK(images_ != nullptr, "DataLoader: the image dataset is null");
  start_workers();
}

void DataLoader::start_workers() {
  ND_CHECK(options_.batch_size() >= 1, "DataLoader: batch_size must be at least 1, got ", options_.batch_size());
  ND_CHECK(options_.prefetch() >= 1, "DataLoader: prefetch must be at least 1, got ", options_.prefetch());
  ND_CHECK(options_.num_workers() >= 1, "DataLoader: num_workers must be at least 1, got ", options_.num_workers(),
           " (batches are always built by worker threads)");
  ND_CHECK(!options_.sampler() || options_.indices().empty(),
           "DataLoader: give either indices or a sampler, not both");
  ND_CHECK(!options_.skip_unreadable() || images_, "DataLoader: skip_unreadable needs an image dataset (files to skip)");
  if (options_.pin_memory()) {
    cuda::check_pinned_memory("DataLoader (pin_memory)");
    ND_CHECK(options_.pin_memory_device().is_cuda(), "DataLoader: pin_memory_device must be a CUDA device, found ",
             options_.pin_memory_device().str());
    cuda::check_device(options_.pin_memory_device());
  }
  if (!options_.sampler()) epoch_indices(0);  // a bad index list is an error here, not at the first batch
  for (int64_t i = 0; i < options_.num_workers(); ++i) workers_.emplace_back([this] { run_worker(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

int64_t DataLoader::dataset_size() const { return images_ ? images_->size() : dataset_.images.size(0); }

std::vector<int64_t> DataLoader::epoch_indices(int64_t epoch) const {
  const int64_t n = dataset_size();
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
  return consume_.first;
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

std::vector<SkippedSample> DataLoader::skipped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<SkippedSample> out;
  for (const auto& [index, error] : skipped_) out.push_back({index, error});
  return out;
}

Batch DataLoader::gather_images(const std::vector<int64_t>& indices, int64_t epoch) {
  std::vector<Example> examples;
  std::vector<int64_t> kept;
  std::string first_error;
  for (int64_t i : indices) {
    Generator gen = sample_generator(options_.seed(), epoch, images_->sample_id(i));
    try {
      examples.push_back(images_->get(i, gen));
      kept.push_back(i);
    } catch (const Error& e) {
      if (!options_.skip_unreadable()) throw;
      if (first_error.empty()) first_error = e.what();
      std::lock_guard<std::mutex> lock(mutex_);
      skipped_.emplace(i, e.what());
    }
  }
  ND_CHECK(!examples.empty(), "DataLoader: skip_unreadable left none of the ", indices.size(),
           " samples of a batch (the first: ", first_error, ")");
  const Tensor first = examples[0].data.contiguous();
  const size_t bytes = static_cast<size_t>(first.numel()) * element_size(first.dtype());
  std::vector<int64_t> sizes = first.sizes();
  sizes.insert(sizes.begin(), static_cast<int64_t>(examples.size()));
  Batch batch{empty(sizes, TensorOptions(first.dtype())), empty({static_cast<int64_t>(examples.size())}, kInt64), kept};
  auto* dst = static_cast<uint8_t*>(batch.images.data_ptr());
  for (size_t j = 0; j < examples.size(); ++j) {
    const Tensor data = examples[j].data.contiguous();
    ND_CHECK(data.sizes() == first.sizes() && data.dtype() == first.dtype(), "DataLoader: sample ", kept[j], " is ",
             shape_str(data.sizes()), " ", dtype_name(data.dtype()), " but sample ", kept[0], " of the same batch is ",
             shape_str(first.sizes()), " ", dtype_name(first.dtype()),
             ": a batch needs one shape; give the dataset a transform that makes every image one size "
             "(Resize + CenterCrop, or RandomResizedCrop)");
    std::memcpy(dst + j * bytes, data.data_ptr(), bytes);
    batch.labels.data_ptr<int64_t>()[j] = examples[j].target;
  }
  return batch;
}

Batch DataLoader::make_batch(const std::vector<int64_t>& order, int64_t first, int64_t epoch) {
  const int64_t count = std::min<int64_t>(options_.batch_size(), static_cast<int64_t>(order.size()) - first);
  std::vector<int64_t> indices(order.begin() + first, order.begin() + first + count);
  Batch batch;
  if (images_) {
    batch = gather_images(indices, epoch);
  } else {
    Tensor index = empty({count}, kInt64);
    std::copy_n(indices.begin(), count, index.data_ptr<int64_t>());
    batch = {dataset_.images.index_select(0, index), dataset_.labels.index_select(0, index), std::move(indices)};
  }
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
  const int64_t capacity = options_.prefetch() * options_.num_workers();
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stop_ || (!stalled_ && ahead_ < capacity); });
    if (stop_) return;
    const uint64_t generation = generation_;
    const Position at = produce_;
    Item item;
    std::shared_ptr<const std::vector<int64_t>> order;
    try {
      auto it = orders_.find(at.first);
      if (it == orders_.end()) {
        std::erase_if(orders_, [&](const auto& kv) { return kv.first < consume_.first; });
        it = orders_.emplace(at.first, std::make_shared<const std::vector<int64_t>>(epoch_order(at.first))).first;
      }
      order = it->second;
    } catch (...) {  // the sampler failed: nothing past this position can be built
      item.error = std::current_exception();
      stalled_ = true;
    }
    ++ahead_;
    if (order) {
      const bool is_batch = at.second < batches_for(static_cast<int64_t>(order->size()));
      produce_ = is_batch ? Position{at.first, at.second + 1} : Position{at.first + 1, 0};
      if (is_batch) {
        lock.unlock();
        try {
          item.batch = make_batch(*order, at.second * options_.batch_size(), at.first);
        } catch (...) {
          item.error = std::current_exception();
        }
        lock.lock();
      }
    }
    if (generation != generation_) continue;  // a restart dropped this position while we worked
    ready_.emplace(at, std::move(item));
    changed_.notify_all();
  }
}

void DataLoader::restart_locked(Position at) {
  ++generation_;
  ready_.clear();
  ahead_ = 0;
  stalled_ = false;
  produce_ = consume_ = at;
  changed_.notify_all();
}

std::optional<Batch> DataLoader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return ready_.count(consume_) > 0; });
  auto node = ready_.extract(consume_);
  Item& item = node.mapped();
  --ahead_;
  changed_.notify_all();
  if (item.error) {
    restart_locked(consume_);  // the next call builds this batch again
    std::rethrow_exception(item.error);
  }
  if (!item.batch) {
    consume_ = {consume_.first + 1, 0};
    mid_epoch_ = false;
    return std::nullopt;
  }
  ++consume_.second;
  mid_epoch_ = true;
  return std::move(item.batch);
}

void DataLoader::seek(int64_t epoch, int64_t batch) {
  ND_CHECK(epoch >= 0, "DataLoader: expected epoch >= 0, got ", epoch);
  const int64_t batches = batches_for(static_cast<int64_t>(epoch_indices(epoch).size()));
  ND_CHECK(batch >= 0 && batch <= batches, "DataLoader::seek: batch ", batch, " is outside epoch ", epoch, " (0 to ",
           batches, " batches)");
  std::lock_guard<std::mutex> lock(mutex_);
  restart_locked({epoch, batch});
  mid_epoch_ = false;
}

DataLoader::Iterator DataLoader::begin() {
  bool restart = false;
  int64_t next_epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    restart = mid_epoch_;
    next_epoch = consume_.first + 1;
  }
  if (restart) set_epoch(next_epoch);
  return Iterator(this);
}

}  // namespace nd::data
