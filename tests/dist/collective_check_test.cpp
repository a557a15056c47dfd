// NANODDP_DISTRIBUTED_DEBUG=DETAIL: the verdict on made-up signatures of several ranks
// (every kind of mismatch, the exact messages), and on a real MPI group at any world size:
// mismatched collectives throw on every rank and run on none, matching ones still give
// the right results, and the group stays usable after a mismatch; and the optimizers'
// options compared across ranks at their first step.
#include "harness.h"

#include <cstdlib>

#include "collectives/collective_check.h"
#include "collectives/dist.h"
#ifdef NANODDP_WITH_MPI
#include "collectives/mpi_process_group.h"
#endif

using namespace nd;
using nd::testing::error_message;

namespace {

const std::string kRule =
    ": ranks must issue the same collectives, with the same sizes, dtypes, roots and reduce ops, in the same order "
    "(checked because NANODDP_DISTRIBUTED_DEBUG=DETAIL)";
const std::string kChecked = " (checked because NANODDP_DISTRIBUTED_DEBUG=DETAIL)";

dist::CollectiveInfo info(const char* op, uint64_t sequence, int64_t numel, ScalarType dtype = kFloat32) {
  dist::CollectiveInfo i;
  i.op = op;
  i.sequence = sequence;
  i.numel = numel;
  i.dtype = dtype;
  return i;
}

int64_t code(dist::ReduceOp op) { return static_cast<int64_t>(op); }

// Sets NANODDP_DISTRIBUTED_DEBUG for one scope.
struct DebugEnv {
  explicit DebugEnv(const char* value) {
    if (const char* old = std::getenv("NANODDP_DISTRIBUTED_DEBUG")) saved = old, had = true;
    setenv("NANODDP_DISTRIBUTED_DEBUG", value, 1);
  }
  ~DebugEnv() {
    if (had) setenv("NANODDP_DISTRIBUTED_DEBUG", saved.c_str(), 1);
    else unsetenv("NANODDP_DISTRIBUTED_DEBUG");
  }
  std::string saved;
  bool had = false;
};

}  // namespace

TEST_CASE("NANODDP_DISTRIBUTED_DEBUG: unset or OFF checks nothing, DETAIL checks, anything else is an error") {
  {
    DebugEnv env("");
    CHECK(dist::debug_level() == dist::DebugLevel::OFF);
  }
  {
    DebugEnv env("OFF");
    CHECK(dist::debug_level() == dist::DebugLevel::OFF);
  }
  {
    DebugEnv env("DETAIL");
    CHECK(dist::debug_level() == dist::DebugLevel::DETAIL);
  }
  DebugEnv env("INFO");
  CHECK(error_message([] { dist::debug_level(); }) ==
        "NANODDP_DISTRIBUTED_DEBUG: expected OFF or DETAIL (check every collective's op, dtype and sizes across ranks "
        "before it runs), found 'INFO'");
}

TEST_CASE("collective check: another op, size, root, reduce op or dtype on one rank names it on every rank") {
  // Three ranks; rank 1 differs. Each rank names its own collective and the first rank that differs from it.
  const auto bcast = dist::make_signature(info("broadcast", 7, 10), 0, 0);
  const auto barrier = dist::make_signature(info("barrier", 7, 0), 1, -1);
  std::vector<dist::CollectiveSignature> all = {bcast, barrier, bcast};
  CHECK(dist::check_signatures(all, 0, info("broadcast", 7, 10), {}) ==
        "broadcast #7 (root 0, 10 x f32) on rank 0 does not match rank 1's barrier #7" + kRule);
  CHECK(dist::check_signatures(all, 1, info("barrier", 7, 0), {}) ==
        "barrier #7 on rank 1 does not match rank 0's broadcast #7 (root 0, 10 x f32)" + kRule);
  CHECK(dist::check_signatures(all, 2, info("broadcast", 7, 10), {}) ==
        "broadcast #7 (root 0, 10 x f32) on rank 2 does not match rank 1's barrier #7" + kRule);

  all[1] = dist::make_signature(info("broadcast", 7, 10), 1, 1);
  CHECK(dist::check_signatures(all, 0, info("broadcast", 7, 10), {}) ==
        "broadcast #7 (root 0, 10 x f32) on rank 0 does not match rank 1's broadcast #7 (root 1, 10 x f32)" + kRule);

  // The purpose is this rank's own (not exchanged).
  dist::CollectiveInfo bucket = info("allreduce", 3, 10);
  bucket.purpose = "bucket 0 of DDP model 'D'";
  const auto sum = dist::make_signature(bucket, 0, code(dist::ReduceOp::SUM));
  all = {sum, dist::make_signature(info("allreduce", 3, 10), 1, code(dist::ReduceOp::MAX))};
  CHECK(dist::check_signatures(all, 0, bucket, {}) ==
        "allreduce #3 (bucket 0 of DDP model 'D', SUM, 10 x f32) on rank 0 does not match rank 1's allreduce #3 (MAX, "
        "10 x f32)" + kRule);
  all[1] = dist::make_signature(info("allreduce", 3, 15), 1, code(dist::ReduceOp::SUM));
  CHECK(dist::check_signatures(all, 1, info("allreduce", 3, 15), {}) ==
        "allreduce #3 (SUM, 15 x f32) on rank 1 does not match rank 0's allreduce #3 (SUM, 10 x f32)" + kRule);
  // The same bytes in another dtype: MPI would run it and return garbage.
  all[1] = dist::make_signature(info("allreduce", 3, 5, kFloat64), 1, code(dist::ReduceOp::SUM));
  CHECK(dist::check_signatures(all, 0, bucket, {}).find("does not match rank 1's allreduce #3 (SUM, 5 x f64)") !=
        std::string::npos);
  // Matching signatures: no error.
  all[1] = dist::make_signature(info("allreduce", 3, 10), 1, code(dist::ReduceOp::SUM));
  CHECK(dist::check_signatures(all, 0, bucket, {}).empty());
  CHECK(dist::check_signatures(all, 1, info("allreduce", 3, 10), {}).empty());
}

