#pragma once
// DistributedDataParallel: data-parallel training of one module over a process group.
//
// Why it looks like this (after PyTorch's reducer and flashlight's coalescing
// reducer): every parameter's post-accumulate hook marks it ready; parameters are
// packed into buckets (reverse registration order; 1 MiB first bucket, 25 MiB
// after; rebuilt after the first iteration in the order gradients became ready on
// rank 0, so every rank agrees) and a bucket whose gradients are all ready is
// all-reduced asynchronously while backward goes on. Buckets launch in index order
// on every rank, so collectives always pair up. `.grad` is a view into its bucket,
// so there is no copy in or out.
//
// A communication hook (register_comm_hook, comm_hooks.h) replaces a bucket's all-reduce:
// the Reducer calls it where it would launch the all-reduce and copies back the averaged
// gradients its FutureWork yields, knowing nothing of compression (ddp_comm_hook.cpp).
//
// ZeRO stage 2 (shard_gradients(), called by a ZeroRedundancyOptimizer given this model,
// zero.h; ddp_zero.cpp): from the second iteration on, each bucket's gradients are
// reduce-scattered instead of all-reduced, rank r receiving the average of chunk r of the
// bucket, so that the optimizer's all-gather of updated parameters completes what one
// all-reduce would have moved.
//
// Where we go beyond PyTorch DDP:
// - Buffers are broadcast once per iteration (at the first forward after a
//   backward), not before every forward, so calling a module twice before one
//   backward (D(real), D(fake)) never overwrites a tensor the first call saved.
// - Which parameters took no part is known from our own graph (their hooks never
//   fired), so there is no per-iteration graph search. The last bucket is always
//   launched at the end of backward and carries, per parameter, how many ranks
//   produced its gradient (plus an optional non-finite vote), so every rank reaches
//   the same verdict from one collective that runs anyway: an error naming the
//   parameters (find_unused_parameters off) or zeros (on).
// - Each backward starts with a 4-number fingerprint all-reduce (MAX of a hash and
//   its negation: equal on every rank iff max == min) over the control group, which
//   covers which model, which iteration, which bucket layout, and the collectives
//   issued on the data group since the previous check (their count and a rolling hash
//   of op, element count and dtype, kept by the group: ProcessGroup::record()), so
//   SyncBatchNorm's all-reduces, a logger's loss all-reduce and user collectives are
//   checked too. Only when it fails, one fixed-size all-gather tells every rank what
//   each one did, and every rank throws an error naming rank 0 and the first rank
//   that differs from it, instead of a hang or garbage. The control group is
//   dist::control_world(), a communicator of its own, so an extra collective on the
//   data group cannot derail the check itself.
// - A synchronised backward can be captured into a CUDA graph (kernels/cuda/graph.h) once the
//   buckets were rebuilt (after the first synchronised backward): its bucket all-reduces are
//   captured on NCCL's stream, forked from and joined back to the capture by events, and each
//   replay reduces the buckets again (ddp_capture.cpp says what is refused, by name).
#include <memory>
#include <string>
#include <vector>

#include "collectives/comm_hooks.h"
#include "collectives/process_group.h"
#include "engine/nn/module.h"

