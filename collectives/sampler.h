#pragma once
// DistributedSampler (PyTorch's torch.utils.data.DistributedSampler semantics): which
// data set indices this rank reads in an epoch. Every rank shuffles the same way
// (seed + epoch), pads the list by repeating it from the start to a multiple of
// num_replicas (or truncates it with drop_last), then takes every num_replicas-th
// index from position `rank`: shards are disjoint (up to the padding) and cover the
// data set, and every rank gets the same count, so collectives stay matched.
// The shuffle is our own counter-based Fisher-Yates, not PyTorch's random numbers.
// Tests: tests/dist/sampler_test.cpp.
#include <cstdint>
#include <vector>

namespace nd::dist {

class DistributedSampler {
 public:
  // requires: dataset_size >= 0, num_replicas > 0, 0 <= rank < num_replicas.
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);

  // Call before each epoch so the shuffle differs between epochs (same on every rank).
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  uint64_t epoch() const { return epoch_; }
  // This rank's indices for the current epoch, num_samples() of them.
  std::vector<int64_t> indices() const;
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return num_samples_ * num_replicas_; }

 private:
  int64_t dataset_size_;
  int num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  uint64_t epoch_ = 0;
  int64_t num_samples_ = 0;
};

}  // namespace nd::dist