TEST_CASE("collective check: allgather and reduce_scatter parts may differ by rank, but every rank must expect them") {
  // Rank r contributes r + 1 elements; every rank sizes its outputs 1, 2, 3.
  const std::vector<int64_t> parts = {1, 2, 3};
  std::vector<dist::CollectiveSignature> all;
  for (int r = 0; r < 3; ++r) all.push_back(dist::make_signature(info("allgather", 5, 6), r, -1, parts));
  for (int r = 0; r < 3; ++r) CHECK(dist::check_signatures(all, r, info("allgather", 5, 6), parts).empty());

  // Rank 2 sized outputs[0] for 2 elements.
  const std::vector<int64_t> wrong = {2, 2, 3};
  all[2] = dist::make_signature(info("allgather", 5, 7), 2, -1, wrong);
  CHECK(dist::check_signatures(all, 0, info("allgather", 5, 6), parts) ==
        "allgather #5 (parts 1, 2, 3 x f32) on rank 0: rank 2 expects parts of other sizes than the ranks' inputs "
        "(1, 2, 3): outputs[r] must be sized as rank r's input on every rank" + kChecked);
  CHECK(dist::check_signatures(all, 2, info("allgather", 5, 7), wrong) ==
        "allgather #5 (parts 2, 2, 3 x f32) on rank 2: this rank expects parts of other sizes than the ranks' inputs "
        "(1, 2, 3): outputs[r] must be sized as rank r's input on every rank" + kChecked);

  std::vector<dist::CollectiveSignature> rs;
  for (int r = 0; r < 3; ++r)
    rs.push_back(dist::make_signature(info("reduce_scatter", 2, 6), r, code(dist::ReduceOp::SUM), r == 1 ? wrong : parts));
  CHECK(dist::check_signatures(rs, 0, info("reduce_scatter", 2, 6), parts) ==
        "reduce_scatter #2 (SUM, parts 1, 2, 3 x f32) on rank 0: rank 1 expects parts of other sizes than the ranks' "
        "outputs (1, 2, 3): inputs[r] must be sized as rank r's output on every rank" + kChecked);
  // Another op on one rank is named before the parts are compared.
  rs[1] = dist::make_signature(info("allgather", 2, 6), 1, -1, parts);
  CHECK(dist::check_signatures(rs, 0, info("reduce_scatter", 2, 6), parts) ==
        "reduce_scatter #2 (SUM, parts 1, 2, 3 x f32) on rank 0 does not match rank 1's allgather #2 (own part 2 x "
        "f32)" + kRule);
}

