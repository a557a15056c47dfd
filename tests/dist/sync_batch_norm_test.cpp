// SyncBatchNorm: N ranks on shards of a batch (equal and unequal shard sizes) must
// match single-process nn::BatchNorm2d on the whole batch: outputs, each rank's slice
// of the input gradient, the sum over ranks of the weight/bias gradients, and the
// running statistics. Every rank builds the full batch from a fixed seed and computes
// that reference itself. Runs at 1 rank alone, 2 and 4 under mpirun.
#include "harness.h"

#include "collectives/dist.h"

using namespace nd;
using nd::testing::check_close;
using nd::testing::random_input;

namespace {

constexpr int64_t kC = 3, kH = 2, kW = 3;

// weight 1 + 0.25c, bias 0.1c: away from the init values so their gradients matter.
void set_affine(const Tensor& weight, const Tensor& bias) {
  NoGradGuard no_grad;
  for (int64_t c = 0; c < kC; ++c) {
    weight.data_ptr<double>()[c] = 1.0 + 0.25 * static_cast<double>(c);
    bias.data_ptr<double>()[c] = 0.1 * static_cast<double>(c);
  }
}

// The sequence number the next collective on the world will get.
uint64_t next_sequence() { return dist::world()->barrier()->info().sequence + 1; }

void check_matches_single_process(const std::function<int64_t(int)>& shard_size, const std::string& what) {
  auto w = dist::world();
  const int rank = w->rank();
  int64_t N = 0, offset = 0;
  for (int r = 0; r < w->size(); ++r) {
    if (r == rank) offset = N;
    N += shard_size(r);
  }
  const int64_t n = shard_size(rank);

  nn::BatchNorm2d ref(kC);
  ref->to(kFloat64);
  set_affine(ref->weight, ref->bias);
  nn::SyncBatchNorm sync(kC);
  sync->to(kFloat64);
  set_affine(sync->weight, sync->bias);

  for (int step = 0; step < 2; ++step) {
    CAPTURE(step);
    const Tensor x_full = random_input({N, kC, kH, kW}, 100 + step);
    const Tensor g_full = random_input({N, kC, kH, kW}, 200 + step);
    const Tensor x_ref = x_full.clone().detach().requires_grad_(true);
    const Tensor y_ref = ref(x_ref);
    (y_ref * g_full).sum().backward();

    const Tensor x = x_full.narrow(0, offset, n).contiguous().detach().requires_grad_(true);
    const uint64_t before = next_sequence();
    const Tensor y = sync(x);
    CHECK(next_sequence() == before + 2);  // the barrier above plus ONE all-reduce of statistics
    CHECK(y.grad_fn()->name() == "SyncBatchNormBackward");
    (y * g_full.narrow(0, offset, n)).sum().backward();

    check_close(y, y_ref.narrow(0, offset, n), 1e-12, 1e-10, what + ": output");
    check_close(x.grad(), x_ref.grad().narrow(0, offset, n), 1e-12, 1e-10, what + ": input gradient");
    // Each rank holds its share of the parameter gradients; their sum is the whole batch's.
    for (auto [local, expected, name] : {std::tuple{sync->weight.grad(), ref->weight.grad(), "weight"},
                                        std::tuple{sync->bias.grad(), ref->bias.grad(), "bias"}}) {
      Tensor summed = local.clone();
      w->allreduce(summed)->wait();
      check_close(summed, expected, 1e-12, 1e-10, what + ": " + name + " gradient summed over ranks");
    }
    check_close(sync->running_mean, ref->running_mean, 1e-12, 1e-10, what + ": running_mean");
    check_close(sync->running_var, ref->running_var, 1e-12, 1e-10, what + ": running_var");
    CHECK(sync->num_batches_tracked.item<int64_t>() == step + 1);
    sync->zero_grad();
    ref->zero_grad();
  }

  // Eval: running statistics, no communication.
  sync->eval();
  ref->eval();
  const Tensor x_full = random_input({N, kC, kH, kW}, 300);
  const uint64_t before = next_sequence();
  const Tensor y = sync(x_full.narrow(0, offset, n).contiguous());
  CHECK(next_sequence() == before + 1);  // only the barrier
  check_close(y, ref(x_full).narrow(0, offset, n), 1e-12, 1e-10, what + ": eval output");
}

}  // namespace

TEST_CASE("SyncBatchNorm: equal shards match BatchNorm2d on the whole batch") {
  check_matches_single_process([](int) { return int64_t{2}; }, "equal shards");
}

