// The Reducer's side of communication hooks (ddp.h, comm_hooks.h): registering one,
// calling it where a bucket's all-reduce would be launched, and taking its result.
// The Reducer knows nothing of compression: it hands the hook the bucket's gradients
// and copies back whatever averaged gradients the hook's FutureWork yields.
#include "collectives/ddp.h"
#include "collectives/local_process_group.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/ops/copy.h"

namespace nd::dist {

void Reducer::register_comm_hook(CommHook hook, std::string description) {
  ND_CHECK(hook != nullptr, "DistributedDataParallel '", name_, "': register_comm_hook: expected a hook, found none");
  ND_CHECK(!comm_hook_, "DistributedDataParallel '", name_,
           "': register_comm_hook called twice; a model takes one communication hook (register it once, "
           "right after constructing DistributedDataParallel)");
  ND_CHECK(iteration_ == 0 && !active_, "DistributedDataParallel '", name_,
           "': register_comm_hook must come before the first backward, found it after ", iteration_,
           " synchronised backward(s); register it right after constructing DistributedDataParallel");
  ND_CHECK(!shard_gradients_, "DistributedDataParallel '", name_,
           "': register_comm_hook: this model's buckets are reduce-scattered for a ZeroRedundancyOptimizer (ZeRO "
           "stage 2), which cannot take a communication hook; use one or the other");
  comm_hook_ = std::move(hook);
  comm_hook_description_ = std::move(description);
  // Hooks run in a world of one process too (compression changes the gradients there as
  // well), where the default group may be none at all (a GPU alone): a group of one rank.
  hook_group_ = reduce_buckets_ ? pg_ : std::make_shared<LocalProcessGroup>(params_[0].device());
}

void Reducer::launch_hook(size_t b) {
  Bucket& bucket = buckets_[b];
  const bool last = b + 1 == buckets_.size();
  CollectivePurpose purpose("bucket " + std::to_string(b) + " of DDP model '" + name_ + "'");
  // The last bucket's status slots (ranks per gradient, the non-finite vote) are counts,
  // not gradients: summed exactly on their own, before the hook's collectives.
  std::shared_ptr<Work> status;
  if (last && reduce_buckets_) {
    AllreduceOptions opts;
    opts.bucket = static_cast<int64_t>(b);
    status = pg_->allreduce(bucket.flat.narrow(0, bucket.grad_numel, bucket.flat.numel() - bucket.grad_numel), opts);
  }
  std::vector<Tensor> params, grads;
  for (size_t i : bucket.params) {
    params.push_back(params_[i]);
    grads.push_back(slot(i));
  }
  GradBucket view(b, bucket.flat.narrow(0, 0, bucket.grad_numel), std::move(params), std::move(grads), last,
                  hook_group_);
  std::shared_ptr<FutureWork> hooked = comm_hook_(view);
  ND_CHECK(hooked != nullptr, "DistributedDataParallel '", name_, "': the communication hook returned no work for bucket ",
           b, "; return a FutureWork (e.g. FutureWork::then(process_group.allreduce(...), ...))");
  if (!status) {
    bucket.work = hooked;
    return;
  }
  bucket.work = FutureWork::then(hooked, [status, hooked] {
    status->wait();
    return hooked->value();
  });
}

void Reducer::take_hook_result(size_t b) {
  const Bucket& bucket = buckets_[b];
  const Tensor grads = bucket.flat.narrow(0, 0, bucket.grad_numel);
  const Tensor& result = std::static_pointer_cast<FutureWork>(bucket.work)->value();
  if (!result.defined() || result.numel() != grads.numel() || result.dtype() != grads.dtype() ||
      result.device() != grads.device())
    throw Error("DistributedDataParallel '" + name_ + "': the communication hook's result for bucket " +
                std::to_string(b) + " is " + (result.defined() ? result.describe() : std::string("undefined")) +
                ", expected " + grads.describe() + " (the bucket's gradients); return bucket.buffer() or a tensor "
                "of its size, dtype and device");
  if (result.storage() == grads.storage() && result.storage_offset() == grads.storage_offset()) return;
  NoGradGuard no_grad;
  copy_data(grads, result.reshape({grads.numel()}));
}

}  // namespace nd::dist
