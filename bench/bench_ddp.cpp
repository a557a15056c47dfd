// DDP step-time benchmark: the MAE (tiny and small) under DistributedDataParallel vs the same
// model with no communication, for several bucket sizes, at whatever world size
// mpirun gives (run it with -np 1, 2, 4). Reports the share of all-reduce time
// hidden behind backward:
//   hidden = 1 - (t_ddp - t_local) / t_comm
// where t_local is a step without communication, t_ddp a DDP step, and t_comm the
// time the same buckets take to all-reduce back to back with nothing to overlap; and,
// less sensitive to other load on the machine, the wait at the end of backward
// (Reducer::last_exposed_wait_ms: communication not yet done when backward finished,
// plus waiting for a slower rank):  hidden_by_wait = 1 - wait / t_comm.
// A second table runs the default buckets with each communication hook (none, bf16, fp16,
// PowerSGD rank 4 from the first step) and reports the bytes every rank all-reduced per
// step (ProcessGroup::record().bytes: payload; a ring all-reduce puts about 2 (W - 1) / W
// times that on each rank's wire), next to the step time, the same step without DDP (timed
// interleaved with it: baseline_ms) and the exposed wait.
// A third table runs the default buckets with AdamW plain and wrapped in a
// ZeroRedundancyOptimizer, stage 1 (DDP all-reduces) and stage 2 (DDP reduce-scatters):
// step time, optimizer state bytes per rank (the largest rank's share with ZeRO) and
// payload bytes issued per step (an all-gather's and a reduce-scatter's payload is all
// ranks' parts: on a ring each puts (W - 1) / W of it on a rank's wire, an all-reduce
// 2 (W - 1) / W of its own).
// A fourth table takes apps/train_gan's step at its defaults (nz 64, ngf = ndf = 32, 64 images
// per rank, Adam; D's backward, D's step, G's backward through D, G's step) with both models
// under DDP, without a hook and with bf16, against the same step without DDP, interleaved.
// A fifth table times the collectives alone (all-reduce, reduce-scatter, all-gather of f32
// buffers, and all-reduce of bf16 ones, from 1 KiB to 16 MiB per rank), the input of bench/scale_model's fit of the
// transport's alpha and bandwidth; "gbps" is NCCL's bus bandwidth (busBw = n / t times
// 2(W-1)/W for all-reduce, (W-1)/W for the others, n the whole buffer).
// Every row with a step without DDP also gives baseline_slowest_ms, the median over steps of
// the slowest rank's step without DDP: what a DDP step, which synchronises the ranks, waits for.
// Output (rank 0): tables, then JSON lines {"op","shape","dtype","impl","ms",...} (json_line.h).
// Usage: OMP_NUM_THREADS=1 mpirun -np N bench_ddp [steps] [buckets|hooks|zero|gan|collectives: one table only]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <omp.h>

#include <nanoddp.h>

#include "json_line.h"

