// DistributedDataParallel, run at 1, 2 and 4 ranks: N ranks on N shards end with the
// same parameters as one process on the whole batch, for the cases users get stuck on.
#include <cmath>
#include <limits>

#include "collectives/ddp.h"
#include "dist/ddp_test_util.h"
#include "harness.h"

using namespace nd;
using dist::DistributedDataParallel;
using dist::DistributedDataParallelOptions;

using namespace nd::testing::ddp;

TEST_CASE("ddp: an MLP on N shards equals one process on the whole batch") {
  manual_seed(1);
  nn::Sequential reference = make_mlp();
  manual_seed(1);
  nn::Sequential model = make_mlp();
  reference->to(kFloat64);
  model->to(kFloat64);
  DistributedDataParallel ddp(model, "mlp");
  optim::SGD opt_ref(reference->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  optim::SGD opt(model->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  // The order in which this rank's gradients became ready in the first backward.
  std::vector<std::string> ready_order;
  bool first_backward = true;
  for (auto& [pname, p] : model->named_parameters())
    p.register_post_accumulate_grad_hook([&, pname](const Tensor&) {
      if (first_backward) ready_order.push_back(pname);
    });
  Generator data{5, 0};
  for (int step = 0; step < 5; ++step) {
    Tensor x = randn({12, 6}, kFloat64, &data), y = randn({12, 3}, kFloat64, &data);
    opt_ref.zero_grad();
    mse_loss(reference(x), y).backward();
    opt_ref.step();
    opt.zero_grad();
    mse_loss(ddp(shard(x)), shard(y)).backward();
    first_backward = false;
    opt.step();
  }
  check_same_params(*model, *reference, 1e-10);
  // Buckets were rebuilt in gradient-ready order after the first iteration (one bucket
  // here: its parameters in that order), the same on every rank. For this MLP that order
  // is also the initial reverse registration order; "buckets are rebuilt in
  // gradient-ready order" below uses a model where the rebuild changes the layout.
  const auto buckets = ddp.reducer().bucket_parameter_names();
  REQUIRE(buckets.size() == 1);
  CHECK(buckets[0] == ready_order);
  CHECK(same_on_every_rank(layout_indices(*model, buckets)));
}

TEST_CASE("ddp: small buckets, several launched while backward runs, give the same result") {
  manual_seed(2);
  nn::Sequential reference = make_mlp();
  manual_seed(2);
  nn::Sequential model = make_mlp();
  reference->to(kFloat64);
  model->to(kFloat64);
  // 100-byte buckets: one parameter per bucket.
  DistributedDataParallel ddp(model, "mlp", DistributedDataParallelOptions().bucket_cap_mb(1e-4).first_bucket_cap_mb(1e-4));
  CHECK(ddp.reducer().bucket_parameter_names().size() == 4);
  CHECK(ddp.reducer().bucket_parameter_names()[0][0] == "2.bias");  // reverse registration order
  optim::Adam opt_ref(reference->parameters(), optim::AdamOptions(0.01));
  optim::Adam opt(model->parameters(), optim::AdamOptions(0.01));
  Generator data{6, 0};
  for (int step = 0; step < 4; ++step) {
    Tensor x = randn({8, 6}, kFloat64, &data), y = randn({8, 3}, kFloat64, &data);
    opt_ref.zero_grad();
    mse_loss(reference(x), y).backward();
    opt_ref.step();
    opt.zero_grad();
    mse_loss(ddp(shard(x)), shard(y)).backward();
    opt.step();
  }
  check_same_params(*model, *reference, 1e-10);
  // After the rebuild the buckets follow the gradient-ready order, one parameter each:
  // every bucket but the last (which waits for the end of backward) was launched by the
  // hooks while backward still ran.
  CHECK(ddp.reducer().buckets_launched_during_backward() == 3);
}

TEST_CASE("ddp: a discriminator called twice before one backward works with default options (story 4)") {
  auto make_d = [] {
    nn::Sequential d(nn::Conv2d(nn::Conv2dOptions(1, 4, 3).stride(2)), nn::BatchNorm2d(nn::BatchNorm2dOptions(4)),
                     nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)), nn::Flatten(),
                     nn::Linear(nn::LinearOptions(4 * 3 * 3, 1)));
    d->to(kFloat64);
    d->eval();  // eval BatchNorm saves running statistics for backward: a buffer overwrite would be caught
    return d;
  };
  manual_seed(3);
  nn::Sequential reference = make_d();
  manual_seed(3);
  nn::Sequential D = make_d();
  DistributedDataParallel ddp(D, "D");  // default options: broadcast_buffers on
  optim::Adam opt_ref(reference->parameters(), optim::AdamOptions(1e-2));
  optim::Adam opt(D->parameters(), optim::AdamOptions(1e-2));
  Generator data{7, 0};
  for (int step = 0; step < 3; ++step) {
    Tensor real = randn({8, 1, 7, 7}, kFloat64, &data), fake = randn({8, 1, 7, 7}, kFloat64, &data);
    auto loss = [](const Tensor& on_real, const Tensor& on_fake) {
      return binary_cross_entropy_with_logits(on_real, ones_like(on_real)) +
             binary_cross_entropy_with_logits(on_fake, zeros_like(on_fake));
    };
    opt_ref.zero_grad();
    loss(reference(real), reference(fake)).backward();
    opt_ref.step();
    opt.zero_grad();
    loss(ddp(shard(real)), ddp(shard(fake))).backward();
    opt.step();
  }
  check_same_params(*D, *reference, 1e-10);
}

