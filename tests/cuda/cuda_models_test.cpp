// Whole training steps on CUDA against the same steps on the CPU: a small conv + BatchNorm
// + attention model, the DCGAN (G and D steps as train_gan takes them) and the tiny MAE,
// each built twice from one seed, one copy moved to the GPU. Compared after forward and
// backward: the loss, every gradient and every buffer (running statistics); after the
// optimizer step: every parameter; the conv + BatchNorm + attention step also under f16
// autocast with a GradScaler, to f16 precision. Then DDP over NCCL at world size 1 (the bucket path runs
// for real with an explicit group) must equal plain CUDA training. Without a GPU every case
// reports "SKIPPED:".
#include <string>
#include <vector>

#include "cuda/cuda_compare.h"
#include "harness.h"

#ifdef NANODDP_WITH_NCCL
#include "collectives/ddp.h"
#endif

using namespace nd;
using namespace nd::testing::cuda_compare;

namespace {

// f32 through a few layers of different kernels: a looser bound than one op's 2e-5.
constexpr double kStepTol = 2e-4;

// Adam's and AdamW's epsilon here. Some gradients are zero in exact arithmetic and only
// rounding noise on either device: the key part of attention's in_proj_bias (adding one
// constant to every score of a row leaves its softmax unchanged). With the default 1e-8,
// Adam turns that noise into steps of +-lr whose signs differ between the devices (relative
// errors near 1e-2 in in_proj_bias, found running this test under the CUDA emulator, and
// expected on a GPU too: its sums are ordered differently from the CPU's). With 1e-3, a
// gradient g of rounding-noise size moves a parameter by about lr * |g| / 1e-3, a negligible
// step, while gradients well above 1e-3 still take steps near lr through the moments and
// bias corrections.
constexpr double kAdamEps = 1e-3;

// Conv -> BN -> ReLU -> tokens -> LayerNorm -> self-attention -> mean -> Linear.
struct ConvAttention : nn::Module {
  // No bias: BatchNorm (training) subtracts each channel's mean, so a conv bias would get a
  // gradient that is zero in exact arithmetic and only rounding noise on either device (a
  // relative error near 1 between them; then running_mean differs after Adam).
  nn::Conv2d conv{nn::Conv2dOptions(3, 8, 3).padding(1).stride(2).bias(false)};
  nn::BatchNorm2d bn{nn::BatchNorm2dOptions(8)};
  nn::LayerNorm norm{nn::LayerNormOptions({8})};
  nn::MultiheadAttention attn{nn::MultiheadAttentionOptions(8, 2).batch_first(true)};
  nn::Linear head{nn::LinearOptions(8, 3)};
  ConvAttention() : nn::Module("ConvAttention") {
    register_module("conv", conv);
    register_module("bn", bn);
    register_module("norm", norm);
    register_module("attn", attn);
    register_module("head", head);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = relu(bn(conv(x)));                   // [N, 8, 5, 5]
    Tensor tokens = h.flatten(2).transpose(1, 2);    // [N, 25, 8]
    Tensor a = attn(norm(tokens));
    return head((tokens + a).mean({1}));             // [N, 3]
  }
};

void check_module_matches(const nn::Module& on_gpu, const nn::Module& on_cpu, const std::string& what,
                          bool grads) {
  const auto pg = on_gpu.named_parameters(), pc = on_cpu.named_parameters();
  REQUIRE(pg.size() == pc.size());
  for (size_t i = 0; i < pg.size(); ++i) {
    check_matches(pg[i].second, pc[i].second, what + " parameter " + pc[i].first, kStepTol);
    if (grads && pc[i].second.grad().defined()) {
      REQUIRE_MESSAGE(pg[i].second.grad().defined(), what, ": ", pc[i].first, " has a gradient on the CPU only");
      check_matches(pg[i].second.grad(), pc[i].second.grad(), what + " grad of " + pc[i].first, kStepTol);
    }
  }
  const auto bg = on_gpu.named_buffers(), bc = on_cpu.named_buffers();
  REQUIRE(bg.size() == bc.size());
  for (size_t i = 0; i < bg.size(); ++i)
    if (bc[i].second.is_floating_point())
      check_matches(bg[i].second, bc[i].second, what + " buffer " + bc[i].first, kStepTol);
}

// Inputs drawn once on the CPU and copied, so both devices see the same numbers.
Tensor input(const Shape& shape, uint64_t seed, const Device& device) {
  Generator g{seed, 0};
  return randn(shape, kFloat32, &g).to(device);
}

}  // namespace

