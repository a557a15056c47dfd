// SyncBatchNorm under DDP against PyTorch: tests/golden/make_sync_bn_golden.py ran one
// SGD step of conv -> BatchNorm2d -> LeakyReLU -> conv with an MSE loss on a global
// batch of 8 (BatchNorm2d on the whole batch is SyncBatchNorm's definition). Here, as
// a user would: the same model, convert_sync_batchnorm, DistributedDataParallel, each
// rank on its own slice of unequal size (the golden's split.<W>: 1 rank 8, 2 ranks 3 + 5,
// 4 ranks 1 + 2 + 2 + 3; other world sizes report themselves skipped). Every rank must
// reproduce the outputs of its slice, the loss, every gradient, the running statistics
// and the updated weights in f32. Runs alone and under mpirun -np 2 / 4.
#include <algorithm>
#include <filesystem>

#include "collectives/dist.h"
#include "harness.h"

using namespace nd;

using nd::testing::check_close_scaled;

namespace {

// The golden tensor `key` ("param.1.weight", "grad.0.weight", ...).
Tensor golden_at(const TensorDict& g, const std::string& key) {
  REQUIRE_MESSAGE(g.count(key), "the golden file has no '", key, "' (regenerate it with make_sync_bn_golden.py)");
  return g.at(key);
}

size_t count_prefixed(const TensorDict& g, const std::string& prefix) {
  return static_cast<size_t>(
      std::count_if(g.begin(), g.end(), [&](const auto& entry) { return entry.first.rfind(prefix, 0) == 0; }));
}

}  // namespace

TEST_CASE("golden: SyncBatchNorm under DDP, unequal per-rank batches, one SGD step equals PyTorch's BatchNorm2d "
          "on the global batch") {
  const auto path = std::filesystem::path(NANODDP_SOURCE_DIR) / "tests" / "golden" / "sync_bn_2rank.safetensors";
  REQUIRE_MESSAGE(std::filesystem::exists(path), path.string(),
                  " is missing (run tests/golden/make_sync_bn_golden.py)");
  const TensorDict g = load(path.string());
  auto world = dist::world();
  const int W = world->size(), rank = world->rank();
  const std::string split_key = "split." + std::to_string(W);
  if (!g.count(split_key)) {
    MESSAGE("SKIPPED: the golden splits its batch of 8 for 1, 2 or 4 ranks, not ", W);
    return;
  }
  const Tensor split = g.at(split_key);
  REQUIRE(split.numel() == W);
  int64_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += split.data_ptr<int64_t>()[r];
  const int64_t n = split.data_ptr<int64_t>()[rank];
  const Tensor x = golden_at(g, "input.x").narrow(0, offset, n).contiguous();
  const Tensor target = golden_at(g, "input.target").narrow(0, offset, n).contiguous();
  CAPTURE(W);
  CAPTURE(rank);

  nn::Sequential net(nn::Conv2d(nn::Conv2dOptions(2, 4, 3).padding(1).bias(false)), nn::BatchNorm2d(4),
                     nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)), nn::Conv2d(4, 1, 3));
  TensorDict initial;
  for (const auto& [name, t] : net->state_dict()) initial[name] = golden_at(g, "param." + name);
  CHECK(count_prefixed(g, "param.") == initial.size());
  net->load_state_dict(initial);
  nn::convert_sync_batchnorm(net.ptr());
  REQUIRE(net[1]->type_name() == "SyncBatchNorm");
  dist::DistributedDataParallel ddp(net, "net");
  optim::SGD opt(net->parameters(), optim::SGDOptions(0.1).momentum(0.9));

  // The global loss is the mean over all N * 9 outputs. DDP averages the ranks'
  // gradients, so each rank's loss is its slice's sum scaled by W / (N * 9): the
  // average of the ranks' losses is then the global mean, and so are the gradients.
  const Tensor out = ddp(x);
  const double global_numel = static_cast<double>(golden_at(g, "input.target").numel());
  const Tensor loss = mse_loss(out, target, Reduction::Sum) * (W / global_numel);
  check_close_scaled(out, golden_at(g, "out.out").narrow(0, offset, n), 1e-4, "output of this rank's slice");
  Tensor mean_loss = loss.detach().clone();
  world->allreduce(mean_loss)->wait();
  check_close_scaled(mean_loss / static_cast<double>(W), golden_at(g, "out.loss"), 1e-5,
                     "loss, averaged over the ranks");

  opt.zero_grad();
  loss.backward();
  CHECK(count_prefixed(g, "grad.") == net->parameters().size());
  for (const auto& [name, p] : net->named_parameters()) {
    REQUIRE_MESSAGE(p.grad().defined(), name, " has no gradient");
    check_close_scaled(p.grad(), golden_at(g, "grad." + name), 1e-4, "gradient of " + name);
  }
  opt.step();
  // Updated weights and the running statistics of the global batch, on every rank.
  const TensorDict state = net->state_dict();
  CHECK(count_prefixed(g, "after.") == state.size());
  for (const auto& [name, t] : state) {
    const Tensor expected = golden_at(g, "after." + name);
    if (expected.dtype() == kInt64) CHECK(t.item<int64_t>() == expected.item<int64_t>());
    else check_close_scaled(t, expected, 1e-5, "after the step: " + name);
  }
}