using namespace nd;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ms of one call of fn, started together on every rank.
template <class Fn>
double time_once(Fn&& fn) {
  dist::world()->barrier()->wait();
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The slowest rank's median decides the step time.
double slowest_median(const std::vector<double>& ms) {
  Tensor t = tensor({median(ms)}, kFloat64);
  dist::world()->allreduce(t, {dist::ReduceOp::MAX})->wait();
  return t.item();
}

// The median over steps of each step's slowest rank: what a step synchronised across the ranks
// waits for (above slowest_median by the ranks' skew: at each step another rank may be slowest).
double median_of_slowest(const std::vector<double>& ms) {
  Tensor t = tensor(ms, kFloat64);
  dist::world()->allreduce(t, {dist::ReduceOp::MAX})->wait();
  const double* slowest = t.data_ptr<double>();
  return median(std::vector<double>(slowest, slowest + ms.size()));
}

// The same MAE step without DDP: the baseline each DDP row is timed against, interleaved.
struct LocalMae {
  explicit LocalMae(const std::string& config)
      : model((manual_seed(7), models::MAE(models::MAEConfig::by_name(config)))),
        opt(model->parameters(), optim::AdamWOptions(1e-3)) {}
  void step(const Tensor& images) {
    opt.zero_grad();
    model(images).loss.backward();
    opt.step();
  }
  models::MAE model;
  optim::AdamW opt;
};

// The ZeRO table: MAE under DDP with AdamW, plain and as ZeroRedundancyOptimizer (stage 1, 2).
void zero_table(const Tensor& images, int steps, int per_rank, std::vector<std::string>& json) {
  auto& pg = *dist::world();
  const int W = pg.size();
  const bool root = pg.rank() == 0;
  if (root)
    std::printf("\n%-6s %-6s %10s %16s %14s %8s\n", "model", "optim", "ddp_ms", "state_bytes/rank", "bytes/step",
                "state");
  for (const std::string config : {"tiny", "small"}) {
    double state_plain = 0;
    for (const std::string mode : {"adamw", "zero1", "zero2"}) {
      const bool zero = mode != "adamw";
      manual_seed(7);
      models::MAE model(models::MAEConfig::by_name(config));
      dist::DistributedDataParallel ddp(model, "mae");
      std::unique_ptr<optim::Optimizer> opt;
      if (zero)
        opt = dist::ZeroRedundancyOptimizer::make<optim::AdamW>(
            model->parameters(), optim::AdamWOptions(1e-3),
            dist::ZeroRedundancyOptimizerOptions().ddp(mode == "zero2" ? &ddp.reducer() : nullptr));
      else
        opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions(1e-3));
      auto step = [&] {
        opt->zero_grad();
        ddp(images).loss.backward();
        opt->step();
      };
      for (int i = 0; i < 3; ++i) step();
      const uint64_t bytes_before = pg.record().bytes;
      std::vector<double> ms;
      for (int i = 0; i < steps; ++i) ms.push_back(time_once(step));
      const double bytes = static_cast<double>(pg.record().bytes - bytes_before) / steps;
      const double t = slowest_median(ms);
      Tensor state = tensor({static_cast<double>(opt->state_bytes())}, kFloat64);
      pg.allreduce(state, {dist::ReduceOp::MAX})->wait();
      if (!zero) state_plain = state.item();
      if (!root) continue;
      const double ratio = state.item() / state_plain;
      std::printf("%-6s %-6s %10.2f %16.0f %14.0f %7.3f\n", config.c_str(), mode.c_str(), t, state.item(),
                  bytes, ratio);
      char shape[128];
      std::snprintf(shape, sizeof shape, "mae_%s b%d x%d ranks, %s", config.c_str(), per_rank, W,
                    mode == "adamw" ? "AdamW" : mode == "zero1" ? "ZeRO-1 AdamW" : "ZeRO-2 AdamW");
      json.push_back(bench::JsonLine::row("ddp_zero", shape, "f32", "nanoddp")
                         .number("ms", t, "%.3f")
                         .null("gflops")
                         .null("gbps")
                         .text("baseline", "optimizer state bytes per rank of plain AdamW")
                         .number("ratio", ratio, "%.4f")
                         .number("state_bytes_per_rank", state.item(), "%.0f")
                         .number("bytes_per_step", bytes, "%.0f")
                         .str());
    }
  }
}