namespace nd::dist {

struct DistributedDataParallelOptions {
  DistributedDataParallelOptions() = default;
  ND_ARG(double, bucket_cap_mb) = 25;
  ND_ARG(double, first_bucket_cap_mb) = 1;
  // Off: a parameter that got no gradient in an iteration is an error naming it.
  // On: it is reduced as zero.
  ND_ARG(bool, find_unused_parameters) = false;
  ND_ARG(bool, broadcast_buffers) = true;
  // The set of parameters used is the same every iteration: unused ones are zeros, no error.
  // (PyTorch's flag also enables reentrant backward / activation checkpointing and skips its
  // per-iteration graph search; nanoddp has neither: unused parameters are known from the
  // gradient hooks, so both flags only decide what an unused parameter means.)
  ND_ARG(bool, static_graph) = false;
  ND_ARG(bool, gradient_as_bucket_view) = true;
  // Whether the averaged gradients hold an inf or NaN, the same answer on every rank
  // (see Reducer::skip_step()).
  ND_ARG(bool, skip_nonfinite_steps) = false;
  // For the gradient buckets and buffers. Default: dist::world() for a module on the
  // CPU, dist::nccl_world() for one on a GPU. The small control messages (layout check,
  // per-iteration fingerprint, bucket order) travel on the CPU over dist::control_world()
  // (over this group itself when it has one rank).
  ND_ARG(std::shared_ptr<ProcessGroup>, process_group) = nullptr;
};

// The Reducer's bucketing rule, without a process group (bench/scale_model plans with it):
// the parameters taken in `order` (indices into `params`), a bucket closed when the next
// parameter would take its bytes past the cap (options.first_bucket_cap_mb() for the first
// bucket, options.bucket_cap_mb() after; a parameter larger than the cap gets one of its own)
// or has another dtype. Per bucket, its parameters' indices in order.
std::vector<std::vector<size_t>> plan_buckets(const std::vector<Tensor>& params, const std::vector<size_t>& order,
                                              const DistributedDataParallelOptions& options);

// How DDP broadcasts its parameters (at construction) and buffers (before a forward) from rank 0,
// as PyTorch's _broadcast_coalesced: the tensors of one dtype and device flattened into one
// broadcast, a group closed when the next tensor would take its bytes past `cap_bytes` (a tensor
// larger than the cap gets one of its own). Per broadcast, its tensors' indices in order;
// the groups in the order they were opened. bench/scale_model prices the buffers with it.
constexpr int64_t kBroadcastCapBytes = 250 * 1024 * 1024;  // PyTorch's buffer_broadcast bucket
std::vector<std::vector<size_t>> plan_broadcasts(const std::vector<Tensor>& tensors,
                                                 int64_t cap_bytes = kBroadcastCapBytes);

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  // Verifies that every rank holds the same parameters (names the first difference
  // and the ranks), broadcasts parameters and buffers from rank 0, builds buckets and
  // installs the gradient hooks. `name` identifies the model in messages ("D"); a module
  // whose tensors are unnamed gets it as their prefix, so errors say 'D.main.5.weight'.
  static std::shared_ptr<Reducer> create(nn::Module& module, std::string name,
                                         const DistributedDataParallelOptions& options);
  ~Reducer();

  // Before each forward: broadcasts buffers from rank 0 once per iteration.
  void prepare_forward();
  // Each bucket is then reduced by `hook` (comm_hooks.h) where the all-reduce would run;
  // its value replaces the bucket's averaged gradients. Once per model, before the first
  // backward (nd::Error otherwise). Called also in a world of one process. `description`
  // names the hook and its state's settings ("powerSGD_hook (matrix_approximation_rank 4,
  // ...)"): the per-iteration check compares it across ranks, from iteration 0 on, before
  // any bucket is reduced.
  void register_comm_hook(CommHook hook, std::string description = "a custom hook");
  // no_sync(): while disabled, backward only accumulates local gradients.
  void set_sync(bool enabled) { sync_ = enabled; }
  bool sync_enabled() const { return sync_; }
  // With skip_nonfinite_steps: true when the last synchronised backward's averaged
  // gradients hold an inf or NaN, which they do when any rank's gradient did (or when the
  // sum of the gradients overflowed its dtype); every rank gets the same answer. Checked on
  // the device and read with the status the end of backward reads anyway: no extra
  // collective or device wait.
  bool skip_step() const { return skip_step_; }
  // Milliseconds the last synchronised backward spent blocked at its end waiting for
  // all-reduces (communication not hidden behind backward, plus waiting for slower ranks).
  double last_exposed_wait_ms() const { return exposed_wait_ms_; }
  // Buckets of the last synchronised backward launched by its gradient hooks before
  // every gradient was ready, so that their all-reduce overlapped the rest of backward
  // (the others, the last bucket at least, launched with the last gradient or at the end).
  size_t buckets_launched_during_backward() const { return launched_during_backward_; }
  // Parameters (their module keys) per bucket, in launch order (for tests and benchmarks).
  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  // The parameters DDP reduces (those that require grad, in registration order) and, per
  // bucket in launch order, their indices into it and element offsets in the bucket.
  const std::vector<Tensor>& parameters() const { return params_; }
  struct BucketLayout {
    std::vector<size_t> params;
    std::vector<int64_t> offsets;
  };
  std::vector<BucketLayout> bucket_layout() const;
  // Counts bucket (re)builds: the layout above changed when it did.
  int64_t layout_version() const { return layout_version_; }
  // ZeRO stage 2 (ddp_zero.cpp): from the first iteration after the bucket rebuild on, every
  // bucket is reduce-scattered into W contiguous chunks (chunk_range()); after backward each
  // gradient holds the average on the elements this rank owns and zeros elsewhere (NaN when
  // any rank's gradient was non-finite, so skip_step() and a GradScaler decide alike on every
  // rank). The first iteration is all-reduced, so that its gradients survive the rebuild whole.
  // Once, before the first backward; refused with a communication hook (nd::Error).
  void shard_gradients();
  // Bucket `bucket`'s elements [begin, end) that rank `rank` owns: [n r / W, n (r + 1) / W).
  std::pair<int64_t, int64_t> chunk_range(size_t bucket, int rank) const;
  std::shared_ptr<ProcessGroup> process_group_ptr() const { return pg_; }
  const std::string& name() const { return name_; }
  ProcessGroup& process_group() const { return *pg_; }

