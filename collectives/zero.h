#pragma once
// ZeroRedundancyOptimizer: PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer, the
// optimizer-state sharding of ZeRO stage 1, and with DDP the gradient sharding of stage 2
// (Rajbhandari et al. 2020; llm.c's layout).
//
// Why it looks like this:
// - It wraps an elementwise optimizer (SGD, Adam, AdamW): each element's update reads only
//   that element's parameter, gradient and state. So ownership is by element: alone, the
//   parameters of all groups are seen as one flat vector of N elements and rank r owns the
//   contiguous elements [r N / W, (r + 1) N / W), balanced to one element whatever the
//   parameter sizes (a parameter may be split between ranks). Each rank builds the wrapped optimizer over
//   1-D views of the elements it owns (views into the parameters themselves: its step
//   writes them in place), so its state holds ~N / W elements per buffer, and stepping a
//   slice is exactly stepping that slice of the whole.
// - step(): each rank steps its own elements, then one all-gather brings every rank the
//   updated elements of the others, so every rank ends the step with the same full parameters.
// - Alone (ZeRO stage 1), every rank holds the full averaged gradient (DDP's all-reduce,
//   unchanged): step traffic is DDP's all-reduce plus the all-gather, 1.5x plain DDP on a ring.
// - Given the DDP model (options.ddp, ZeRO stage 2), ownership follows DDP's buckets instead:
//   rank r owns chunk r of every bucket ([n r / W, n (r + 1) / W) of its n gradient
//   elements), and DDP reduce-scatters each bucket as it becomes ready (overlapping backward as
//   the all-reduce did), so rank r receives only the averaged gradients it steps. A
//   reduce-scatter plus the all-gather move what one all-reduce does. Since DDP rebuilds its
//   buckets after the first iteration (which it all-reduces whole), ownership is recomputed
//   when the layout changes, carrying any optimizer state across (consolidate, re-slice).
//   Either way, a parameter's owned elements on one rank are one contiguous range.
// - It is an optim::Optimizer whose param_groups() hold the full parameters, so zero_grad,
//   LR schedulers (lr is copied into the wrapped optimizer at each step), GradScaler (which
//   unscales every gradient and skips the step when one is inf or NaN: in stage 2 every rank's
//   gradients hold a NaN when any rank's did, ddp_zero.cpp, so all skip alike) and TrainState
//   take it as they take the optimizer it wraps.
// - Checkpoints: state_dict() consolidates, on every rank (a collective: all ranks call it),
//   the full per-parameter state in exactly the wrapped optimizer's unsharded layout
//   ("state.<k>.exp_avg" of parameter k's shape); load_state_dict() takes such a dict, from a
//   ZeRO run at any world size or from a plain optimizer, and keeps this rank's slice. So a
//   run saved at N ranks resumes at M (1 included), with or without ZeRO.
// Tests: tests/dist/zero_test.cpp (1, 2 and 4 ranks), tests/dist/apps_dist_test.cpp (--zero).
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/process_group.h"
#include "engine/nn/module.h"  // ND_ARG
#include "engine/optim/optimizer.h"

namespace nd::dist {

struct ZeroRedundancyOptimizerOptions {
  using ReducerPtr = Reducer*;  // (ND_ARG's `const T&` needs a pointer type by one name)
  ZeroRedundancyOptimizerOptions() = default;
  // Default: dist::default_group(device) of the parameters (world() for the CPU,
  // nccl_world() for a GPU; none for a GPU alone: nothing to gather). With ddp: its group.
  ND_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;
  // ZeRO stage 2: the DDP model whose gradients this optimizer steps (ddp.reducer()); its
  // buckets are then reduce-scattered, not all-reduced. The optimizer must hold exactly that
  // model's parameters; it is given before the model's first backward and without a
  // communication hook (an nd::Error says which). After a synchronised backward, each
  // parameter's .grad holds the average only on the elements this rank owns (zeros
  // elsewhere); accumulate micro-batches with no_sync(), not over several synchronised
  // backwards.
  ND_ARG(ReducerPtr, ddp) = nullptr;
};

class ZeroRedundancyOptimizer : public optim::Optimizer {
 public:
  // PyTorch's optimizer_class: builds the wrapped optimizer over this rank's shards, one
  // group per group given here (with that group's options).
  using OptimizerClass = std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::OptimizerParamGroup>,
                                                                         const optim::OptimizerOptions& defaults)>;
  // optimizer_class<optim::AdamW>(), for an optimizer constructed as O(groups, const O::Options&)
  // where the defaults given to the ZeroRedundancyOptimizer are of the options type O takes.
  template <class O, class Options>
  static OptimizerClass optimizer_class() {
    return [](std::vector<optim::OptimizerParamGroup> groups, const optim::OptimizerOptions& defaults) {
      return std::unique_ptr<optim::Optimizer>(std::make_unique<O>(std::move(groups), static_cast<const Options&>(defaults)));
    };
  }
  // ZeroRedundancyOptimizer::make<optim::Adam>(G->parameters(), optim::AdamOptions(2e-4)): the
  // wrapped class and its options, as PyTorch's ZeroRedundancyOptimizer(params, optimizer_class=Adam, lr=2e-4).
  template <class O, class Options>
  static std::unique_ptr<ZeroRedundancyOptimizer> make(std::vector<Tensor> params, const Options& defaults,
                                                       const ZeroRedundancyOptimizerOptions& options = {}) {
    return std::make_unique<ZeroRedundancyOptimizer>(
        std::vector<optim::OptimizerParamGroup>{optim::OptimizerParamGroup(std::move(params))},
        optimizer_class<O, Options>(), defaults, options);
  }

