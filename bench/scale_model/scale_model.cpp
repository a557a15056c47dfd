// scale_model: what 1 to 4096 GPUs buy for one of our models under DDP, predicted from the
// Reducer's real bucket plan, a CPU profile of the step (when each gradient becomes ready),
// and the alpha-beta costs of NCCL's collectives on an interconnect (collective_cost.h).
// Prints a table, JSON lines (json_line.h), and with --png a plot of scaling efficiency
// (step time on 1 GPU / step time on p GPUs, the batch per GPU fixed) against p, one curve
// per option set. `--fit ROWS.jsonl` instead fits a transport's alpha and bandwidth to
// bench_ddp's collective rows. Usage: scale_model --help.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "common/flags.h"
#include "common/png.h"
#include "common/run.h"
#include "json_line.h"
#include "scale_model/hook_cost.h"

using namespace nd;
using namespace nd::scale;

namespace {

// --precision's and --ready's values, in the order of their names.
enum class Precision { kF32, kBf16 };
const std::vector<std::string> kPrecisions{"f32", "bf16"};
enum class Ready { kProfile, kBytes };
enum class HookCostFrom { kMemory, kMeasured };

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

double number(const std::string& s, const std::string& flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || !(v >= 0)) throw app::UsageError{flag + " expects numbers >= 0, found '" + s + "'"};
  return v;
}

// The value of "key" in one of our flat JSON lines: a number or a string ("" when absent).
std::string field(const std::string& line, const std::string& key) {
  const std::string tag = "\"" + key + "\":";
  const size_t at = line.find(tag);
  if (at == std::string::npos) return "";
  size_t b = at + tag.size();
  if (b < line.size() && line[b] == '"') return line.substr(b + 1, line.find('"', b + 1) - b - 1);
  return line.substr(b, line.find_first_of(",}", b) - b);
}

// Fits the ring model to bench_ddp's f32 collective rows in `path` of at most max_bytes (the
// median of repeated rows): the
// all-reduces alone (what DDP's buckets are) and all three collectives; prints both and each
// sample against the all-reduce fit.
int fit_main(const std::string& path, double max_bytes) {
  std::ifstream in(path);
  ND_CHECK(in.good(), "cannot read ", path);
  // Repeated runs: the median time per (collective, ranks, bytes), so that a run disturbed by
  // other load does not pull the fit.
  std::map<std::tuple<std::string, int, double>, std::vector<double>> runs;
  for (std::string line; std::getline(in, line);) {
    if (field(line, "op") != "collective" || field(line, "dtype") != "f32") continue;
    const double bytes = std::stod(field(line, "bytes"));
    if (bytes <= max_bytes)
      runs[{field(line, "collective"), std::stoi(field(line, "ranks")), bytes}].push_back(std::stod(field(line, "ms")));
  }
  std::vector<Sample> all, allreduces;
  for (auto& [key, ms] : runs) {
    std::sort(ms.begin(), ms.end());
    const Sample s{std::get<0>(key), std::get<2>(key), std::get<1>(key), ms[ms.size() / 2] * 1e-3};
    all.push_back(s);
    if (s.op == "allreduce") allreduces.push_back(s);
  }
  ND_CHECK(!allreduces.empty(), "no all-reduce rows ({\"op\":\"collective\",...}, bench_ddp's ",
           "collectives table) of at most ", max_bytes, " bytes in ", path);
  const Fit fit = fit_link(allreduces), both = fit_link(all);
  std::printf("fit of %zu all-reduces (of at most %.0f bytes) from %s: alpha %.2f us per step, bandwidth %.3f GB/s, "
              "rms relative error %.1f%%\n",
              allreduces.size(), max_bytes, path.c_str(), fit.link.alpha * 1e6, fit.link.bandwidth / 1e9,
              100 * fit.rms_relative_error);
  std::printf("fit of all %zu collectives: alpha %.2f us, bandwidth %.3f GB/s, rms relative error %.1f%%\n", all.size(),
              both.link.alpha * 1e6, both.link.bandwidth / 1e9, 100 * both.rms_relative_error);
  Fabric one_node;
  one_node.intra = fit.link;
  one_node.gpus_per_node = 1 << 30;
  std::printf("%-15s %6s %10s %11s %11s %7s\n", "collective", "ranks", "bytes", "measured_ms", "fitted_ms", "error");
  for (const Sample& s : all) {
    const double t = s.op == "allreduce" ? ring_allreduce(s.bytes, s.ranks, one_node)
                                         : reduce_scatter(s.bytes, s.ranks, one_node, Algorithm::kRing);
    std::printf("%-15s %6d %10.0f %11.4f %11.4f %6.1f%%\n", s.op.c_str(), s.ranks, s.bytes, s.seconds * 1e3, t * 1e3,
                100 * (t / s.seconds - 1));
  }
  bench::JsonLine::row("scale_model_fit", path + " allreduce", "f32", "model")
      .number("ms", fit.link.alpha * 1e3, "%.6f")
      .null("gflops")
      .number("gbps", fit.link.bandwidth / 1e9, "%.4f")
      .text("baseline", "bench_ddp collective rows")
      .number("ratio", fit.rms_relative_error, "%.4f")
      .print();
  return 0;
}

