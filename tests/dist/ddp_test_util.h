#pragma once
// What the DDP tests share (tests/dist/ddp_test.cpp, ddp_options_test.cpp,
// ddp_divergence_test.cpp): this rank and the world size, the small MLP most cases train,
// bucket layouts, a cross-rank equality check, and the skip for cases that need several
// ranks.
#include <string>
#include <vector>

#include "harness.h"

namespace nd::testing::ddp {

inline int rank() { return dist::world()->rank(); }
inline int world_size() { return dist::world()->size(); }

inline nn::Sequential make_mlp() {
  return nn::Sequential(nn::Linear(nn::LinearOptions(6, 16)), nn::Tanh(), nn::Linear(nn::LinearOptions(16, 3)));
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Bucket layout as parameter indices (registration order), bucket after bucket, -1 between.
inline std::vector<int64_t> layout_indices(const nn::Module& m, const std::vector<std::vector<std::string>>& buckets) {
  auto named = m.named_parameters();
  std::vector<int64_t> out;
  for (const auto& bucket : buckets) {
    for (const std::string& name : bucket)
      for (size_t i = 0; i < named.size(); ++i)
        if (named[i].first == name) out.push_back(static_cast<int64_t>(i));
    out.push_back(-1);
  }
  return out;
}

// True when every rank passes the same values (one all-gather over the world).
inline bool same_on_every_rank(const std::vector<int64_t>& mine) {
  auto w = dist::world();
  std::vector<double> v(mine.begin(), mine.end());
  std::vector<Tensor> all;
  for (int r = 0; r < w->size(); ++r) all.push_back(empty({static_cast<int64_t>(v.size())}, kInt64));
  w->allgather(all, tensor(v, kInt64))->wait();
  for (int r = 0; r < w->size(); ++r)
    if (!nd::testing::bitwise_equal(all[r], all[0])) return false;
  return true;
}

// True (after printing SKIPPED) when this process is the only rank.
inline bool skip_at_one_rank() {
  if (world_size() > 1) return false;
  MESSAGE("SKIPPED: needs 2 or more ranks (run under mpirun)");
  return true;
}

}  // namespace nd::testing::ddp