// The GAN table: train_gan's step under DDP (hook none or bf16) against the same step alone.
void gan_table(int steps, std::vector<std::string>& json) {
  auto& pg = *dist::world();
  const int W = pg.size(), batch = 64;
  const bool root = pg.rank() == 0;
  if (root) std::printf("\n%-6s %-6s %10s %10s %9s\n", "model", "hook", "local_ms", "ddp_ms", "wait_ms");
  Generator data{2, 0};
  const Tensor real = rand({batch, 1, 28, 28}, kFloat32, &data) * 2.0 - 1.0, z = randn({batch, 64}, kFloat32, &data);
  auto bce = [](const Tensor& logits, double target) {
    return binary_cross_entropy_with_logits(logits, target > 0.5 ? ones_like(logits) : zeros_like(logits));
  };
  // One GAN step of G and D, called through g and d (the modules themselves or their DDP wrappers).
  auto gan_step = [&](auto& g, auto& d, optim::Optimizer& opt_g, optim::Optimizer& opt_d) {
    const Tensor fake = g(z);
    opt_d.zero_grad();
    (bce(d(real), 1.0) + bce(d(fake.detach()), 0.0)).backward();
    opt_d.step();
    opt_g.zero_grad();
    bce(d(fake), 1.0).backward();
    opt_g.step();
  };
  for (const std::string hook : {"none", "bf16"}) {
    manual_seed(7);
    models::DCGANGenerator G(64, 32), G_local(64, 32);
    models::DCGANDiscriminator D(32), D_local(32);
    auto adam = [](nn::Module& m) {
      return optim::Adam(m.parameters(), optim::AdamOptions(2e-4).betas({0.5, 0.999}));
    };
    optim::Adam opt_g = adam(*G), opt_d = adam(*D), opt_g_local = adam(*G_local), opt_d_local = adam(*D_local);
    dist::DistributedDataParallel g(G, "G");
    dist::DistributedDataParallel d(D, "D");
    if (hook == "bf16") {
      g.register_comm_hook(nullptr, dist::bf16_compress_hook);
      d.register_comm_hook(nullptr, dist::bf16_compress_hook);
    }
    auto ddp_step = [&] { gan_step(g, d, opt_g, opt_d); };
    auto local_step = [&] { gan_step(G_local, D_local, opt_g_local, opt_d_local); };
    for (int i = 0; i < 3; ++i) ddp_step(), local_step();
    std::vector<double> ms_ddp, ms_local, ms_wait;
    for (int i = 0; i < steps; ++i) {
      ms_local.push_back(time_once(local_step));
      ms_ddp.push_back(time_once(ddp_step));
      ms_wait.push_back(g.reducer().last_exposed_wait_ms() + d.reducer().last_exposed_wait_ms());
    }
    const double t_local = slowest_median(ms_local), t_ddp = slowest_median(ms_ddp), t_wait = slowest_median(ms_wait);
    const double t_local_max = median_of_slowest(ms_local);
    if (!root) continue;
    std::printf("%-6s %-6s %10.2f %10.2f %9.2f\n", "dcgan", hook.c_str(), t_local, t_ddp, t_wait);
    char shape[128];
    std::snprintf(shape, sizeof shape, "dcgan28 b%d x%d ranks, hook %s", batch, W, hook.c_str());
    json.push_back(bench::JsonLine::row("ddp_gan", shape, "f32", "nanoddp")
                       .number("ms", t_ddp, "%.3f")
                       .null("gflops")
                       .null("gbps")
                       .text("baseline", "same step, no DDP")
                       .number("ratio", t_local / t_ddp, "%.3f")
                       .number("baseline_ms", t_local, "%.3f")
                       .number("baseline_slowest_ms", t_local_max, "%.3f")
                       .number("exposed_wait_ms", t_wait, "%.3f")
                       .str());
  }
}

