// DistributedDataParallel, run at 1, 2 and 4 ranks: N ranks on N shards end with the
// same parameters as one process on the whole batch, for the cases users get stuck on.
#include <cmath>
#include <map>
#include <set>

#include "collectives/ddp.h"
#include "harness.h"

using namespace nd;
using dist::DistributedDataParallel;
using dist::DistributedDataParallelOptions;

namespace {

int rank() { return dist::world()->rank(); }
int world_size() { return dist::world()->size(); }

// Rows [rank * n / W, (rank + 1) * n / W) of a global batch.
Tensor shard(const Tensor& global) {
  const int64_t n = global.size(0), W = world_size();
  return global.narrow(0, rank() * n / W, n / W);
}

void check_same_params(const nn::Module& a, const nn::Module& b, double tol) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i].first);
    nd::testing::check_close(pa[i].second, pb[i].second, tol, tol, pa[i].first);
  }
}

nn::Sequential make_mlp() {
  return nn::Sequential(nn::Linear(nn::LinearOptions(6, 16)), nn::Tanh(), nn::Linear(nn::LinearOptions(16, 3)));
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Bucket layout as parameter indices (registration order), bucket after bucket, -1 between.
std::vector<int64_t> layout_indices(const nn::Module& m, const std::vector<std::vector<std::string>>& buckets) {
  auto named = m.named_parameters();
  std::vector<int64_t> out;
  for (const auto& bucket : buckets) {
    for (const std::string& name : bucket)
      for (size_t i = 0; i < named.size(); ++i)
        if (named[i].first == name) out.push_back(static_cast<int64_t>(i));
    out.push_back(-1);
  }
  return out;
}

// True when every rank passes the same values (one all-gather over the world).
bool same_on_every_rank(const std::vector<int64_t>& mine) {
  auto w = dist::world();
  std::vector<double> v(mine.begin(), mine.end());
  std::vector<Tensor> all;
  for (int r = 0; r < w->size(); ++r) all.push_back(empty({static_cast<int64_t>(v.size())}, kInt64));
  w->allgather(all, tensor(v, kInt64))->wait();
  for (int r = 0; r < w->size(); ++r)
    if (!nd::testing::bitwise_equal(all[r], all[0])) return false;
  return true;
}

}  // namespace

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

namespace {
// Two heads; head "b" is used only when asked.
struct Branchy : nn::Module {
  nn::Linear trunk{nn::LinearOptions(4, 8)}, a{nn::LinearOptions(8, 2)}, b{nn::LinearOptions(8, 2)};
  Branchy() : nn::Module("Branchy") {
    register_module("trunk", trunk);
    register_module("a", a);
    register_module("b", b);
  }
  Tensor forward(const Tensor& x, bool use_b) {
    Tensor h = tanh(trunk(x));
    return use_b ? a(h) + b(h) : a(h);
  }
};
}  // namespace

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
    Tensor fake = Gf(z);
    od.zero_grad();
    Tensor on_real = Df(real), on_fake = Df(fake.detach());
    (binary_cross_entropy_with_logits(on_real, ones_like(on_real)) +
     binary_cross_entropy_with_logits(on_fake, zeros_like(on_fake)))
        .backward();
    od.step();
    og.zero_grad();
    Tensor judged = Df(fake);
    binary_cross_entropy_with_logits(judged, ones_like(judged)).backward();
    og.step();
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

TEST_CASE("ddp: ranks with different models get an error naming the parameter and the ranks") {
  if (world_size() == 1) {
    MESSAGE("SKIPPED: needs 2 or more ranks (run under mpirun)");
    return;
  }
  nn::Sequential model(nn::Linear(nn::LinearOptions(4, rank() == 1 ? 5 : 4)));
  const std::string msg = nd::testing::error_message([&] { DistributedDataParallel ddp(model, "mismatch"); });
  CHECK(contains(msg, "parameter 0 ('0.weight' here) differs across ranks: rank 0 has f32 [4, 4], rank 1 has f32 [5, 4]"));
}

