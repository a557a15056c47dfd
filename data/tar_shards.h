#pragma once
// Tar shards in WebDataset's layout (nd::data::TarShards): each sample is a run of tar
// members sharing a key, `key.jpg` (or .jpeg, .png) and `key.cls` holding its class index
// as decimal text. Tests: tests/data/tar_shards_test.cpp.
//
// Why an index and not a pipe: WebDataset reads each shard front to back, so its order
// depends on how the reading is split over workers and a resumed run must replay the
// epoch. Here construction reads only the member headers of this rank's shards (512
// bytes a member, the data skipped) and get() reads one sample's members by offset. The
// stream order (shards shuffled per epoch, then WebDataset's shuffle buffer) is computed
// from the index alone as a list of sample indices: the DataLoader's sampler. So any
// worker can build any batch, the batches are the same at any number of workers, and
// seek() resumes mid-epoch exactly. Reading stays nearly sequential: the buffer only mixes
// samples that are at most `shuffle_buffer` members apart in a shard.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/datasets.h"

namespace nd::data {

// Brace expansion as the shell (and Python's braceexpand, which WebDataset uses) does it:
// "a-{000..002}.tar" -> a-000.tar a-001.tar a-002.tar (a bound with a leading zero pads to
// the wider bound's width; descending ranges count down), "{x,y}" -> x y, nested and
// several groups as a product, "{x}" stays literal (so do letter ranges and steps, which
// braceexpand also knows: "{a..c}", "{0..9..2}"). An nd::Error for an unmatched '{'.
std::vector<std::string> expand_braces(const std::string& pattern);

struct TarShardsOptions {
  // Applied to each sample (it starts encoded, as in ImageFolder).
  ND_ARG(transforms::AnyTransform, transform);
  // Shard i (in list order) belongs to rank i % world_size; only those are read.
  ND_ARG(int64_t, rank) = 0;
  ND_ARG(int64_t, world_size) = 1;
};

// The samples of this rank's shards, in shard order, then tar order within a shard.
// Errors at construction (nd::Error naming the shard): a pattern naming no existing file,
// a listed shard that does not exist or cannot be read, fewer shards than ranks, and a
// shard that cannot be indexed: a header with a bad checksum (not a tar file, or damaged),
// a member cut off by the end of the file, a file ending inside a header or without tar's
// end-of-archive blocks, no sample at all on this rank. Errors of one sample are raised by
// get() (so that DataLoader's skip_unreadable can leave it out): no .cls member, no image
// member, two of either, a .cls that is not a non-negative decimal integer, an image that
// does not decode.
class TarShards : public ImageDataset {
 public:
  // `pattern`: one path or a brace pattern ("train-{000000..000127}.tar").
  explicit TarShards(const std::string& pattern, TarShardsOptions options = {});
  TarShards(std::vector<std::string> paths, TarShardsOptions options = {});

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  Example get(int64_t index, Generator& gen) const override;
  // Empty: shards hold class indices, not names.
  const std::vector<std::string>& classes() const override { return classes_; }
  // (shard number in the whole list << 32) + the sample's position in its shard: the same
  // sample has the same augmentation stream at any world size.
  int64_t sample_id(int64_t index) const override;

  // Every shard of the list, and this rank's.
  const std::vector<std::string>& all_shards() const { return all_shards_; }
  std::vector<std::string> shards() const;
  // "<shard>:<key>" of sample `index`.
  std::string name(int64_t index) const;

  // The sample order of `epoch`: this rank's shards shuffled, their samples in tar order
  // through a shuffle buffer of `shuffle_buffer` samples (WebDataset's shuffle(n)): once
  // it is full, each new sample takes the place of one drawn uniformly from it, which is
  // emitted; at the end of the stream the rest leave in a random order. Every draw comes
  // from (seed, epoch, rank). shuffle_buffer 1 shuffles only the shards; 0 shuffles
  // nothing (shards in list order, samples in tar order). epoch_size > 0 keeps the first
  // epoch_size samples of the order (WebDataset's with_epoch): under DDP every rank must
  // take the same number of batches, and shards rarely split evenly, so give every rank the
  // smallest rank's size() (an all-reduce MIN); more than size() is an error.
  std::vector<int64_t> stream_order(uint64_t seed, int64_t epoch, int64_t shuffle_buffer, int64_t epoch_size = 0) const;
  // stream_order as a DataLoaderOptions::sampler.
  std::function<std::vector<int64_t>(int64_t epoch)> sampler(uint64_t seed, int64_t shuffle_buffer,
                                                             int64_t epoch_size = 0) const;

 private:
  struct Sample {
    int32_t shard = 0;     // into shards_
    int64_t position = 0;  // in its shard
    std::string key;
    std::string image;  // the image member's name
    int64_t image_offset = 0, image_size = 0;
    int64_t cls_offset = -1, cls_size = 0;  // -1: no .cls member (yet)
    std::string error;  // what get() raises instead, when the members are not a sample
  };
  struct Shard {
    std::string path;
    int64_t number = 0;            // in all_shards_
    int64_t first = 0, count = 0;  // its samples in samples_
  };
  void index_shard(int64_t number);
  static std::vector<int64_t> order(const std::vector<Shard>& shards, int64_t rank, uint64_t seed, int64_t epoch,
                                    int64_t shuffle_buffer, int64_t epoch_size);
  void check_order_options(int64_t shuffle_buffer, int64_t epoch_size) const;

  TarShardsOptions options_;
  std::vector<std::string> all_shards_;
  std::vector<Shard> shards_;
  std::vector<Sample> samples_;
  std::vector<std::string> classes_;
};

}  // namespace nd::data
