// Training-step benchmark: one full step (forward, backward, optimizer step) of the two
// models the apps train, timed end to end, against the GEMM rate of the same machine.
//   dcgan  exactly apps/train_gan's step at its defaults (nz 64, ngf = ndf = 32, batch 64,
//          Adam lr 2e-4 betas (0.5, 0.999)): fake = G(z); D step on
//          bce(D(real), 1) + bce(D(fake.detach()), 0); G step on bce(D(fake), 1).
//   mae    exactly apps/train_mae's step with the tiny model (batch 128, AdamW betas
//          (0.9, 0.95), weight decay 0.05): loss = MAE(images, noise); backward; step.
// Left out of the timed step, as app bookkeeping rather than training: loading the batch
// (a fixed random batch stands in), the update-norm metric, logging, the LR schedule,
// and DDP (one rank; bench_ddp measures its overhead). The losses are read with item()
// as the apps do; on CUDA the step ends with a device synchronize.
//
// Model FLOPs per step are counted analytically from the layer shapes (GEMM FLOPs only:
// conv, conv_transpose, linear, attention; BatchNorm, activations, losses and the
// optimizer are not counted). A training pass is 3x its forward: backward runs two GEMMs
// per forward GEMM (input and weight gradients; attention: dQ/dK and dV/dP). The one
// input gradient that is not needed (the first layer's, on data) is counted anyway, the
// usual "6 N" convention. The rate is compared with a large sgemm measured in the same
// run (bare Eigen and our matmul, same thread count; on CUDA: our matmul = cuBLAS).
// The PyTorch twin of this file is bench/bench_train_torch.py (same rows, impl "pytorch").
//
// Output: a table, then JSON lines (json_line.h) {"op","shape","dtype","impl","ms","gflops","gbps",
// "baseline","ratio"} plus "model","device","threads","ms_min","ms_max","runs" (timed runs)
// and, for steps, "steps_per_s","images_per_s","gflop_per_step". ms is the median; ratio = achieved
// GFLOP/s / the baseline GEMM's GFLOP/s. Rows that cannot run say why ("skipped: ...",
// "no CUDA kernel yet: ...") with ms null.
// --amp bf16|f16: the step under AutocastGuard(device, true, dtype) as the apps' --amp
// (--amp-dtype f16 adds their GradScaler: scale(loss).backward(), scaler.step, update());
// the step rows then have that dtype (the sgemm rows stay f32). bench_train_torch.py --amp
// is the same under torch.autocast and torch.amp.GradScaler.
// --batch N: N images per step instead of the apps' batch; a small batch (1, 2) makes the
// step mostly per-op host work (dispatch, autograd, allocation), which on a GPU is what
// the kernels of a small model wait behind.
// --anomaly on: the step under autograd::DetectAnomalyGuard (engine/anomaly_mode.h), impl
// "nanoddp+anomaly": every op records its call site and checks its outputs for NaN/inf,
// every backward node its gradients. Its cost, and the cost of the switch when off, are in
// bench/RESULTS.md ("Anomaly mode").
// Usage: bench_train [--steps N] [--warmup N] [--threads N] [--gemm N] [--device cpu|cuda|all]
//                    [--model dcgan|mae|all] [--amp f32|bf16|f16] [--batch N] [--anomaly off|on]
// GCC 12 false positives inside Eigen's AVX-512 code (see kernels/cpu/matmul.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Core>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nanoddp.h>

#include "kernels/cpu/matmul.h"
#include "json_line.h"
#include "kernels/cuda/stream.h"