// Every combination of the comma lists: one option set (one curve) each.
std::vector<Options> option_sets(const std::string& caps, double first_cap, const std::string& hooks,
                                 const std::string& zeros, const std::string& buffers, ScalarType dtype) {
  std::vector<Options> sets;
  for (const std::string& cap : split(caps))
    for (const std::string& hook : split(hooks))
      for (const std::string& zero : split(zeros))
        for (const std::string& broadcast : split(buffers)) {
          Options o;
          o.bucket_cap_mb = number(cap, "--bucket-cap-mb");
          if (o.bucket_cap_mb <= 0) throw app::UsageError{"--bucket-cap-mb expects values > 0, found '" + cap + "'"};
          o.first_bucket_cap_mb = first_cap;
          parse_hook(hook, o);
          if (zero != "0" && zero != "1" && zero != "2")
            throw app::UsageError{"--zero expects 0, 1 or 2, found '" + zero + "'"};
          o.zero = zero[0] - '0';
          if (broadcast != "on" && broadcast != "off")
            throw app::UsageError{"--broadcast-buffers expects on or off, found '" + broadcast + "'"};
          o.broadcast_buffers = broadcast == "on";
          o.grad_dtype = dtype;
          sets.push_back(o);
        }
  return sets;
}

}  // namespace