TEST_CASE("ddp: PyTorch's DCGAN loop, one backward per discriminator call, gradients summed before one step") {
  // errD_real.backward(); errD_fake.backward(); optimizerD.step(): each backward
  // all-reduces on its own, and the second adds to the already averaged first.
  auto make_d = [] {
    nn::Sequential d(nn::Linear(nn::LinearOptions(6, 8)), nn::LeakyReLU(), nn::Linear(nn::LinearOptions(8, 1)));
    d->to(kFloat64);
    return d;
  };
  manual_seed(12);
  nn::Sequential reference = make_d();
  manual_seed(12);
  nn::Sequential D = make_d();
  DistributedDataParallel ddp(D, "D");
  optim::Adam opt_ref(reference->parameters(), optim::AdamOptions(1e-2).betas({0.5, 0.999}));
  optim::Adam opt(D->parameters(), optim::AdamOptions(1e-2).betas({0.5, 0.999}));
  Generator data{13, 0};
  for (int step = 0; step < 3; ++step) {
    Tensor real = randn({8, 6}, kFloat64, &data), fake = randn({8, 6}, kFloat64, &data);
    auto half_losses = [](auto&& d, const Tensor& r, const Tensor& f) {
      Tensor on_real = d(r);
      binary_cross_entropy_with_logits(on_real, ones_like(on_real)).backward();
      Tensor on_fake = d(f);
      binary_cross_entropy_with_logits(on_fake, zeros_like(on_fake)).backward();
    };
    opt_ref.zero_grad();
    half_losses(reference, real, fake);
    opt_ref.step();
    opt.zero_grad();
    half_losses(ddp, shard(real), shard(fake));
    opt.step();
  }
  check_same_params(*D, *reference, 1e-10);
}

