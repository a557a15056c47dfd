#include "collectives/sampler.h"

#include <numeric>
#include <utility>

#include "engine/error.h"
#include "engine/factories.h"

namespace nd::dist {

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), shuffle_(shuffle), seed_(seed),
      drop_last_(drop_last) {
  ND_CHECK(dataset_size >= 0, "DistributedSampler: dataset_size must be >= 0, got ", dataset_size);
  ND_CHECK(num_replicas > 0, "DistributedSampler: num_replicas must be positive, got ", num_replicas);
  ND_CHECK(rank >= 0 && rank < num_replicas, "DistributedSampler: rank must be in [0, ", num_replicas - 1,
           "] (num_replicas ", num_replicas, "), got ", rank);
  // drop_last: floor(size / replicas) each; otherwise ceil, the last ones padded.
  num_samples_ = drop_last ? dataset_size / num_replicas : (dataset_size + num_replicas - 1) / num_replicas;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order(dataset_size_);
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle_) {
    // Fisher-Yates: position i swaps with j uniform in [0, i], drawn from value i of
    // the counter stream of seed + epoch (the 128-bit product maps 64 bits to [0, i]).
    const uint64_t stream = seed_ + epoch_;
    for (int64_t i = dataset_size_ - 1; i > 0; --i) {
      const unsigned __int128 wide =
          static_cast<unsigned __int128>(random_bits(stream, static_cast<uint64_t>(i))) *
          static_cast<uint64_t>(i + 1);
      std::swap(order[i], order[static_cast<int64_t>(wide >> 64)]);
    }
  }
  const int64_t total = total_size();
  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  // Position p of the padded list is order[p % dataset_size]: repeating from the start.
  for (int64_t p = rank_; p < total; p += num_replicas_) mine.push_back(order[p % dataset_size_]);
  return mine;
}

}  // namespace nd::dist
