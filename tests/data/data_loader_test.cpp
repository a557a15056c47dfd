// DataLoader: every sample once per epoch, seeded and per-epoch shuffles, drop_last,
// shard indices, set_epoch, errors from the background thread, destruction mid-epoch.
#include <algorithm>
#include <set>

#include "collectives/sampler.h"
#include "harness.h"

using namespace nd;

namespace {

// n samples; image i is filled with i and label i is i, so a batch says which samples it holds.
data::Dataset numbered(int64_t n) {
  Tensor images = arange(static_cast<double>(n)).reshape({n, 1, 1, 1}).expand({n, 1, 28, 28}).contiguous();
  return {images, arange(static_cast<double>(n), TensorOptions(kInt64))};
}

std::vector<int64_t> labels_of(const data::Batch& b) {
  std::vector<int64_t> out;
  for (double v : nd::testing::to_vector(b.labels)) out.push_back(static_cast<int64_t>(v));
  return out;
}

// One epoch through range-for: the labels in order, checking images agree with labels.
std::vector<int64_t> epoch_labels(data::DataLoader& loader, std::vector<int64_t>* batch_sizes = nullptr) {
  std::vector<int64_t> out;
  for (auto& batch : loader) {
    const auto labels = labels_of(batch);
    const auto pixels = nd::testing::to_vector(batch.images.select(3, 5).select(2, 7).select(1, 0));
    REQUIRE(pixels.size() == labels.size());
    for (size_t i = 0; i < labels.size(); ++i) CHECK(pixels[i] == labels[i]);
    if (batch_sizes) batch_sizes->push_back(batch.images.size(0));
    out.insert(out.end(), labels.begin(), labels.end());
  }
  return out;
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

}  // namespace

TEST_CASE("DataLoader: in order without shuffle, last batch smaller") {
  data::DataLoader loader(numbered(10), data::DataLoaderOptions(4));
  CHECK(loader.size() == 3);
  std::vector<int64_t> sizes;
  CHECK(epoch_labels(loader, &sizes) == iota(10));
  CHECK(sizes == std::vector<int64_t>{4, 4, 2});
  CHECK(loader.epoch() == 1);
}

TEST_CASE("DataLoader: shuffle visits every sample once per epoch, differently per epoch, same per seed") {
  auto options = data::DataLoaderOptions(7).shuffle(true).seed(42);
  data::DataLoader a(numbered(50), options), b(numbered(50), options);
  data::DataLoader c(numbered(50), data::DataLoaderOptions(7).shuffle(true).seed(43));
  const auto a0 = epoch_labels(a), a1 = epoch_labels(a), a2 = epoch_labels(a);
  CHECK(sorted(a0) == iota(50));
  CHECK(sorted(a1) == iota(50));
  CHECK(sorted(a2) == iota(50));
  CHECK(a0 != iota(50));
  CHECK(a0 != a1);
  CHECK(a1 != a2);
  CHECK(epoch_labels(b) == a0);
  CHECK(epoch_labels(b) == a1);
  CHECK(epoch_labels(c) != a0);
  CHECK(a.epoch_order(1) == a1);
}

TEST_CASE("DataLoader: drop_last drops the short batch") {
  data::DataLoader loader(numbered(10), data::DataLoaderOptions(4).drop_last(true).shuffle(true).seed(1));
  CHECK(loader.size() == 2);
  CHECK(loader.num_samples() == 8);
  std::vector<int64_t> sizes;
  const auto labels = epoch_labels(loader, &sizes);
  CHECK(sizes == std::vector<int64_t>{4, 4});
  CHECK(std::set<int64_t>(labels.begin(), labels.end()).size() == 8);
}

TEST_CASE("DataLoader: shard indices restrict the samples, and shards cover the dataset") {
  std::vector<int64_t> even, odd;
  for (int64_t i = 0; i < 20; ++i) (i % 2 ? odd : even).push_back(i);
  data::DataLoader rank0(numbered(20), data::DataLoaderOptions(3).indices(even).shuffle(true).seed(5));
  data::DataLoader rank1(numbered(20), data::DataLoaderOptions(3).indices(odd));
  const auto l0 = epoch_labels(rank0), l1 = epoch_labels(rank1);
  CHECK(sorted(l0) == even);
  CHECK(l1 == odd);
  std::vector<int64_t> all = l0;
  all.insert(all.end(), l1.begin(), l1.end());
  CHECK(sorted(all) == iota(20));
  const std::string msg =
      nd::testing::error_message([] { data::DataLoader bad(numbered(5), data::DataLoaderOptions(2).indices({0, 5})); });
  CHECK(msg.find("index 5 is out of range") != std::string::npos);
}

TEST_CASE("DataLoader: with DistributedSampler shards, the ranks' k-th batches make up one process's k-th batch") {
  // 2 ranks with batch 3 vs 1 process with batch 6, every epoch reshuffled by the sampler.
  auto sampler_of = [](int replicas, int rank) {
    return [s = dist::DistributedSampler(24, replicas, rank, /*shuffle=*/true, /*seed=*/7)](int64_t epoch) {
      auto r = s;
      r.set_epoch(static_cast<uint64_t>(epoch));
      return r.indices();
    };
  };
  data::DataLoader whole(numbered(24), data::DataLoaderOptions(6).sampler(sampler_of(1, 0)));
  data::DataLoader rank0(numbered(24), data::DataLoaderOptions(3).sampler(sampler_of(2, 0)));
  data::DataLoader rank1(numbered(24), data::DataLoaderOptions(3).sampler(sampler_of(2, 1)));
  CHECK(rank0.size() == 4);
  std::vector<int64_t> epoch0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> seen;
    while (auto global = whole.next()) {
      auto b0 = rank0.next(), b1 = rank1.next();
      REQUIRE((b0 && b1));
      std::vector<int64_t> both = labels_of(*b0);
      const auto l1 = labels_of(*b1);
      both.insert(both.end(), l1.begin(), l1.end());
      CHECK(sorted(both) == sorted(labels_of(*global)));
      seen.insert(seen.end(), both.begin(), both.end());
    }
    CHECK((!rank0.next() && !rank1.next()));
    CHECK(sorted(seen) == iota(24));
    if (epoch == 0) epoch0 = seen;
    else CHECK(seen != epoch0);
  }
  const std::string both = nd::testing::error_message(
      [&] { data::DataLoader l(numbered(4), data::DataLoaderOptions(2).indices({0}).sampler(sampler_of(1, 0))); });
  CHECK(both.find("either indices or a sampler") != std::string::npos);
}

