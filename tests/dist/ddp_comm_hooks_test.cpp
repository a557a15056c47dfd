// DDP communication hooks (collectives/comm_hooks.h), run at 1, 2 and 4 ranks: the
// built-in allreduce, fp16 and bf16 hooks against the exact average of every rank's
// gradient (all-gathered, summed in f64), what a user-defined hook is handed, the
// registration and result errors, and ranks with different hooks or settings failing in
// iteration 0 before any bucket is reduced.
#include <cmath>

#include "collectives/ddp.h"
#include "collectives/powersgd.h"
#include "dist/ddp_test_util.h"
#include "harness.h"

using namespace nd;
using dist::DistributedDataParallel;
using dist::DistributedDataParallelOptions;
using namespace nd::testing::ddp;


TEST_CASE("comm hooks: allreduce_hook gives the exact average, as DDP without a hook does") {
  nn::Sequential replica = make_mlp64(10), model = make_mlp64(10);
  DistributedDataParallel ddp(model, "mlp");
  ddp.register_comm_hook(nullptr, dist::allreduce_hook);
  Generator data{100 + static_cast<uint64_t>(rank()), 0};
  for (int step = 0; step < 3; ++step) check_against_exact(step_on_own_batch(ddp, replica, data), rounding_only);
}

TEST_CASE("comm hooks: bf16 and fp16 compression give the exact average rounded, within the rounding bound") {
  // Each rank's g / W is rounded once to the wire type (unit roundoff u), the sum is taken
  // (MPI: in f32 on widened copies; NCCL: in the wire type) and rounded once more:
  //   |result - exact| <= u (sum_r |g_r| / W + |exact|) (1 + 2u) + 2^-23 sum_r |g_r| / W + (W + 1) tiny
  // where tiny covers the subnormal range's absolute rounding (f16: 2^-24).
  struct Wire {
    const char* name;
    std::shared_ptr<dist::FutureWork> (*hook)(dist::ProcessGroup*, dist::GradBucket&);
    double u, tiny;
  };
  for (const Wire& wire : {Wire{"bf16", dist::bf16_compress_hook, std::ldexp(1.0, -8), std::ldexp(1.0, -133)},
                           Wire{"fp16", dist::fp16_compress_hook, std::ldexp(1.0, -11), std::ldexp(1.0, -24)}}) {
    CAPTURE(wire.name);
    nn::Sequential replica = make_mlp64(11), model = make_mlp64(11);
    DistributedDataParallel ddp(model, "mlp");
    ddp.register_comm_hook(nullptr, wire.hook);
    Generator data{200 + static_cast<uint64_t>(rank()), 0};
    const double W = world_size();
    auto bound = [&](const Tensor& exact, const Tensor& abs_mean) {
      return (abs_mean + exact.abs()) * (wire.u * (1 + 2 * wire.u)) + abs_mean * std::ldexp(1.0, -23) +
             (W + 1) * wire.tiny;
    };
    double worst = 0;
    for (int step = 0; step < 3; ++step)
      worst = std::max(worst, check_against_exact(step_on_own_batch(ddp, replica, data), bound));
    CHECK(worst > 1e-6);  // the gradients did travel in 16 bits (also in a world of one)
  }
}

TEST_CASE("comm hooks: fp16 divides by the world size before casting, so a sum past f16's range stays finite") {
  if (skip_at_one_rank()) return;
  nn::Sequential model(nn::Linear(nn::LinearOptions(1, 1).bias(false)));
  model->to(kFloat64);
  DistributedDataParallel ddp(model, "big");
  ddp.register_comm_hook(nullptr, dist::fp16_compress_hook);
  // d(w * g)/dw = g; rank 0's 70000 alone is past f16's largest finite 65504, the average is not.
  const double g = rank() == 0 ? 70000 : 50000;
  (ddp(ones({1, 1}, kFloat64)).sum() * g).backward();
  const double W = world_size(), average = (70000 + (W - 1) * 50000) / W;
  nd::testing::check_close(model->parameters()[0].grad(), {average}, average * std::ldexp(1.0, -9), 0, "weight.grad");
}

TEST_CASE("comm hooks: a user-defined hook gets each bucket's index, parameters and gradient views, in order") {
  struct Seen {
    std::vector<size_t> index;
    std::vector<std::vector<std::string>> names;
    std::vector<bool> last;
    bool views_ok = true;
  };
  nn::Sequential replica = make_mlp64(12), model = make_mlp64(12);
  // One parameter per bucket (100-byte caps).
  DistributedDataParallel ddp(model, "mlp", DistributedDataParallelOptions().bucket_cap_mb(1e-4).first_bucket_cap_mb(1e-4));
  auto seen = std::make_shared<Seen>();
  ddp.register_comm_hook(seen, [](Seen* s, dist::GradBucket& bucket) {
    s->index.push_back(bucket.index());
    s->last.push_back(bucket.is_last());
    s->names.emplace_back();
    int64_t numel = 0;
    for (size_t k = 0; k < bucket.parameters().size(); ++k) {
      const Tensor& p = bucket.parameters()[k];
      const Tensor& g = bucket.gradients()[k];
      s->names.back().push_back(p.name());
      s->views_ok = s->views_ok && g.sizes() == p.sizes() && g.storage() == bucket.buffer().storage();
      numel += p.numel();
    }
    s->views_ok = s->views_ok && bucket.buffer().dim() == 1 && bucket.buffer().numel() == numel;
    return dist::allreduce_hook(nullptr, bucket);
  });
  Generator data{300 + static_cast<uint64_t>(rank()), 0};
  for (int step = 0; step < 2; ++step) {  // before and after the buckets are rebuilt
    CAPTURE(step);
    const auto layout = ddp.reducer().bucket_parameter_names();
    REQUIRE(layout.size() == 4);
    *seen = Seen();
    check_against_exact(step_on_own_batch(ddp, replica, data), rounding_only);
    CHECK(seen->index == std::vector<size_t>{0, 1, 2, 3});
    CHECK(seen->last == std::vector<bool>{false, false, false, true});
    CHECK(seen->views_ok);
    REQUIRE(seen->names.size() == 4);
    for (size_t b = 0; b < 4; ++b) {
      REQUIRE(seen->names[b].size() == 1);
      CHECK(seen->names[b][0] == "mlp." + layout[b][0]);  // DDP names a model's tensors after it
    }
  }
}