namespace {

using nd::Tensor;
using Clock = std::chrono::steady_clock;

struct Options {
  int steps = 20, warmup = 3, threads = 0;  // threads 0: OpenMP's default (OMP_NUM_THREADS)
  int64_t gemm = 1024;                       // M = N = K of the reference sgemm (CUDA: 4x)
  std::string device = "all", model = "all";
  std::string amp = "f32";  // f32 (off), bf16 or f16
  int64_t batch = 0;        // images per step; 0: the app's default (DCGAN 64, MAE 128)
  bool anomaly = false;     // --anomaly on: steps under DetectAnomalyGuard
};

// The step's precision: --amp's AutocastGuard and, for f16, the GradScaler's options.
struct Precision {
  bool on = false;
  nd::ScalarType dtype = nd::kBFloat16;
  explicit Precision(const std::string& amp) : on(amp != "f32"), dtype(amp == "f16" ? nd::kFloat16 : nd::kBFloat16) {}
  nd::optim::GradScalerOptions scaler() const {
    return nd::optim::GradScalerOptions().enabled(on && dtype == nd::kFloat16);
  }
};

// ---- FLOP counting (forward; multiply a training pass by 3, see the top) ---------------
// conv2d: every output pixel is a dot product of length C_in kH kW.
double conv2d_flops(int64_t n, int64_t c_in, int64_t c_out, int64_t k, int64_t out_hw) {
  return 2.0 * n * c_out * out_hw * out_hw * c_in * k * k;
}
// conv_transpose2d: every input pixel scatters C_out kH kW products (conv2d's dgrad).
double conv_transpose2d_flops(int64_t n, int64_t c_in, int64_t c_out, int64_t k, int64_t in_hw) {
  return 2.0 * n * c_in * in_hw * in_hw * c_out * k * k;
}
double linear_flops(int64_t rows, int64_t in, int64_t out) { return 2.0 * rows * in * out; }
// S = Q K^T and O = P V over all heads: 2 * 2 * n * seq^2 * dim (dim = heads * head_dim).
double attention_flops(int64_t n, int64_t seq, int64_t dim) { return 4.0 * n * seq * seq * dim; }

double dcgan_generator_flops(int64_t n, int64_t nz, int64_t ngf) {
  return conv_transpose2d_flops(n, nz, 2 * ngf, 7, 1) + conv_transpose2d_flops(n, 2 * ngf, ngf, 4, 7) +
         conv_transpose2d_flops(n, ngf, 1, 4, 14);
}
double dcgan_discriminator_flops(int64_t n, int64_t ndf) {
  return conv2d_flops(n, 1, ndf, 4, 14) + conv2d_flops(n, ndf, 2 * ndf, 4, 7) + conv2d_flops(n, 2 * ndf, 1, 7, 1);
}
// One train_gan step: G forward once, D forward three times (real, fake.detach(), fake),
// each pass with its backward.
double dcgan_step_flops(int64_t n, int64_t nz, int64_t ngf, int64_t ndf) {
  return 3.0 * (dcgan_generator_flops(n, nz, ngf) + 3.0 * dcgan_discriminator_flops(n, ndf));
}

// Pre-LN block on [n, seq, dim]: qkv, attention, out_proj, the two MLP linears.
double transformer_block_flops(int64_t n, int64_t seq, int64_t dim, double mlp_ratio) {
  const int64_t rows = n * seq, hidden = static_cast<int64_t>(dim * mlp_ratio);
  return linear_flops(rows, dim, 3 * dim) + attention_flops(n, seq, dim) + linear_flops(rows, dim, dim) +
         linear_flops(rows, dim, hidden) + linear_flops(rows, hidden, dim);
}
// One train_mae step: patch_embed on all L patches, encoder on cls + kept tokens, decoder
// on cls + L tokens, decoder_pred on all of them (the cls row is dropped after it).
double mae_step_flops(int64_t n, const nd::models::MAEConfig& c) {
  const int64_t len = c.num_patches(), enc = 1 + static_cast<int64_t>(len * (1 - c.mask_ratio)), dec = 1 + len;
  const double forward = linear_flops(n * len, c.patch_dim(), c.embed_dim) +
                         c.depth * transformer_block_flops(n, enc, c.embed_dim, c.mlp_ratio) +
                         linear_flops(n * enc, c.embed_dim, c.decoder_embed_dim) +
                         c.decoder_depth * transformer_block_flops(n, dec, c.decoder_embed_dim, c.mlp_ratio) +
                         linear_flops(n * dec, c.decoder_embed_dim, c.patch_dim());
  return 3.0 * forward;
}

// ---- the timed steps --------------------------------------------------------------------
struct Workload {
  int64_t images = 0;  // real images per step
  double flops = 0;    // model FLOPs per step
  std::function<void()> step;
};

Tensor bce(const Tensor& logits, double target) {
  return nd::binary_cross_entropy_with_logits(logits, target > 0.5 ? nd::ones_like(logits) : nd::zeros_like(logits));
}

std::string dcgan_shape(int64_t batch) { return "nz=64 ngf=32 ndf=32 batch=" + std::to_string(batch) + " Adam"; }
Workload dcgan(nd::Device device, const Precision& amp, int64_t n) {
  const int64_t nz = 64, ngf = 32, ndf = 32;
  struct State {
    nd::models::DCGANGenerator G;
    nd::models::DCGANDiscriminator D;
    std::unique_ptr<nd::optim::Adam> opt_g, opt_d;
    Tensor real;
    nd::optim::GradScaler scaler;
  };
  nd::manual_seed(0);
  auto s = std::make_shared<State>(State{nd::models::DCGANGenerator(nz, ngf), nd::models::DCGANDiscriminator(ndf),
                                         nullptr, nullptr, {}, nd::optim::GradScaler(amp.scaler())});
  nd::models::dcgan_init(*s->G);
  nd::models::dcgan_init(*s->D);
  s->G->to(device);
  s->D->to(device);
  s->opt_g = std::make_unique<nd::optim::Adam>(s->G->parameters(), nd::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
  s->opt_d = std::make_unique<nd::optim::Adam>(s->D->parameters(), nd::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
  s->real = (nd::rand({n, 1, 28, 28}) * 2.0 - 1.0).to(device);
  auto step = [s, n, nz, amp] {
    const nd::AutocastGuard guard(s->real.device().type, amp.on, amp.dtype);
    const Tensor z = nd::randn({n, nz}).to(s->real.device());
    const Tensor fake = s->G(z);
    s->opt_d->zero_grad();
    const Tensor loss_d = bce(s->D(s->real), 1.0) + bce(s->D(fake.detach()), 0.0);
    s->scaler.scale(loss_d).backward();
    s->scaler.step(*s->opt_d);
    s->opt_g->zero_grad();
    const Tensor loss_g = bce(s->D(fake), 1.0);
    s->scaler.scale(loss_g).backward();
    s->scaler.step(*s->opt_g);
    s->scaler.update();
    loss_d.item();
    loss_g.item();
  };
  return {n, dcgan_step_flops(n, nz, ngf, ndf), step};
}

std::string mae_shape(int64_t batch) { return "tiny E=64x2 Ed=32x1 batch=" + std::to_string(batch) + " AdamW"; }
Workload mae(nd::Device device, const Precision& amp, int64_t n) {
  const nd::models::MAEConfig config = nd::models::MAEConfig::tiny();
  struct State {
    nd::models::MAE M;
    std::unique_ptr<nd::optim::AdamW> opt;
    Tensor images;
    nd::optim::GradScaler scaler;
  };
  nd::manual_seed(0);
  auto s = std::make_shared<State>(State{nd::models::MAE(config), nullptr, {}, nd::optim::GradScaler(amp.scaler())});
  s->M->to(device);
  nd::optim::AdamWOptions adamw(1e-3);
  adamw.betas({0.9, 0.95}).weight_decay(0.05);
  s->opt = std::make_unique<nd::optim::AdamW>(s->M->parameters(), adamw);
  s->images = (nd::rand({n, 1, 28, 28}) * 2.0 - 1.0).to(device);
  auto step = [s, n, len = config.num_patches(), amp] {
    const nd::AutocastGuard guard(s->images.device().type, amp.on, amp.dtype);
    const Tensor noise = nd::rand({n, len});  // on the host, as train_mae: the masking runs there
    s->opt->zero_grad();
    const Tensor loss = s->M(s->images, noise).loss;
    s->scaler.scale(loss).backward();
    s->scaler.step(*s->opt);
    s->scaler.update();
    loss.item();
  };
  return {n, mae_step_flops(n, config), step};
}

// ---- timing and output --------------------------------------------------------------------
struct Row {
  std::string op, shape, impl, model, device, baseline, note, dtype = "f32";
  double ms = -1, gflops = 0, ratio = -1, ms_min = 0, ms_max = 0, flops = 0;
  int64_t images = 0;
  int steps = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `warmup` untimed calls, then the median of `steps` timed ones; fills ms, ms_min, ms_max.
void time_steps(const std::function<void()>& fn, nd::Device device, int warmup, int steps, Row& row) {
  auto sync = [&] {
    if (device.is_cuda()) nd::kernels::cuda::synchronize(device.index);
  };
  for (int i = 0; i < warmup; ++i) fn();
  sync();
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = Clock::now();
    fn();
    sync();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  row.ms = median(ms);
  row.ms_min = *std::min_element(ms.begin(), ms.end());
  row.ms_max = *std::max_element(ms.begin(), ms.end());
  row.steps = steps;
  row.gflops = row.flops / (row.ms * 1e6);
}

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The reference GEMM rates of this run: C = A B, M = N = K = size.
std::vector<Row> gemm_rows(nd::Device device, int64_t size, const Options& o) {
  std::vector<Row> rows;
  auto row = [&](const std::string& impl) {
    Row r;
    r.op = "matmul";
    r.shape = "M=N=K=" + std::to_string(size);
    r.impl = impl;
    r.model = "sgemm";
    r.device = device.str();
    r.flops = 2.0 * size * size * size;
    return r;
  };
  const int reps = std::max(5, o.steps / 2);
  if (device.is_cpu()) {
    RowMat a = RowMat::Random(size, size), b = RowMat::Random(size, size), c(size, size);
    Row eigen = row("eigen");
    time_steps([&] { c.noalias() = a * b; }, device, 2, reps, eigen);
    Row ours = row("nd::gemm");
    time_steps([&] { nd::kernels::cpu::gemm(false, false, size, size, size, 1.f, a.data(), size, b.data(), size, 0.f,
                                            c.data(), size); },
               device, 2, reps, ours);
    rows = {eigen, ours};
  } else {
    const Tensor a = nd::randn({size, size}).to(device), b = nd::randn({size, size}).to(device);
    Row ours = row("nd::matmul");
    time_steps([&] { a.matmul(b); }, device, 2, reps, ours);
    rows = {ours};
  }
  return rows;
}

void print(const std::vector<Row>& rows, int threads) {
  std::printf("bench_train: %d OpenMP thread(s); median step; ratio = achieved GFLOP/s / sgemm GFLOP/s\n", threads);
  std::printf("%-7s %-6s %-36s %-11s %9s %8s %9s %8s %6s\n", "model", "device", "shape", "impl", "ms", "steps/s",
              "images/s", "GFLOP/s", "ratio");
  for (const Row& r : rows) {
    if (r.ms < 0) {
      std::printf("%-7s %-6s %-36s %-11s %s\n", r.model.c_str(), r.device.c_str(), r.shape.c_str(), r.impl.c_str(),
                  r.note.c_str());
      continue;
    }
    std::printf("%-7s %-6s %-36s %-11s %9.2f %8.2f ", r.model.c_str(), r.device.c_str(), r.shape.c_str(),
                r.impl.c_str(), r.ms, 1e3 / r.ms);
    if (r.images > 0) std::printf("%9.0f %8.1f ", r.images * 1e3 / r.ms, r.gflops);
    else std::printf("%9s %8.1f ", "-", r.gflops);
    if (r.ratio < 0) std::printf("%6s\n", "-");
    else std::printf("%6.3f\n", r.ratio);
  }
  for (const Row& r : rows) {
    auto line = nd::bench::JsonLine::row(r.op, r.shape, r.dtype, r.impl);
    if (r.ms < 0) line.null("ms").null("gflops");
    else line.number("ms", r.ms, "%.4f").number("gflops", r.gflops, "%.3f");
    line.null("gbps");
    if (r.ratio < 0) line.null("baseline").null("ratio");
    else line.text("baseline", r.baseline).number("ratio", r.ratio, "%.4f");
    line.text("model", r.model).text("device", r.device).integer("threads", threads);
    if (r.ms >= 0 && r.images > 0)
      line.number("steps_per_s", 1e3 / r.ms, "%.3f")
          .number("images_per_s", r.images * 1e3 / r.ms, "%.1f")
          .number("gflop_per_step", r.flops / 1e9, "%.4f");
    if (r.ms >= 0) line.number("ms_min", r.ms_min, "%.4f").number("ms_max", r.ms_max, "%.4f").integer("runs", r.steps);
    if (!r.note.empty()) line.text("note", r.note);
    line.print();
  }
}

// Replaces characters that would break a JSON string or a table line.
std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '"' || ch == '\\' || ch == '\n' || ch == '\r' || ch == '\t') ch = ch == '"' ? '\'' : ' ';
  return s;
}

// The models, by name, with the apps' batch sizes; shape says what one step is (also for
// rows that cannot run).
struct Model {
  const char* name;
  int64_t default_batch;
  std::string (*shape)(int64_t batch);
  Workload (*build)(nd::Device, const Precision&, int64_t batch);
};
const Model kModels[] = {{"dcgan", 64, dcgan_shape, dcgan}, {"mae", 128, mae_shape, mae}};

// The step rows of one device: baseline GEMM rows, then one row per model.
void bench_device(nd::Device device, const Options& o, std::vector<Row>& out) {
  auto failed = [&](const std::string& model, const std::string& shape, const std::string& why) {
    Row r;
    r.op = "train_step", r.shape = shape, r.model = model, r.device = device.str(), r.impl = "nanoddp";
    r.dtype = o.amp;
    r.note = one_line(why);
    out.push_back(r);
  };
  std::vector<const Model*> models;
  for (const Model& m : kModels)
    if (o.model == "all" || o.model == m.name) models.push_back(&m);
  auto batch = [&](const Model* m) { return o.batch > 0 ? o.batch : m->default_batch; };
  if (device.is_cuda() && !nd::cuda::is_available()) {
    for (const Model* m : models)
      failed(m->name, m->shape(batch(m)), "skipped: no CUDA device (built without CUDA or no GPU)");
    return;
  }
  const std::string kernel_missing = device.is_cuda() ? "no CUDA kernel yet: " : "error: ";
  std::vector<Row> base;
  try {
    base = gemm_rows(device, device.is_cpu() ? o.gemm : 4 * o.gemm, o);
  } catch (const nd::Error& e) {
    failed("sgemm", "", kernel_missing + e.what());
  }
  out.insert(out.end(), base.begin(), base.end());
  for (const Model* m : models) {
    try {
      const Workload w = m->build(device, Precision(o.amp), batch(m));
      Row r;
      r.op = "train_step", r.shape = m->shape(batch(m)), r.model = m->name, r.device = device.str();
      r.impl = o.anomaly ? "nanoddp+anomaly" : "nanoddp";
      r.dtype = o.amp;
      r.images = w.images, r.flops = w.flops;
      auto step = [&] {
        if (!o.anomaly) return w.step();
        const nd::autograd::DetectAnomalyGuard anomaly;
        w.step();
      };
      time_steps(step, device, o.warmup, o.steps, r);
      if (!base.empty()) r.baseline = base.front().impl, r.ratio = r.gflops / base.front().gflops;
      out.push_back(r);
    } catch (const nd::Error& e) {
      failed(m->name, m->shape(batch(m)), kernel_missing + e.what());
    }
  }
}

// Prints why and the usage line; returns the exit status (0 for --help, 2 for a bad command line).
int usage(const char* why, int status = 2) {
  std::fprintf(status == 0 ? stdout : stderr,
               "bench_train: %s\nusage: bench_train [--steps N] [--warmup N] [--threads N] [--gemm N] "
               "[--device cpu|cuda|all] [--model dcgan|mae|all] [--amp f32|bf16|f16] [--batch N] [--anomaly off|on]\n",
               why);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return usage("one training step per model, median of --steps steps", 0);
    if (i + 1 >= argc) return usage(("expected a value after " + flag).c_str());
    const std::string value = argv[++i];
    const int number = std::atoi(value.c_str());
    if (flag == "--steps") o.steps = number;
    else if (flag == "--warmup") o.warmup = number;
    else if (flag == "--threads") o.threads = number;
    else if (flag == "--gemm") o.gemm = number;
    else if (flag == "--device") o.device = value;
    else if (flag == "--model") o.model = value;
    else if (flag == "--amp") o.amp = value;
    else if (flag == "--batch") o.batch = number;
    else if (flag == "--anomaly" && (value == "on" || value == "off")) o.anomaly = value == "on";
    else if (flag == "--anomaly") return usage("--anomaly expects on or off");
    else return usage(("unknown flag " + flag).c_str());
  }
  if (o.steps < 1 || o.warmup < 0 || o.threads < 0 || o.gemm < 1 || o.batch < 0)
    return usage("--steps and --gemm must be >= 1, --warmup, --threads and --batch >= 0");
  if (o.device != "cpu" && o.device != "cuda" && o.device != "all") return usage("--device expects cpu, cuda or all");
  if (o.model != "dcgan" && o.model != "mae" && o.model != "all") return usage("--model expects dcgan, mae or all");
  if (o.amp != "f32" && o.amp != "bf16" && o.amp != "f16") return usage("--amp expects f32, bf16 or f16");
  if (o.threads > 0) omp_set_num_threads(o.threads);

  std::vector<Row> rows;
  if (o.device != "cuda") bench_device(nd::kCPU, o, rows);
  if (o.device != "cpu") bench_device(nd::Device(nd::kCUDA, 0), o, rows);
  print(rows, omp_get_max_threads());
  return 0;
}