TEST_CASE("DataLoader: next() ends an epoch with nullopt and set_epoch restarts any epoch exactly") {
  auto options = data::DataLoaderOptions(4).shuffle(true).seed(9);
  data::DataLoader loader(numbered(12), options);
  std::vector<std::vector<int64_t>> epoch0;
  while (auto batch = loader.next()) epoch0.push_back(labels_of(*batch));
  CHECK(epoch0.size() == 3);
  const auto first_of_1 = labels_of(*loader.next());  // starts epoch 1
  CHECK(loader.epoch() == 1);
  loader.set_epoch(0);
  for (const auto& expected : epoch0) CHECK(labels_of(*loader.next()) == expected);
  CHECK(!loader.next());
  CHECK(labels_of(*loader.next()) == first_of_1);
  // A range-for begun mid-epoch starts the next epoch (2) from its first batch.
  data::DataLoader fresh(numbered(12), options);
  fresh.set_epoch(2);
  const auto epoch2 = epoch_labels(fresh);
  CHECK(epoch_labels(loader) == epoch2);
}

TEST_CASE("DataLoader: an exception in the background thread reaches the caller") {
  int calls = 0;
  auto options = data::DataLoaderOptions(2).prefetch(1).transform([&calls](data::Batch b) {
    if (++calls == 2) throw Error("transform failed on purpose");
    return b;
  });
  data::DataLoader loader(numbered(6), options);
  CHECK(labels_of(*loader.next()) == std::vector<int64_t>{0, 1});
  CHECK(nd::testing::error_message([&] { loader.next(); }) == "transform failed on purpose");
  // The failed batch is retried, then the epoch continues.
  CHECK(labels_of(*loader.next()) == std::vector<int64_t>{2, 3});
  CHECK(labels_of(*loader.next()) == std::vector<int64_t>{4, 5});
  CHECK(!loader.next());
}

TEST_CASE("DataLoader: destruction mid-epoch and before any batch joins the thread cleanly") {
  for (int i = 0; i < 20; ++i) {
    data::DataLoader loader(numbered(64), data::DataLoaderOptions(8).shuffle(true).prefetch(3));
    if (i % 2) loader.next();
  }
  CHECK(true);
}

TEST_CASE("DataLoader: bad options are clear errors") {
  CHECK(nd::testing::error_message([] { data::DataLoader l(numbered(4), data::DataLoaderOptions(0)); })
            .find("batch_size must be at least 1") != std::string::npos);
  CHECK(nd::testing::error_message([] {
          data::DataLoader l({zeros({4, 1, 28, 28}), zeros({3}, kInt64)}, data::DataLoaderOptions(2));
        }).find("same N") != std::string::npos);
}