 private:
  struct Bucket {
    std::vector<size_t> params;    // indices into params_
    std::vector<int64_t> offsets;  // element offset of each param in `flat`
    int64_t grad_numel = 0;        // gradient elements (status slots follow in the last bucket)
    Tensor flat;
    size_t pending = 0;
    std::shared_ptr<Work> work;  // with a comm hook: the hook's FutureWork
    Tensor shard;                // ZeRO stage 2: this rank's reduce-scattered chunk
  };
  Reducer(nn::Module& module, std::string name, const DistributedDataParallelOptions& options);
  void install_hooks();
  void verify_layout();
  void broadcast_state(bool params_too);
  void build_buckets(const std::vector<size_t>& order);
  const Tensor& slot(size_t param) const { return slots_[param]; }  // param's view into its bucket
  void on_grad_ready(size_t param);
  void check_not_cast(size_t param) const;
  void begin_iteration();
  void launch_ready_buckets();
  void launch(size_t bucket_index);
  void launch_hook(size_t bucket_index);   // ddp_comm_hook.cpp
  void take_hook_result(size_t bucket_index);
  void launch_sharded(size_t bucket_index);  // ddp_zero.cpp
  void take_sharded_result(size_t bucket_index, bool nonfinite);
  void check_fingerprint();
  bool capturing() const;         // ddp_capture.cpp: this thread captures the parameters' device
  void check_capturable() const;  // ddp_capture.cpp: what a captured backward cannot hold, by name
  void set_status_flags(const Tensor& status, const std::vector<double>& flags);  // ddp_capture.cpp
  void finish_iteration();
  void rebuild_buckets_in_ready_order();

