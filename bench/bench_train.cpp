// Training-step benchmark: one full step (forward, backward, optimizer step) of the
// models the apps train, timed end to end, against the GEMM rate of the same machine.
//   dcgan  exactly apps/train_gan's step at its defaults (dcgan28: nz 64, ngf = ndf = 32,
//          batch 64, Adam lr 2e-4 betas (0.5, 0.999)): fake = G(z); D step on
//          bce(D(real), 1) + bce(D(fake.detach()), 0); G step on bce(D(fake), 1).
//   mae    exactly apps/train_mae's step with the tiny model (batch 128, AdamW betas
//          (0.9, 0.95), weight decay 0.05): loss = MAE(images, noise); backward; step.
//   NAME   the same step for any models::DCGANConfig (dcgan28, dcgan32, dcgan64; batch 64)
//          or models::MAEConfig (tiny, small, mae_vit_{base,large}_patch16_dec512d8b,
//          mae_vit_huge_patch14_dec512d8b; batch 64) on random images of its size.
// --checkpoint-activations on: the MAE's blocks under nd::checkpoint (FLOPs then count
// each block's forward twice).
// Every step row reports "peak_bytes": the device allocator's peak of allocated bytes
// (nd::cpu::memory_stats / nd::cuda::memory_stats, reset before the warmup): the model,
// its gradients and optimizer state and the most activations a step held at once.
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
//                    [--model dcgan|mae|all|NAME] [--amp f32|bf16|f16] [--batch N] [--anomaly off|on]
//                    [--checkpoint-activations off|on]
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
  bool checkpoint_activations = false;  // --checkpoint-activations on: MAEConfig::checkpoint_activations
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

// The stacks of models/dcgan.h for any DCGANConfig: k = upsamplings() stride-2 layers
// each, widths w_i = ngf 2^(k-1-i) (generator) and ndf 2^i (discriminator).
double dcgan_generator_flops(int64_t n, const nd::models::DCGANConfig& c) {
  const int64_t k = c.upsamplings(), base = c.base();
  double f = conv_transpose2d_flops(n, c.nz, c.ngf << (k - 1), base, 1);
  for (int64_t i = 1; i < k; ++i)
    f += conv_transpose2d_flops(n, c.ngf << (k - i), c.ngf << (k - 1 - i), 4, base << (i - 1));
  return f + conv_transpose2d_flops(n, c.ngf, c.nc, 4, base << (k - 1));
}
double dcgan_discriminator_flops(int64_t n, const nd::models::DCGANConfig& c) {
  const int64_t k = c.upsamplings(), base = c.base();
  double f = conv2d_flops(n, c.nc, c.ndf, 4, c.image_size / 2);
  for (int64_t i = 1; i < k; ++i) f += conv2d_flops(n, c.ndf << (i - 1), c.ndf << i, 4, c.image_size >> (i + 1));
  return f + conv2d_flops(n, c.ndf << (k - 1), 1, base, 1);
}
// One train_gan step: G forward once, D forward three times (real, fake.detach(), fake),
// each pass with its backward.
double dcgan_step_flops(int64_t n, const nd::models::DCGANConfig& c) {
  return 3.0 * (dcgan_generator_flops(n, c) + 3.0 * dcgan_discriminator_flops(n, c));
}

