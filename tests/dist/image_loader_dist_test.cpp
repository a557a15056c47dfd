// The image DataLoader under DistributedSampler shards, at the job's world size (alone,
// and under mpirun with 2 and 4 ranks): every sample exactly once per epoch over the
// ranks; each rank's rows bit for bit the rows of one process's global batch; the same
// batches at 1, 2 and 4 workers; a mid-epoch seek equal to the uninterrupted run.
#include <algorithm>

#include "data/data_test_util.h"

using namespace nd;
namespace T = nd::data::transforms;

namespace {

constexpr int64_t kSamples = 40;  // 38 PNGs + 2 JPEGs: a multiple of 1, 2 and 4 ranks
constexpr int64_t kLocalBatch = 5;  // 40 = 8 batches at 1 rank, 4 at 2, 2 at 4: none left out
constexpr uint64_t kSeed = 17;

std::shared_ptr<const data::ImageFolder> make_dataset(const TempDir& dir) {
  make_image_folder(dir.path, kSamples - 2);
  return std::make_shared<const data::ImageFolder>(
      dir.path.string(), data::ImageFolderOptions().transform(T::Compose(
                             {T::RandomResizedCrop({12}), T::RandomHorizontalFlip(), T::ToTensor()})));
}

// Rank `rank` of `world` as the apps read it: a reshuffling DistributedSampler, drop_last.
data::DataLoaderOptions rank_options(int world, int rank, int64_t batch, int64_t workers) {
  const dist::DistributedSampler sampler(kSamples, world, rank, /*shuffle=*/true, kSeed, /*drop_last=*/true);
  return data::DataLoaderOptions(batch).drop_last(true).seed(kSeed).num_workers(workers).sampler(
      [sampler](int64_t epoch) {
        auto s = sampler;
        s.set_epoch(static_cast<uint64_t>(epoch));
        return s.indices();
      });
}

std::vector<data::Batch> epochs(data::DataLoader& loader, int n) {
  std::vector<data::Batch> out;
  for (int e = 0; e < n; ++e)
    while (auto b = loader.next()) out.push_back(std::move(*b));
  return out;
}

bool same_row(const Tensor& a, int64_t i, const Tensor& b, int64_t j) {
  const Tensor x = a.select(0, i).contiguous(), y = b.select(0, j).contiguous();
  return std::equal(x.data_ptr<float>(), x.data_ptr<float>() + x.numel(), y.data_ptr<float>());
}

}  // namespace

TEST_CASE("image DataLoader over ranks: each sample once per epoch, rows equal to one process's, any workers") {
  const auto pg = dist::world();
  const int world = pg->size(), rank = pg->rank();
  TempDir dir;
  const auto folder = make_dataset(dir);
  data::DataLoader mine(folder, rank_options(world, rank, kLocalBatch, 2));
  data::DataLoader whole(folder, rank_options(1, 0, kLocalBatch * world, 1));
  const int64_t per_epoch = kSamples / world / kLocalBatch;
  CHECK(mine.size() == per_epoch);
  const auto batches = epochs(mine, 2), global = epochs(whole, 2);
  REQUIRE(static_cast<int64_t>(batches.size()) == 2 * per_epoch);
  for (int epoch = 0; epoch < 2; ++epoch) {
    // Every rank's indices of this epoch, gathered: each sample exactly once.
    Tensor local = empty({per_epoch * kLocalBatch}, kInt64);
    for (int64_t k = 0; k < per_epoch; ++k) {
      const data::Batch& b = batches[epoch * per_epoch + k];
      REQUIRE(static_cast<int64_t>(b.indices.size()) == kLocalBatch);
      std::copy(b.indices.begin(), b.indices.end(), local.data_ptr<int64_t>() + k * kLocalBatch);
      // The rank's k-th batch: rows of the one-process k-th batch, the same bits.
      const data::Batch& g = global[epoch * per_epoch + k];
      for (int64_t j = 0; j < kLocalBatch; ++j) {
        const auto at = std::find(g.indices.begin(), g.indices.end(), b.indices[j]);
        REQUIRE(at != g.indices.end());
        CHECK(same_row(b.images, j, g.images, at - g.indices.begin()));
      }
    }
    std::vector<Tensor> all(world);
    for (Tensor& t : all) t = empty({per_epoch * kLocalBatch}, kInt64);
    pg->allgather(all, local)->wait();
    std::vector<int64_t> seen;
    for (const Tensor& t : all) seen.insert(seen.end(), t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> every(kSamples);
    for (int64_t i = 0; i < kSamples; ++i) every[i] = i;
    CHECK(seen == every);
  }
  // 1 and 4 workers: the same batches, bit for bit.
  for (int64_t workers : {1, 4}) {
    data::DataLoader again(folder, rank_options(world, rank, kLocalBatch, workers));
    const auto other = epochs(again, 2);
    REQUIRE(other.size() == batches.size());
    for (size_t k = 0; k < other.size(); ++k) {
      CHECK(other[k].indices == batches[k].indices);
      for (int64_t j = 0; j < kLocalBatch; ++j) CHECK(same_row(other[k].images, j, batches[k].images, j));
    }
  }
  // A resume at batch 1 of epoch 1 continues as the uninterrupted run did.
  data::DataLoader resumed(folder, rank_options(world, rank, kLocalBatch, 2));
  resumed.seek(1, 1);
  for (size_t k = per_epoch + 1; k < batches.size(); ++k) {
    const auto b = resumed.next();
    REQUIRE(b);
    CHECK(b->indices == batches[k].indices);
    for (int64_t j = 0; j < kLocalBatch; ++j) CHECK(same_row(b->images, j, batches[k].images, j));
  }
  CHECK(!resumed.next());
}
