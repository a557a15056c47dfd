// ZeroRedundancyOptimizer, run at 1, 2 and 4 ranks (f64): DCGAN G, D and the MAE under DDP
// with ZeRO Adam / AdamW (the MAE's over the paper's two param groups, each with its own
// weight decay) end equal to DDP with plain Adam / AdamW; each rank's optimizer
// state is its ~1/W share; the consolidated state_dict is the plain optimizer's, so a run
// saved at W ranks resumes at 1 (with or without ZeRO) and a plain checkpoint loads into a
// ZeRO run; bad input is an nd::Error.
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "collectives/ddp.h"
#include "collectives/local_process_group.h"
#include "collectives/zero.h"
#include "engine/ops/copy.h"
#include "dist/ddp_test_util.h"
#include "harness.h"
#include "models/dcgan.h"
#include "models/mae.h"
#include "models/recipes.h"

using namespace nd;
using dist::DistributedDataParallel;
using dist::ZeroRedundancyOptimizer;

namespace {

using namespace nd::testing::ddp;

void check_same_state(const TensorDict& a, const TensorDict& b, double tol) {
  REQUIRE(a.size() == b.size());
  for (const auto& [key, t] : a) {
    REQUIRE(b.count(key));
    nd::testing::check_close(t, b.at(key), tol, tol, key);
  }
}

// The ZeRO optimizer's share of the unsharded state: the ranks' shares add up to it exactly,
// and each is its 1/W up to one element per buffer.
void check_state_share(const ZeroRedundancyOptimizer& zero, const optim::Optimizer& plain, int64_t buffers) {
  const int64_t mine = zero.state_bytes(), total = plain.state_bytes();
  Tensor sum = tensor({static_cast<double>(mine)}, kInt64);
  dist::world()->allreduce(sum)->wait();
  CHECK(sum.item() == total);
  const int64_t per_element = buffers * 8, W = world_size();
  CHECK(mine >= total / W - per_element);
  CHECK(mine <= total / W + per_element);
  if (rank() == 0)
    MESSAGE("optimizer state bytes per rank: " << mine << " of " << total << " unsharded (" << W << " ranks)");
}

models::MAEConfig small_mae() {
  models::MAEConfig c;
  c.embed_dim = 16, c.depth = 1, c.num_heads = 2;
  c.decoder_embed_dim = 8, c.decoder_depth = 1, c.decoder_num_heads = 2;
  return c;
}


// DCGAN G, D and the MAE, each under DDP, trained like train_joint for 4 steps with Adam,
// Adam and AdamW (models::mae_param_groups) + cosine: plain, and wrapped in ZeroRedundancyOptimizer (stage 2: given the
// DDP model, whose buckets are then reduce-scattered).
void check_gan_and_mae(bool stage2) {
  auto build = [](uint64_t seed) {
    manual_seed(seed);
    models::DCGANGenerator G(/*nz=*/8, /*ngf=*/4);
    models::DCGANDiscriminator D(/*ndf=*/4);
    models::MAE M(small_mae());
    models::dcgan_init(*G);
    models::dcgan_init(*D);
    G->to(kFloat64);
    D->to(kFloat64);
    M->to(kFloat64);
    return std::make_tuple(G, D, M);
  };
  auto [G0, D0, M0] = build(21);
  auto [G, D, M] = build(21);
  DistributedDataParallel g0(G0, "G0"), g(G, "G");
  DistributedDataParallel d0(D0, "D0"), d(D, "D");
  DistributedDataParallel m0(M0, "MAE0"), m(M, "MAE");
  const auto adam = optim::AdamOptions(1e-2).betas({0.5, 0.999});
  const auto adamw = optim::AdamWOptions(1e-2).betas({0.9, 0.95}).weight_decay(0.05);
  optim::Adam og0(G0->parameters(), adam), od0(D0->parameters(), adam);
  // The MAE's AdamW over the paper's two groups (weight decay 0 and 0.05: per-group options).
  optim::AdamW om0(models::mae_param_groups(*M0, 1e-2), adamw);
  optim::CosineAnnealingLR s0(om0, 4);
  auto with = [&](auto& ddp) {
    return dist::ZeroRedundancyOptimizerOptions().ddp(stage2 ? &ddp.reducer() : nullptr);
  };
  auto og = ZeroRedundancyOptimizer::make<optim::Adam>(G->parameters(), adam, with(g));
  auto od = ZeroRedundancyOptimizer::make<optim::Adam>(D->parameters(), adam, with(d));
  auto om = std::make_unique<ZeroRedundancyOptimizer>(
      models::mae_param_groups(*M, 1e-2), ZeroRedundancyOptimizer::optimizer_class<optim::AdamW, optim::AdamWOptions>(),
      adamw, with(m));
  optim::CosineAnnealingLR s(*om, 4);

  // One step of train_joint's loop: D on real vs detached fake, G through D, MAE on real.
  auto step = [](auto& Gf, auto& Df, auto& Mf, optim::Optimizer& og, optim::Optimizer& od, optim::Optimizer& om,
                 optim::LRScheduler& sched, const Tensor& z, const Tensor& real, const Tensor& noise) {
    gan_step(Gf, Df, og, od, z, real);
    om.zero_grad();
    Mf(real, noise).loss.backward();
    om.step();
    sched.step();
  };
  Generator data{22, 0};
  std::vector<std::string> ops;  // what the last ZeRO step issued on the data group
  for (int k = 0; k < 4; ++k) {
    Tensor z = randn({8, 8}, kFloat64, &data), real = rand({8, 1, 28, 28}, kFloat64, &data) * 2 - 1;
    Tensor noise = rand({8, 49}, kFloat64, &data);
    step(g0, d0, m0, og0, od0, om0, s0, shard(z), shard(real), shard(noise));
    const dist::CollectiveRecord before = dist::world()->record();
    step(g, d, m, *og, *od, *om, s, shard(z), shard(real), shard(noise));
    ops.clear();
    for (const auto& info : dist::world()->record().last_since(before, 4)) ops.push_back(info.op);
  }
  if (world_size() > 1) {  // the MAE's bucket (reduce-scattered in stage 2), then the all-gather of its parameters
    CAPTURE(ops);
    REQUIRE(ops.size() >= 2);
    CHECK(ops.back() == "allgather");
    CHECK(ops[ops.size() - 2] == (stage2 ? "reduce_scatter" : "allreduce"));
  }
  // Elementwise steps on the same averaged gradients: equal to the last bit in practice.
  check_same_params(*G, *G0, 1e-13);
  check_same_params(*D, *D0, 1e-13);
  check_same_params(*M, *M0, 1e-13);
  // The consolidated state is the plain optimizer's, key for key.
  check_same_state(og->state_dict(), og0.state_dict(), 1e-13);
  check_same_state(od->state_dict(), od0.state_dict(), 1e-13);
  check_same_state(om->state_dict(), om0.state_dict(), 1e-13);
  check_state_share(*og, og0, 2);
  check_state_share(*om, om0, 2);
}

}  // namespace