TEST_CASE("ddp: no_sync accumulates locally, the next backward averages the sum") {
  manual_seed(4);
  nn::Sequential reference = make_mlp();
  manual_seed(4);
  nn::Sequential model = make_mlp();
  reference->to(kFloat64);
  model->to(kFloat64);
  DistributedDataParallel ddp(model, "mlp");
  optim::SGD opt_ref(reference->parameters(), optim::SGDOptions(0.1));
  optim::SGD opt(model->parameters(), optim::SGDOptions(0.1));
  Generator data{8, 0};
  for (int step = 0; step < 3; ++step) {
    Tensor x1 = randn({8, 6}, kFloat64, &data), y1 = randn({8, 3}, kFloat64, &data);
    Tensor x2 = randn({8, 6}, kFloat64, &data), y2 = randn({8, 3}, kFloat64, &data);
    opt_ref.zero_grad();
    (mse_loss(reference(x1), y1) * 0.5).backward();
    (mse_loss(reference(x2), y2) * 0.5).backward();
    opt_ref.step();
    opt.zero_grad();
    {
      auto guard = ddp.no_sync();
      (mse_loss(ddp(shard(x1)), shard(y1)) * 0.5).backward();
    }
    (mse_loss(ddp(shard(x2)), shard(y2)) * 0.5).backward();
    opt.step();
  }
  check_same_params(*model, *reference, 1e-10);
}

TEST_CASE("ddp: find_unused_parameters with a branch skipped on some steps") {
  manual_seed(5);
  auto reference = std::make_shared<Branchy>();
  manual_seed(5);
  auto model = std::make_shared<Branchy>();
  reference->to(kFloat64);
  model->to(kFloat64);
  DistributedDataParallel ddp(model, "branchy", DistributedDataParallelOptions().find_unused_parameters(true));
  optim::SGD opt_ref(reference->parameters(), optim::SGDOptions(0.1));
  optim::SGD opt(model->parameters(), optim::SGDOptions(0.1));
  Generator data{9, 0};
  for (int step = 0; step < 4; ++step) {
    const bool use_b = step % 2 == 1;
    Tensor x = randn({8, 4}, kFloat64, &data), y = randn({8, 2}, kFloat64, &data);
    opt_ref.zero_grad();
    mse_loss(reference->forward(x, use_b), y).backward();
    opt_ref.step();
    opt.zero_grad();
    mse_loss(ddp(shard(x), use_b), shard(y)).backward();
    opt.step();
  }
  check_same_params(*model, *reference, 1e-10);
}

