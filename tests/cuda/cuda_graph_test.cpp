// CUDA graphs (kernels/cuda/graph.h, nd::cuda::Graph): a small model's whole training step
// (forward, loss, backward, SGD with momentum, Adam, AdamW) captured after two eager warm-up steps and
// replayed on static input and target tensors equals the same steps run eagerly, bit for bit:
// the replay runs the very kernels with the very arguments, in the same order. And every host
// operation a capture cannot hold is refused by name while capturing. Without a GPU every
// case reports "SKIPPED:"; under the emulator (tests/emu) the capture and the replay are the
// stand-in's (include/emu_graph.h).
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_compare.h"
#include "harness.h"

using namespace nd;
using namespace nd::testing::cuda_compare;

namespace {

struct Mlp : nn::Module {
  nn::Linear fc1{nn::LinearOptions(8, 16)};
  nn::Linear fc2{nn::LinearOptions(16, 4)};
  Mlp() : nn::Module("Mlp") {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  Tensor forward(const Tensor& x) override { return fc2(relu(fc1(x))); }
};

std::shared_ptr<Mlp> build() {
  manual_seed(31);
  auto m = std::make_shared<Mlp>();
  m->to(kGpu);
  return m;
}

// Batch i, drawn on the CPU from its own seed.
Tensor batch(const Shape& shape, uint64_t seed) {
  Generator g{seed, 0};
  return randn(shape, kFloat32, &g);
}

std::vector<double> values(const Tensor& t) { return testing::to_vector(t.cpu()); }

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

// The MLP's step under `make`'s optimizer, eager for 7 steps against 2 eager warm-up steps,
// a capture and 5 replays: every loss, parameter, gradient and the optimizer's state_dict
// bit for bit; its step counts too where `device_counts` (Adam's; SGD's count on the host
// takes only the eager steps, docs/cuda_graphs.md).
void check_replays(const MakeOptimizer& make, bool device_counts) {
  constexpr int kSteps = 7, kWarmup = 2;
  auto eager = build(), graphed = build();
  const auto eager_opt = make(eager->parameters()), graphed_opt = make(graphed->parameters());
  auto step = [](Mlp& m, optim::Optimizer& opt, const Tensor& x, const Tensor& y) {
    opt.zero_grad();
    Tensor loss = mse_loss(m.forward(x), y);
    loss.backward();
    opt.step();
    return loss;
  };
  std::vector<std::vector<double>> eager_losses;
  for (int i = 0; i < kSteps; ++i)
    eager_losses.push_back(values(step(*eager, *eager_opt, batch({6, 8}, 100 + i).to(kGpu), batch({6, 4}, 200 + i).to(kGpu))));

  Tensor x = empty({6, 8}, TensorOptions().device(kGpu)), y = empty({6, 4}, TensorOptions().device(kGpu));
  for (int i = 0; i < kWarmup; ++i) {
    x.copy_(batch({6, 8}, 100 + i));
    y.copy_(batch({6, 4}, 200 + i));
    CHECK(values(step(*graphed, *graphed_opt, x, y)) == eager_losses[i]);
  }
  cuda::Graph graph(0);
  graph.capture_begin();
  const Tensor loss = step(*graphed, *graphed_opt, x, y);
  graph.capture_end();
  const int64_t mallocs_after_capture = cuda::memory_stats(kGpu).num_mallocs;
  CHECK(graph.num_nodes() > 0);
  for (int i = kWarmup; i < kSteps; ++i) {
    CAPTURE(i);
    x.copy_(batch({6, 8}, 100 + i));
    y.copy_(batch({6, 4}, 200 + i));
    graph.replay();
    CHECK(values(loss) == eager_losses[i]);
  }
  const auto pe = eager->named_parameters(), pg = graphed->named_parameters();
  REQUIRE(pe.size() == pg.size());
  for (size_t i = 0; i < pe.size(); ++i) {
    CAPTURE(pe[i].first);
    CHECK(values(pg[i].second) == values(pe[i].second));
    CHECK(values(pg[i].second.grad()) == values(pe[i].second.grad()));
  }
  const TensorDict se = eager_opt->state_dict(), sg = graphed_opt->state_dict();
  REQUIRE(se.size() == sg.size());
  for (const auto& [key, value] : se) {
    CAPTURE(key);
    REQUIRE(sg.count(key));
    if (device_counts || !key.ends_with(".step")) CHECK(values(sg.at(key)) == values(value));
  }
  // The replays allocated nothing: the capture's tensors live in the graph's pool.
  CHECK(cuda::memory_stats(kGpu).num_mallocs == mallocs_after_capture);
}

}  // namespace

TEST_CASE("cuda graphs: an MLP step captured after two warm-up steps and replayed 5 times equals the eager steps bit for bit") {
  if (skip_without_gpu()) return;
  SUBCASE("SGD with momentum and weight decay") {
    check_replays([](std::vector<Tensor> params) {
      return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-2));
    }, false);
  }
  SUBCASE("Adam (its step counts on the device) with AMSGrad and weight decay") {
    check_replays([](std::vector<Tensor> params) {
      return std::make_unique<optim::Adam>(std::move(params),
                                           optim::AdamOptions(1e-2).weight_decay(1e-2).amsgrad(true));
    }, true);
  }
  SUBCASE("AdamW") {
    check_replays([](std::vector<Tensor> params) {
      return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions(1e-2).betas({0.8, 0.95}));
    }, true);
  }
}