TEST_CASE("SyncBatchNorm: unequal shards (rank r has r + 1 samples) match BatchNorm2d on the whole batch") {
  check_matches_single_process([](int r) { return int64_t{r + 1}; }, "unequal shards");
}

TEST_CASE("SyncBatchNorm: a rank with an empty shard still takes part") {
  // Rank 0 has no samples when there are other ranks to hold the batch.
  const bool alone = dist::world()->size() == 1;
  check_matches_single_process([&](int r) { return r == 0 && !alone ? int64_t{0} : int64_t{2}; }, "empty shard");
}

TEST_CASE("SyncBatchNorm: f32 and a cumulative-average momentum") {
  auto w = dist::world();
  nn::BatchNorm2d ref(nn::BatchNormOptions(kC).momentum(std::nullopt));
  nn::SyncBatchNorm sync(nn::BatchNormOptions(kC).momentum(std::nullopt));
  const int64_t n = 3, N = n * w->size();
  for (int step = 0; step < 3; ++step) {
    const Tensor x_full = random_input({N, kC, kH, kW}, 400 + step).to(kFloat32);
    const Tensor y_ref = ref(x_full);
    const Tensor y = sync(x_full.narrow(0, n * w->rank(), n).contiguous());
    check_close(y, y_ref.narrow(0, n * w->rank(), n), 1e-5, 1e-5, "f32 output");
  }
  check_close(sync->running_mean, ref->running_mean, 1e-6, 1e-5, "f32 running_mean");
  check_close(sync->running_var, ref->running_var, 1e-6, 1e-5, "f32 running_var");
}

TEST_CASE("SyncBatchNorm: state_dict names are BatchNorm2d's, running stats bump their versions") {
  nn::SyncBatchNorm sync(4);
  nn::BatchNorm2d bn(4);
  std::vector<std::string> a, b;
  for (auto& [k, v] : sync->state_dict()) a.push_back(k);
  for (auto& [k, v] : bn->state_dict()) b.push_back(k);
  CHECK(a == b);
  const int64_t version = sync->running_mean._version();
  sync(random_input({2, 4, 2, 2}, 1).to(kFloat32));
  CHECK(sync->running_mean._version() > version);
  CHECK(nd::testing::error_message([&] { sync(zeros({2, 3, 2, 2})); }).find("expected 4 channels") !=
        std::string::npos);
}

TEST_CASE("convert_sync_batchnorm: swaps every BatchNorm2d, keeping names and tensors") {
  nn::Sequential inner(nn::Conv2d(4, 4, 1), nn::BatchNorm2d(4));
  nn::Sequential net(nn::Conv2d(2, 4, 3), nn::BatchNorm2d(4), nn::ReLU(), inner);
  net->name_tensors("D");
  const TensorDict before = net->state_dict();
  auto converted = nn::convert_sync_batchnorm(net.ptr());
  CHECK(converted == net.ptr());
  CHECK(net[1]->type_name() == "SyncBatchNorm");
  CHECK(inner[1]->type_name() == "SyncBatchNorm");
  const TensorDict after = net->state_dict();
  REQUIRE(after.size() == before.size());
  for (auto& [name, t] : before) {
    CAPTURE(name);
    REQUIRE(after.count(name) == 1);
    CHECK(after.at(name).impl_ptr() == t.impl_ptr());  // the same tensors: optimizers stay valid
    CHECK(after.at(name).name() == "D." + name);
  }
  // forward goes through the synchronised layers: one statistics all-reduce per layer.
  auto w = dist::world();
  const uint64_t first = w->barrier()->info().sequence;
  net->forward(random_input({2, 2, 5, 5}, 3).to(kFloat32));
  CHECK(w->barrier()->info().sequence == first + 3);

  // A bare BatchNorm2d converts to a SyncBatchNorm sharing its tensors.
  nn::BatchNorm2d bn(5);
  auto sync = std::dynamic_pointer_cast<nn::SyncBatchNormImpl>(nn::convert_sync_batchnorm(bn.ptr()));
  REQUIRE(sync);
  CHECK(sync->weight.impl_ptr() == bn->weight.impl_ptr());
  CHECK(sync->running_var.impl_ptr() == bn->running_var.impl_ptr());
}

TEST_CASE("convert_sync_batchnorm: warns about a BatchNorm2d also held outside the tree") {
  nn::BatchNorm2d held(4);
  nn::Sequential net(nn::Conv2d(2, 4, 3), held);
  nd::testing::WarningCapture warnings;
  nn::convert_sync_batchnorm(net.ptr());
  REQUIRE(warnings.messages.size() == 1);
  CHECK(warnings.messages[0].find("BatchNorm2d '1' is also held outside the module tree") != std::string::npos);
}