TEST_CASE("ddp: static_graph with a head that is never used equals one process, no error") {
  manual_seed(7);
  auto reference = std::make_shared<Branchy>();
  manual_seed(7);
  auto model = std::make_shared<Branchy>();
  reference->to(kFloat64);
  model->to(kFloat64);
  DistributedDataParallel ddp(model, "branchy", DistributedDataParallelOptions().static_graph(true));
  optim::SGD opt_ref(reference->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  optim::SGD opt(model->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  Generator data{10, 0};
  for (int step = 0; step < 3; ++step) {
    Tensor x = randn({8, 4}, kFloat64, &data), y = randn({8, 2}, kFloat64, &data);
    opt_ref.zero_grad();
    mse_loss(reference->forward(x, false), y).backward();
    opt_ref.step();
    opt.zero_grad();
    mse_loss(ddp(shard(x), false), shard(y)).backward();
    opt.step();
  }
  check_same_params(*model, *reference, 1e-10);
}

TEST_CASE("ddp: a parameter without a gradient is an error naming it (story 9)") {
  manual_seed(6);
  auto model = std::make_shared<Branchy>();
  model->name_tensors("net");
  DistributedDataParallel ddp(model, "branchy");
  Tensor x = randn({4, 4});
  const std::string msg = nd::testing::error_message([&] { ddp(x, /*use_b=*/false).sum().backward(); });
  CHECK(contains(msg, "DistributedDataParallel 'branchy': 2 parameter(s) received no gradient in this backward"));
  CHECK(contains(msg, "net.b.weight (gradient on 0 of " + std::to_string(world_size()) + " ranks)"));
  CHECK(contains(msg, "find_unused_parameters(true)"));
  // The reducer is usable again afterwards.
  ddp(x, true).sum().backward();
  CHECK(model->b->weight.grad().defined());
}

TEST_CASE("ddp: a module cast or moved after wrapping is an error at the next forward or gradient") {
  manual_seed(6);
  auto model = std::make_shared<Branchy>();
  DistributedDataParallel ddp(model, "D");
  model->to(kFloat64);
  const std::string expected =
      "DistributedDataParallel 'D': parameter 'D.trunk.weight' is now f64 on cpu, but its gradient bucket was built "
      "for f32 on cpu: the module was cast or moved (module->to(...)) after it was wrapped. Cast or move it before "
      "constructing DistributedDataParallel.";
  Tensor x = randn({4, 4}, TensorOptions(kFloat64));
  CHECK(nd::testing::error_message([&] { ddp(x, true); }) == expected);
  // Called without the wrapper, the first gradient says so (b's weight is the first ready).
  const std::string direct = nd::testing::error_message([&] { model->forward(x, true).sum().backward(); });
  CHECK(contains(direct, "DistributedDataParallel 'D': parameter 'D."));
  CHECK(contains(direct, "after it was wrapped"));
}

TEST_CASE("ddp: errors name a parameter with DDP's model name when the module's tensors were unnamed") {
  manual_seed(6);
  auto model = std::make_shared<Branchy>();
  DistributedDataParallel ddp(model, "D");
  CHECK(model->b->weight.name() == "D.b.weight");
  Tensor x = randn({4, 4});
  const std::string unused = nd::testing::error_message([&] { ddp(x, /*use_b=*/false).sum().backward(); });
  CHECK(contains(unused, "\n  D.b.weight (gradient on 0 of "));
  ddp(x, true).sum().backward();  // usable again
  // The version counter's error names tensors by these names too (autograd_test checks the text).
  CHECK(model->trunk->weight.name() == "D.trunk.weight");
  // A module the user named keeps its names.
  auto named = std::make_shared<Branchy>();
  named->name_tensors("disc");
  DistributedDataParallel other(named, "D2");
  CHECK(named->b->weight.name() == "disc.b.weight");
}

TEST_CASE("ddp: G, D and an MAE with Adam, Adam and AdamW + cosine equal one process") {
  auto build = [](uint64_t seed) {
    manual_seed(seed);
    nn::Sequential G(nn::Linear(nn::LinearOptions(4, 8)), nn::ReLU(), nn::Linear(nn::LinearOptions(8, 6)));
    nn::Sequential D(nn::Linear(nn::LinearOptions(6, 8)), nn::LeakyReLU(), nn::Linear(nn::LinearOptions(8, 1)));
    nn::Sequential M(nn::Linear(nn::LinearOptions(6, 8)), nn::GELU(), nn::Linear(nn::LinearOptions(8, 6)));
    G->to(kFloat64);
    D->to(kFloat64);
    M->to(kFloat64);
    return std::make_tuple(G, D, M);
  };
  auto [G0, D0, M0] = build(10);
  auto [G, D, M] = build(10);
  DistributedDataParallel g(G, "G"), d(D, "D"), m(M, "MAE");
  optim::Adam og0(G0->parameters(), optim::AdamOptions(1e-2).betas({0.5, 0.999}));
  optim::Adam od0(D0->parameters(), optim::AdamOptions(1e-2).betas({0.5, 0.999}));
  optim::AdamW om0(M0->parameters(), optim::AdamWOptions(1e-2));
  optim::CosineAnnealingLR s0(om0, 4);
  optim::Adam og(G->parameters(), optim::AdamOptions(1e-2).betas({0.5, 0.999}));
  optim::Adam od(D->parameters(), optim::AdamOptions(1e-2).betas({0.5, 0.999}));
  optim::AdamW om(M->parameters(), optim::AdamWOptions(1e-2));
  optim::CosineAnnealingLR s(om, 4);

  // One joint step: D on real vs detached fake, G through D, MAE on masked real.
  auto step = [](auto&& Gf, auto&& Df, auto&& Mf, optim::Optimizer& og, optim::Optimizer& od, optim::Optimizer& om,
                 optim::LRScheduler& sched, const Tensor& z, const Tensor& real, const Tensor& mask) {
    gan_step(Gf, Df, og, od, z, real);
    om.zero_grad();
    mse_loss(Mf(real * mask), real).backward();
    om.step();
    sched.step();
  };
  Generator data{11, 0};
  for (int k = 0; k < 3; ++k) {
    Tensor z = randn({8, 4}, kFloat64, &data), real = randn({8, 6}, kFloat64, &data);
    Tensor mask = rand({8, 6}, kFloat64, &data).gt(0.5).to(kFloat64);
    step(G0, D0, M0, og0, od0, om0, s0, z, real, mask);
    step(g, d, m, og, od, om, s, shard(z), shard(real), shard(mask));
  }
  check_same_params(*G, *G0, 1e-10);
  check_same_params(*D, *D0, 1e-10);
  check_same_params(*M, *M0, 1e-10);
}

TEST_CASE("ddp: one rank's non-finite gradient makes every rank skip the step") {
  manual_seed(13);
  nn::Sequential model = make_mlp();
  DistributedDataParallel ddp(model, "mlp", DistributedDataParallelOptions().skip_nonfinite_steps(true));
  Tensor x = randn({4, 6});
  ddp(x).sum().backward();
  CHECK_FALSE(ddp.reducer().skip_step());
  Tensor scale = scalar_tensor(rank() == world_size() - 1 ? std::nan("") : 1.0);
  (ddp(x).sum() * scale).backward();
  CHECK(ddp.reducer().skip_step());
  model->zero_grad();  // (else the next backwards add to the NaN gradients)
  Tensor inf_scale = scalar_tensor(rank() == 0 ? std::numeric_limits<double>::infinity() : 1.0);
  (ddp(x).sum() * inf_scale).backward();
  CHECK(ddp.reducer().skip_step());
  model->zero_grad();
  ddp(x).sum().backward();
  CHECK_FALSE(ddp.reducer().skip_step());
}

TEST_CASE("ddp: GradScaler skips the same steps on every rank, as one process would") {
  // Rank W-1's loss is inf at step 1: the all-reduce makes that gradient inf on every rank,
  // so every rank skips step 1 and halves its scale, with no collective of the scaler's own.
  // Every rank has the same batch, so the averaged gradient is one process's.
  const double inf = std::numeric_limits<double>::infinity();
  manual_seed(16);
  nn::Sequential reference = make_mlp();
  manual_seed(16);
  nn::Sequential model = make_mlp();
  DistributedDataParallel ddp(model, "mlp");
  optim::Adam opt_ref(reference->parameters(), optim::AdamOptions(1e-2));
  optim::Adam opt(model->parameters(), optim::AdamOptions(1e-2));
  optim::GradScaler scaler(optim::GradScalerOptions().init_scale(1024.0));
  const Tensor x = randn({4, 6});
  std::vector<int64_t> stepped;
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    const double factor = step == 1 && rank() == world_size() - 1 ? inf : 1.0;
    scaler.scale(ddp(x).sum() * factor).backward();
    stepped.push_back(scaler.step(opt));
    scaler.update();
    if (step == 1) continue;  // the reference takes the steps that were taken
    opt_ref.zero_grad();
    reference(x).sum().backward();
    opt_ref.step();
  }
  CHECK(stepped == std::vector<int64_t>{1, 0, 1});
  CHECK(scaler.get_scale() == 512.0);
  CHECK(same_on_every_rank(stepped));
  auto p = model->named_parameters(), pr = reference->named_parameters();
  for (size_t i = 0; i < p.size(); ++i) nd::testing::check_close(p[i].second, pr[i].second, 1e-6, 1e-6, p[i].first);
}

TEST_CASE("ddp: conv + SyncBatchNorm, called twice per step, unequal per-rank batches, equals one process") {
  auto make_d = [] {
    nn::Sequential d(nn::Conv2d(nn::Conv2dOptions(1, 4, 3).stride(2)), nn::BatchNorm2d(nn::BatchNorm2dOptions(4)),
                     nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)), nn::Flatten(),
                     nn::Linear(nn::LinearOptions(4 * 3 * 3, 1)));
    d->to(kFloat64);
    return d;
  };
  manual_seed(14);
  nn::Sequential reference = make_d();  // plain BatchNorm2d over the whole batch
  manual_seed(14);
  nn::Sequential D = make_d();
  nn::convert_sync_batchnorm(D.ptr());
  DistributedDataParallel ddp(D, "D");
  optim::Adam opt_ref(reference->parameters(), optim::AdamOptions(1e-2));
  optim::Adam opt(D->parameters(), optim::AdamOptions(1e-2));
  // Rank r holds r + 1 samples: a global batch of W (W + 1) / 2.
  const int64_t W = world_size(), N = W * (W + 1) / 2, begin = rank() * (rank() + 1) / 2, count = rank() + 1;
  // Losses are sums scaled by W / N, so DDP's average over ranks is the mean over all N samples.
  auto loss = [](const Tensor& on_real, const Tensor& on_fake, double scale) {
    return (binary_cross_entropy_with_logits(on_real, ones_like(on_real), {}, {}, Reduction::Sum) +
            binary_cross_entropy_with_logits(on_fake, zeros_like(on_fake), {}, {}, Reduction::Sum)) *
           scale;
  };
  Generator data{15, 0};
  for (int step = 0; step < 3; ++step) {
    Tensor real = randn({N, 1, 7, 7}, kFloat64, &data), fake = randn({N, 1, 7, 7}, kFloat64, &data);
    opt_ref.zero_grad();
    loss(reference(real), reference(fake), 1.0 / N).backward();
    opt_ref.step();
    opt.zero_grad();
    loss(ddp(real.narrow(0, begin, count)), ddp(fake.narrow(0, begin, count)), double(W) / N).backward();
    opt.step();
  }
  check_same_params(*D, *reference, 1e-9);
  auto rb = reference->named_buffers(), db = D->named_buffers();
  REQUIRE(rb.size() == db.size());
  for (size_t i = 0; i < rb.size(); ++i) nd::testing::check_close(db[i].second, rb[i].second, 1e-9, 1e-9, db[i].first);
}

