#include "scale_model/predict.h"

#include <algorithm>
#include <map>

namespace nd::scale {

std::string Options::label() const {
  char cap[32];
  std::snprintf(cap, sizeof cap, "%g", bucket_cap_mb);
  std::string s = std::string("bucket ") + cap + "MB";
  if (first_bucket_cap_mb != 1) {
    std::snprintf(cap, sizeof cap, "%g", first_bucket_cap_mb);
    s += std::string(" (first ") + cap + "MB)";
  }
  if (hook != "none") s += ", " + (hook == "powersgd" ? "powersgd " + std::to_string(powersgd_rank) : hook);
  if (zero > 0) s += ", zero " + std::to_string(zero);
  if (grad_dtype != kFloat32) s += std::string(", ") + dtype_name(grad_dtype) + " grads";
  if (!broadcast_buffers) s += ", no buffer broadcast";
  return s;
}

void parse_hook(const std::string& spec, Options& o) {
  if (spec == "none" || spec == "bf16" || spec == "fp16") {
    o.hook = spec;
    return;
  }
  if (spec.rfind("powersgd:", 0) == 0) {
    const std::string r = spec.substr(9);
    if (!r.empty() && r.size() < 6 && std::all_of(r.begin(), r.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
        std::stoi(r) >= 1) {
      o.hook = "powersgd";
      o.powersgd_rank = std::stoi(r);
      return;
    }
  }
  throw Error("unknown comm hook '" + spec + "': expected none, bf16, fp16 or powersgd:RANK (RANK >= 1)");
}

namespace {

// What one bucket sends, in elements: as a whole, or PowerSGD's plain part, P and Q.
struct BucketSize {
  double elements = 0, plain = 0, p = 0, q = 0, compressed = 0;
};

BucketSize bucket_size(const std::vector<Tensor>& params, const std::vector<size_t>& members, int rank) {
  BucketSize s;
  for (size_t i : members) {
    const Tensor& g = params[i];
    const double numel = static_cast<double>(g.numel());
    s.elements += numel;
    if (rank == 0 || g.dim() <= 1 || g.numel() == 0) {
      s.plain += numel;
      continue;
    }
    const double a = static_cast<double>(g.size(0)), b = numel / a;
    const double r = std::min({a, b, static_cast<double>(rank)});
    if ((a + b) * r * 2 >= a * b) {  // min_compression_rate 2, PowerSGD's default
      s.plain += numel;
      continue;
    }
    s.p += a * r;
    s.q += b * r;
    s.compressed += numel;
  }
  return s;
}

}  // namespace

StepResult predict(const Workload& w, const Profile& profile, const Options& o, const DeviceModel& device,
                   const Fabric& fabric, int gpus, Algorithm algorithm) {
  ND_CHECK(gpus >= 1, "predict: expected at least 1 GPU, found ", gpus);
  ND_CHECK(!(o.zero == 2 && o.hook != "none"), "ZeRO stage 2 refuses a communication hook (",
           o.hook, "), as ZeroRedundancyOptimizer does");
  const double p = gpus;
  // ZeRO: each optimizer step shrinks to 1/p; later times move up by what earlier steps saved.
  auto at = [&](double t) {
    double saved = 0;
    if (o.zero > 0)
      for (const auto& [a, b] : profile.optimizer)
        if (b <= t) saved += (b - a) * (1 - 1 / p);
    return (t - saved) * device.time_scale;
  };
  StepInput in;
  in.compute = at(profile.step);
  in.overlap = fabric.overlaps_compute;
  if (gpus == 1) return simulate_step(in);  // one process: DDP communicates nothing
  in.skew = device.rank_skew;

  const double e = static_cast<double>(element_size(o.grad_dtype));
  auto ar = [&](double bytes) { return allreduce(bytes, gpus, fabric, algorithm); };
  auto memory = [&](double bytes) { return bytes / device.memory_bandwidth; };
  std::map<size_t, std::vector<std::vector<size_t>>> plans;
  for (size_t m = 0; m < w.models.size(); ++m) {
    plans[m] = bucket_plan(w, profile, m, o.bucket_cap_mb, o.first_bucket_cap_mb, o.grad_dtype);
    if (o.zero > 0) {
      double bytes = 0;
      for (const Tensor& t : w.models[m].params) bytes += static_cast<double>(t.numel()) * e;
      in.after += all_gather(bytes, gpus, fabric, algorithm);
    }
  }
  for (const Profile::Backward& pb : profile.backwards) {
    Backward b{at(pb.start), at(pb.end), {}};
    std::vector<size_t> reached;
    std::map<std::pair<size_t, size_t>, double> ready;
    for (const Profile::Ready& r : pb.ready) {
      if (std::find(reached.begin(), reached.end(), r.model) == reached.end()) reached.push_back(r.model);
      ready[{r.model, r.param}] = at(r.at);
    }
    for (size_t m : reached) {
      const DdpModel& model = w.models[m];
      in.before += ar(32);  // the per-iteration fingerprint
      if (o.broadcast_buffers)  // as the Reducer: one broadcast per dtype (dist::plan_broadcasts)
        for (const std::vector<size_t>& group : dist::plan_broadcasts(model.buffers)) {
          double bytes = 0;
          for (size_t i : group)
            bytes += static_cast<double>(model.buffers[i].numel()) * element_size(model.buffers[i].dtype());
          in.before += broadcast(bytes, gpus, fabric);
        }
      const std::vector<std::vector<size_t>>& plan = plans[m];
      const double status = (static_cast<double>(model.params.size()) + 1) * e;
      std::vector<BucketComm> buckets;
      for (size_t k = 0; k < plan.size(); ++k) {
        BucketComm c;
        c.ready = b.start;
        for (size_t i : plan[k]) {
          auto it = ready.find({m, i});
          c.ready = std::max(c.ready, it == ready.end() ? b.end : it->second);
        }
        const bool last = k + 1 == plan.size();
        const BucketSize s = bucket_size(model.params, plan[k], o.hook == "powersgd" ? o.powersgd_rank : 0);
        HookCost hook;
        if (o.hook != "none" && device.hook_cost) {
          hook = device.hook_cost(model, plan[k], o);  // CPU seconds, as the profile's
          hook = {hook.launch * device.time_scale, hook.wait * device.time_scale};
        }
        if (o.hook == "bf16" || o.hook == "fp16") {
          if (!device.hook_cost) hook = {memory(14 * s.elements), memory(6 * s.elements)};
          c.first = ar(s.elements * std::min(e, 2.0)) + (last ? ar(status) : 0);
        } else if (o.hook == "powersgd") {
          const double r = o.powersgd_rank;
          if (!device.hook_cost) hook = {memory(16 * s.compressed), memory(28 * s.compressed + 12 * r * (s.p + s.q))};
          c.first = ar(s.plain * e) + ar(s.p * e) + (last ? ar(status) : 0);
          c.second = ar(s.q * e);
        } else if (o.zero == 2) {
          c.first = reduce_scatter(s.elements * e, gpus, fabric, algorithm) + (last ? ar(status) : 0);
          in.after += memory(2 * s.elements * e);  // the averaged chunk copied into the gradients
        } else {
          c.first = ar(s.elements * e + (last ? status : 0));
          in.after += memory(2 * s.elements * e);  // the sum divided by the world size
        }
        c.launch_compute = hook.launch;
        c.wait_compute = hook.wait;
        buckets.push_back(c);
      }
      b.models.push_back(std::move(buckets));
    }
    in.backwards.push_back(std::move(b));
  }
  return simulate_step(in);
}

}  // namespace nd::scale