#ifdef NANODDP_WITH_MPI
TEST_CASE("DETAIL on an MPI group: a mismatch throws on every rank and runs on none, and the group stays in step") {
  const int W = dist::world()->size();
  const int R = dist::world()->rank();
  std::unique_ptr<dist::MpiProcessGroup> made;
  {
    DebugEnv env("DETAIL");
    made = std::make_unique<dist::MpiProcessGroup>();  // every rank: the variable is read here
  }
  dist::MpiProcessGroup& g = *made;
  // Rank 1 (the last rank in a world of one) is the odd one out; `other` is the rank each names.
  const int odd = std::min(1, W - 1);
  const int other = R == odd ? 0 : odd;
  const std::string on = " on rank " + std::to_string(R) + " does not match rank " + std::to_string(other) + "'s ";
  const auto expect_error = [&](const std::shared_ptr<dist::Work>& work, const std::string& expected) {
    if (W == 1) {
      CHECK_NOTHROW(work->wait());
      return;
    }
    CHECK(error_message([&] { work->wait(); }) == expected);
  };

  Tensor t = full({R == odd ? 15 : 10}, R + 1);
  expect_error(g.allreduce(t), R == odd ? "allreduce #0 (SUM, 15 x f32)" + on + "allreduce #0 (SUM, 10 x f32)" + kRule
                                        : "allreduce #0 (SUM, 10 x f32)" + on + "allreduce #0 (SUM, 15 x f32)" + kRule);
  if (W > 1) CHECK(nd::testing::to_vector(t) == std::vector<double>(R == odd ? 15 : 10, R + 1));  // not run

  Tensor b = full({10}, R + 1);
  expect_error(R == odd ? g.barrier() : g.broadcast(b, 0),
               R == odd ? "barrier #1" + on + "broadcast #1 (root 0, 10 x f32)" + kRule
                        : "broadcast #1 (root 0, 10 x f32)" + on + "barrier #1" + kRule);
  expect_error(g.allreduce(b, {R == odd ? dist::ReduceOp::MAX : dist::ReduceOp::SUM}),
               R == odd ? "allreduce #2 (MAX, 10 x f32)" + on + "allreduce #2 (SUM, 10 x f32)" + kRule
                        : "allreduce #2 (SUM, 10 x f32)" + on + "allreduce #2 (MAX, 10 x f32)" + kRule);

  // Allgather: rank r contributes r + 1 elements; rank `odd` sizes outputs[0] for 2.
  std::vector<Tensor> outputs;
  std::vector<int64_t> actual;
  for (int r = 0; r < W; ++r) {
    actual.push_back(r + 1);
    outputs.push_back(zeros({(R == odd && r == 0 && W > 1) ? 2 : r + 1}));
  }
  auto gathered = g.allgather(outputs, full({R + 1}, R + 1));
  const std::string who = R == odd ? "this rank" : "rank " + std::to_string(odd);
  if (W > 1)
    CHECK(error_message([&] { gathered->wait(); }).find(" on rank " + std::to_string(R) + ": " + who +
                                                        " expects parts of other sizes than the ranks' inputs") !=
          std::string::npos);
  else
    gathered->wait();

  // Nothing mismatched ran, so the group is still in step: a matching collective works.
  Tensor ok = full({4}, R + 1);
  g.allreduce(ok)->wait();
  CHECK(nd::testing::to_vector(ok) == std::vector<double>(4, W * (W + 1) / 2));
}

TEST_CASE("DETAIL: an optimizer with other options on one rank fails at its first step on every rank, naming both") {
  const int W = dist::world()->size();
  const int R = dist::world()->rank();
  {
    DebugEnv env("DETAIL");
    dist::MpiProcessGroup made;  // the first group made under DETAIL turns the check on
  }
  const int odd = std::min(1, W - 1);
  Tensor w = ones({3}).requires_grad_(true), v = ones({2}).requires_grad_(true);
  auto with_grads = [&] {
    w.set_grad(full({3}, 0.5));
    v.set_grad(full({2}, 0.5));
  };
  // Rank `odd` has another beta2 in its second group.
  optim::Adam differs({optim::OptimizerParamGroup({w}), optim::OptimizerParamGroup({v}, optim::AdamOptions(1e-3).betas(
                                                                                            {0.9, R == odd ? 0.99 : 0.999}))},
                      optim::AdamOptions(1e-3));
  with_grads();
  const std::string same = "Adam, 2 param group(s): group 0 (1 parameters): amsgrad 0, beta1 0.9, beta2 0.999, eps 1e-08, "
                           "lr 0.001, weight_decay 0; group 1 (1 parameters): amsgrad 0, beta1 0.9, beta2 ";
  if (W > 1) {
    CHECK(error_message([&] { differs.step(); }) ==
          "Adam: the ranks' optimizers differ at their first step: rank 1 has other options than rank 0.\n  rank 0: " +
              same + "0.999, eps 1e-08, lr 0.001, weight_decay 0\n  rank 1: " + same +
              "0.99, eps 1e-08, lr 0.001, weight_decay 0\nEvery rank must build its optimizer with the same options "
              "(checked because NANODDP_DISTRIBUTED_DEBUG=DETAIL)");
    CHECK(nd::testing::to_vector(w) == std::vector<double>(3, 1.0));  // the step was not taken
  } else {
    CHECK_NOTHROW(differs.step());
  }
  // The same options everywhere: checked once, then stepped.
  Tensor u = ones({2}).requires_grad_(true);
  optim::SGD agrees({u}, optim::SGDOptions(0.5));
  for (int step = 0; step < 2; ++step) {
    u.set_grad(full({2}, 0.5));
    agrees.step();
  }
  CHECK(nd::testing::to_vector(u) == std::vector<double>(2, 0.5));
}
#endif
