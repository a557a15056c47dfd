// DistributedDataParallel's options and layout, run at 1, 2 and 4 ranks: what
// construction checks and broadcasts, broadcast_buffers (coalesced: one broadcast per dtype), gradient_as_bucket_view, bucket
// caps and their rebuild in gradient-ready order, and the state_dict it exposes.
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "collectives/ddp.h"
#include "dist/ddp_test_util.h"
#include "harness.h"

using namespace nd;
using dist::DistributedDataParallel;
using dist::DistributedDataParallelOptions;
using namespace nd::testing::ddp;

TEST_CASE("ddp: ranks with different models get an error naming the parameter and the ranks") {
  if (skip_at_one_rank()) return;
  nn::Sequential model(nn::Linear(nn::LinearOptions(4, rank() == 1 ? 5 : 4)));
  const std::string msg = nd::testing::error_message([&] { DistributedDataParallel ddp(model, "mismatch"); });
  CHECK(contains(msg, "parameter 0 ('mismatch.0.weight' here) differs across ranks: rank 0 has f32 [4, 4], rank 1 has f32 [5, 4]"));
}

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
  if (skip_at_one_rank()) return;
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
  if (skip_at_one_rank()) return;
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

TEST_CASE("ddp: plan_broadcasts groups tensors by dtype, each group up to the cap, a larger tensor alone") {
  // f32 x 10 (40 bytes), i64 x 1, f32 x 10, f32 x 10, f64 x 100 (800 bytes), cap 80 bytes.
  const std::vector<Tensor> tensors{empty({10}), empty({1}, kInt64), empty({2, 5}), empty({10}),
                                    empty({100}, kFloat64)};
  CHECK(dist::plan_broadcasts(tensors, 80) == std::vector<std::vector<size_t>>{{0, 2}, {1}, {3}, {4}});
  // PyTorch's 250 MiB: one broadcast per dtype.
  CHECK(dist::plan_broadcasts(tensors) == std::vector<std::vector<size_t>>{{0, 2, 3}, {1}, {4}});
  CHECK(dist::plan_broadcasts({}).empty());
  CHECK(nd::testing::error_message([&] { dist::plan_broadcasts(tensors, 0); }) ==
        "plan_broadcasts: expected a positive cap in bytes, found 0");
}

namespace {
// A Linear (f32 weight and bias) with buffers of six dtypes that its forward never reads, so
// any bit pattern may sit in them: f64, f32 (two), bf16, i64 (two), i32, u8.
nn::Sequential make_mixed_buffers() {
  nn::Sequential m(nn::Linear(nn::LinearOptions(4, 3)));
  m->register_buffer("f64", empty({3}, kFloat64));
  m->register_buffer("f32", empty({5}, kFloat32));
  m->register_buffer("bf16", empty({7}, kBFloat16));
  m->register_buffer("i64", empty({1}, kInt64));
  m->register_buffer("f32b", empty({2, 3}, kFloat32));
  m->register_buffer("i32", empty({3}, kInt32));
  m->register_buffer("i64b", empty({4}, kInt64));
  m->register_buffer("u8", empty({9}, kUInt8));
  return m;
}
constexpr uint64_t kMixedGroups = 6;

size_t nbytes(const Tensor& t) { return static_cast<size_t>(t.numel()) * element_size(t.dtype()); }

// Random bytes from `seed` in every buffer (NaNs, infinities and -0 included); what was written.
std::vector<std::vector<unsigned char>> fill_random_bytes(const nn::Module& m, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::vector<unsigned char>> written;
  for (auto& [name, b] : m.named_buffers()) {
    std::vector<unsigned char> bytes(nbytes(b));
    for (unsigned char& c : bytes) c = static_cast<unsigned char>(gen());
    std::memcpy(b.data_ptr(), bytes.data(), bytes.size());
    written.push_back(std::move(bytes));
  }
  return written;
}
}  // namespace

TEST_CASE("ddp: buffers of six dtypes end bit for bit rank 0's, in one broadcast per dtype, not one per buffer") {
  if (skip_at_one_rank()) return;
  manual_seed(43);
  nn::Sequential model = make_mixed_buffers();
  const auto group = dist::world();
  const dist::CollectiveRecord start = group->record();
  DistributedDataParallel ddp(model, "mixed");
  // Construction: the f32 parameters travel with the f32 buffers.
  CHECK(group->record().count - start.count == kMixedGroups);
  Tensor x = randn({2, 4});
  for (int step = 0; step < 2; ++step) {
    CAPTURE(step);
    const auto expected = fill_random_bytes(*model, 100 * step);  // rank 0's
    fill_random_bytes(*model, 100 * step + rank());
    std::vector<int64_t> versions;
    for (auto& [name, b] : model->named_buffers()) versions.push_back(b.storage()->version());
    const dist::CollectiveRecord before = group->record();
    Tensor y = ddp(x);  // the buffers' broadcast, then the forward
    const dist::CollectiveRecord after = group->record();
    CHECK(after.count - before.count == kMixedGroups);
    size_t total = 0;
    for (auto& [name, b] : model->named_buffers()) total += nbytes(b);
    CHECK(after.bytes - before.bytes == total);
    for (const dist::CollectiveInfo& info : after.last_since(before, dist::CollectiveRecord::kDepth))
      CHECK(info.op == "broadcast");
    size_t k = 0;
    for (auto& [name, b] : model->named_buffers()) {
      CAPTURE(name);
      CHECK(std::memcmp(b.data_ptr(), expected[k].data(), expected[k].size()) == 0);
      CHECK(b.storage()->version() > versions[k]);  // what read the old values sees the change
      ++k;
    }
    y.sum().backward();  // makes the buffers stale again
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
  auto model = std::make_shared<HeadFirst>();
  model->trunk->to(Device("cuda:0"));
  const std::string msg = nd::testing::error_message([&] { DistributedDataParallel ddp(model, "devices"); });
  CHECK(contains(msg, "DistributedDataParallel 'devices': parameters on several devices"));
  CHECK(contains(msg, "put the whole module on one device"));
}

TEST_CASE("ddp: ranks with different parameter counts get an error naming both counts and ranks") {
  if (skip_at_one_rank()) return;
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
