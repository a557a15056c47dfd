// DistributedSampler: PyTorch's sharding rules (pad by repeating from the start, or
// drop_last; rank r takes every num_replicas-th index from r) with our own shuffle.
#include "harness.h"

#include <algorithm>
#include <set>

#include "collectives/dist.h"

using namespace nd;
using dist::DistributedSampler;

namespace {
std::vector<std::vector<int64_t>> shards(int64_t n, int replicas, bool shuffle, uint64_t seed, bool drop_last,
                                         uint64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < replicas; ++r) {
    DistributedSampler s(n, replicas, r, shuffle, seed, drop_last);
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}
}  // namespace

TEST_CASE("sampler: shards are equal-sized, disjoint up to padding, and cover the data set") {
  for (int64_t n : {0, 1, 7, 10, 1001}) {
    for (int replicas : {1, 2, 3, 4}) {
      for (bool shuffle : {false, true}) {
        CAPTURE(n);
        CAPTURE(replicas);
        CAPTURE(shuffle);
        auto s = shards(n, replicas, shuffle, 7, false, 0);
        const int64_t per_rank = (n + replicas - 1) / replicas;
        std::vector<int64_t> all;
        for (auto& shard : s) {
          CHECK(static_cast<int64_t>(shard.size()) == per_rank);
          all.insert(all.end(), shard.begin(), shard.end());
        }
        std::set<int64_t> distinct(all.begin(), all.end());
        CHECK(static_cast<int64_t>(distinct.size()) == n);  // covers everything
        CHECK(static_cast<int64_t>(all.size()) - n == per_rank * replicas - n);  // only padding repeats
        for (int64_t i : all) CHECK((i >= 0 && i < n));
      }
    }
  }
}

TEST_CASE("sampler: without shuffle it is PyTorch's layout exactly") {
  // PyTorch: indices 0..9 padded with 0, 1 to 12, rank r takes [r::4].
  auto s = shards(10, 4, false, 0, false, 0);
  CHECK(s[0] == std::vector<int64_t>{0, 4, 8});
  CHECK(s[1] == std::vector<int64_t>{1, 5, 9});
  CHECK(s[2] == std::vector<int64_t>{2, 6, 0});
  CHECK(s[3] == std::vector<int64_t>{3, 7, 1});
  // Padding longer than the data set repeats it: 2 items over 5 ranks.
  auto tiny = shards(2, 5, false, 0, false, 0);
  CHECK(tiny[2] == std::vector<int64_t>{0});
  CHECK(tiny[3] == std::vector<int64_t>{1});
  // drop_last truncates to 8: rank r takes [r::4] of 0..7.
  auto dropped = shards(10, 4, false, 0, true, 0);
  CHECK(dropped[0] == std::vector<int64_t>{0, 4});
  CHECK(dropped[3] == std::vector<int64_t>{3, 7});
}

TEST_CASE("sampler: drop_last gives disjoint shards of floor(n / replicas)") {
  auto s = shards(1001, 4, true, 3, true, 2);
  std::set<int64_t> seen;
  for (auto& shard : s) {
    CHECK(shard.size() == 250);
    for (int64_t i : shard) CHECK(seen.insert(i).second);
  }
}

TEST_CASE("sampler: shuffle is deterministic per (seed, epoch) and changes across epochs") {
  auto a = shards(100, 3, true, 5, false, 1);
  auto b = shards(100, 3, true, 5, false, 1);
  auto c = shards(100, 3, true, 5, false, 2);
  auto d = shards(100, 3, true, 6, false, 1);
  CHECK(a == b);
  CHECK(a != c);
  CHECK(a != d);
  auto unshuffled = shards(100, 3, false, 5, false, 1);
  CHECK(a != unshuffled);
  // One replica sees the whole shuffled list: a permutation.
  DistributedSampler one(100, 1, 0, true, 5);
  one.set_epoch(2);
  std::vector<int64_t> perm = one.indices();
  std::sort(perm.begin(), perm.end());
  for (int64_t i = 0; i < 100; ++i) CHECK(perm[i] == i);
}

TEST_CASE("sampler: every rank of the world computes the same shuffle") {
  auto w = dist::world();
  DistributedSampler s(57, w->size(), w->rank(), true, 11);
  s.set_epoch(4);
  std::vector<int64_t> mine = s.indices();
  Tensor t = zeros({static_cast<int64_t>(mine.size())}, kInt64);
  for (size_t i = 0; i < mine.size(); ++i) t.data_ptr<int64_t>()[i] = mine[i];
  std::vector<Tensor> all;
  for (int r = 0; r < w->size(); ++r) all.push_back(zeros({s.num_samples()}, kInt64));
  w->allgather(all, t)->wait();
  for (int r = 0; r < w->size(); ++r) {
    DistributedSampler other(57, w->size(), r, true, 11);
    other.set_epoch(4);
    std::vector<int64_t> expected = other.indices();
    for (size_t i = 0; i < expected.size(); ++i) CHECK(all[r].data_ptr<int64_t>()[i] == expected[i]);
  }
}

TEST_CASE("sampler: bad arguments") {
  CHECK(nd::testing::error_message([] { DistributedSampler(10, 0, 0); }).find("num_replicas must be positive") !=
        std::string::npos);
  CHECK(nd::testing::error_message([] { DistributedSampler(10, 2, 2); }).find("rank must be in [0, 1]") !=
        std::string::npos);
  CHECK(nd::testing::error_message([] { DistributedSampler(-1, 2, 0); }).find("dataset_size must be >= 0") !=
        std::string::npos);
}