TEST_CASE("cuda models: a conv + BatchNorm + attention step (forward, backward, Adam) matches the CPU") {
  if (skip_without_gpu()) return;
  PoisonAllocations poison;
  auto build = [] {
    manual_seed(21);
    return std::make_shared<ConvAttention>();
  };
  auto cpu_model = build(), gpu_model = build();
  gpu_model->to(kGpu);
  optim::Adam cpu_opt(cpu_model->parameters(), optim::AdamOptions(1e-3).eps(kAdamEps));
  optim::Adam gpu_opt(gpu_model->parameters(), optim::AdamOptions(1e-3).eps(kAdamEps));
  for (int step = 0; step < 2; ++step) {
    CAPTURE(step);
    auto run = [&](ConvAttention& m, optim::Adam& opt, const Device& d) {
      opt.zero_grad();
      Tensor loss = mse_loss(m.forward(input({4, 3, 9, 9}, 100 + step, d)), input({4, 3}, 200 + step, d));
      loss.backward();
      return loss;
    };
    const Tensor loss_cpu = run(*cpu_model, cpu_opt, Device(kCPU)), loss_gpu = run(*gpu_model, gpu_opt, kGpu);
    check_matches(loss_gpu, loss_cpu, "loss", kStepTol);
    check_module_matches(*gpu_model, *cpu_model, "after backward", true);
    cpu_opt.step();
    gpu_opt.step();
    check_module_matches(*gpu_model, *cpu_model, "after Adam", false);
  }
}

TEST_CASE("cuda models: the conv + BatchNorm + attention step under f16 autocast with a GradScaler matches the CPU") {
  if (skip_without_gpu()) return;
  PoisonAllocations poison;
  // f16 operands for the conv, the attention and the Linear layers on both devices; the GPU
  // also rounds attention's P and dS to f16 (2^-12 relative each), so the devices agree to
  // f16 precision, not f32's: 1e-2 over the whole step. SGD, not Adam: it does not amplify
  // the differences of near-zero gradients.
  constexpr double kF16StepTol = 1e-2;
  auto build = [] {
    manual_seed(22);
    return std::make_shared<ConvAttention>();
  };
  auto cpu_model = build(), gpu_model = build();
  gpu_model->to(kGpu);
  optim::SGD cpu_opt(cpu_model->parameters(), optim::SGDOptions(0.1));
  optim::SGD gpu_opt(gpu_model->parameters(), optim::SGDOptions(0.1));
  optim::GradScaler cpu_scaler, gpu_scaler;
  for (int step = 0; step < 2; ++step) {
    CAPTURE(step);
    auto run = [&](ConvAttention& m, optim::SGD& opt, optim::GradScaler& scaler, const Device& d) {
      opt.zero_grad();
      Tensor loss;
      {
        AutocastGuard amp(d.type, true, kFloat16);
        loss = mse_loss(m.forward(input({4, 3, 9, 9}, 300 + step, d)), input({4, 3}, 400 + step, d));
      }
      scaler.scale(loss).backward();
      scaler.unscale_(opt);
      return loss;
    };
    const Tensor loss_cpu = run(*cpu_model, cpu_opt, cpu_scaler, Device(kCPU));
    const Tensor loss_gpu = run(*gpu_model, gpu_opt, gpu_scaler, kGpu);
    check_matches(loss_gpu, loss_cpu, "f16 loss", kF16StepTol);
    const auto pg = gpu_model->named_parameters(), pc = cpu_model->named_parameters();
    for (size_t i = 0; i < pc.size(); ++i)
      check_matches(pg[i].second.grad(), pc[i].second.grad(), "f16 unscaled grad of " + pc[i].first, kF16StepTol);
    CHECK(cpu_scaler.step(cpu_opt) == gpu_scaler.step(gpu_opt));
    cpu_scaler.update();
    gpu_scaler.update();
    CHECK(gpu_scaler.get_scale() == cpu_scaler.get_scale());
    for (size_t i = 0; i < pc.size(); ++i)
      check_matches(pg[i].second, pc[i].second, "f16 step, parameter " + pc[i].first, kF16StepTol);
  }
}

