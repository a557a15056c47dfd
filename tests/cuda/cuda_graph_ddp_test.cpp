// DDP under a CUDA graph (docs/cuda_graphs.md, "DDP and NCCL"): an MLP's (with a SyncBatchNorm)
// DDP + SGD step over the NCCL process group, captured after two eager warm-up steps and
// replayed 5 times, equals the eager steps bit for bit (losses, parameters, gradients, the
// SyncBatchNorm's statistics) at world size 1 and at 2 ranks, and the 2 ranks train as one rank
// on the whole batch does. The ranks are threads of this
// process, rank r on cuda:r (the emulator's: NANODDP_EMU_DEVICES=2, the entry "(emu, 2
// devices)"). And what a captured DDP backward cannot hold is refused by name.
#include <barrier>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/dist.h"
#include "cuda/cuda_compare.h"
#include "harness.h"
#ifdef NANODDP_WITH_NCCL
#include "collectives/nccl_process_group.h"
#endif

using namespace nd;
using namespace nd::testing::cuda_compare;

#ifdef NANODDP_WITH_NCCL
namespace {

// The ranks' meeting point: NcclProcessGroup::create broadcasts its NCCL id over it.
struct Threads {
  explicit Threads(int n) : meet(n) {}
  std::barrier<> meet;
  std::vector<unsigned char> bytes;
};
class ThreadBootstrap : public dist::ProcessGroup {
 public:
  ThreadBootstrap(int rank, int size, Threads& threads) : rank_(rank), size_(size), threads_(threads) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "threads"; }
  std::shared_ptr<dist::Work> broadcast(const Tensor& t, int root) override {
    const size_t n = t.numel() * element_size(t.dtype());
    if (rank_ == root) threads_.bytes.assign(static_cast<unsigned char*>(t.data_ptr()), static_cast<unsigned char*>(t.data_ptr()) + n);
    threads_.meet.arrive_and_wait();
    if (rank_ != root) std::memcpy(t.data_ptr(), threads_.bytes.data(), n);
    threads_.meet.arrive_and_wait();
    auto work = std::make_shared<dist::AsyncWork>(dist::CollectiveInfo{"broadcast", 0, t.numel(), t.dtype(), -1, {}});
    work->mark_done();
    return work;
  }
  std::shared_ptr<dist::Work> allreduce(const Tensor&, const dist::AllreduceOptions&) override { return refused(); }
  std::shared_ptr<dist::Work> allgather(const std::vector<Tensor>&, const Tensor&) override { return refused(); }
  std::shared_ptr<dist::Work> reduce_scatter(const Tensor&, const std::vector<Tensor>&, dist::ReduceOp) override {
    return refused();
  }
  std::shared_ptr<dist::Work> barrier() override { return refused(); }

 private:
  static std::shared_ptr<dist::Work> refused() { throw Error("ThreadBootstrap: only broadcast"); }
  int rank_, size_;
  Threads& threads_;
};

constexpr int kSteps = 7, kWarmup = 2, kBatch = 8;

Tensor batch(const Shape& shape, uint64_t seed) {
  Generator g{seed, 0};
  return randn(shape, kFloat32, &g);
}
std::vector<double> values(const Tensor& t) { return testing::to_vector(t.cpu()); }

struct Run {
  std::vector<std::vector<double>> losses, params, grads, buffers;
};

// A rank's model: the same on every rank (built under a lock: the seed is process-wide), its
// SyncBatchNorm over `group`.
nn::Sequential mlp(const Device& device, const std::shared_ptr<dist::ProcessGroup>& group) {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  manual_seed(31);
  nn::Sequential m(nn::Linear(nn::LinearOptions(8, 16)),
                   nn::SyncBatchNorm(std::make_shared<nn::SyncBatchNormImpl>(nn::BatchNormOptions(16), group)),
                   nn::ReLU(), nn::Linear(nn::LinearOptions(16, 4)));
  m->to(device);
  return m;
}