TEST_CASE("zero: DCGAN G, D and the MAE under DDP with ZeRO Adam / AdamW equal DDP with Adam / AdamW") {
  check_gan_and_mae(/*stage2=*/false);
}

TEST_CASE("zero: stage 2, DDP reduce-scattering each bucket, DCGAN G, D and the MAE equal DDP with Adam / AdamW") {
  check_gan_and_mae(/*stage2=*/true);
}

TEST_CASE("zero: SGD with momentum, two parameter groups and a schedule equal plain SGD") {
  nn::Sequential a = make_mlp64(31), b = make_mlp64(31);
  DistributedDataParallel da(a, "plain"), db(b, "zero");
  auto groups = [](nn::Sequential& m) {
    auto p = m->parameters();
    return std::vector<optim::OptimizerParamGroup>{
        optim::OptimizerParamGroup({p[0], p[1]}),
        optim::OptimizerParamGroup({p[2], p[3]}, optim::SGDOptions(0.05).momentum(0.8).nesterov(true))};
  };
  const auto sgd = optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3);
  optim::SGD plain(groups(a), sgd);
  ZeroRedundancyOptimizer zero(groups(b), ZeroRedundancyOptimizer::optimizer_class<optim::SGD, optim::SGDOptions>(),
                               sgd);
  optim::StepLR sa(plain, 2, 0.5), sb(zero, 2, 0.5);
  Generator data{32, 0};
  for (int k = 0; k < 5; ++k) {
    const Tensor x = randn({8, 6}, kFloat64, &data), y = randn({8, 3}, kFloat64, &data);
    plain.zero_grad();
    mse_loss(da(shard(x)), shard(y)).backward();
    plain.step();
    sa.step();
    zero.zero_grad();
    mse_loss(db(shard(x)), shard(y)).backward();
    zero.step();
    sb.step();
  }
  check_same_params(*b, *a, 1e-13);
  check_same_state(zero.state_dict(), plain.state_dict(), 1e-13);
  check_state_share(zero, plain, 1);
}