// The collectives table: each collective of n bytes (the whole buffer) timed alone.
void collectives_table(int steps, std::vector<std::string>& json) {
  auto& pg = *dist::world();
  const int W = pg.size();
  if (W == 1) return;  // nothing to time
  const bool root = pg.rank() == 0;
  if (root) std::printf("\n%-15s %10s %10s %10s\n", "collective", "bytes", "ms", "busbw_GB/s");
  for (const std::string op : {"allreduce", "allreduce_bf16", "reduce_scatter", "allgather"})
    for (int64_t size = 1024; size <= 16 * 1024 * 1024; size *= 4) {
      const ScalarType dtype = op == "allreduce_bf16" ? kBFloat16 : kFloat32;
      const int64_t esize = static_cast<int64_t>(element_size(dtype));
      const int64_t chunk = size / esize / W, n = chunk * W, bytes = esize * n;
      Tensor buffer = zeros({n}, dtype);
      std::vector<Tensor> parts;
      for (int r = 0; r < W; ++r) parts.push_back(buffer.narrow(0, r * chunk, chunk));
      Tensor mine = zeros({chunk});
      auto run = [&] {
        if (op == "allreduce" || op == "allreduce_bf16")
          pg.allreduce(buffer)->wait();
        else if (op == "reduce_scatter")
          pg.reduce_scatter(mine, parts)->wait();
        else
          pg.allgather(parts, mine)->wait();
      };
      for (int i = 0; i < 2; ++i) run();
      std::vector<double> ms;
      for (int i = 0; i < std::max(steps, 5); ++i) ms.push_back(time_once(run));
      const double t = slowest_median(ms);
      const double factor = (op == "reduce_scatter" || op == "allgather" ? 1.0 : 2.0) * (W - 1) / W;
      const double busbw = static_cast<double>(bytes) / (t * 1e-3) * factor / 1e9;
      if (!root) continue;
      std::printf("%-15s %10lld %10.4f %10.3f\n", op.c_str(), static_cast<long long>(bytes), t, busbw);
      char shape[128];
      std::snprintf(shape, sizeof shape, "%s %lld bytes x%d ranks", op.c_str(), static_cast<long long>(bytes), W);
      json.push_back(bench::JsonLine::row("collective", shape, dtype_name(dtype), "nanoddp")
                         .number("ms", t, "%.5f")
                         .null("gflops")
                         .number("gbps", busbw, "%.4f")
                         .null("baseline")
                         .null("ratio")
                         .text("collective", op == "allreduce_bf16" ? "allreduce" : op)
                         .integer("bytes", bytes)
                         .integer("ranks", W)
                         .str());
    }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::printf("usage: OMP_NUM_THREADS=1 mpirun -np N bench_ddp [STEPS] [buckets|hooks|zero]\n"
                "DDP step time of the MAE (tiny, small) against no communication: bucket sizes, communication\n"
                "hooks, ZeRO. STEPS per measurement (default 10); a table name runs that table only.\n");
    return 0;
  }
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  const std::string only = argc > 2 ? argv[2] : "";
  auto runs = [&](const char* table) { return only.empty() || only == table; };
  auto& pg = *dist::world();
  const int W = pg.size(), per_rank = 32;
  const bool root = pg.rank() == 0;
  Generator data{1, 0};
  Tensor images = rand({per_rank, 1, 28, 28}, kFloat32, &data) * 2.0 - 1.0;
  if (root)
    std::printf("bench_ddp: MAE, %d images per rank, %d rank(s), %d thread(s) per rank\n", per_rank, W,
                omp_get_max_threads());
  if (root && runs("buckets")) {
    std::printf("%-6s %-10s %10s %10s %10s %10s %8s %9s %8s\n", "model", "bucket_mb", "local_ms", "ddp_ms",
                "comm_ms", "overhead", "hidden", "wait_ms", "hidden_w");
  }
  std::vector<std::string> json;
  for (const std::string config : {"tiny", "small"})
  for (double cap : {0.25, 1.0, 25.0}) {
    if (!runs("buckets")) break;
    LocalMae local(config);
    auto local_step = [&] { local.step(images); };
    manual_seed(7);
    models::MAE model(models::MAEConfig::by_name(config));
    dist::DistributedDataParallel ddp(model, "mae", dist::DistributedDataParallelOptions().bucket_cap_mb(cap).first_bucket_cap_mb(std::min(cap, 1.0)));
    optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-3));
    auto ddp_step = [&] {
      opt.zero_grad();
      ddp(images).loss.backward();
      opt.step();
    };
    // The same buckets, all-reduced back to back: communication with nothing to hide behind.
    std::vector<Tensor> flats;
    for (const auto& names : ddp.reducer().bucket_parameter_names()) {
      int64_t n = 0;
      for (const auto& [pname, p] : model->named_parameters())
        if (std::find(names.begin(), names.end(), pname) != names.end()) n += p.numel();
      flats.push_back(zeros({n}));
    }
    int64_t total = 0;
    for (const Tensor& f : flats) total += f.numel();
    ND_CHECK(total == [&] {
      int64_t n = 0;
      for (const Tensor& p : model->parameters()) n += p.numel();
      return n;
    }(), "bench_ddp: bucket sizes do not add up to the model's parameters");
    auto comm_step = [&] {
      std::vector<std::shared_ptr<dist::Work>> works;
      for (const Tensor& f : flats) works.push_back(pg.allreduce(f));
      for (auto& w : works) w->wait();
    };
    for (int i = 0; i < 3; ++i) {  // warm-up (the first DDP step also rebuilds buckets)
      local_step();
      ddp_step();
      comm_step();
    }
    // Interleaved, so that load from other processes hits all three alike.
    std::vector<double> ms_local, ms_ddp, ms_comm, ms_wait;
    for (int i = 0; i < steps; ++i) {
      ms_local.push_back(time_once(local_step));
      ms_ddp.push_back(time_once(ddp_step));
      ms_wait.push_back(ddp.reducer().last_exposed_wait_ms());
      ms_comm.push_back(time_once(comm_step));
    }
    const double t_local = slowest_median(ms_local), t_ddp = slowest_median(ms_ddp), t_comm = slowest_median(ms_comm);
    const double t_wait = slowest_median(ms_wait), t_local_max = median_of_slowest(ms_local);
    const double hidden_by_wait = W == 1 ? 1.0 : std::clamp(1.0 - t_wait / t_comm, 0.0, 1.0);
    const double hidden = W == 1 ? 1.0 : std::clamp(1.0 - (t_ddp - t_local) / t_comm, 0.0, 1.0);
    if (root) {
      std::printf("%-6s %-10g %10.2f %10.2f %10.2f %9.1f%% %7.0f%% %9.2f %7.0f%%\n", config.c_str(), cap, t_local,
                  t_ddp, t_comm, 100.0 * (t_ddp - t_local) / t_local, 100.0 * hidden, t_wait, 100.0 * hidden_by_wait);
      char shape[128];
      std::snprintf(shape, sizeof shape, "mae_%s b%d x%d ranks, bucket %gMB, %zu buckets", config.c_str(), per_rank, W,
                    cap, flats.size());
      json.push_back(bench::JsonLine::row("ddp_step", shape, "f32", "nanoddp")
                         .number("ms", t_ddp, "%.3f")
                         .null("gflops")
                         .null("gbps")
                         .text("baseline", "same model, no communication")
                         .number("ratio", t_local / t_ddp, "%.3f")
                         .number("baseline_ms", t_local, "%.3f")
                         .number("baseline_slowest_ms", t_local_max, "%.3f")
                         .number("comm_ms", t_comm, "%.3f")
                         .number("hidden", hidden, "%.3f")
                         .number("exposed_wait_ms", t_wait, "%.3f")
                         .number("hidden_by_wait", hidden_by_wait, "%.3f")
                         .str());
    }
  }
  if (root && runs("hooks"))
    std::printf("\n%-6s %-9s %10s %10s %9s %14s %8s\n", "model", "hook", "local_ms", "ddp_ms", "wait_ms", "bytes/step",
                "ratio");
  for (const std::string config : {"tiny", "small"}) {
    if (!runs("hooks")) break;
    double bytes_none = 0;
    for (const std::string hook : {"none", "bf16", "fp16", "powersgd"}) {
      manual_seed(7);
      models::MAE model(models::MAEConfig::by_name(config));
      dist::DistributedDataParallel ddp(model, "mae");
      if (hook == "bf16") ddp.register_comm_hook(nullptr, dist::bf16_compress_hook);
      if (hook == "fp16") ddp.register_comm_hook(nullptr, dist::fp16_compress_hook);
      if (hook == "powersgd")
        ddp.register_comm_hook(std::make_shared<dist::PowerSGDState>(
                                   dist::PowerSGDOptions().matrix_approximation_rank(4).start_powerSGD_iter(0)),
                               dist::powerSGD_hook);
      optim::AdamW opt(model->parameters(), optim::AdamWOptions(1e-3));
      auto ddp_step = [&] {
        opt.zero_grad();
        ddp(images).loss.backward();
        opt.step();
      };
      LocalMae local(config);
      for (int i = 0; i < 3; ++i) ddp_step(), local.step(images);
      const uint64_t bytes_before = ddp.reducer().process_group().record().bytes;
      std::vector<double> ms, wait, ms_local;
      for (int i = 0; i < steps; ++i) {  // interleaved, as in the buckets table
        ms_local.push_back(time_once([&] { local.step(images); }));
        ms.push_back(time_once(ddp_step));
        wait.push_back(ddp.reducer().last_exposed_wait_ms());
      }
      const double bytes = static_cast<double>(ddp.reducer().process_group().record().bytes - bytes_before) / steps;
      if (hook == "none") bytes_none = bytes;
      const double t_ddp = slowest_median(ms), t_wait = slowest_median(wait), t_local = slowest_median(ms_local);
      const double t_local_max = median_of_slowest(ms_local);
      if (!root) continue;
      const double ratio = bytes_none > 0 ? bytes / bytes_none : 1.0;
      std::printf("%-6s %-9s %10.2f %10.2f %9.2f %14.0f %7.3f\n", config.c_str(), hook.c_str(), t_local, t_ddp, t_wait,
                  bytes, ratio);
      char shape[128];
      std::snprintf(shape, sizeof shape, "mae_%s b%d x%d ranks, hook %s", config.c_str(), per_rank, W, hook.c_str());
      json.push_back(bench::JsonLine::row("ddp_comm_hook", shape, "f32", "nanoddp")
                         .number("ms", t_ddp, "%.3f")
                         .null("gflops")
                         .null("gbps")
                         .text("baseline", "bytes of the same step without a hook")
                         .number("ratio", ratio, "%.4f")
                         .number("bytes_per_step", bytes, "%.0f")
                         .number("baseline_ms", t_local, "%.3f")
                         .number("baseline_slowest_ms", t_local_max, "%.3f")
                         .number("exposed_wait_ms", t_wait, "%.3f")
                         .str());
    }
  }
  if (runs("zero")) zero_table(images, steps, per_rank, json);
  if (runs("gan")) gan_table(steps, json);
  if (runs("collectives")) collectives_table(steps, json);
  for (const auto& line : json) std::printf("%s\n", line.c_str());
  return 0;
}