TEST_CASE("cuda graphs: Adam's step counts on the device are saved and loaded as the CPU's") {
  if (skip_without_gpu()) return;
  // Three steps on the CPU and on the GPU: the same "state.<k>.step" (f64 on the CPU); a
  // fresh GPU optimizer loading the GPU's state takes the fourth step as the CPU does.
  auto run = [](const Device& d, int steps, const TensorDict* load) {
    manual_seed(31);
    auto m = std::make_shared<Mlp>();
    m->to(d);
    optim::Adam opt(m->parameters(), optim::AdamOptions(1e-2));
    if (load) opt.load_state_dict(*load);
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      mse_loss(m->forward(batch({6, 8}, 100 + i).to(d)), batch({6, 4}, 200 + i).to(d)).backward();
      opt.step();
    }
    return std::pair{opt.state_dict(), m};
  };
  const auto [cpu_state, cpu_model] = run(Device(kCPU), 3, nullptr);
  const auto [gpu_state, gpu_model] = run(kGpu, 3, nullptr);
  REQUIRE(gpu_state.size() == cpu_state.size());
  for (int k = 0; k < 4; ++k) {
    const std::string key = "state." + std::to_string(k) + ".step";
    CAPTURE(key);
    CHECK(gpu_state.at(key).is_cpu());
    CHECK(gpu_state.at(key).dtype() == kFloat64);
    CHECK(values(gpu_state.at(key)) == std::vector<double>{3.0});
  }
  const auto [resumed_state, resumed_model] = run(kGpu, 1, &gpu_state);
  CHECK(values(resumed_state.at("state.0.step")) == std::vector<double>{4.0});
}

TEST_CASE("cuda graphs: the pool's blocks survive empty_cache while the graph lives") {
  if (skip_without_gpu()) return;
  Tensor x = full({256}, 1.0, TensorOptions().device(kGpu));
  cuda::Graph graph(0);
  graph.capture_begin();
  Tensor y = x * 2.0;
  {
    Tensor scratch = y + 1.0;  // freed during the capture: back to the graph's pool
    y.add_(scratch);           // y = 2x + (2x + 1)
  }
  graph.capture_end();
  kernels::cuda::empty_cache(0);
  Tensor other = full({256}, -7.0, TensorOptions().device(kGpu));  // must not land on the pool's blocks
  x.fill_(3.0);
  graph.replay();
  CHECK(values(y) == std::vector<double>(256, 13.0));
  CHECK(values(other) == std::vector<double>(256, -7.0));
}

TEST_CASE("cuda graphs: what a capture cannot hold is refused by name") {
  if (skip_without_gpu()) return;
  const std::string during = " while a CUDA graph is being captured on cuda:0 (";
  Tensor g = full({2}, 1.0, TensorOptions().device(kGpu));
  Tensor c = full({2}, 1.0);
  Tensor s = full({}, 5.0, TensorOptions().device(kGpu));
  {
    cuda::Graph graph(0);
    graph.capture_begin();
    CHECK_THROWS_WITH_AS(s.item(), ("cannot read " + s.describe() + " with item()" + during +
                                    "the host would wait for a value the capture only records; read it after a replay)")
                                       .c_str(),
                         Error);
    CHECK_THROWS_WITH_AS(g.cpu(), ("cannot copy " + g.describe() + " to the CPU" + during +
                                   "the host would wait for values the capture only records; copy them after a replay)")
                                      .c_str(),
                         Error);
    CHECK_THROWS_WITH_AS(g.copy_(c), ("cannot copy " + c.describe() + " to cuda:0" + during +
                                      "a replay would not copy it again; fill a static CUDA tensor with copy_ before "
                                      "replay())")
                                         .c_str(),
                         Error);
    CHECK_THROWS_WITH_AS(c + c, ("cannot run a CPU op on " + c.describe() + during +
                                 "a replay runs only the CUDA work; move the tensor to the GPU or out of the captured "
                                 "step)")
                                    .c_str(),
                         Error);
    CHECK_THROWS_WITH_AS(kernels::cuda::synchronize(0),
                         ("cannot synchronize cuda:0" + during + "the host cannot wait for work that is only being recorded)")
                             .c_str(),
                         Error);
    CHECK_THROWS_WITH_AS(kernels::cuda::copy_host_to_device(0, g.data_ptr(), c.data_ptr(), 8),
                         ("cannot copy 8 bytes from the host to cuda:0" + during +
                          "a replay would copy whatever the host's staging memory holds then; fill a static CUDA "
                          "tensor with copy_ before replay())")
                             .c_str(),
                         Error);
    bool other_thread = false;  // a DataLoader's worker keeps running CPU ops
    std::thread([&] { other_thread = testing::to_vector(c + c) == std::vector<double>{2.0, 2.0}; }).join();
    CHECK(other_thread);
    cuda::Graph second(0);
    CHECK_THROWS_WITH_AS(second.capture_begin(),
                         "Graph::capture_begin: cuda:0 is already being captured by another graph", Error);
    CHECK_THROWS_WITH_AS(second.replay(),
                         "Graph::replay: nothing captured (capture_begin and capture_end first)", Error);
    CHECK_THROWS_WITH_AS(graph.capture_begin(), "Graph::capture_begin: this graph was already captured", Error);
    // Left capturing: the destructor ends the capture.
  }
  CHECK_FALSE(kernels::cuda::capture_active());
  CHECK(s.item() == 5.0);  // eager again
  CHECK(values(c + c) == std::vector<double>{2.0, 2.0});
  cuda::Graph graph(0);
  CHECK_THROWS_WITH_AS(graph.capture_end(), "Graph::capture_end: no capture_begin before it", Error);
}