TEST_CASE("cuda models: DCGAN discriminator and generator steps match the CPU") {
  if (skip_without_gpu()) return;
  PoisonAllocations poison;
  auto build = [] {
    manual_seed(22);
    models::DCGANGenerator G(16, 8);
    models::DCGANDiscriminator D(8);
    models::dcgan_init(*G);
    models::dcgan_init(*D);
    return std::make_pair(G, D);
  };
  auto [Gc, Dc] = build();
  auto [Gg, Dg] = build();
  Gg->to(kGpu);
  Dg->to(kGpu);
  // SGD: one step moves each weight by lr * gradient, so a difference stays a difference
  // of gradients (Adam's first step, lr * sign(g), would amplify a near-zero one).
  optim::SGD ogc(Gc->parameters(), optim::SGDOptions(0.05)), odc(Dc->parameters(), optim::SGDOptions(0.05));
  optim::SGD ogg(Gg->parameters(), optim::SGDOptions(0.05)), odg(Dg->parameters(), optim::SGDOptions(0.05));
  auto step = [](models::DCGANGenerator& G, models::DCGANDiscriminator& D, optim::SGD& og, optim::SGD& od,
                 const Device& d) {
    const Tensor real = tanh(input({6, 1, 28, 28}, 300, d)), z = input({6, 16}, 301, d);
    Tensor fake = G(z);
    od.zero_grad();
    Tensor on_real = D(real), on_fake = D(fake.detach());
    Tensor loss_d = binary_cross_entropy_with_logits(on_real, ones_like(on_real)) +
                    binary_cross_entropy_with_logits(on_fake, zeros_like(on_fake));
    loss_d.backward();
    od.step();
    og.zero_grad();
    Tensor judged = D(fake);
    Tensor loss_g = binary_cross_entropy_with_logits(judged, ones_like(judged));
    loss_g.backward();
    return std::make_pair(loss_d, loss_g);
  };
  const auto [ld_c, lg_c] = step(Gc, Dc, ogc, odc, Device(kCPU));
  const auto [ld_g, lg_g] = step(Gg, Dg, ogg, odg, kGpu);
  check_matches(ld_g, ld_c, "loss_d", kStepTol);
  check_matches(lg_g, lg_c, "loss_g", kStepTol);
  check_module_matches(*Dg, *Dc, "D after its step", false);
  check_module_matches(*Gg, *Gc, "G after backward", true);
  ogc.step();
  ogg.step();
  check_module_matches(*Gg, *Gc, "G after its step", false);
}

TEST_CASE("cuda models: a tiny MAE step (masking, encoder, decoder, loss, AdamW) matches the CPU") {
  if (skip_without_gpu()) return;
  PoisonAllocations poison;
  auto build = [] {
    manual_seed(23);
    return models::MAE(models::MAEConfig::tiny());
  };
  models::MAE mc = build(), mg = build();
  mg->to(kGpu);
  optim::AdamWOptions adamw(1e-3);
  adamw.eps(kAdamEps);
  optim::AdamW oc(mc->parameters(), adamw), og(mg->parameters(), adamw);
  const int64_t L = models::MAEConfig::tiny().num_patches();
  auto run = [&](models::MAE& m, optim::AdamW& opt, const Device& d) {
    opt.zero_grad();
    Generator g{400, 0};
    const Tensor noise = rand({5, L}, kFloat32, &g).to(d);  // the same masking on both devices
    models::MAEOutput out = m->forward(tanh(input({5, 1, 28, 28}, 401, d)), noise);
    out.loss.backward();
    return out;
  };
  const models::MAEOutput c = run(mc, oc, Device(kCPU)), g = run(mg, og, kGpu);
  check_matches(g.mask, c.mask, "mask");
  check_matches(g.pred, c.pred, "pred", kStepTol);
  check_matches(g.loss, c.loss, "loss", kStepTol);
  check_module_matches(*mg, *mc, "MAE after backward", true);
  oc.step();
  og.step();
  check_module_matches(*mg, *mc, "MAE after AdamW", false);
}