TEST_CASE("ddp: a backward abandoned by an exception does not break the next iteration") {
  manual_seed(16);
  nn::Sequential model = make_mlp();
  model->to(kFloat64);
  DistributedDataParallel ddp(model, "mlp");
  Tensor x = randn({4, 6}, kFloat64);
  // A hook that throws once, in the middle of backward (after DDP's own hook ran).
  bool armed = true;
  model->parameters()[0].register_post_accumulate_grad_hook([&](const Tensor&) {
    if (armed) {
      armed = false;
      throw Error("injected failure");
    }
  });
  CHECK(nd::testing::error_message([&] { ddp(x).sum().backward(); }) == "injected failure");
  // The next iteration reduces normally: the average over ranks of each shard's sum is
  // the whole batch's sum divided by the world size.
  manual_seed(16);
  nn::Sequential reference = make_mlp();
  reference->to(kFloat64);
  for (auto& p : model->parameters()) p.set_grad(Tensor());
  ddp(shard(x)).sum().backward();
  reference(x).sum().backward();
  auto ours = model->parameters(), theirs = reference->parameters();
  for (size_t i = 0; i < ours.size(); ++i)
    nd::testing::check_close(ours[i].grad(), theirs[i].grad() / double(world_size()), 1e-10, 1e-10,
                             "grad after recovery");
}

// --- Parameters, buffers and gradients: what construction, broadcast_buffers and
// --- gradient_as_bucket_view promise (each test fails if the promise is dropped).