// Rank `rank` of `world` trains kSteps DDP + SGD steps on its rows of each batch over an NCCL
// group of the threads (or, `nccl` false at world size 1, the default group: none, nothing
// reduced), eagerly or captured after kWarmup eager steps and replayed.
Run train(int rank, int world, Threads& threads, bool graphed, bool nccl = true) {
  const Device device(kCUDA, rank);
  cuda::set_device(device);
  std::shared_ptr<dist::ProcessGroup> pg;
  if (nccl) pg = dist::NcclProcessGroup::create(std::make_shared<ThreadBootstrap>(rank, world, threads), rank);
  nn::Sequential model = mlp(device, pg);
  dist::DistributedDataParallel ddp(model, "mlp", dist::DistributedDataParallelOptions().process_group(pg));
  optim::SGD opt(model->parameters(), optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-2));
  const int64_t rows = kBatch / world;
  Tensor x = empty({rows, 8}, TensorOptions().device(device)), y = empty({rows, 4}, TensorOptions().device(device));
  Tensor loss;
  auto step = [&] {
    opt.zero_grad();
    loss = mse_loss(ddp(x), y);
    loss.backward();
    opt.step();
  };
  std::unique_ptr<cuda::Graph> graph;
  Run run;
  for (int i = 0; i < kSteps; ++i) {
    x.copy_(batch({kBatch, 8}, 100 + i).narrow(0, rank * rows, rows));
    y.copy_(batch({kBatch, 4}, 200 + i).narrow(0, rank * rows, rows));
    if (!graphed || i < kWarmup) {
      step();
    } else {
      if (!graph) {  // every rank captures at once: no eager cudaMalloc of another rank meanwhile
        threads.meet.arrive_and_wait();
        graph = std::make_unique<cuda::Graph>(rank);
        graph->capture_begin();
        step();
        graph->capture_end();
        threads.meet.arrive_and_wait();
        CHECK(graph->num_nodes() > 0);
      }
      graph->replay();
    }
    run.losses.push_back(values(loss));
  }
  for (const Tensor& p : model->parameters()) {
    run.params.push_back(values(p));
    run.grads.push_back(values(p.grad()));
  }
  for (const Tensor& b : model->buffers()) run.buffers.push_back(values(b));  // SyncBatchNorm's statistics
  return run;
}

// Every rank's run, each on its own thread.
std::vector<Run> train_ranks(int world, bool graphed, bool nccl = true) {
  Threads threads(world);
  std::vector<Run> runs(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back([&, r] { runs[r] = train(r, world, threads, graphed, nccl); });
  for (std::thread& t : ranks) t.join();
  return runs;
}

void check_equal(const Run& graphed, const Run& eager) {
  CHECK(graphed.losses == eager.losses);
  CHECK(graphed.params == eager.params);
  CHECK(graphed.grads == eager.grads);
  CHECK(graphed.buffers == eager.buffers);
}

}  // namespace

TEST_CASE("cuda graphs with DDP: a step over NCCL at world size 1 captured and replayed 5 times equals the eager steps") {
  if (skip_without_gpu()) return;
  check_equal(train_ranks(1, true)[0], train_ranks(1, false)[0]);
}

TEST_CASE("cuda graphs with DDP: a GPU alone with the default group (nothing to reduce) captured and replayed equals eager") {
  if (skip_without_gpu()) return;
  check_equal(train_ranks(1, true, false)[0], train_ranks(1, false, false)[0]);
}

TEST_CASE("cuda graphs with DDP: two emulated devices: 2 ranks captured and replayed equal their eager steps and 1 rank") {
  if (skip_without_gpu()) return;
  if (cuda::device_count() < 2) {
    MESSAGE("SKIPPED: one device; the entry '(emu, 2 devices)' runs this with NANODDP_EMU_DEVICES=2");
    return;
  }
  const std::vector<Run> graphed = train_ranks(2, true), eager = train_ranks(2, false);
  const Run one = train_ranks(1, false)[0];
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    check_equal(graphed[r], eager[r]);
  }
  CHECK(graphed[1].params == graphed[0].params);  // every rank holds the same model
  CHECK(graphed[1].grads == graphed[0].grads);
  CHECK(graphed[1].buffers == graphed[0].buffers);
  // Averaged over 2 shards, normalised over both: the whole batch's, up to rounding.
  for (size_t i = 0; i < one.params.size(); ++i) {
    CAPTURE(i);
    testing::check_close(tensor(graphed[0].params[i]), one.params[i], 1e-6, 1e-5, "parameter");
    testing::check_close(tensor(graphed[0].grads[i]), one.grads[i], 1e-6, 1e-5, "gradient");
  }
  for (size_t i = 0; i < one.buffers.size(); ++i) {
    CAPTURE(i);
    testing::check_close(tensor(graphed[0].buffers[i]), one.buffers[i], 1e-6, 1e-5, "buffer");
  }
}

