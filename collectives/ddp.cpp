#include "collectives/ddp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/copy.h"

namespace nd::dist {

namespace {

// Layout signature of one parameter: ndim, up to 6 dims, dtype.
constexpr int64_t kSigWidth = 8;

uint64_t mix(uint64_t h, uint64_t v) { return (h ^ (v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2))); }

}  // namespace

std::vector<std::vector<size_t>> plan_buckets(const std::vector<Tensor>& params, const std::vector<size_t>& order,
                                              const DistributedDataParallelOptions& options) {
  const double mib = 1024.0 * 1024.0;
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> current;
  int64_t bytes = 0;
  for (size_t i : order) {
    ND_CHECK(i < params.size(), "plan_buckets: parameter index ", i, " in the order is out of range for ",
             params.size(), " parameters");
    const Tensor& p = params[i];
    const int64_t size = p.numel() * static_cast<int64_t>(element_size(p.dtype()));
    const double cap = (buckets.empty() ? options.first_bucket_cap_mb() : options.bucket_cap_mb()) * mib;
    if (!current.empty() && (params[current[0]].dtype() != p.dtype() || bytes + size > cap)) {
      buckets.push_back(std::move(current));
      current.clear();
      bytes = 0;
    }
    current.push_back(i);
    bytes += size;
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

std::shared_ptr<Reducer> Reducer::create(nn::Module& module, std::string name,
                                         const DistributedDataParallelOptions& options) {
  std::shared_ptr<Reducer> r(new Reducer(module, std::move(name), options));
  r->install_hooks();
  return r;
}

Reducer::Reducer(nn::Module& module, std::string name, const DistributedDataParallelOptions& options)
    : module_(module), name_(std::move(name)), options_(options), pg_(options.process_group()) {
  ND_CHECK(options_.bucket_cap_mb() > 0 && options_.first_bucket_cap_mb() > 0, "DistributedDataParallel '", name_,
           "': expected positive bucket_cap_mb and first_bucket_cap_mb, found ", options_.bucket_cap_mb(), " and ",
           options_.first_bucket_cap_mb());
  // Errors name a parameter with its model first ('D.main.5.weight': G and D both have a
  // main.5.weight): a module whose tensors carry only their paths takes DDP's name as
  // prefix (Module::name_tensors); one the user named keeps its names.
  const auto named = module.named_parameters();
  if (std::all_of(named.begin(), named.end(),
                  [](const auto& np) { return np.second.name().empty() || np.second.name() == np.first; }))
    module.name_tensors(name_);
  for (const auto& [pname, p] : named) {  // handles: they carry the names just set
    if (!p.requires_grad()) continue;
    params_.push_back(p);
    param_names_.push_back(p.name().empty() ? pname : p.name());
    param_paths_.push_back(pname);
  }
  ND_CHECK(!params_.empty(), "DistributedDataParallel '", name_, "': the module has no parameter that requires grad");
  for (const Tensor& p : params_)
    ND_CHECK(p.device() == params_[0].device(), "DistributedDataParallel '", name_,
             "': parameters on several devices (", params_[0].describe(), " and ", p.describe(),
             "); put the whole module on one device");
  // One process needs no communication (and no NCCL): with the default group the bucket
  // all-reduces are skipped; a group passed in explicitly is always used.
  reduce_buckets_ = pg_ != nullptr || world()->size() > 1;
  if (!pg_) pg_ = default_group(params_[0].device());
  if (!pg_) pg_ = world();  // a GPU alone: only the size-1 checks below read it
  control_ = pg_->size() > 1 ? control_world() : pg_;
  buffers_ = module.buffers();
  verify_layout();
  broadcast_state(/*params_too=*/true);
  base_record_ = pg_->record();  // the fingerprint covers what the data group issues from here on
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;  // reverse registration order
  build_buckets(order);
  ready_.assign(params_.size(), false);
}

Reducer::~Reducer() = default;

void Reducer::install_hooks() {
  std::weak_ptr<Reducer> weak = weak_from_this();
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].register_post_accumulate_grad_hook([weak, i](const Tensor&) {
      if (auto self = weak.lock()) self->on_grad_ready(i);
    });
}

// Every rank must hold the same parameters in the same order: compare signatures.
void Reducer::verify_layout() {
  const int W = control_->size();
  if (W == 1) return;
  std::vector<Tensor> counts;
  for (int r = 0; r < W; ++r) counts.push_back(empty({1}, kInt64));
  control_->allgather(counts, tensor({static_cast<double>(params_.size())}, kInt64))->wait();
  for (int r = 0; r < W; ++r) {
    const int64_t n = counts[r].data_ptr<int64_t>()[0];
    ND_CHECK(n == static_cast<int64_t>(params_.size()), "DistributedDataParallel '", name_, "': rank ", control_->rank(),
             " has ", params_.size(), " parameters that require grad but rank ", r, " has ", n,
             ". Every rank must build the same model.");
  }
  const int64_t P = static_cast<int64_t>(params_.size());
  Tensor sig = full({P * kSigWidth}, -1, kInt64);
  int64_t* s = sig.data_ptr<int64_t>();
  for (int64_t i = 0; i < P; ++i) {
    const Tensor& p = params_[i];
    s[i * kSigWidth] = p.dim();
    for (int64_t d = 0; d < std::min<int64_t>(p.dim(), 6); ++d) s[i * kSigWidth + 1 + d] = p.size(d);
    s[i * kSigWidth + 7] = static_cast<int64_t>(p.dtype());
  }
  std::vector<Tensor> all;
  for (int r = 0; r < W; ++r) all.push_back(empty({P * kSigWidth}, kInt64));
  control_->allgather(all, sig)->wait();
  for (int64_t i = 0; i < P; ++i) {
    for (int r = 1; r < W; ++r) {
      const int64_t* a = all[0].data_ptr<int64_t>() + i * kSigWidth;
      const int64_t* b = all[r].data_ptr<int64_t>() + i * kSigWidth;
      if (std::equal(a, a + kSigWidth, b)) continue;
      auto describe = [](const int64_t* x) {
        Shape shape(x + 1, x + 1 + std::min<int64_t>(x[0], 6));
        return std::string(dtype_name(static_cast<ScalarType>(x[7]))) + " " + shape_str(shape);
      };
      throw Error("DistributedDataParallel '" + name_ + "': parameter " + std::to_string(i) + " ('" +
                  param_names_[i] + "' here) differs across ranks: rank 0 has " + describe(a) + ", rank " +
                  std::to_string(r) + " has " + describe(b) + ". Every rank must build the same model.");
    }
  }
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  // Keep the gradients accumulated so far (no_sync, or the first iteration's) across a rebuild.
  std::vector<Tensor> old_grads(params_.size());
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].impl().grad) old_grads[i] = params_[i].grad().clone();

  buckets_.clear();
  ++layout_version_;
  bucket_of_.assign(params_.size(), 0);
  slots_.assign(params_.size(), Tensor());
  for (std::vector<size_t>& members : plan_buckets(params_, order, options_)) {
    Bucket bucket;
    for (size_t i : members) {
      bucket.offsets.push_back(bucket.grad_numel);
      bucket.grad_numel += params_[i].numel();
    }
    bucket.params = std::move(members);
    buckets_.push_back(std::move(bucket));
  }
  // The last bucket also carries, per parameter, the number of ranks that produced its
  // gradient, then the non-finite vote (see the header).
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    const int64_t status = b + 1 == buckets_.size() ? static_cast<int64_t>(params_.size()) + 1 : 0;
    const Tensor& first = params_[bucket.params[0]];
    bucket.flat = zeros({bucket.grad_numel + status}, first.options());
    NoGradGuard no_grad;
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const size_t i = bucket.params[k];
      bucket_of_[i] = b;
      slots_[i] = bucket.flat.narrow(0, bucket.offsets[k], params_[i].numel()).view(params_[i].sizes());
    }
  }
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& view = slot(i);
    if (old_grads[i].defined()) copy_data(view, old_grads[i]);
    if (options_.gradient_as_bucket_view() && old_grads[i].defined()) params_[i].set_grad(view);
  }
}

