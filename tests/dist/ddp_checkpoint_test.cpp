// nd::checkpoint under DistributedDataParallel, at any world size (1, and 2 and 4 under
// mpirun): the gradients DDP reduces and the parameters after the optimizer's steps are
// bit for bit those of the run without checkpointing, dropout included, and each
// parameter's post-accumulate hook (DDP's trigger for its bucket) fires once per backward.
#include <map>

#include "collectives/ddp.h"
#include "dist/ddp_test_util.h"
#include "harness.h"

using namespace nd;
using dist::DistributedDataParallel;
using nd::testing::bitwise_equal;
using namespace nd::testing::ddp;

namespace {
// Two residual blocks (Linear, Tanh, Dropout, Linear), checkpointed or not, and a head.
struct Net : nn::Module {
  bool use_checkpoint = false;
  nn::Sequential blocks[2];
  nn::Linear head{nn::LinearOptions(6, 3)};
  Net() : nn::Module("Net") {
    for (int i = 0; i < 2; ++i) {
      blocks[i] = nn::Sequential(nn::Linear(nn::LinearOptions(6, 10)), nn::Tanh(), nn::Dropout(nn::DropoutOptions(0.25)),
                                 nn::Linear(nn::LinearOptions(10, 6)));
      register_module("block" + std::to_string(i), blocks[i]);
    }
    register_module("head", head);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (auto& b : blocks) {
      auto block = [b](const Tensor& in) mutable { return in + b(in); };
      h = use_checkpoint ? checkpoint(block, h) : block(h);
    }
    return head(h);
  }
};

struct Result {
  std::vector<Tensor> params;
  std::map<std::string, int> fired;
};

Result train(bool use_checkpoint) {
  manual_seed(11);
  auto net = std::make_shared<Net>();
  net->to(kFloat64);
  net->use_checkpoint = use_checkpoint;
  DistributedDataParallel ddp(net, "net");
  Result r;
  for (auto& [name, p] : net->named_parameters()) {
    std::string n = name;
    p.register_post_accumulate_grad_hook([&r, n](const Tensor&) { ++r.fired[n]; });
  }
  optim::SGD opt(net->parameters(), optim::SGDOptions(0.1).momentum(0.9));
  manual_seed(100 + static_cast<uint64_t>(rank()));  // each rank its own data and dropout masks
  for (int step = 0; step < 3; ++step) {
    Tensor x = randn({4, 6}, kFloat64), y = randn({4, 3}, kFloat64);
    opt.zero_grad();
    mse_loss(ddp(x), y).backward();
    opt.step();
  }
  for (auto& p : net->parameters()) r.params.push_back(p.detach().clone());
  return r;
}
}  // namespace

TEST_CASE("ddp with checkpointed blocks: the parameters of the plain run, bit for bit, one hook call per step") {
  const Result plain = train(false), ck = train(true);
  REQUIRE(plain.params.size() == ck.params.size());
  for (size_t i = 0; i < plain.params.size(); ++i) {
    CAPTURE(i);
    CHECK(bitwise_equal(plain.params[i], ck.params[i]));
  }
  CHECK(ck.fired == plain.fired);
  for (auto& [name, count] : ck.fired) {
    CAPTURE(name);
    CHECK(count == 3);  // three backward passes
  }
  // The ranks agree (DDP averaged the same gradients everywhere).
  for (const Tensor& p : ck.params)
    for (const Tensor& other : gather_from_ranks(p)) CHECK(bitwise_equal(other, p));
}