TEST_CASE("zero: saved at W ranks (stage 2), resumed at 1 rank with or without ZeRO and at W ranks, equals the run "
          "that went on") {
  const auto adamw = optim::AdamWOptions(1e-2).amsgrad(true);
  Generator data{41, 0};
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int k = 0; k < 5; ++k) batches.emplace_back(randn({8, 6}, kFloat64, &data), randn({8, 3}, kFloat64, &data));
  auto ddp_steps = [&](auto& ddp, optim::Optimizer& opt, int from, int to) {
    for (int k = from; k < to; ++k) {
      opt.zero_grad();
      mse_loss(ddp(shard(batches[k].first)), shard(batches[k].second)).backward();
      opt.step();
    }
  };
  auto whole_batch_steps = [&](nn::Sequential& model, optim::Optimizer& opt, int from, int to) {
    for (int k = from; k < to; ++k) {
      opt.zero_grad();
      mse_loss(model(batches[k].first), batches[k].second).backward();
      opt.step();
    }
  };
  // W ranks, ZeRO: 2 steps, checkpoint through save_train_state / load_train_state, 3 more.
  nn::Sequential model = make_mlp64(42);
  DistributedDataParallel ddp(model, "mlp");
  auto zero = ZeroRedundancyOptimizer::make<optim::AdamW>(model->parameters(), adamw,
                                                         dist::ZeroRedundancyOptimizerOptions().ddp(&ddp.reducer()));
  ddp_steps(ddp, *zero, 0, 2);
  Tensor tag = tensor({static_cast<double>(std::rand() % 1000000)}, kInt64);  // one file name on every rank
  dist::world()->broadcast(tag, 0)->wait();
  const std::string path = "/tmp/nanoddp_zero_test_" + std::to_string(world_size()) + "_" +
                           std::to_string(static_cast<int64_t>(tag.item())) + ".safetensors";
  TrainState saved{{{"mlp", model.get()}}, {{"mlp", zero.get()}}, {}, 2, {}, {}};
  const TensorDict collected = train_state_dict(saved);  // every rank: ZeRO consolidates
  if (rank() == 0) save_train_state(path, collected, saved, {}, world_size());
  dist::world()->barrier()->wait();
  ddp_steps(ddp, *zero, 2, 5);

  // 1 rank with ZeRO (a group of one process), and 1 rank with plain AdamW.
  for (bool with_zero : {true, false}) {
    CAPTURE(with_zero);
    nn::Sequential one = make_mlp64(43);
    std::unique_ptr<optim::Optimizer> opt;
    if (with_zero)
      opt = ZeroRedundancyOptimizer::make<optim::AdamW>(
          one->parameters(), adamw,
          dist::ZeroRedundancyOptimizerOptions().process_group(std::make_shared<dist::LocalProcessGroup>()));
    else
      opt = std::make_unique<optim::AdamW>(one->parameters(), adamw);
    TrainState resumed{{{"mlp", one.get()}}, {{"mlp", opt.get()}}, {}, 0, {}, {}};
    load_train_state(path, resumed);
    CHECK(resumed.step == 2);
    whole_batch_steps(one, *opt, 2, 5);
    check_same_params(*one, *model, 1e-12);
  }
  // W ranks again, ZeRO stage 2: the same steps on the same shards. The state is loaded in
  // DDP's first bucket layout and re-sliced when DDP rebuilds its buckets.
  nn::Sequential again = make_mlp64(44);
  DistributedDataParallel ddp_again(again, "again");
  auto zero_again = ZeroRedundancyOptimizer::make<optim::AdamW>(
      again->parameters(), adamw, dist::ZeroRedundancyOptimizerOptions().ddp(&ddp_again.reducer()));
  TrainState resumed{{{"mlp", again.get()}}, {{"mlp", zero_again.get()}}, {}, 0, {}, {}};
  load_train_state(path, resumed);
  ddp_steps(ddp_again, *zero_again, 2, 5);
  check_same_params(*again, *model, 1e-13);
  dist::world()->barrier()->wait();
  if (rank() == 0) std::remove(path.c_str());
}

