// The Reducer's side of ZeRO stage 2 (ddp.h, zero.h): each bucket reduce-scattered
// instead of all-reduced, so that rank r receives only the averaged chunk r of every bucket,
// the elements its ZeroRedundancyOptimizer steps. The optimizer's all-gather of updated
// parameters then completes what one all-reduce would have moved: on a ring, a
// reduce-scatter and an all-gather each put (W - 1) / W of the bucket on every rank's wire,
// an all-reduce 2 (W - 1) / W.
//
// What the other ranks' chunks hold after backward: zeros, so that nothing reads another
// rank's unaveraged gradient as if it were averaged. Two things still need a verdict over
// every gradient, the same on every rank: the non-finite check (skip_nonfinite_steps, and a
// GradScaler, which looks at every gradient of its optimizer) and the count of ranks that
// produced each gradient. Both travel in the last bucket's status slots, all-reduced on their
// own: slot P carries the sum of this rank's local gradients, inf or NaN when any was (an inf
// or NaN on any rank makes the average non-finite). When it is non-finite, every rank fills
// the chunks it does not own with NaN instead of zeros, so that every rank's gradients hold a
// non-finite value exactly when the averaged ones do, as under plain DDP.
#include <cmath>
#include <limits>

#include "collectives/ddp.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/copy.h"

namespace nd::dist {

void Reducer::shard_gradients() {
  ND_CHECK(!comm_hook_, "DistributedDataParallel '", name_,
           "': ZeRO stage 2 (a ZeroRedundancyOptimizer given this model) reduce-scatters the buckets itself and "
           "cannot take a communication hook; use one or the other");
  ND_CHECK(iteration_ == 0 && !active_, "DistributedDataParallel '", name_,
           "': a ZeroRedundancyOptimizer must be given this model before its first backward, found it after ",
           iteration_, " synchronised backward(s)");
  shard_gradients_ = true;
}

std::pair<int64_t, int64_t> Reducer::chunk_range(size_t b, int rank) const {
  const int64_t n = buckets_[b].grad_numel, W = pg_->size();
  return {n * rank / W, n * (rank + 1) / W};
}

std::vector<Reducer::BucketLayout> Reducer::bucket_layout() const {
  std::vector<BucketLayout> out;
  for (const Bucket& b : buckets_) out.push_back({b.params, b.offsets});
  return out;
}

void Reducer::launch_sharded(size_t b) {
  Bucket& bucket = buckets_[b];
  const int W = pg_->size();
  CollectivePurpose purpose("bucket " + std::to_string(b) + " of DDP model '" + name_ + "'");
  NoGradGuard no_grad;
  const Tensor grads = bucket.flat.narrow(0, 0, bucket.grad_numel);
  // The non-finite vote: the sum of this rank's gradients, on the device (see the top).
  const Tensor sum = grads.sum().to(kFloat64);
  local_sum_ = local_sum_.defined() ? local_sum_ + sum : sum;
  if (b + 1 == buckets_.size()) {
    const int64_t P = static_cast<int64_t>(params_.size());
    Tensor status = bucket.flat.narrow(0, bucket.grad_numel, P + 1);
    copy_data(status.narrow(0, P, 1), local_sum_);
    AllreduceOptions opts;
    opts.bucket = static_cast<int64_t>(b);
    status_work_ = pg_->allreduce(status, opts);
    local_sum_ = Tensor();
  }
  std::vector<Tensor> chunks;
  for (int r = 0; r < W; ++r) {
    const auto [begin, end] = chunk_range(b, r);
    chunks.push_back(grads.narrow(0, begin, end - begin));
  }
  const auto [begin, end] = chunk_range(b, pg_->rank());
  if (!bucket.shard.defined() || bucket.shard.numel() != end - begin)
    bucket.shard = empty({end - begin}, bucket.flat.options());
  bucket.work = pg_->reduce_scatter(bucket.shard, chunks, ReduceOp::SUM);
}

void Reducer::take_sharded_result(size_t b, bool nonfinite) {
  Bucket& bucket = buckets_[b];
  const auto [begin, end] = chunk_range(b, pg_->rank());
  const Tensor grads = bucket.flat.narrow(0, 0, bucket.grad_numel);
  const double other = nonfinite ? std::numeric_limits<double>::quiet_NaN() : 0.0;
  fill_data(grads.narrow(0, 0, begin), other);
  fill_data(grads.narrow(0, end, bucket.grad_numel - end), other);
  const Tensor mine = grads.narrow(0, begin, end - begin);
  copy_data(mine, bucket.shard);
  mine.div_(static_cast<double>(pg_->size()));
}

}  // namespace nd::dist