// Pre-LN block on [n, seq, dim]: qkv, attention, out_proj, the two MLP linears.
double transformer_block_flops(int64_t n, int64_t seq, int64_t dim, double mlp_ratio) {
  const int64_t rows = n * seq, hidden = static_cast<int64_t>(dim * mlp_ratio);
  return linear_flops(rows, dim, 3 * dim) + attention_flops(n, seq, dim) + linear_flops(rows, dim, dim) +
         linear_flops(rows, dim, hidden) + linear_flops(rows, hidden, dim);
}
// One train_mae step: patch_embed on all L patches, encoder on cls + kept tokens, decoder
// on cls + L tokens, decoder_pred on all of them (the cls row is dropped after it). With
// checkpoint_activations every block's forward runs twice: 4x its forward instead of 3x.
double mae_step_flops(int64_t n, const nd::models::MAEConfig& c) {
  const int64_t len = c.num_patches(), enc = 1 + static_cast<int64_t>(len * (1 - c.mask_ratio)), dec = 1 + len;
  const double forward = linear_flops(n * len, c.patch_dim(), c.embed_dim) +
                         c.depth * transformer_block_flops(n, enc, c.embed_dim, c.mlp_ratio) +
                         linear_flops(n * enc, c.embed_dim, c.decoder_embed_dim) +
                         c.decoder_depth * transformer_block_flops(n, dec, c.decoder_embed_dim, c.mlp_ratio) +
                         linear_flops(n * dec, c.decoder_embed_dim, c.patch_dim());
  const double blocks = c.depth * transformer_block_flops(n, enc, c.embed_dim, c.mlp_ratio) +
                        c.decoder_depth * transformer_block_flops(n, dec, c.decoder_embed_dim, c.mlp_ratio);
  return 3.0 * forward + (c.checkpoint_activations ? blocks : 0.0);
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

std::string dcgan_shape(const nd::models::DCGANConfig& c, int64_t batch) {
  const std::string side = std::to_string(c.image_size);
  return side + "x" + side + "x" + std::to_string(c.nc) + " nz=" + std::to_string(c.nz) + " ngf=" +
         std::to_string(c.ngf) + " ndf=" + std::to_string(c.ndf) + " batch=" + std::to_string(batch) + " Adam";
}
Workload dcgan(nd::Device device, const Precision& amp, int64_t n, const nd::models::DCGANConfig& config) {
  struct State {
    nd::models::DCGANGenerator G;
    nd::models::DCGANDiscriminator D;
    std::unique_ptr<nd::optim::Adam> opt_g, opt_d;
    Tensor real;
    nd::optim::GradScaler scaler;
  };
  nd::manual_seed(0);
  auto s = std::make_shared<State>(State{nd::models::DCGANGenerator(config), nd::models::DCGANDiscriminator(config),
                                         nullptr, nullptr, {}, nd::optim::GradScaler(amp.scaler())});
  nd::models::dcgan_init(*s->G);
  nd::models::dcgan_init(*s->D);
  s->G->to(device);
  s->D->to(device);
  s->opt_g = std::make_unique<nd::optim::Adam>(s->G->parameters(), nd::models::dcgan_adam_options());
  s->opt_d = std::make_unique<nd::optim::Adam>(s->D->parameters(), nd::models::dcgan_adam_options());
  s->real = (nd::rand({n, config.nc, config.image_size, config.image_size}) * 2.0 - 1.0).to(device);
  auto step = [s, n, nz = config.nz, amp] {
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
  return {n, dcgan_step_flops(n, config), step};
}

std::string mae_shape(const std::string& name, const nd::models::MAEConfig& c, int64_t batch) {
  return name + " E=" + std::to_string(c.embed_dim) + "x" + std::to_string(c.depth) + " Ed=" +
         std::to_string(c.decoder_embed_dim) + "x" + std::to_string(c.decoder_depth) + " batch=" +
         std::to_string(batch) + " AdamW" + (c.checkpoint_activations ? " ckpt" : "");
}
Workload mae(nd::Device device, const Precision& amp, int64_t n, const nd::models::MAEConfig& config) {
  struct State {
    nd::models::MAE M;
    std::unique_ptr<nd::optim::AdamW> opt;
    Tensor images;
    nd::optim::GradScaler scaler;
  };
  nd::manual_seed(0);
  auto s = std::make_shared<State>(State{nd::models::MAE(config), nullptr, {}, nd::optim::GradScaler(amp.scaler())});
  s->M->to(device);
  s->opt = std::make_unique<nd::optim::AdamW>(s->M->parameters(), nd::models::mae_adamw_options(1e-3));
  s->images = (nd::rand({n, config.in_chans, config.img_size, config.img_size}) * 2.0 - 1.0).to(device);
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
  int64_t peak_bytes = -1;  // the device allocator's peak over the warmup and timed steps
  int steps = 0;
};

// The allocator's peak of allocated bytes (PyTorch's max_memory_allocated): the model,
// its gradients and optimizer state, and the most activations a step held at once.
void reset_peak(nd::Device device) {
  if (device.is_cpu()) nd::cpu::reset_peak_memory_stats();
  else nd::cuda::reset_peak_memory_stats(device);
}
int64_t peak_bytes(nd::Device device) {
  return device.is_cpu() ? nd::cpu::memory_stats().peak_allocated_bytes
                         : nd::cuda::memory_stats(device).peak_allocated_bytes;
}

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
  std::printf("%-7s %-6s %-36s %-11s %9s %8s %9s %8s %6s %9s\n", "model", "device", "shape", "impl", "ms", "steps/s",
              "images/s", "GFLOP/s", "ratio", "peak MiB");
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
    if (r.ratio < 0) std::printf("%6s", "-");
    else std::printf("%6.3f", r.ratio);
    if (r.peak_bytes < 0) std::printf(" %9s\n", "-");
    else std::printf(" %9.1f\n", static_cast<double>(r.peak_bytes) / (1 << 20));
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
    if (r.peak_bytes >= 0) line.integer("peak_bytes", r.peak_bytes);
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

// The models, by name, with their default batch sizes; shape says what one step is (also
// for rows that cannot run).
struct Model {
  std::string name;
  int64_t default_batch;
  std::function<std::string(int64_t batch)> shape;
  std::function<Workload(nd::Device, const Precision&, int64_t batch)> build;
};

Model dcgan_model(const std::string& name, const nd::models::DCGANConfig& c) {
  return {name, 64, [c](int64_t b) { return dcgan_shape(c, b); },
          [c](nd::Device d, const Precision& p, int64_t b) { return dcgan(d, p, b, c); }};
}
Model mae_model(const std::string& name, const std::string& config_name, int64_t batch, bool checkpointed) {
  nd::models::MAEConfig c = nd::models::MAEConfig::by_name(config_name);
  c.checkpoint_activations = checkpointed;
  return {name, batch, [c, config_name](int64_t b) { return mae_shape(config_name, c, b); },
          [c](nd::Device d, const Precision& p, int64_t b) { return mae(d, p, b, c); }};
}

// --model: "dcgan" and "mae" are the apps' steps (dcgan28 at batch 64, tiny at 128),
// "all" both; a DCGANConfig name (batch 64, examples/dcgan's) or an MAEConfig name (batch
// 64, main_pretrain.py's per-GPU batch) that config. Throws nd::Error for another name.
std::vector<Model> models_for(const Options& o) {
  std::vector<Model> out;
  if (o.model == "dcgan" || o.model == "all") out.push_back(dcgan_model("dcgan", nd::models::DCGANConfig::dcgan28()));
  if (o.model == "mae" || o.model == "all") out.push_back(mae_model("mae", "tiny", 128, o.checkpoint_activations));
  if (!out.empty()) return out;
  if (o.model.rfind("dcgan", 0) == 0) return {dcgan_model(o.model, nd::models::DCGANConfig::by_name(o.model))};
  return {mae_model(o.model, o.model, 64, o.checkpoint_activations)};
}

// The step rows of one device: baseline GEMM rows, then one row per model.
void bench_device(nd::Device device, const Options& o, std::vector<Row>& out) {
  auto failed = [&](const std::string& model, const std::string& shape, const std::string& why) {
    Row r;
    r.op = "train_step", r.shape = shape, r.model = model, r.device = device.str(), r.impl = "nanoddp";
    r.dtype = o.amp;
    r.note = one_line(why);
    out.push_back(r);
  };
  const std::vector<Model> all = models_for(o);
  std::vector<const Model*> models;
  for (const Model& m : all) models.push_back(&m);
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
      reset_peak(device);
      time_steps(step, device, o.warmup, o.steps, r);
      r.peak_bytes = peak_bytes(device);
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
               "[--device cpu|cuda|all] [--model dcgan|mae|all|NAME] [--amp f32|bf16|f16] [--batch N] [--anomaly off|on] "
               "[--checkpoint-activations off|on]\n",
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
    else if (flag == "--checkpoint-activations" && (value == "on" || value == "off"))
      o.checkpoint_activations = value == "on";
    else if (flag == "--checkpoint-activations") return usage("--checkpoint-activations expects on or off");
    else return usage(("unknown flag " + flag).c_str());
  }
  if (o.steps < 1 || o.warmup < 0 || o.threads < 0 || o.gemm < 1 || o.batch < 0)
    return usage("--steps and --gemm must be >= 1, --warmup, --threads and --batch >= 0");
  if (o.device != "cpu" && o.device != "cuda" && o.device != "all") return usage("--device expects cpu, cuda or all");
  try {
    models_for(o);
  } catch (const nd::Error& e) {
    return usage(("--model expects dcgan, mae, all, a DCGAN config (dcgan28, dcgan32, dcgan64) or an MAE config "
                  "(tiny, small, mae_vit_base_patch16_dec512d8b, mae_vit_large_patch16_dec512d8b, "
                  "mae_vit_huge_patch14_dec512d8b), got '" + o.model + "'").c_str());
  }
  if (o.amp != "f32" && o.amp != "bf16" && o.amp != "f16") return usage("--amp expects f32, bf16 or f16");
  if (o.threads > 0) omp_set_num_threads(o.threads);

  std::vector<Row> rows;
  if (o.device != "cuda") bench_device(nd::kCPU, o, rows);
  if (o.device != "cpu") bench_device(nd::Device(nd::kCUDA, 0), o, rows);
  print(rows, omp_get_max_threads());
  return 0;
}