TEST_CASE("zero: a plain optimizer's state loads into a ZeRO run at W ranks and continues it") {
  const auto adam = optim::AdamOptions(1e-2);
  Generator data{51, 0};
  nn::Sequential plain = make_mlp64(52), sharded = make_mlp64(52);
  optim::Adam opt(plain->parameters(), adam);
  for (int k = 0; k < 2; ++k) {  // every rank: one process on the whole batch
    opt.zero_grad();
    mse_loss(plain(randn({8, 6}, kFloat64, &data)), randn({8, 3}, kFloat64, &data)).backward();
    opt.step();
  }
  sharded->load_state_dict(plain->state_dict());
  DistributedDataParallel ddp(sharded, "sharded");
  auto zero = ZeroRedundancyOptimizer::make<optim::Adam>(sharded->parameters(), adam);
  zero->load_state_dict(opt.state_dict());
  for (int k = 0; k < 3; ++k) {
    const Tensor x = randn({8, 6}, kFloat64, &data), y = randn({8, 3}, kFloat64, &data);
    opt.zero_grad();
    mse_loss(plain(x), y).backward();
    opt.step();
    zero->zero_grad();
    mse_loss(ddp(shard(x)), shard(y)).backward();
    zero->step();
  }
  check_same_params(*sharded, *plain, 1e-12);
}

namespace {
// An optimizer ZeRO does not know to be elementwise (its name is not SGD, Adam or AdamW).
class SignSGD : public optim::Optimizer {
 public:
  SignSGD(std::vector<optim::OptimizerParamGroup> groups, const optim::SGDOptions& o)
      : Optimizer("SignSGD", std::move(groups), o) {}

 protected:
  void update(const optim::OptimizerOptions& o, std::vector<ParamUpdate>& params) override {
    for (ParamUpdate& u : params) u.param.sub_(u.grad, o.get_lr());
  }
};
}  // namespace