#ifdef NANODDP_WITH_NCCL
TEST_CASE("cuda models: DDP over NCCL (world size 1, explicit group) equals plain CUDA training") {
  if (skip_without_gpu()) return;
  if (dist::world()->size() != 1) {
    MESSAGE("SKIPPED: runs alone (one GPU)");
    return;
  }
  auto build = [] {
    manual_seed(24);
    auto m = std::make_shared<ConvAttention>();
    m->to(kGpu);
    return m;
  };
  auto plain = build(), wrapped = build();
  // Both caps tiny: the first bucket's own cap (1 MB by default) would hold the whole model.
  dist::DistributedDataParallel ddp(
      wrapped, "ConvAttention",
      dist::DistributedDataParallelOptions()
          .process_group(dist::nccl_world())
          .bucket_cap_mb(1e-3)
          .first_bucket_cap_mb(1e-3));
  optim::SGD op(plain->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  optim::SGD ow(wrapped->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    const Tensor x = input({4, 3, 9, 9}, 500 + step, kGpu), y = input({4, 3}, 600 + step, kGpu);
    op.zero_grad();
    mse_loss(plain->forward(x), y).backward();
    op.step();
    ow.zero_grad();
    mse_loss(ddp(x), y).backward();
    ow.step();
  }
  CHECK(ddp.reducer().bucket_parameter_names().size() > 1);  // several buckets went through NCCL
  const auto a = wrapped->named_parameters(), b = plain->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) check_matches(a[i].second, b[i].second, "DDP " + a[i].first, 1e-6);
}

TEST_CASE("cuda models: DDP over NCCL with no_sync accumulation and a model called twice per backward") {
  if (skip_without_gpu()) return;
  if (dist::world()->size() != 1) {
    MESSAGE("SKIPPED: runs alone (one GPU)");
    return;
  }
  auto build = [] {
    manual_seed(25);
    auto m = std::make_shared<ConvAttention>();
    m->to(kGpu);
    m->eval();  // BatchNorm on running statistics, saved for backward by both calls
    return m;
  };
  auto plain = build(), wrapped = build();
  dist::DistributedDataParallel ddp(
      wrapped, "ConvAttention",
      dist::DistributedDataParallelOptions()
          .process_group(dist::nccl_world())
          .bucket_cap_mb(1e-3)
          .first_bucket_cap_mb(1e-3));
  optim::Adam op(plain->parameters(), optim::AdamOptions(1e-3));
  optim::Adam ow(wrapped->parameters(), optim::AdamOptions(1e-3));
  for (int step = 0; step < 3; ++step) {
    const Tensor x1 = input({4, 3, 9, 9}, 700 + step, kGpu), x2 = input({4, 3, 9, 9}, 710 + step, kGpu);
    const Tensor y = input({4, 3}, 720 + step, kGpu);
    auto two_calls = [&](auto&& f) { return mse_loss(f(x1) + f(x2), y); };
    op.zero_grad();
    mse_loss(plain->forward(x1), y).backward();
    two_calls([&](const Tensor& x) { return plain->forward(x); }).backward();
    op.step();
    ow.zero_grad();
    {
      auto no_sync = ddp.no_sync();
      mse_loss(ddp(x1), y).backward();
    }
    two_calls([&](const Tensor& x) { return ddp(x); }).backward();
    ow.step();
  }
  const auto a = wrapped->named_parameters(), b = plain->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) check_matches(a[i].second, b[i].second, "DDP " + a[i].first, 1e-6);
}
#endif