int main(int argc, char** argv) {
  return app::run_main("scale_model", [&] {
    std::string model = "mae-tiny", caps = "25", hooks = "none", zeros = "0", fabric_name = "ib400",
                algorithm_name_ = "best", gpus_list = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096", png, fit,
                buffers = "on";
    Precision precision = Precision::kF32;
    Ready ready = Ready::kProfile;
    HookCostFrom hook_cost = HookCostFrom::kMemory;
    int64_t batch = 0, profile_batch = 0, profile_steps = 5, gpus_per_node = 0;
    double step_ms = 0, backward_ms = 0, skew_ms = 0, memory_gbs = 3350, fit_max_bytes = 1e18, first_cap = 1,
           backward_fraction = 2.0 / 3;
    app::Flags flags("scale_model",
                     "Predicts DDP step time, hidden communication and scaling efficiency at 1 to 4096 GPUs from the "
                     "Reducer's bucket plan, a CPU profile of the step and NCCL's collective costs.\nInterconnects:\n" +
                         fabric_presets_text());
    flags.add("--model", &model, workload_names(), "NAME");
    flags.add("--batch", &batch, "images per GPU (0: the app's default, 64 / 128)", 0);
    flags.add("--bucket-cap-mb", &caps, "bucket_cap_mb values, comma-separated (one curve each)", "LIST");
    flags.add("--first-bucket-cap-mb", &first_cap, "first_bucket_cap_mb");
    flags.add("--hook", &hooks, "comm hooks, comma-separated: none, bf16, fp16, powersgd:RANK", "LIST");
    flags.add("--zero", &zeros, "ZeRO stages, comma-separated: 0 (off), 1, 2", "LIST");
    flags.add("--broadcast-buffers", &buffers, "on, off or on,off: DDP's broadcast_buffers", "LIST");
    flags.add_choice("--precision", &precision, kPrecisions, "gradient dtype: f32 or bf16", "DTYPE");
    flags.add("--fabric", &fabric_name, "interconnect presets (above), comma-separated", "LIST");
    flags.add("--gpus-per-node", &gpus_per_node, "ranks per node (0: the preset's)", 0);
    flags.add("--algorithm", &algorithm_name_, "ring, tree, hierarchical or best (NCCL's tuner: the fastest)", "NAME");
    flags.add("--gpus", &gpus_list, "GPU counts, comma-separated", "LIST");
    flags.add("--step-ms", &step_ms, "one GPU's step time: the CPU profile is scaled to it");
    flags.add("--backward-ms", &backward_ms, "one GPU's backward time(s) in all: the profile is scaled to it");
    flags.add("--backward-fraction", &backward_fraction,
              "shapes: models (no step to profile): the backward's share of the step");
    flags.add_choice("--ready", &ready, {"profile", "bytes"},
                     "profile: gradients ready when measured; bytes: spread over each backward by bytes", "HOW");
    flags.add("--memory-gbs", &memory_gbs, "device memory bandwidth for the hooks' element-wise work (GB/s)");
    flags.add_choice("--hook-cost", &hook_cost, {"memory", "measured"},
                     "the hooks' compute: memory traffic over --memory-gbs, or the library's hooks timed on this CPU "
                     "per bucket (scaled by --step-ms as the profile is)", "HOW");
    flags.add("--skew-ms", &skew_ms, "how long a DDP step waits for the slowest rank beyond the typical step "
              "(bench_ddp: baseline_slowest_ms - baseline_ms)");
    flags.add("--profile-steps", &profile_steps, "CPU steps profiled (medians)");
    flags.add("--profile-batch", &profile_batch, "images per CPU profile step (0: --batch); for the ViT configs", 0);
    flags.add("--png", &png, "write the efficiency plot here", "PATH");
    flags.add("--fit", &fit, "fit alpha and bandwidth to bench_ddp's collective rows in this file, then exit", "PATH");
    flags.add("--fit-max-bytes", &fit_max_bytes, "--fit: leave out collectives larger than this");
    flags.parse(argc, argv);
    if (!fit.empty()) return fit_main(fit, fit_max_bytes);
    if (flags.given("--step-ms") && flags.given("--backward-ms"))
      throw app::UsageError{"give --step-ms or --backward-ms, not both"};
    std::vector<Fabric> fabrics;
    for (const std::string& name : split(fabric_name)) {
      fabrics.push_back(fabric_preset(name));
      if (gpus_per_node > 0) fabrics.back().gpus_per_node = static_cast<int>(gpus_per_node);
    }
    const Algorithm algorithm = algorithm_by_name(algorithm_name_);
    const std::vector<Options> sets =
        option_sets(caps, first_cap, hooks, zeros, buffers, precision == Precision::kBf16 ? kBFloat16 : kFloat32);
    std::vector<int> gpus;
    for (const std::string& g : split(gpus_list)) {
      const double v = number(g, "--gpus");
      if (v < 1 || v != static_cast<int>(v)) throw app::UsageError{"--gpus expects whole numbers >= 1, found '" + g + "'"};
      gpus.push_back(static_cast<int>(v));
    }
    if (sets.empty() || gpus.empty() || fabrics.empty()) throw app::UsageError{"nothing to predict: empty option list"};

    Workload w = make_workload(model, batch, profile_batch);
    if (!w.step && step_ms <= 0 && backward_ms <= 0)
      throw app::UsageError{"--model " + model + " has no step to profile: give --step-ms or --backward-ms"};
    Profile profile =
        w.step ? profile_workload(w, static_cast<int>(profile_steps)) : synthetic_profile(w, backward_fraction);
    if (ready == Ready::kBytes) spread_ready_by_bytes(profile, w);
    double cpu_backward = 0;
    for (const Profile::Backward& b : profile.backwards) cpu_backward += b.end - b.start;
    DeviceModel device;
    device.memory_bandwidth = memory_gbs * 1e9;
    device.rank_skew = skew_ms * 1e-3;
    if (hook_cost == HookCostFrom::kMeasured) device.hook_cost = MeasuredHookCosts();
    device.time_scale = step_ms > 0 ? step_ms * 1e-3 / profile.step : backward_ms > 0 ? backward_ms * 1e-3 / cpu_backward : 1;
    std::printf("scale_model: %s, batch %lld per GPU, %s gradients; CPU profile (batch %lld): step %.2f ms, backward "
                "%.2f ms (%zu backward(s)); times x %.4g; all-reduce %s\n",
                model.c_str(), static_cast<long long>(w.batch), kPrecisions[static_cast<size_t>(precision)].c_str(),
                static_cast<long long>(profile_batch > 0 ? profile_batch : w.batch), profile.step * 1e3,
                cpu_backward * 1e3, profile.backwards.size(), device.time_scale, algorithm_name(algorithm));
    for (size_t m = 0; m < w.models.size(); ++m) {
      int64_t numel = 0;
      for (const Tensor& p : w.models[m].params) numel += p.numel();
      std::printf("  %s: %lld parameters\n", w.models[m].name.c_str(), static_cast<long long>(numel));
    }
    std::printf("%-44s %6s %6s %10s %10s %10s %10s %10s %7s %6s\n", "fabric: options", "gpus", "nodes", "step_ms",
                "compute_ms", "comm_ms", "hook_ms", "exposed_ms", "hidden", "eff");
    std::vector<app::Series> curves;
    std::vector<std::string> json;
    for (const Fabric& fabric : fabrics)
      for (const Options& o : sets) {
        const double t1 = predict(w, profile, o, device, fabric, 1, algorithm).step;
        const std::string label = fabric.name + ": " + o.label();
        curves.push_back({fabrics.size() > 1 ? label : o.label(), {}});
        for (int p : gpus) {
          const StepResult r = predict(w, profile, o, device, fabric, p, algorithm);
          const double eff = t1 / r.step, hidden = r.comm > 0 ? r.hidden / r.comm : 1.0;
          const int nodes = (p + fabric.gpus_per_node - 1) / fabric.gpus_per_node;
          std::printf("%-44s %6d %6d %10.3f %10.3f %10.3f %10.3f %10.3f %6.0f%% %6.3f\n", label.c_str(), p, nodes,
                      r.step * 1e3, (r.step - r.exposed) * 1e3, r.comm * 1e3, r.hook * 1e3, r.exposed * 1e3,
                      100 * hidden, eff);
          curves.back().points.emplace_back(p, eff);
          char shape[256];
          std::snprintf(shape, sizeof shape, "%s b%lld %s, %s x%d GPUs", model.c_str(),
                        static_cast<long long>(w.batch), fabric.name.c_str(), o.label().c_str(), p);
          json.push_back(bench::JsonLine::row("scale_model", shape, kPrecisions[static_cast<size_t>(precision)], "model")
                             .number("ms", r.step * 1e3, "%.4f")
                             .null("gflops")
                             .null("gbps")
                             .text("baseline", "the same step on 1 GPU, no communication")
                             .number("ratio", eff, "%.4f")
                             .integer("gpus", p)
                             .number("comm_ms", r.comm * 1e3, "%.4f")
                             .number("hook_ms", r.hook * 1e3, "%.4f")
                             .number("exposed_ms", r.exposed * 1e3, "%.4f")
                             .number("hidden", hidden, "%.4f")
                             .str());
        }
      }
    for (const std::string& line : json) std::printf("%s\n", line.c_str());
    if (!png.empty()) {
      app::write_png(png, app::plot_lines("scaling efficiency: " + model + (fabrics.size() > 1 ? "" : " on " + fabric_name),
                                          curves, "gpus", true));
      std::printf("wrote %s\n", png.c_str());
    }
    return 0;
  });
}