TEST_CASE("zero: bad input is an nd::Error saying what was expected and found") {
  nn::Sequential model = make_mlp64(61);
  const std::string other = nd::testing::error_message([&] {
    ZeroRedundancyOptimizer z({optim::OptimizerParamGroup(model->parameters())},
                              ZeroRedundancyOptimizer::optimizer_class<SignSGD, optim::SGDOptions>(),
                              optim::SGDOptions(0.1));
  });
  CHECK(contains(other, "expected an elementwise optimizer class (SGD, Adam or AdamW"));
  CHECK(contains(other, "found 'SignSGD'"));

  CHECK(contains(nd::testing::error_message([] { ZeroRedundancyOptimizer::make<optim::Adam>({}, optim::AdamOptions()); }),
                 "ZeroRedundancyOptimizer: expected parameters to shard, found none"));

  Tensor f32 = zeros({3}).requires_grad_(true), f64 = zeros({3}, kFloat64).requires_grad_(true);
  CHECK(contains(nd::testing::error_message([&] { ZeroRedundancyOptimizer::make<optim::Adam>({f64, f32}, optim::AdamOptions()); }),
                 "expected parameters of one dtype on one device"));

  auto zero = ZeroRedundancyOptimizer::make<optim::Adam>(model->parameters(), optim::AdamOptions());
  CHECK(contains(nd::testing::error_message([&] { zero->load_state_dict({{"state.0.exp_avg", zeros({2}, kFloat64)}}); }),
                 "ZeroRedundancyOptimizer.load_state_dict: 'state.0.exp_avg' has shape [2] but parameter 0"));
  CHECK(contains(nd::testing::error_message([&] { zero->load_state_dict({{"state.9.step", scalar_tensor(1, kFloat64)}}); }),
                 "the state has parameter 9 but this optimizer holds 4 parameter(s)"));
}

TEST_CASE("zero: stage 2 with no_sync accumulation, an unused head and gradients outside the buckets equals DDP") {
  const auto options = dist::DistributedDataParallelOptions().find_unused_parameters(true).gradient_as_bucket_view(false);
  auto build = [] {
    manual_seed(81);
    auto m = std::make_shared<Branchy>();
    m->to(kFloat64);
    return m;
  };
  auto plain_model = build(), zero_model = build();
  DistributedDataParallel plain(plain_model, "plain", options), sharded(zero_model, "sharded", options);
  optim::AdamW plain_opt(plain_model->parameters(), optim::AdamWOptions(1e-2));
  auto zero = ZeroRedundancyOptimizer::make<optim::AdamW>(zero_model->parameters(), optim::AdamWOptions(1e-2),
                                                          dist::ZeroRedundancyOptimizerOptions().ddp(&sharded.reducer()));
  Generator data{82, 0};
  for (int k = 0; k < 4; ++k) {
    const bool use_b = k % 2 == 1;  // head b: no gradient on even steps
    const Tensor x1 = randn({8, 4}, kFloat64, &data), y1 = randn({8, 2}, kFloat64, &data);
    const Tensor x2 = randn({8, 4}, kFloat64, &data), y2 = randn({8, 2}, kFloat64, &data);
    auto train = [&](auto& ddp, optim::Optimizer& opt) {
      opt.zero_grad();
      {
        auto guard = ddp.no_sync();  // the first micro-batch accumulates locally
        mse_loss(ddp(shard(x1), use_b), shard(y1)).backward();
      }
      mse_loss(ddp(shard(x2), use_b), shard(y2)).backward();
      opt.step();
    };
    train(plain, plain_opt);
    train(sharded, *zero);
  }
  check_same_params(*zero_model, *plain_model, 1e-13);
}

TEST_CASE("zero: stage 2, one rank's non-finite gradient makes every rank's GradScaler and DDP skip the step") {
  nn::Sequential model = make_mlp64(71);
  // The last rank's gradient of one element turns inf before DDP takes it (this hook runs
  // before DDP's): only the rank owning that element's chunk receives an inf average.
  bool poisoned = false;
  model->parameters()[3].register_post_accumulate_grad_hook([&](const Tensor& p) {
    if (poisoned && rank() == world_size() - 1) fill_data(p.grad().narrow(0, 1, 1), std::numeric_limits<double>::infinity());
  });
  DistributedDataParallel ddp(model, "mlp", dist::DistributedDataParallelOptions().skip_nonfinite_steps(true));
  auto zero = ZeroRedundancyOptimizer::make<optim::Adam>(model->parameters(), optim::AdamOptions(1e-2),
                                                         dist::ZeroRedundancyOptimizerOptions().ddp(&ddp.reducer()));
  optim::GradScaler scaler;
  Generator data{72, 0};
  for (int k = 0; k < 3; ++k) {  // iteration 0 all-reduces; 1 and 2 reduce-scatter
    CAPTURE(k);
    const Tensor x = randn({8, 6}, kFloat64, &data), y = randn({8, 3}, kFloat64, &data);
    poisoned = k == 2;
    zero->zero_grad();
    scaler.scale(mse_loss(ddp(shard(x)), shard(y))).backward();
    CHECK(ddp.reducer().skip_step() == poisoned);
    const Tensor before = model->parameters()[0].clone();
    CHECK(scaler.step(*zero) == !poisoned);  // every rank: no all-gather is left unpaired
    scaler.update();
    CHECK(nd::testing::bitwise_equal(model->parameters()[0], before) == poisoned);
  }
  CHECK(same_on_every_rank({static_cast<int64_t>(scaler.get_scale())}));
}