// Module::to keeps the parameter objects (the hooks still fire) but changes their dtype or
// device: the buckets, built for the old ones, no longer fit. Said at the next forward
// through DDP, or at the first gradient of a module called directly.
void Reducer::check_not_cast(size_t i) const {
  const Tensor& p = params_[i];
  const Tensor& s = slot(i);
  if (p.dtype() == s.dtype() && p.device() == s.device()) return;
  throw Error("DistributedDataParallel '" + name_ + "': parameter '" + param_names_[i] + "' is now " +
              dtype_name(p.dtype()) + " on " + p.device().str() + ", but its gradient bucket was built for " +
              dtype_name(s.dtype()) + " on " + s.device().str() +
              ": the module was cast or moved (module->to(...)) after it was wrapped. Cast or move it before "
              "constructing DistributedDataParallel.");
}

void Reducer::prepare_forward() {
  for (size_t i = 0; i < params_.size(); ++i) check_not_cast(i);
  if (active_) {
    // The last backward was abandoned by an exception before its end: finish what it
    // launched, so this rank's collectives stay in order, and start afresh.
    auto finish = [](std::shared_ptr<Work>& work) {
      if (!work) return;
      try {
        work->wait();
      } catch (const Error&) {
      }
      work.reset();
    };
    for (Bucket& b : buckets_) finish(b.work);
    finish(status_work_);
    fingerprint_work_.reset();
    active_ = false;
  }
  if (!options_.broadcast_buffers() || !buffers_stale_) return;
  broadcast_state(/*params_too=*/false);
  buffers_stale_ = false;
}

