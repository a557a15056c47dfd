// The Reducer's broadcasts from rank 0 (ddp.h, plan_broadcasts): the parameters and buffers at
// construction, the buffers before a forward (broadcast_buffers), one broadcast per dtype and
// device (up to kBroadcastCapBytes each) instead of one per tensor. A group of several tensors is
// copied into a flat tensor, broadcast, and copied back on the other ranks: a broadcast is a
// copy, so every rank ends bit for bit with rank 0's values. On NCCL the copies and the broadcast
// are ordered on the streams (wait_on_device), so this also runs under a CUDA graph capture.
#include <string>
#include <vector>

#include "collectives/ddp.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/ops/copy.h"

namespace nd::dist {

std::vector<std::vector<size_t>> plan_broadcasts(const std::vector<Tensor>& tensors, int64_t cap_bytes) {
  ND_CHECK(cap_bytes > 0, "plan_broadcasts: expected a positive cap in bytes, found ", cap_bytes);
  std::vector<std::vector<size_t>> groups;
  std::vector<int64_t> bytes;  // per group
  std::vector<size_t> open;    // the group each dtype and device fills now
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const int64_t size = t.numel() * static_cast<int64_t>(element_size(t.dtype()));
    size_t k = 0;
    while (k < open.size() && (tensors[groups[open[k]][0]].dtype() != t.dtype() ||
                               !(tensors[groups[open[k]][0]].device() == t.device())))
      ++k;
    if (k == open.size() || bytes[open[k]] + size > cap_bytes) {
      if (k == open.size()) open.push_back(0);
      open[k] = groups.size();
      groups.emplace_back();
      bytes.push_back(0);
    }
    groups[open[k]].push_back(i);
    bytes[open[k]] += size;
  }
  return groups;
}

void Reducer::broadcast_state(bool params_too) {
  if (pg_->size() == 1) return;
  CollectivePurpose purpose(std::string(params_too ? "parameters and buffers" : "buffers") + " of DDP model '" +
                            name_ + "' from rank 0");
  NoGradGuard no_grad;
  std::vector<Tensor> states;
  if (params_too) states = params_;
  states.insert(states.end(), buffers_.begin(), buffers_.end());
  for (const Tensor& t : states)
    ND_CHECK(t.is_contiguous(), "DistributedDataParallel '", name_, "': cannot broadcast non-contiguous ",
             t.describe());
  struct Group {
    std::vector<size_t> members;
    Tensor flat;  // undefined for a group of one tensor, broadcast in place
    std::shared_ptr<Work> work;
  };
  // fn(the tensor's view into its group's flat tensor, the tensor), member after member.
  auto each_slot = [&](const Group& g, auto&& fn) {
    int64_t offset = 0;
    for (size_t i : g.members) {
      fn(g.flat.narrow(0, offset, states[i].numel()).view(states[i].sizes()), states[i]);
      offset += states[i].numel();
    }
  };
  std::vector<Group> groups;
  for (std::vector<size_t>& members : plan_broadcasts(states)) {
    Group g{std::move(members), Tensor(), nullptr};
    if (g.members.size() == 1) {
      g.work = pg_->broadcast(states[g.members[0]], 0);
    } else {
      int64_t numel = 0;
      for (size_t i : g.members) numel += states[i].numel();
      g.flat = empty({numel}, states[g.members[0]].options());
      each_slot(g, [](const Tensor& slot, const Tensor& t) { copy_data(slot, t); });
      g.work = pg_->broadcast(g.flat, 0);
    }
    groups.push_back(std::move(g));
  }
  // NCCL: the forward's kernels wait for the broadcasts, the host does not (MPI: blocks).
  for (Group& g : groups) g.work->wait_on_device();
  if (pg_->rank() != 0)
    for (const Group& g : groups)
      if (g.flat.defined()) each_slot(g, [](const Tensor& slot, const Tensor& t) { copy_data(t, slot); });
  if (params_too)
    for (const Tensor& p : params_) p.storage()->bump_version("DistributedDataParallel.broadcast");
  for (const Tensor& b : buffers_) b.storage()->bump_version("DistributedDataParallel.broadcast_buffers");
}

}  // namespace nd::dist