TEST_CASE("zero: stage 2 needs exactly the DDP model's parameters, no communication hook, and to come first") {
  nn::Sequential model = make_mlp64(63), other = make_mlp64(64);
  DistributedDataParallel ddp(model, "mlp");
  auto params = model->parameters();
  const auto stage2 = dist::ZeroRedundancyOptimizerOptions().ddp(&ddp.reducer());
  CHECK(contains(nd::testing::error_message([&] {
                   ZeroRedundancyOptimizer::make<optim::Adam>({params[0], params[1]}, optim::AdamOptions(), stage2);
                 }),
                 "ZeroRedundancyOptimizer: DDP model 'mlp' reduces parameter 'mlp.2.weight' but the optimizer does "
                 "not hold it"));
  std::vector<Tensor> extra = params;
  extra.push_back(other->parameters()[3]);
  CHECK(contains(nd::testing::error_message(
                     [&] { ZeroRedundancyOptimizer::make<optim::Adam>(extra, optim::AdamOptions(), stage2); }),
                 "which DDP model 'mlp' does not reduce"));

  DistributedDataParallel hooked(other, "hooked");
  hooked.register_comm_hook(nullptr, dist::bf16_compress_hook);
  CHECK(contains(nd::testing::error_message([&] {
                   ZeroRedundancyOptimizer::make<optim::Adam>(other->parameters(), optim::AdamOptions(),
                                                              dist::ZeroRedundancyOptimizerOptions().ddp(&hooked.reducer()));
                 }),
                 "cannot take a communication hook; use one or the other"));

  auto zero = ZeroRedundancyOptimizer::make<optim::Adam>(params, optim::AdamOptions(), stage2);
  CHECK(contains(nd::testing::error_message([&] { ddp.register_comm_hook(nullptr, dist::bf16_compress_hook); }),
                 "register_comm_hook: this model's buckets are reduce-scattered for a ZeroRedundancyOptimizer"));

  nn::Sequential late = make_mlp64(65);
  DistributedDataParallel ddp_late(late, "late");
  mse_loss(ddp_late(randn({4, 6}, kFloat64)), zeros({4, 3}, kFloat64)).backward();
  CHECK(contains(nd::testing::error_message([&] {
                   ZeroRedundancyOptimizer::make<optim::Adam>(late->parameters(), optim::AdamOptions(),
                                                              dist::ZeroRedundancyOptimizerOptions().ddp(&ddp_late.reducer()));
                 }),
                 "must be given this model before its first backward, found it after 1 synchronised backward(s)"));
}

TEST_CASE("zero: ranks that pass different parameters get an nd::Error naming the difference") {
  if (skip_at_one_rank()) return;
  nn::Sequential model = make_mlp64(62);
  // Rank 0 passes one parameter fewer: every rank names the difference.
  auto params = model->parameters();
  if (rank() == 0) params.pop_back();
  const std::string differ =
      nd::testing::error_message([&] { ZeroRedundancyOptimizer::make<optim::Adam>(params, optim::AdamOptions()); });
  CHECK(contains(differ, "Every rank must pass the same parameters"));
  CHECK(contains(differ, rank() == 0 ? "rank 0 has 3 parameters of 160 elements but rank 1 has 4 of 163"
                                     : "but rank 0 has 3 of 160"));
}