void Reducer::on_grad_ready(size_t i) {
  check_not_cast(i);
  if (!sync_) return;  // no_sync: gradients accumulate locally
  if (!active_) begin_iteration();
  ready_[i] = true;
  ready_order_.push_back(i);
  // Move the gradient into its bucket slot (a no-op when .grad already is that view).
  const Tensor& view = slot(i);
  Tensor g = params_[i].grad();
  if (g.storage() != view.storage() || g.storage_offset() != view.storage_offset()) {
    NoGradGuard no_grad;
    copy_data(view, g);
    if (options_.gradient_as_bucket_view()) params_[i].set_grad(view);
  }
  Bucket& b = buckets_[bucket_of_[i]];
  --b.pending;
  launch_ready_buckets();
}

void Reducer::begin_iteration() {
  capturing_ = capturing();
  if (capturing_) check_capturable();
  active_ = true;
  std::fill(ready_.begin(), ready_.end(), false);
  ready_order_.clear();
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
  }
  next_bucket_ = 0;
  launched_during_backward_ = 0;
  // ZeRO stage 2 from the second iteration on: the first one's gradients must survive the
  // bucket rebuild whole (ddp_zero.cpp).
  sharded_iteration_ = shard_gradients_ && rebuilt_ && reduce_buckets_ && pg_->size() > 1;
  status_work_.reset();
  local_sum_ = Tensor();
  // Fingerprint: which model, which iteration, which layout and hook (a), and what the data
  // group issued since the previous check (b). MAX over [a, b, -a, -b] gives every rank
  // the maximum and minus the minimum: the same verdict everywhere, equal iff max == min.
  record_now_ = pg_->record();
  uint64_t a = std::hash<std::string>{}(name_);
  a = mix(a, static_cast<uint64_t>(iteration_));
  a = mix(a, buckets_.size());
  a = mix(a, params_.size());
  a = mix(a, std::hash<std::string>{}(comm_hook_description_));
  const uint64_t b = mix(record_now_.hash_since(base_record_), record_now_.count - base_record_.count);
  const int64_t a62 = static_cast<int64_t>(a >> 2), b62 = static_cast<int64_t>(b >> 2);  // -x cannot overflow
  fingerprint_ = empty({4}, kInt64);
  int64_t* f = fingerprint_.data_ptr<int64_t>();
  f[0] = a62, f[1] = b62, f[2] = -a62, f[3] = -b62;
  if (control_->size() > 1 && !capturing_) {  // a captured backward is checked by none (ddp_capture.cpp)
    CollectivePurpose purpose("the per-iteration check of DDP model '" + name_ + "'");
    fingerprint_work_ = control_->allreduce(fingerprint_, {ReduceOp::MAX});
  }
  std::weak_ptr<Reducer> weak = weak_from_this();
  autograd::queue_callback([weak] {
    if (auto self = weak.lock()) self->finish_iteration();
  });
}