TEST_CASE("ddp: ranks in different backward passes get an error, not a hang") {
  if (world_size() == 1) {
    MESSAGE("SKIPPED: needs 2 or more ranks (run under mpirun)");
    return;
  }
  manual_seed(12);
  nn::Sequential A(nn::Linear(nn::LinearOptions(3, 2)));
  nn::Sequential B(nn::Linear(nn::LinearOptions(3, 2)));
  DistributedDataParallel a(A, "A"), b(B, "B");
  Tensor x = randn({2, 3});
  // Rank 0 runs A's backward while the others run B's.
  const std::string msg = nd::testing::error_message([&] { (rank() == 0 ? a(x) : b(x)).sum().backward(); });
  CHECK(contains(msg, "ranks diverged"));
  CHECK(contains(msg, "rank 0: backward of DDP model 'A'"));
  CHECK(contains(msg, "rank 1: backward of DDP model 'B'"));
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

namespace {
nn::Sequential make_conv_bn() {
  nn::Sequential m(nn::Conv2d(nn::Conv2dOptions(1, 2, 3)), nn::BatchNorm2d(nn::BatchNorm2dOptions(2)));
  m->to(kFloat64);
  return m;
}

// Every buffer (running_mean, running_var, num_batches_tracked) set to `value`.
void fill_buffers(const nn::Module& m, double value) {
  NoGradGuard no_grad;
  for (auto& [name, b] : m.named_buffers()) b.fill_(value);
}
}  // namespace

TEST_CASE("ddp: construction gives every rank rank 0's parameters and buffers") {
  if (world_size() == 1) {
    MESSAGE("SKIPPED: needs 2 or more ranks (run under mpirun)");
    return;
  }
  manual_seed(40);
  nn::Sequential reference = make_conv_bn();  // what rank 0 builds
  fill_buffers(*reference, 1.0);
  manual_seed(40 + rank());  // every rank starts from its own values
  nn::Sequential model = make_conv_bn();
  fill_buffers(*model, 1.0 + rank());
  DistributedDataParallel ddp(model, "bcast");
  auto p = model->named_parameters(), pr = reference->named_parameters();
  REQUIRE(p.size() == pr.size());
  for (size_t i = 0; i < p.size(); ++i) nd::testing::check_close(p[i].second, pr[i].second, 0, 0, p[i].first);
  auto b = model->named_buffers(), br = reference->named_buffers();
  REQUIRE(b.size() == 3);
  REQUIRE(br.size() == 3);
  for (size_t i = 0; i < b.size(); ++i) nd::testing::check_close(b[i].second, br[i].second, 0, 0, b[i].first);
}

TEST_CASE("ddp: broadcast_buffers(true) gives every rank rank 0's buffers at each forward, false keeps its own") {
  if (world_size() == 1) {
    MESSAGE("SKIPPED: needs 2 or more ranks (run under mpirun)");
    return;
  }
  for (bool broadcast : {true, false}) {
    CAPTURE(broadcast);
    manual_seed(41);
    nn::Sequential model = make_conv_bn();
    model->eval();  // running statistics are used, not updated: only the broadcast changes them
    DistributedDataParallel ddp(model, "buffers", DistributedDataParallelOptions().broadcast_buffers(broadcast));
    Tensor x = randn({2, 1, 5, 5}, kFloat64);
    for (int step = 0; step < 2; ++step) {
      fill_buffers(*model, 10.0 * step + 1.0 + rank());  // rank-dependent, after construction
      ddp(x).sum().backward();
      const double expected = 10.0 * step + 1.0 + (broadcast ? 0 : rank());
      for (auto& [name, b] : model->named_buffers())
        nd::testing::check_close(b, std::vector<double>(b.numel(), expected), 0, 0, name);
    }
  }
}

TEST_CASE("ddp: gradient_as_bucket_view: .grad are views into their bucket, false gives each its own storage") {
  for (bool as_view : {true, false}) {
    CAPTURE(as_view);
    manual_seed(42);
    nn::Sequential model = make_mlp();
    model->to(kFloat64);
    // A first bucket of ~470 bytes: the second layer's two gradients (24 + 384 bytes)
    // fill it before and after the rebuild, the first layer's two the second bucket.
    DistributedDataParallel ddp(
        model, "views", DistributedDataParallelOptions().first_bucket_cap_mb(4.5e-4).gradient_as_bucket_view(as_view));
    std::map<std::string, Tensor> params;
    for (auto& [name, p] : model->named_parameters()) params[name] = p;
    Tensor x = randn({4, 6}, kFloat64);
    for (int step = 0; step < 2; ++step) {  // before and after the bucket rebuild
      CAPTURE(step);
      model->zero_grad();
      ddp(x).sum().backward();
      const auto buckets = ddp.reducer().bucket_parameter_names();
      REQUIRE(buckets.size() == 2);
      std::set<const Storage*> storages;
      for (const auto& bucket : buckets) {
        REQUIRE(bucket.size() == 2);
        const Tensor first = params.at(bucket[0]).grad();
        int64_t offset = 0;
        for (const std::string& name : bucket) {
          CAPTURE(name);
          const Tensor g = params.at(name).grad();
          REQUIRE(g.defined());
          storages.insert(g.storage().get());
          if (as_view) {
            CHECK(g.storage() == first.storage());  // one flat storage per bucket
            CHECK(g.storage_offset() == offset);     // laid out back to back in bucket order
          } else {
            CHECK(g.storage_offset() == 0);  // a storage of its own, exactly its size
            CHECK(g.storage()->nbytes() == static_cast<size_t>(g.numel()) * sizeof(double));
          }
          offset += g.numel();
        }
      }
      CHECK(storages.size() == (as_view ? 2u : 4u));
    }
  }
}

namespace {
// Registers its head before its trunk, but runs the trunk first: the gradient-ready
// order (head first) is not the reverse registration order (trunk first).
struct HeadFirst : nn::Module {
  nn::Linear head{nn::LinearOptions(8, 2)}, trunk{nn::LinearOptions(4, 8)};
  HeadFirst() : nn::Module("HeadFirst") {
    register_module("head", head);
    register_module("trunk", trunk);
  }
  Tensor forward(const Tensor& x) { return head(tanh(trunk(x))); }
};
}  // namespace

TEST_CASE("ddp: buckets are rebuilt in gradient-ready order after the first iteration, the same on every rank") {
  manual_seed(43);
  auto model = std::make_shared<HeadFirst>();
  // 10-byte buckets: one parameter each.
  DistributedDataParallel ddp(model, "order", DistributedDataParallelOptions().bucket_cap_mb(1e-5).first_bucket_cap_mb(1e-5));
  using Names = std::vector<std::vector<std::string>>;
  CHECK(ddp.reducer().bucket_parameter_names() ==
        Names{{"trunk.bias"}, {"trunk.weight"}, {"head.bias"}, {"head.weight"}});  // reverse registration
  std::vector<std::string> ready_order;
  for (auto& [pname, p] : model->named_parameters())
    p.register_post_accumulate_grad_hook([&ready_order, pname](const Tensor&) { ready_order.push_back(pname); });
  Tensor x = randn({4, 4});
  ddp(x).sum().backward();
  // The first backward ran in the old layout: buckets 0 and 1 (the trunk's) became
  // ready with the last two gradients, so bucket 2 (head.bias, ready first) waited for
  // them: at most one bucket launched before every gradient was ready.
  CHECK(ddp.reducer().buckets_launched_during_backward() <= 1);
  REQUIRE(ready_order.size() == 4);
  CHECK(ready_order[0].rfind("head.", 0) == 0);
  Names expected;
  for (const std::string& n : ready_order) expected.push_back({n});
  CHECK(ddp.reducer().bucket_parameter_names() == expected);
  CHECK(same_on_every_rank(layout_indices(*model, ddp.reducer().bucket_parameter_names())));
  ddp(x).sum().backward();
  CHECK(ddp.reducer().buckets_launched_during_backward() == 3);
  CHECK(ddp.reducer().bucket_parameter_names() == expected);  // rebuilt once only
}

// --- Argument and layout errors.

TEST_CASE("ddp: non-positive bucket caps are errors naming the values") {
  nn::Sequential model = make_mlp();
  CHECK(contains(nd::testing::error_message([&] {
                   DistributedDataParallel ddp(model, "caps", DistributedDataParallelOptions().bucket_cap_mb(0));
                 }),
                 "DistributedDataParallel 'caps': expected positive bucket_cap_mb and first_bucket_cap_mb, found 0 and 1"));
  CHECK(contains(nd::testing::error_message([&] {
                   DistributedDataParallel ddp(model, "caps",
                                               DistributedDataParallelOptions().first_bucket_cap_mb(-2));
                 }),
                 "found 25 and -2"));
}

TEST_CASE("ddp: parameters on several devices are an error") {
  if (!cuda::is_available()) {
    MESSAGE("SKIPPED: needs a GPU (a CPU-only machine has one device)");
    return;
  }
  auto model = std::make_shared<Branchy>();
  model->b->to(Device("cuda:0"));
  const std::string msg = nd::testing::error_message([&] { DistributedDataParallel ddp(model, "devices"); });
  CHECK(contains(msg, "DistributedDataParallel 'devices': parameters on several devices"));
  CHECK(contains(msg, "put the whole module on one device"));
}

TEST_CASE("ddp: ranks with different parameter counts get an error naming both counts and ranks") {
  if (world_size() == 1) {
    MESSAGE("SKIPPED: needs 2 or more ranks (run under mpirun)");
    return;
  }
  nn::Sequential model(nn::Linear(nn::LinearOptions(4, 4)));
  if (rank() == 1) model->push_back(nn::Linear(nn::LinearOptions(4, 4)));
  const std::string msg = nd::testing::error_message([&] { DistributedDataParallel ddp(model, "count"); });
  const std::string expected = rank() == 1 ? "rank 1 has 4 parameters that require grad but rank 0 has 2"
                                           : "rank " + std::to_string(rank()) +
                                                 " has 2 parameters that require grad but rank 1 has 4";
  CHECK(contains(msg, "DistributedDataParallel 'count': " + expected));
}

TEST_CASE("ddp: state_dict keys are the module's, with no 'module.' prefix (story 7)") {
  manual_seed(44);
  nn::Sequential model = make_conv_bn();
  DistributedDataParallel ddp(model, "dict");
  const TensorDict ours = ddp.state_dict(), theirs = model->state_dict();
  std::vector<std::string> keys, module_keys;
  for (const auto& [k, v] : ours) keys.push_back(k);
  for (const auto& [k, v] : theirs) module_keys.push_back(k);
  CHECK(keys == module_keys);
  CHECK(keys == std::vector<std::string>{"0.bias", "0.weight", "1.bias", "1.num_batches_tracked", "1.running_mean",
                                         "1.running_var", "1.weight"});
  // And it loads back into the wrapper and into a bare module.
  TensorDict changed;
  for (const auto& [k, v] : ours) changed[k] = v.detach().clone().fill_(3.0);
  ddp.load_state_dict(changed);
  nd::testing::check_close(model->named_parameters()[0].second, std::vector<double>(18, 3.0), 0, 0, "0.weight");
}

// --- Ranks that diverge in the collectives they issue get an error naming both
// --- sides at the next backward, on every rank, not a hang.
//
// The data group is the world; the check travels on dist::control_world(), its own
// communicator. MPI still pairs the divergent collectives on the world, so they keep
// equal byte counts pairwise (a different dtype of the same width, the same two in
// another order); the extra collective is left pending and matched after the error;
// a pure size difference goes through a group that only records (RecordingGroup).

namespace {
// A process group of the world's size that moves no data: it records what is issued
// and completes it at once. DDP's reduction through it is wrong (each rank keeps its own
// sums, so every parameter looks used on one rank only: find_unused_parameters(true));
// its checks are not.
class RecordingGroup : public dist::ProcessGroup {
 public:
  int rank() const override { return dist::world()->rank(); }
  int size() const override { return dist::world()->size(); }
  std::string backend() const override { return "recording"; }
  std::shared_ptr<dist::Work> allreduce(const Tensor& t, const dist::AllreduceOptions& o = {}) override {
    return issue("allreduce", t, o.bucket);
  }
  std::shared_ptr<dist::Work> broadcast(const Tensor& t, int) override { return issue("broadcast", t); }
  std::shared_ptr<dist::Work> allgather(const std::vector<Tensor>&, const Tensor& t) override {
    return issue("allgather", t);
  }
  std::shared_ptr<dist::Work> reduce_scatter(const Tensor& t, const std::vector<Tensor>&, dist::ReduceOp) override {
    return issue("reduce_scatter", t);
  }
  std::shared_ptr<dist::Work> barrier() override { return issue("barrier", Tensor()); }

 private:
  std::shared_ptr<dist::Work> issue(const char* op, const Tensor& t, int64_t bucket = -1) {
    dist::CollectiveInfo info{op, sequence_++, t.defined() ? t.numel() : 0, t.defined() ? t.dtype() : kFloat32,
                              bucket};
    note_issued(info);
    auto work = std::make_shared<dist::AsyncWork>(info);
    work->mark_done();
    return work;
  }
  uint64_t sequence_ = 0;
};

DistributedDataParallelOptions recorded(const std::shared_ptr<dist::ProcessGroup>& group) {
  return DistributedDataParallelOptions().find_unused_parameters(true).process_group(group);
}

bool separate_control_group() { return dist::control_world() != dist::world(); }

// The MLP's one bucket: 163 gradients and 4 + 1 status slots, f64.
const char* kMlpBucket = "(bucket 0, 168 x f64)";
}  // namespace

TEST_CASE("ddp divergence: a rank that issues one extra all-reduce on the data group") {
  if (world_size() == 1 || !separate_control_group()) {
    MESSAGE("SKIPPED: needs 2 or more ranks and MPI_THREAD_MULTIPLE (run under mpirun)");
    return;
  }
  manual_seed(50);
  nn::Sequential model = make_mlp();
  model->to(kFloat64);
  DistributedDataParallel ddp(model, "extra");
  Tensor x = randn({4, 6}, kFloat64);
  ddp(x).sum().backward();  // iteration 0: checked, then its bucket all-reduce
  const uint64_t bucket_seq = dist::world()->record().count - 1;
  Tensor out = ddp(x).sum();
  Tensor extra = ones({3});
  std::shared_ptr<dist::Work> work;
  if (rank() == 1) work = dist::world()->allreduce(extra);  // unmatched until the others issue theirs below
  const std::string msg = nd::testing::error_message([&] { out.backward(); });
  if (rank() != 1) work = dist::world()->allreduce(extra);
  work->wait();
  nd::testing::check_close(extra, std::vector<double>(3, world_size()), 0, 0, "the extra all-reduce, matched late");
  const std::string since = " on the mpi group since the backward of iteration 0, ";
  CHECK(contains(msg, "ranks diverged: rank 1 differs from rank 0"));
  CHECK(contains(msg, "rank 0: backward of DDP model 'extra', iteration 1, 1 bucket(s), 4 parameter(s); issued 1 "
                      "collective(s)" + since + "the last allreduce #" + std::to_string(bucket_seq) + " " + kMlpBucket));
  CHECK(contains(msg, "rank 1: backward of DDP model 'extra', iteration 1, 1 bucket(s), 4 parameter(s); issued 2 "
                      "collective(s)" + since + "the last 2: allreduce #" + std::to_string(bucket_seq) + " " +
                      kMlpBucket + ", then allreduce #" + std::to_string(bucket_seq + 1) + " (3 x f32)"));
}

TEST_CASE("ddp divergence: a rank that all-reduces a different dtype, then the reducer goes on") {
  if (world_size() == 1 || !separate_control_group()) {
    MESSAGE("SKIPPED: needs 2 or more ranks and MPI_THREAD_MULTIPLE (run under mpirun)");
    return;
  }
  manual_seed(51);
  nn::Sequential model = make_mlp();
  model->to(kFloat64);
  DistributedDataParallel ddp(model, "dtype");
  Tensor x = randn({4, 6}, kFloat64);
  ddp(x).sum().backward();
  const uint64_t next = dist::world()->record().count;
  // 4 x i64 on rank 1, 4 x f64 elsewhere: the same bytes, so MPI pairs them (garbage values).
  dist::world()->allreduce(rank() == 1 ? ones({4}, kInt64) : ones({4}, kFloat64))->wait();
  const std::string msg = nd::testing::error_message([&] { ddp(x).sum().backward(); });
  const std::string head = "issued 2 collective(s) on the mpi group since the backward of iteration 0, the last 2: "
                           "allreduce #" + std::to_string(next - 1) + " " + kMlpBucket + ", then allreduce #" +
                           std::to_string(next);
  CHECK(contains(msg, "ranks diverged: rank 1 differs from rank 0"));
  CHECK(contains(msg, "rank 0: backward of DDP model 'dtype', iteration 1, 1 bucket(s), 4 parameter(s); " + head +
                          " (4 x f64)"));
  CHECK(contains(msg, "rank 1: backward of DDP model 'dtype', iteration 1, 1 bucket(s), 4 parameter(s); " + head +
                          " (4 x i64)"));
  // Every rank starts a fresh comparison from the failed check: the next backward passes.
  ddp(x).sum().backward();
  ddp(x).sum().backward();
}

TEST_CASE("ddp divergence: the same collectives in another order") {
  if (world_size() == 1 || !separate_control_group()) {
    MESSAGE("SKIPPED: needs 2 or more ranks and MPI_THREAD_MULTIPLE (run under mpirun)");
    return;
  }
  manual_seed(52);
  nn::Sequential model = make_mlp();
  model->to(kFloat64);
  DistributedDataParallel ddp(model, "order");
  Tensor x = randn({4, 6}, kFloat64);
  ddp(x).sum().backward();
  const uint64_t next = dist::world()->record().count;
  // 4 x f64 then 4 x i64, and on rank 1 the other way round (pairwise the same bytes).
  Tensor a = ones({4}, kFloat64), b = ones({4}, kInt64);
  auto w1 = dist::world()->allreduce(rank() == 1 ? b : a);
  auto w2 = dist::world()->allreduce(rank() == 1 ? a : b);
  w1->wait();
  w2->wait();
  const std::string msg = nd::testing::error_message([&] { ddp(x).sum().backward(); });
  const std::string head = "issued 3 collective(s) on the mpi group since the backward of iteration 0, the last 2: ";
  const std::string first = "allreduce #" + std::to_string(next), second = "allreduce #" + std::to_string(next + 1);
  CHECK(contains(msg, "rank 0: backward of DDP model 'order', iteration 1, 1 bucket(s), 4 parameter(s); " + head +
                          first + " (4 x f64), then " + second + " (4 x i64)"));
  CHECK(contains(msg, "rank 1: backward of DDP model 'order', iteration 1, 1 bucket(s), 4 parameter(s); " + head +
                          first + " (4 x i64), then " + second + " (4 x f64)"));
  ddp(x).sum().backward();
}

TEST_CASE("ddp divergence: a rank that all-reduces a different size (through a recording group)") {
  if (world_size() == 1) {
    MESSAGE("SKIPPED: needs 2 or more ranks (run under mpirun)");
    return;
  }
  auto group = std::make_shared<RecordingGroup>();
  manual_seed(53);
  nn::Sequential model = make_mlp();
  model->to(kFloat64);
  DistributedDataParallel ddp(model, "sized", recorded(group));
  Tensor x = randn({4, 6}, kFloat64);
  ddp(x).sum().backward();  // construction broadcast 4 parameters (#0-#3); iteration 0 all-reduced bucket 0 (#4)
  group->allreduce(zeros({rank() == 1 ? 6 : 4}));
  const std::string msg = nd::testing::error_message([&] { ddp(x).sum().backward(); });
  const std::string head = "issued 2 collective(s) on the recording group since the backward of iteration 0, the "
                           "last 2: allreduce #4 " + std::string(kMlpBucket) + ", then allreduce #5 ";
  CHECK(contains(msg, "rank 0: backward of DDP model 'sized', iteration 1, 1 bucket(s), 4 parameter(s); " + head +
                          "(4 x f32)"));
  CHECK(contains(msg, "rank 1: backward of DDP model 'sized', iteration 1, 1 bucket(s), 4 parameter(s); " + head +
                          "(6 x f32)"));
  // Collectives since construction count too: a rank with one more before the first backward.
  manual_seed(54);
  nn::Sequential other = make_mlp();
  other->to(kFloat64);
  DistributedDataParallel fresh(other, "fresh", recorded(group));
  if (rank() == 1) group->barrier();
  const std::string first = nd::testing::error_message([&] { fresh(x).sum().backward(); });
  CHECK(contains(first, "rank 0: backward of DDP model 'fresh', iteration 0, 1 bucket(s), 4 parameter(s); issued 0 "
                        "collective(s) on the recording group since DDP construction"));
  CHECK(contains(first, "rank 1: backward of DDP model 'fresh', iteration 0, 1 bucket(s), 4 parameter(s); issued 1 "
                        "collective(s) on the recording group since DDP construction, the last barrier #"));
}
