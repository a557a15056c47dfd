#include "collectives/zero.h"

#include <algorithm>
#include <set>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/copy.h"

namespace nd::dist {

namespace {

constexpr const char* kName = "ZeroRedundancyOptimizer";

// The state buffers of the elementwise optimizers ZeRO wraps (Adam, AdamW: exp_avg,
// exp_avg_sq, max_exp_avg_sq with amsgrad; SGD with momentum: momentum_buffer).
const std::vector<std::string>& buffer_names() {
  static const std::vector<std::string> names{"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"};
  return names;
}

std::vector<Tensor> all_params(const std::vector<optim::OptimizerParamGroup>& groups) {
  std::vector<Tensor> out;
  for (const auto& g : groups) out.insert(out.end(), g.params().begin(), g.params().end());
  return out;
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<optim::OptimizerParamGroup> groups,
                                                 OptimizerClass optimizer_class,
                                                 const optim::OptimizerOptions& defaults,
                                                 const ZeroRedundancyOptimizerOptions& options)
    : Optimizer(kName, std::move(groups), defaults),
      optimizer_class_(std::move(optimizer_class)),
      local_defaults_(defaults.clone()),
      params_(all_params(param_groups())) {
  ND_CHECK(!params_.empty(), kName, ": expected parameters to shard, found none");
  for (const Tensor& p : params_)
    ND_CHECK(p.dtype() == params_[0].dtype() && p.device() == params_[0].device(), kName,
             ": expected parameters of one dtype on one device (they are sharded as one flat vector), found ",
             params_[0].describe(), " and ", p.describe());
  for (size_t k = 0; k < params_.size(); ++k) index_of_[params_[k].impl_ptr().get()] = k;
  if (options.ddp()) {
    ddp_ = options.ddp()->shared_from_this();
    pg_ = ddp_->process_group_ptr();
  } else {
    pg_ = options.process_group() ? options.process_group() : default_group(params_[0].device());
  }
  if (pg_) rank_ = pg_->rank(), world_size_ = pg_->size();
  check_same_on_every_rank();
  if (ddp_) {
    check_same_as_ddp();
    ddp_->shard_gradients();
  }
  partition();
  const std::set<std::string> elementwise{"SGD", "Adam", "AdamW"};
  ND_CHECK(elementwise.count(local_->name()), kName, ": expected an elementwise optimizer class (SGD, Adam or AdamW: "
           "stepping a shard of the elements must equal stepping them all), found '", local_->name(), "'");
}

// Every rank must shard the same flat vector: compare (parameter count, elements) across ranks.
void ZeroRedundancyOptimizer::check_same_on_every_rank() const {
  if (world_size_ == 1) return;
  int64_t N = 0;
  for (const Tensor& p : params_) N += p.numel();
  const Device device = params_[0].device();  // the group's own device (NCCL: this rank's GPU)
  std::vector<Tensor> all;
  for (int r = 0; r < world_size_; ++r) all.push_back(empty({2}, TensorOptions(kInt64).device(device)));
  const Tensor mine = tensor({static_cast<double>(params_.size()), static_cast<double>(N)}, kInt64).to(device);
  // A rank that skipped this (a plain optimizer there) leaves the others waiting here: the
  // watchdog's line then says what for.
  CollectivePurpose purpose(ddp_ ? std::string(kName) + "'s ownership check of model '" + ddp_->name() + "'"
                                 : std::string(kName) + "'s check that every rank shards the same parameters");
  pg_->allgather(all, mine)->wait();
  for (int r = 0; r < world_size_; ++r) {
    const Tensor cpu = all[r].cpu();
    const int64_t* v = cpu.data_ptr<int64_t>();
    ND_CHECK(v[0] == static_cast<int64_t>(params_.size()) && v[1] == N, kName, ": rank ", rank_, " has ",
             params_.size(), " parameters of ", N, " elements but rank ", r, " has ", v[0], " of ", v[1],
             ". Every rank must pass the same parameters.");
  }
}

// ZeRO stage 2 steps exactly the gradients DDP reduce-scatters: the same set of tensors.
void ZeroRedundancyOptimizer::check_same_as_ddp() const {
  std::set<const TensorImpl*> in_ddp;
  for (const Tensor& p : ddp_->parameters()) {
    in_ddp.insert(p.impl_ptr().get());
    ND_CHECK(index_of_.count(p.impl_ptr().get()), kName, ": DDP model '", ddp_->name(), "' reduces parameter '",
             p.name(), "' but the optimizer does not hold it; with options.ddp (ZeRO stage 2) the optimizer must "
             "hold exactly the model's parameters that require grad");
  }
  for (const Tensor& p : params_)
    ND_CHECK(in_ddp.count(p.impl_ptr().get()), kName, ": the optimizer holds ", p.describe(),
             ", which DDP model '", ddp_->name(), "' does not reduce; with options.ddp (ZeRO stage 2) the optimizer "
             "must hold exactly the model's parameters that require grad");
}

void ZeroRedundancyOptimizer::partition() {
  segments_.assign(world_size_, {});
  if (ddp_) {  // rank r owns chunk r of every bucket
    layout_version_ = ddp_->layout_version();
    const auto layout = ddp_->bucket_layout();
    for (int r = 0; r < world_size_; ++r)
      for (size_t b = 0; b < layout.size(); ++b) {
        const auto [chunk_begin, chunk_end] = ddp_->chunk_range(b, r);
        for (size_t j = 0; j < layout[b].params.size(); ++j) {
          const Tensor& p = ddp_->parameters()[layout[b].params[j]];
          const int64_t at = layout[b].offsets[j];
          const int64_t begin = std::max(chunk_begin, at), end = std::min(chunk_end, at + p.numel());
          if (end > begin) segments_[r].push_back({index_of_.at(p.impl_ptr().get()), begin - at, end - at});
        }
      }
  } else {  // rank r owns elements [r N / W, (r + 1) N / W) of the parameters laid end to end
    int64_t N = 0;
    for (const Tensor& p : params_) N += p.numel();
    for (int r = 0; r < world_size_; ++r) {
      const int64_t mine_begin = N * r / world_size_, mine_end = N * (r + 1) / world_size_;
      int64_t offset = 0;
      for (size_t k = 0; k < params_.size(); ++k) {
        const int64_t begin = std::clamp(mine_begin - offset, int64_t{0}, params_[k].numel());
        const int64_t end = std::clamp(mine_end - offset, int64_t{0}, params_[k].numel());
        if (end > begin) segments_[r].push_back({k, begin, end});
        offset += params_[k].numel();
      }
    }
  }
  shards_.assign(params_.size(), Shard());
  for (const Segment& s : segments_[rank_]) shards_[s.param].begin = s.begin, shards_[s.param].end = s.end;
  std::vector<optim::OptimizerParamGroup> local_groups;
  int64_t local_count = 0;
  size_t k = 0;
  for (size_t g = 0; g < param_groups().size(); ++g) {
    std::vector<Tensor> views;
    for (const Tensor& p : param_groups()[g].params()) {
      Shard& s = shards_[k++];
      s.group = g;
      if (s.end == s.begin) continue;
      // A leaf view of the owned elements: the wrapped optimizer's step writes the
      // parameter in place and bumps its version counter.
      s.local = p.detach().view({p.numel()}).narrow(0, s.begin, s.end - s.begin);
      s.local_index = local_count++;
      views.push_back(s.local);
    }
    local_groups.emplace_back(std::move(views), param_groups()[g].options());
  }
  local_ = optimizer_class_(std::move(local_groups), *local_defaults_);
  local_->skip_first_step_hooks();  // ranks step shards of their own sizes, some none
}

void ZeroRedundancyOptimizer::repartition() {
  // Every rank sees the same layout change at the same step: the collectives pair up.
  const TensorDict state = stepped_ ? state_dict() : TensorDict();
  partition();
  if (stepped_) load_state_dict(state);
}

int64_t ZeroRedundancyOptimizer::owned_numel() const {
  int64_t n = 0;
  for (const Segment& s : segments_[rank_]) n += s.end - s.begin;
  return n;
}

void ZeroRedundancyOptimizer::update(const optim::OptimizerOptions& options, std::vector<ParamUpdate>& params) {
  if (params.empty()) return;
  NoGradGuard no_grad;
  // Every update of one call belongs to one group; find it through its first parameter.
  const size_t group = shards_[index_of_.at(params[0].param.impl_ptr().get())].group;
  local_->param_groups()[group].options().from_map(options.to_map());  // lr from a scheduler
  std::vector<Tensor> handed;
  for (const ParamUpdate& u : params) {
    const Shard& s = shards_[index_of_.at(u.param.impl_ptr().get())];
    if (!s.local.defined()) continue;
    s.local.set_grad(u.grad.view({u.grad.numel()}).narrow(0, s.begin, s.end - s.begin));
    handed.push_back(s.local);
  }
  if (handed.empty()) return;  // this rank owns none of the group's elements
  local_->step();
  for (const Tensor& t : handed) t.set_grad(Tensor());  // so that the next group's step skips them
}

void ZeroRedundancyOptimizer::step() {
  if (ddp_ && ddp_->layout_version() != layout_version_) repartition();
  Optimizer::step();
  stepped_ = true;
  gather_parameters();
}

void ZeroRedundancyOptimizer::gather(const Tensor& mine,
                                     const std::function<void(const Segment&, const Tensor&)>& put) const {
  std::vector<int64_t> starts{0};
  for (const auto& part : segments_) {
    int64_t n = 0;
    for (const Segment& s : part) n += s.end - s.begin;
    starts.push_back(starts.back() + n);
  }
  Tensor all = mine;
  if (world_size_ > 1) {
    all = empty({starts.back()}, mine.options());
    std::vector<Tensor> parts;
    for (int r = 0; r < world_size_; ++r) parts.push_back(all.narrow(0, starts[r], starts[r + 1] - starts[r]));
    pg_->allgather(parts, mine)->wait();
  }
  for (int r = 0; r < world_size_; ++r) {
    int64_t at = starts[r];
    for (const Segment& s : segments_[r]) {
      put(s, all.narrow(0, at, s.end - s.begin));
      at += s.end - s.begin;
    }
  }
}

void ZeroRedundancyOptimizer::gather_parameters() {
  if (world_size_ == 1) return;
  CollectivePurpose purpose("the parameters updated by ZeroRedundancyOptimizer");
  NoGradGuard no_grad;
  Tensor mine = empty({owned_numel()}, params_[0].options());
  int64_t at = 0;
  for (const Segment& s : segments_[rank_]) {
    copy_data(mine.narrow(0, at, s.end - s.begin), shards_[s.param].local);
    at += s.end - s.begin;
  }
  gather(mine, [&](const Segment& s, const Tensor& values) {
    const Tensor& p = params_[s.param];
    copy_data(p.detach().view({p.numel()}).narrow(0, s.begin, s.end - s.begin), values);
  });
  for (const Tensor& p : params_) p.storage()->bump_version(std::string(kName) + ".step");
}

TensorDict ZeroRedundancyOptimizer::state_dict() const {
  NoGradGuard no_grad;
  const TensorDict local = local_->state_dict();
  const int64_t P = static_cast<int64_t>(params_.size());
  const std::vector<std::string>& names = buffer_names();
  const int64_t B = static_cast<int64_t>(names.size());
  // Per parameter: its step and which buffers it has, on the ranks that own part of it (MAX).
  Tensor info = zeros({P * (1 + B)}, kFloat64);
  double* v = info.data_ptr<double>();  // f64 holds every step count exactly
  for (int64_t k = 0; k < P; ++k) {
    const Shard& s = shards_[k];
    if (s.local_index < 0) continue;
    const std::string prefix = "state." + std::to_string(s.local_index) + ".";
    if (!local.count(prefix + "step")) continue;
    v[k * (1 + B)] = local.at(prefix + "step").item();
    for (int64_t b = 0; b < B; ++b) v[k * (1 + B) + 1 + b] = local.count(prefix + names[b]) ? 1 : 0;
  }
  if (world_size_ > 1) {
    CollectivePurpose purpose("ZeroRedundancyOptimizer.state_dict");
    const Tensor reduced = info.to(params_[0].device());  // pg_'s device (NCCL: this rank's GPU)
    pg_->allreduce(reduced, {ReduceOp::MAX})->wait();
    info = reduced.cpu();
    v = info.data_ptr<double>();
  }
  TensorDict out;
  for (size_t g = 0; g < param_groups().size(); ++g)
    for (const auto& [opt, value] : param_groups()[g].options().to_map())
      out["param_groups." + std::to_string(g) + "." + opt] = scalar_tensor(value, kFloat64);
  for (int64_t k = 0; k < P; ++k)
    if (v[k * (1 + B)] > 0) out["state." + std::to_string(k) + ".step"] = scalar_tensor(v[k * (1 + B)], kFloat64);
  for (int64_t b = 0; b < B; ++b) {
    bool any = false;
    for (int64_t k = 0; k < P; ++k) any = any || v[k * (1 + B) + 1 + b] > 0;
    if (!any) continue;  // the same on every rank: `info` was reduced
    CollectivePurpose purpose("ZeroRedundancyOptimizer.state_dict: " + names[b]);
    Tensor mine = zeros({owned_numel()}, params_[0].options());
    int64_t at = 0;
    for (const Segment& seg : segments_[rank_]) {
      const std::string key = "state." + std::to_string(shards_[seg.param].local_index) + "." + names[b];
      if (local.count(key)) copy_data(mine.narrow(0, at, seg.end - seg.begin), local.at(key));
      at += seg.end - seg.begin;
    }
    std::vector<Tensor> full(P);
    for (int64_t k = 0; k < P; ++k)
      if (v[k * (1 + B) + 1 + b] > 0) full[k] = empty(params_[k].sizes(), params_[k].options());
    gather(mine, [&](const Segment& seg, const Tensor& values) {
      if (full[seg.param].defined())
        copy_data(full[seg.param].view({full[seg.param].numel()}).narrow(0, seg.begin, seg.end - seg.begin), values);
    });
    for (int64_t k = 0; k < P; ++k)
      if (full[k].defined()) out["state." + std::to_string(k) + "." + names[b]] = full[k];
  }
  return out;
}

void ZeroRedundancyOptimizer::load_state_dict(const TensorDict& state) {
  NoGradGuard no_grad;
  TensorDict local;
  std::vector<std::map<std::string, double>> group_options(param_groups().size());
  for (const auto& [key, t] : state) {
    const auto [kind, index, field] = parse_state_key(kName, key, t, params_, param_groups().size());
    if (kind == "param_groups") {
      group_options[index][field] = t.item();
      local[key] = t;
      continue;
    }
    const Shard& s = shards_[index];
    if (s.local_index < 0) continue;  // none of its elements is this rank's
    const std::string local_key = "state." + std::to_string(s.local_index) + "." + field;
    local[local_key] = field == "step" ? t : t.contiguous().view({t.numel()}).narrow(0, s.begin, s.end - s.begin);
  }
  local_->load_state_dict(local);
  stepped_ = true;
  for (size_t g = 0; g < param_groups().size(); ++g)
    if (!group_options[g].empty()) param_groups()[g].options().from_map(group_options[g]);
}

}  // namespace nd::dist