void Reducer::launch(size_t b) {
  if (b == 0) check_fingerprint();
  if (comm_hook_) return launch_hook(b);
  AllreduceOptions opts;
  opts.op = ReduceOp::SUM;
  opts.bucket = static_cast<int64_t>(b);
  if (!reduce_buckets_) {  // the sum over one rank is the bucket itself: nothing to wait for
    auto done = std::make_shared<AsyncWork>(
        CollectiveInfo{"allreduce", 0, buckets_[b].flat.numel(), buckets_[b].flat.dtype(), opts.bucket, {}});
    done->mark_done();
    buckets_[b].work = done;
    return;
  }
  if (sharded_iteration_) return launch_sharded(b);
  CollectivePurpose purpose("bucket " + std::to_string(b) + " of DDP model '" + name_ + "'");
  buckets_[b].work = pg_->allreduce(buckets_[b].flat, opts);
}

void Reducer::launch_ready_buckets() {
  // The last bucket waits for the end of backward: it carries the status slots.
  while (next_bucket_ + 1 < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    launch(next_bucket_++);
    if (ready_order_.size() < params_.size()) ++launched_during_backward_;
  }
}

void Reducer::finish_iteration() {
  NoGradGuard no_grad;
  const size_t P = params_.size();
  Bucket& last = buckets_.back();
  Tensor status = last.flat.narrow(0, last.grad_numel, static_cast<int64_t>(P) + 1);
  {
    std::vector<double> flags(P + 1, 0.0);  // slot P: the non-finite check, written after the reduce
    for (size_t i = 0; i < P; ++i) flags[i] = ready_[i] ? 1.0 : 0.0;
    set_status_flags(status, flags);
  }
  // A parameter this backward did not reach contributes its current gradient (an
  // earlier backward's, already equal on every rank, so the average keeps it) or zeros.
  for (size_t i = 0; i < P; ++i) {
    if (ready_[i]) continue;
    if (params_[i].impl().grad)
      copy_data(slot(i), params_[i].grad());
    else
      slot(i).zero_();
  }
  try {
    while (next_bucket_ < buckets_.size()) launch(next_bucket_++);
    const auto t0 = std::chrono::steady_clock::now();
    for (Bucket& b : buckets_) capturing_ ? b.work->wait_on_device() : b.work->wait();  // captured: a join
    if (status_work_) status_work_->wait();
    exposed_wait_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  } catch (...) {
    active_ = false;
    throw;
  }
  const double W = pg_->size();
  // ZeRO stage 2: slot P already holds the all-reduced sum of every rank's gradients.
  const bool sharded_nonfinite =
      sharded_iteration_ && !std::isfinite(status.narrow(0, static_cast<int64_t>(P), 1).to(kFloat64).cpu().item());
  Tensor grad_sum;  // skip_nonfinite_steps: the sum of every averaged gradient, on the device
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    Tensor grads = b.flat.narrow(0, 0, b.grad_numel);
    if (comm_hook_)
      take_hook_result(i);  // averaged by the hook
    else if (sharded_iteration_)
      take_sharded_result(i, sharded_nonfinite);
    else if (W > 1)
      grads.div_(W);
    if (options_.skip_nonfinite_steps() && !sharded_iteration_) {
      Tensor s = grads.sum().to(kFloat64);
      grad_sum = grad_sum.defined() ? grad_sum + s : s;
    }
  }
  // Every rank holds the same averaged gradients, so each decides alone and all decide
  // alike: an inf or NaN on any rank made the sums non-finite (they survive addition). The
  // answer travels in slot P to the one read of the status below: no collective or wait of
  // its own.
  if (grad_sum.defined()) copy_data(status.narrow(0, static_cast<int64_t>(P), 1), grad_sum);
  // A captured backward reduces what the last eager one did (set_status_flags checked it), so
  // it takes that one's verdict: the host cannot read the device while capturing.
  if (!capturing_) {
    Tensor status64 = status.to(kFloat64).cpu().contiguous();
    used_.assign(status64.data_ptr<double>(), status64.data_ptr<double>() + P + 1);
  }
  const double* used = used_.data();
  active_ = false;
  ++iteration_;
  buffers_stale_ = true;
  skip_step_ = options_.skip_nonfinite_steps() && !std::isfinite(used[P]);

  std::vector<std::string> missing;
  for (size_t i = 0; i < P; ++i) {
    const bool used_somewhere = used[i] > 0;
    if (used_somewhere || params_[i].impl().grad) {
      if (options_.gradient_as_bucket_view())
        params_[i].set_grad(slot(i));
      else if (params_[i].impl().grad)
        copy_data(params_[i].grad(), slot(i));
      else
        params_[i].set_grad(slot(i).clone());
    }
    if (used[i] < W)
      missing.push_back(param_names_[i] + " (gradient on " + std::to_string(static_cast<int64_t>(used[i])) + " of " +
                        std::to_string(pg_->size()) + " ranks)");
  }
  if (!rebuilt_) {
    rebuilt_ = true;
    rebuild_buckets_in_ready_order();
  }
  if (!missing.empty() && !options_.find_unused_parameters() && !options_.static_graph()) {
    std::string msg = "DistributedDataParallel '" + name_ + "': " + std::to_string(missing.size()) +
                      " parameter(s) received no gradient in this backward:";
    for (const auto& m : missing) msg += "\n  " + m;
    msg += "\nEither make every parameter take part in the loss you call backward on, or construct "
           "DistributedDataParallel with DistributedDataParallelOptions().find_unused_parameters(true) to reduce "
           "them as zeros.";
    throw Error(msg);
  }
}

void Reducer::rebuild_buckets_in_ready_order() {
  // Rank 0's order of readiness, then the parameters it never saw, in reverse registration order.
  std::vector<double> order;
  std::vector<bool> seen(params_.size(), false);
  for (size_t i : ready_order_) {
    order.push_back(static_cast<double>(i));
    seen[i] = true;
  }
  for (size_t i = params_.size(); i-- > 0;)
    if (!seen[i]) order.push_back(static_cast<double>(i));
  Tensor t = tensor(order, kInt64);
  if (control_->size() > 1) control_->broadcast(t, 0)->wait();
  std::vector<size_t> agreed(params_.size());
  for (size_t k = 0; k < agreed.size(); ++k) agreed[k] = static_cast<size_t>(t.data_ptr<int64_t>()[k]);
  build_buckets(agreed);
}

std::vector<std::vector<std::string>> Reducer::bucket_parameter_names() const {
  std::vector<std::vector<std::string>> out;
  for (const Bucket& b : buckets_) {
    out.emplace_back();
    for (size_t i : b.params) out.back().push_back(param_paths_[i]);
  }
  return out;
}

}  // namespace nd::dist