TEST_CASE("comm hooks: registering twice, after the first backward, or returning the wrong size is an error") {
  using nd::testing::error_message;
  {
    nn::Sequential model = make_mlp64(13);
    DistributedDataParallel ddp(model, "twice");
    ddp.register_comm_hook(nullptr, dist::bf16_compress_hook);
    const std::string msg = error_message([&] { ddp.register_comm_hook(nullptr, dist::allreduce_hook); });
    CHECK(contains(msg, "DistributedDataParallel 'twice': register_comm_hook called twice"));
  }
  {
    nn::Sequential model = make_mlp64(13);
    DistributedDataParallel ddp(model, "late");
    mse_loss(ddp(ones({2, 6}, kFloat64)), zeros({2, 3}, kFloat64)).backward();
    const std::string msg = error_message([&] { ddp.register_comm_hook(nullptr, dist::allreduce_hook); });
    CHECK(contains(msg, "DistributedDataParallel 'late': register_comm_hook must come before the first backward, "
                        "found it after 1 synchronised backward(s)"));
  }
  {
    nn::Sequential model = make_mlp64(13);
    DistributedDataParallel ddp(model, "size");
    ddp.register_comm_hook(std::make_shared<int>(0), [](int*, dist::GradBucket& bucket) {
      return dist::FutureWork::completed(zeros({bucket.buffer().numel() + 1}, kFloat64));
    });
    const std::string msg =
        error_message([&] { mse_loss(ddp(ones({2, 6}, kFloat64)), zeros({2, 3}, kFloat64)).backward(); });
    CAPTURE(msg);
    CHECK(contains(msg, "DistributedDataParallel 'size': the communication hook's result for bucket 0 is "));
    CHECK(contains(msg, "is [cpu f64 [164]], expected [cpu f64 [163]] (the bucket's gradients)"));
  }
}

TEST_CASE("comm hooks: ranks with different hooks or hook settings fail in iteration 0 before any bucket is reduced") {
  if (skip_at_one_rank()) return;
  using Ddp = DistributedDataParallel<nn::Sequential>;
  using Register = std::function<void(Ddp&)>;
  auto powersgd = [](int64_t r) {
    return [r](Ddp& ddp) {
      ddp.register_comm_hook(std::make_shared<dist::PowerSGDState>(dist::PowerSGDOptions().matrix_approximation_rank(r)),
                             dist::powerSGD_hook);
    };
  };
  const std::string psgd = " (matrix_approximation_rank 1, start_powerSGD_iter 1000, min_compression_rate 2, "
                           "use_error_feedback true, warm_start true, orthogonalization_epsilon 0, random_seed 0, "
                           "batch_tensors_with_same_shape false)";
  struct Mixed {
    Register on_rank0, elsewhere;
    std::string rank0, rank1;
  };
  const std::vector<Mixed> cases = {
      {[](Ddp& d) { d.register_comm_hook(nullptr, dist::bf16_compress_hook); },
       [](Ddp& d) { d.register_comm_hook(nullptr, dist::fp16_compress_hook); },
       "bf16_compress_hook", "fp16_compress_hook"},
      {powersgd(1), powersgd(2), "powerSGD_hook" + psgd,
       "powerSGD_hook" + std::string(psgd).replace(psgd.find("rank 1"), 6, "rank 2")},
      {[](Ddp&) {}, [](Ddp& d) {
         d.register_comm_hook(nullptr, +[](dist::ProcessGroup* pg, dist::GradBucket& b) {
           return dist::allreduce_hook(pg, b);
         });
       },
       "none (DDP's all-reduce)", "a custom hook"},
  };
  for (const Mixed& c : cases) {
    CAPTURE(c.rank0);
    nn::Sequential model = make_mlp64(12);
    DistributedDataParallel ddp(model, "mixed");
    (rank() == 0 ? c.on_rank0 : c.elsewhere)(ddp);
    const uint64_t issued = dist::world()->record().count;
    const std::string msg = nd::testing::error_message([&] { ddp(ones({2, 6}, kFloat64)).sum().backward(); });
    CHECK(msg == "DistributedDataParallel: ranks diverged: rank 1 reduces DDP model 'mixed' with another "
                 "communication hook than rank 0 (found in iteration 0, before any bucket was reduced).\n  rank 0: " +
                     c.rank0 + "\n  rank 1: " + c.rank1 +
                     "\nEvery rank must register the same hook with the same settings (register_comm_hook), or none.");
    if (dist::control_world() != dist::world()) CHECK(dist::world()->record().count == issued);  // no bucket went out
  }
}