  // Every rank must pass the same parameters (count and elements; an nd::Error names the
  // ranks that differ), of one dtype on one device (with options.ddp: the model's). The wrapped optimizer must be
  // elementwise: SGD, Adam or AdamW (another is an nd::Error naming it).
  ZeroRedundancyOptimizer(std::vector<optim::OptimizerParamGroup> groups, OptimizerClass optimizer_class,
                          const optim::OptimizerOptions& defaults, const ZeroRedundancyOptimizerOptions& options = {});

  // Steps this rank's shard, then all-gathers the updated parameters (every rank calls it).
  void step() override;
  // The unsharded state (a collective: every rank calls it and gets the whole dict).
  TensorDict state_dict() const override;
  // An unsharded state (from state_dict() at any world size, or from the wrapped optimizer
  // alone); this rank keeps its slice.
  void load_state_dict(const TensorDict& state) override;

  // The bytes of the wrapped optimizer's state buffers on this rank: ~1/W of the unsharded
  // optimizer's (the memory ZeRO saves).
  int64_t state_bytes() const override { return local_->state_bytes(); }

 protected:
  // One group's step: hands this rank's slices of the gradients to the wrapped optimizer.
  void update(const optim::OptimizerOptions& options, std::vector<ParamUpdate>& params) override;

 private:
  // Elements [begin, end) of parameter `param` (an index into params_).
  struct Segment {
    size_t param = 0;
    int64_t begin = 0, end = 0;
  };
  struct Shard {
    size_t group = 0;
    int64_t begin = 0, end = 0;  // the elements of the parameter this rank owns
    int64_t local_index = -1;    // in the wrapped optimizer's numbering; -1 when it owns none
    Tensor local;                // 1-D view of the owned elements (undefined when none)
  };
  void check_same_on_every_rank() const;
  void check_same_as_ddp() const;
  // Who owns what (segments_), this rank's shards and the wrapped optimizer over them;
  // repartition() also carries the optimizer state over to a new DDP bucket layout.
  void partition();
  void repartition();
  int64_t owned_numel() const;  // the parameter elements this rank owns
  void gather_parameters();
  // All-gathers `mine` (this rank's owned elements, in segment order) and hands every
  // rank's segments with their values to `put`.
  void gather(const Tensor& mine, const std::function<void(const Segment&, const Tensor&)>& put) const;

  std::shared_ptr<ProcessGroup> pg_;  // null: a GPU alone
  std::shared_ptr<Reducer> ddp_;      // ZeRO stage 2
  int64_t layout_version_ = -1;       // ddp_'s bucket layout the partition follows
  int rank_ = 0, world_size_ = 1;
  bool stepped_ = false;              // the wrapped optimizer may hold state (the same on every rank)
  OptimizerClass optimizer_class_;
  std::unique_ptr<optim::OptimizerOptions> local_defaults_;
  std::vector<Tensor> params_;  // every group's, in order (the numbering of state_dict keys)
  std::map<const TensorImpl*, size_t> index_of_;  // parameter -> its index in params_
  std::vector<std::vector<Segment>> segments_;    // per rank, in the order its part is gathered
  std::vector<Shard> shards_;                     // per parameter, this rank's
  std::unique_ptr<optim::Optimizer> local_;
};

}  // namespace nd::dist
