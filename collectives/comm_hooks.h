#pragma once
// DDP communication hooks (PyTorch's DistributedDataParallel.register_comm_hook): a hook
// replaces a bucket's all-reduce. It receives the bucket (this rank's flat gradients, its
// parameters, its index) and returns a FutureWork whose value is the bucket's averaged
// gradient. Built in, with PyTorch's names and semantics: allreduce_hook (what DDP does
// without a hook), fp16_compress_hook, bf16_compress_hook; PowerSGD is in powersgd.h.
//
// Why a FutureWork and not a plain Work: a hook's result is computed after its collective
// (decompression, PowerSGD's second round), so the Work carries a continuation that runs
// on the thread that waits for it. The Reducer waits for buckets in index order on every
// rank, so collectives issued by continuations are issued in the same order everywhere
// (a continuation run by whichever collective finished first could not promise that).
// The hook itself is called where the Reducer would launch the all-reduce, while backward
// goes on, so the first collective of every hook overlaps backward as the default path's
// does. Tensors stay on the gradients' device: on CUDA the compression kernels run on the
// compute stream, and the NCCL group orders its communication stream after them.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/process_group.h"

namespace nd::dist {

// One bucket of gradients, ready to be reduced (PyTorch's dist.GradBucket).
class GradBucket {
 public:
  GradBucket(size_t index, Tensor buffer, std::vector<Tensor> parameters, std::vector<Tensor> gradients, bool is_last,
             std::shared_ptr<ProcessGroup> process_group)
      : index_(index), buffer_(std::move(buffer)), parameters_(std::move(parameters)),
        gradients_(std::move(gradients)), is_last_(is_last), process_group_(std::move(process_group)) {}
  // Position in launch order; every rank sees the same buckets under the same indices.
  size_t index() const { return index_; }
  // This rank's gradients of the bucket, flat and contiguous (1-D). The hook may write it,
  // and may return it as its result.
  const Tensor& buffer() const { return buffer_; }
  // The bucket's parameters and their gradients: views into buffer(), shaped as the parameters.
  const std::vector<Tensor>& parameters() const { return parameters_; }
  const std::vector<Tensor>& gradients() const { return gradients_; }
  // The last bucket of the iteration (launched at the end of backward, waited for last).
  bool is_last() const { return is_last_; }
  // The DDP model's group: what a built-in hook uses when its state names none. With the
  // default group in a world of one process, a group of one rank on the gradients' device.
  const std::shared_ptr<ProcessGroup>& process_group() const { return process_group_; }

 private:
  size_t index_;
  Tensor buffer_;
  std::vector<Tensor> parameters_, gradients_;
  bool is_last_;
  std::shared_ptr<ProcessGroup> process_group_;
};

// A Work with a value: what a hook returns (PyTorch's Future[Tensor] from .then()).
class FutureWork : public Work {
 public:
  // Finished already, with `value`.
  static std::shared_ptr<FutureWork> completed(Tensor value, CollectiveInfo info = {});
  // After `work` finishes, `next` runs on the thread that waits (once; with the
  // CollectivePurpose current now, so collectives it issues say what they are for) and
  // returns the value. `next` may issue and wait for further collectives.
  static std::shared_ptr<FutureWork> then(std::shared_ptr<Work> work, std::function<Tensor()> next);

  void wait() override;
  bool is_completed() override;
  std::exception_ptr error() override;
  // wait(), then the value.
  const Tensor& value();

 private:
  FutureWork() = default;
  std::shared_ptr<Work> work_;
  std::function<Tensor()> next_;
  std::string purpose_;
  bool done_ = false;
  std::exception_ptr error_;
  Tensor value_;
};

// A hook as the Reducer holds it (state already bound).
using CommHook = std::function<std::shared_ptr<FutureWork>(GradBucket&)>;

// PyTorch's default_hooks. `process_group`: the group to reduce over; null: the model's.
// allreduce_hook: divides by the world size, then sums over the ranks (DDP's default).
std::shared_ptr<FutureWork> allreduce_hook(ProcessGroup* process_group, GradBucket& bucket);
// Divide by the world size in the gradients' dtype, cast to f16 (bf16), sum over the ranks
// in f16 (bf16), cast back into the bucket: half the bytes of an f32 all-reduce. Dividing
// first keeps a sum whose average is representable from overflowing f16.
std::shared_ptr<FutureWork> fp16_compress_hook(ProcessGroup* process_group, GradBucket& bucket);
std::shared_ptr<FutureWork> bf16_compress_hook(ProcessGroup* process_group, GradBucket& bucket);

// A built-in hook's name ("bf16_compress_hook"), "a custom hook" for any other: what DDP's
// per-iteration check compares across ranks and names when they differ.
std::string comm_hook_name(std::shared_ptr<FutureWork> (*hook)(ProcessGroup*, GradBucket&));

// What DDP's per-iteration check compares across ranks for `hook` called with `state`: a
// built-in by its name (comm_hook_name), with its state's settings where the state
// describes them (PowerSGDState::describe(): "powerSGD_hook (matrix_approximation_rank 4,
// ...)"); any other hook "a custom hook". For Reducer::register_comm_hook's description.
template <class State, class Hook>
std::string describe_comm_hook(const State* state, const Hook& hook) {
  std::string description = "a custom hook";
  if constexpr (requires { comm_hook_name(hook); }) description = comm_hook_name(hook);
  if constexpr (requires { state->describe(); })
    if (state) description += " (" + state->describe() + ")";
  return description;
}

}  // namespace nd::dist