  nn::Module& module_;
  std::string name_;
  DistributedDataParallelOptions options_;
  std::shared_ptr<ProcessGroup> pg_;       // buckets and buffers, on the parameters' device
  std::shared_ptr<ProcessGroup> control_;  // CPU messages: control_world(), or pg_ when it has one rank
  bool reduce_buckets_ = true;             // false: default group of one process
  CommHook comm_hook_;
  std::string comm_hook_description_ = "none (DDP's all-reduce)";
  std::shared_ptr<ProcessGroup> hook_group_;  // pg_, or a group of one rank where pg_ is not reduced
  std::vector<Tensor> params_;
  std::vector<std::string> param_names_;  // as errors show them ("D.main.5.weight")
  std::vector<std::string> param_paths_;  // the module's keys ("main.5.weight")
  std::vector<Tensor> buffers_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // param -> bucket
  std::vector<Tensor> slots_;      // param -> its view into its bucket (built with the buckets)
  std::vector<bool> ready_;
  std::vector<size_t> ready_order_;
  size_t next_bucket_ = 0;
  bool active_ = false;
  bool sync_ = true;
  bool buffers_stale_ = true;
  bool rebuilt_ = false;
  bool skip_step_ = false;
  bool shard_gradients_ = false;  // ZeRO stage 2 requested
  bool capturing_ = false;        // this backward is being captured into a CUDA graph
  // The status flags (which parameters this rank reduced) as last set, here and on the device,
  // and the last eager backward's all-reduced status (ranks per gradient): what a captured
  // backward, which cannot read the device, must repeat.
  std::vector<double> flags_, used_;
  Tensor flags_device_;
  bool sharded_iteration_ = false;  // this backward reduce-scatters (stage 2, buckets rebuilt, W > 1)
  std::shared_ptr<Work> status_work_;  // sharded: the last bucket's status slots, all-reduced
  Tensor local_sum_;                   // sharded: the sum of this rank's gradients so far (f64)
  int64_t layout_version_ = 0;
  double exposed_wait_ms_ = 0;
  int64_t iteration_ = 0;
  size_t launched_during_backward_ = 0;
  Tensor fingerprint_;
  std::shared_ptr<Work> fingerprint_work_;
  // pg_'s record at the previous fingerprint (or at construction: base_iteration_ -1)
  // and at this backward's.
  CollectiveRecord base_record_, record_now_;
  int64_t base_iteration_ = -1;
};

// The wrapper users hold, around a holder (nn::Sequential) or a std::shared_ptr to a
// Module: ddp(x) runs the module's forward with DDP's bookkeeping;
// state_dict()/load_state_dict() are the module's own (no "module." prefix).
template <class ModuleHolder>
class DistributedDataParallel {
 public:
  DistributedDataParallel(ModuleHolder module, std::string name = "model",
                          const DistributedDataParallelOptions& options = {})
      : module_(std::move(module)), reducer_(Reducer::create(*module_, std::move(name), options)) {}

  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    reducer_->prepare_forward();
    if constexpr (requires { module_(std::forward<Args>(args)...); })
      return module_(std::forward<Args>(args)...);  // a holder (nn::Sequential)
    else
      return module_->forward(std::forward<Args>(args)...);  // a std::shared_ptr<Module>
  }
  ModuleHolder& module() { return module_; }
  auto* operator->() { return module_.operator->(); }
  Reducer& reducer() { return *reducer_; }
  // PyTorch's register_comm_hook(state, hook): hook(state.get(), bucket) reduces every
  // bucket from now on; DDP keeps `state` alive. ddp.register_comm_hook(powersgd_state,
  // dist::powerSGD_hook), or with a built-in hook on the model's own group:
  // ddp.register_comm_hook(nullptr, dist::bf16_compress_hook).
  // The per-iteration check compares the hook across ranks (describe_comm_hook).
  template <class State, class Hook>
  void register_comm_hook(std::shared_ptr<State> state, Hook hook) {
    reducer_->register_comm_hook([state, hook](GradBucket& bucket) { return hook(state.get(), bucket); },
                                 describe_comm_hook(state.get(), hook));
  }
  void register_comm_hook(std::nullptr_t, std::shared_ptr<FutureWork> (*hook)(ProcessGroup*, GradBucket&)) {
    register_comm_hook(std::shared_ptr<ProcessGroup>(), hook);
  }
  TensorDict state_dict() const { return module_->state_dict(); }
  nn::LoadStateDictResult load_state_dict(const TensorDict& state, bool strict = true) {
    return module_->load_state_dict(state, strict);
  }

  // Gradient accumulation: while the guard lives, backward does not communicate.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Reducer& r) : reducer_(r), previous_(r.sync_enabled()) { r.set_sync(false); }
    ~NoSyncGuard() { reducer_.set_sync(previous_); }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Reducer& reducer_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }

 private:
  ModuleHolder module_;
  std::shared_ptr<Reducer> reducer_;
};

}  // namespace nd::dist