namespace {
// Two heads on one input; the second takes part only while `both` (find_unused_parameters).
struct Heads : nn::Module {
  nn::Linear a{nn::LinearOptions(8, 4)}, b{nn::LinearOptions(8, 4)};
  bool both = true;
  Heads() : nn::Module("Heads") {
    register_module("a", a);
    register_module("b", b);
  }
  Tensor forward(const Tensor& x) override { return both ? a(x) + b(x) : a(x); }
};

// The message a capture of one backward of `options`'s DDP model with one head gets, after
// `eager` eager backwards (`before(ddp, heads)` first; both heads unless it says otherwise), or
// "" when it is captured.
std::string capture_error(int eager, dist::DistributedDataParallelOptions options,
                          const std::function<void(dist::DistributedDataParallel<std::shared_ptr<Heads>>&, Heads&)>& before = {}) {
  Threads threads(1);
  auto pg = dist::NcclProcessGroup::create(std::make_shared<ThreadBootstrap>(0, 1, threads), 0);
  manual_seed(5);
  auto heads = std::make_shared<Heads>();
  heads->to(kGpu);
  dist::DistributedDataParallel ddp(heads, "heads", options.process_group(pg));
  const Tensor x = batch({6, 8}, 1).to(kGpu);
  auto backward = [&] {
    heads->zero_grad();
    ddp(x).pow(2).sum().backward();
  };
  if (before) before(ddp, *heads);
  for (int i = 0; i < eager; ++i) backward();
  cuda::Graph graph(0);
  graph.capture_begin();
  heads->both = false;
  try {
    backward();
    graph.capture_end();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("cuda graphs with DDP: what a captured backward cannot hold is refused by name") {
  if (skip_without_gpu()) return;
  const std::string during = "cannot capture a backward of DDP model 'heads' while a CUDA graph is being captured on cuda:0 (";
  const auto options = dist::DistributedDataParallelOptions().find_unused_parameters(true);
  CHECK(capture_error(1, options, [](auto&, Heads& h) { h.both = false; }) == "");
  CHECK(capture_error(0, options) ==
        during +
            "its gradient buckets are rebuilt at the end of its first synchronised backward, in the order the "
            "gradients became ready; run one eager synchronised backward before the capture)");
  CHECK(capture_error(1, options) ==
        during +
            "parameter 'heads.b.weight' did not get a gradient in it but did in the eager backward before; a replay "
            "reduces the gradients the captured backward produced, so it must use the parameters the eager warm-up "
            "used)");
  CHECK(capture_error(1, options, [](auto& ddp, Heads&) { ddp.register_comm_hook(nullptr, dist::allreduce_hook); }) ==
        during + "its communication hook, allreduce_hook, runs on the host when each bucket is waited for; capture without a hook)");
  CHECK(capture_error(1, options, [](auto& ddp, Heads&) { ddp.reducer().shard_gradients(); }) ==
        during + "ZeRO stage 2 (a ZeroRedundancyOptimizer given this model) reads and re-slices its buckets on the host)");
  CHECK(capture_error(1, dist::DistributedDataParallelOptions().skip_nonfinite_steps(true)) ==
        during + "skip_nonfinite_steps reads the non-finite vote on the host at the end of backward; capture without it)");
}

TEST_CASE("cuda graphs with DDP: a host wait for a collective issued during the capture is refused, the device's joins") {
  if (skip_without_gpu()) return;
  Threads threads(1);
  auto pg = dist::NcclProcessGroup::create(std::make_shared<ThreadBootstrap>(0, 1, threads), 0);
  Tensor t = full({3}, 2.0, TensorOptions().device(kGpu));
  cuda::Graph graph(0);
  graph.capture_begin();
  const auto work = pg->allreduce(t);
  CHECK(testing::error_message([&] { work->wait(); }) ==
        "cannot wait on the host for allreduce #0 (3 x f32) while a CUDA graph is being captured on cuda:0 (the "
        "collective is only being recorded; wait_on_device() makes the captured work wait for it)");
  CHECK_FALSE(work->is_completed());
  work->wait_on_device();
  t.mul_(3.0);
  graph.capture_end();
  CHECK(work->is_completed());  // part of the graph now: each replay runs it
  graph.replay();
  graph.replay();
  CHECK(values(t) == std::vector<double>(3, 18.0));
}
#endif
