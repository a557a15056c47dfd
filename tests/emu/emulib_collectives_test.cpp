// The collectives' host side under the emulator (nanoddp_emulib, tests/emu/README.md): the
// REAL NCCL process group, DDP's Reducer and SyncBatchNorm against the stand-ins
// include/cuda_runtime.h and include/nccl.h, which count the calls they receive: every
// collective reaching NCCL, where DDP and SyncBatchNorm make the host wait for the device,
// and (with the emulated GPU's events held) that they queue their collectives for the GPU
// to wait on instead of blocking the host.
#include <doctest/doctest.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <future>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "collectives/ddp.h"
#include "collectives/process_group.h"
#include "collectives/sync_batch_norm.h"
#include "harness.h"
#include "kernels/cuda/stream.h"

using namespace nd;
namespace kc = nd::kernels::cuda;

namespace {
const Device kGpu(kCUDA, 0);
}

namespace {
// A group of two ranks whose other rank holds this rank's very data: a SUM all-reduce
// doubles the tensor (on its device, no wait). For SyncBatchNorm that leaves every mean,
// variance and gradient as one rank's, with twice the count.
class TwinGroup : public dist::ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "twin"; }
  std::shared_ptr<dist::Work> allreduce(const Tensor& t, const dist::AllreduceOptions& o = {}) override {
    REQUIRE(o.op == dist::ReduceOp::SUM);
    NoGradGuard no_grad;
    t.mul_(2.0);
    return done("allreduce", t);
  }
  std::shared_ptr<dist::Work> broadcast(const Tensor& t, int) override { return done("broadcast", t); }
  std::shared_ptr<dist::Work> allgather(const std::vector<Tensor>&, const Tensor& t) override {
    return done("allgather", t);
  }
  std::shared_ptr<dist::Work> reduce_scatter(const Tensor& t, const std::vector<Tensor>&, dist::ReduceOp) override {
    return done("reduce_scatter", t);
  }
  std::shared_ptr<dist::Work> barrier() override { return done("barrier", Tensor()); }

 private:
  std::shared_ptr<dist::Work> done(const char* op, const Tensor& t) {
    auto work = std::make_shared<dist::AsyncWork>(
        dist::CollectiveInfo{op, sequence_++, t.defined() ? t.numel() : 0, t.defined() ? t.dtype() : kFloat32, -1, {}});
    work->mark_done();
    return work;
  }
  uint64_t sequence_ = 0;
};
}  // namespace

TEST_CASE("emulib: SyncBatchNorm on a GPU makes the host wait for no count, and trains as one rank would") {
  manual_seed(8);
  nn::BatchNorm2d local(nn::BatchNormOptions(3));
  nn::SyncBatchNorm sync(std::make_shared<nn::SyncBatchNormImpl>(*local, std::make_shared<TwinGroup>()));
  local->to(kGpu);
  sync->to(kGpu);
  const Tensor x = testing::random_input({4, 3, 5, 5}, 11).to(kFloat32).to(kGpu);
  const Tensor dy = testing::random_input({4, 3, 5, 5}, 12).to(kFloat32).to(kGpu);
  const Tensor xs = x.detach().requires_grad_(), xl = x.detach().requires_grad_();
  const long before = emu_rt::stats().host_waits;
  const Tensor ys = sync(xs);
  ys.backward(dy);
  CHECK(emu_rt::stats().host_waits == before);  // was one per forward: the count's item()
  // (The converted layer shares the running statistics with `local`: read them first.)
  const Tensor running_mean = sync->running_mean.cpu().to(kFloat64), running_var = sync->running_var.cpu().to(kFloat64);
  const Tensor yl = local(xl);
  yl.backward(dy);
  testing::check_close(ys.cpu(), yl.cpu(), 1e-5, 1e-5, "output");
  testing::check_close(xs.grad().cpu(), xl.grad().cpu(), 1e-5, 1e-5, "input gradient");
  // From 0 and 1 with momentum 0.1; the unbiased running variance uses the count of both
  // ranks: 2n values, not n.
  const double n = 4 * 5 * 5;
  const Tensor x64 = x.cpu().to(kFloat64);
  testing::check_close(running_mean, x64.mean({0, 2, 3}) * 0.1, 1e-6, 1e-6, "running_mean");
  testing::check_close(running_var, x64.var({0, 2, 3}, 0) * (0.1 * 2 * n / (2 * n - 1)) + 0.9, 1e-6, 1e-6,
                       "running_var");
}

TEST_CASE("emulib: SyncBatchNorm over NCCL queues its all-reduces for the GPU to wait on, not the host") {
  // While events are held the "GPU" has not finished the all-reduces: a host that waited for
  // them would spin until the timeout below.
  manual_seed(9);
  nn::SyncBatchNorm sync(std::make_shared<nn::SyncBatchNormImpl>(nn::BatchNormOptions(3), dist::nccl_world()));
  sync->to(kGpu);
  const Tensor x = testing::random_input({4, 3, 5, 5}, 13).to(kFloat32).to(kGpu).requires_grad_();
  const Tensor dy = testing::random_input({4, 3, 5, 5}, 14).to(kFloat32).to(kGpu);
  const long collectives = emu_nccl::collectives(), stream_waits = emu_rt::stats().stream_waits;
  emu_rt::set_hold_events(true);
  auto done = std::async(std::launch::async, [&] {
    kc::use_device(0);
    sync(x).backward(dy);
  });
  const bool finished = done.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  emu_rt::complete_events();
  emu_rt::set_hold_events(false);
  done.wait();
  CHECK(finished);
  CHECK(emu_nccl::collectives() == collectives + 2);  // the forward's statistics, the backward's sums
  CHECK(emu_rt::stats().stream_waits >= stream_waits + 2);
}

TEST_CASE("emulib: DDP with skip_nonfinite_steps reads the device once per backward, its status") {
  manual_seed(6);
  nn::Sequential model(nn::Linear(nn::LinearOptions(8, 16)), nn::ReLU(), nn::Linear(nn::LinearOptions(16, 4)));
  model->to(kGpu);
  dist::DistributedDataParallel ddp(model, "mlp", dist::DistributedDataParallelOptions().skip_nonfinite_steps(true));
  const Tensor x = testing::random_input({5, 8}, 3).to(kFloat32).to(kGpu);
  auto backward = [&](double factor) {
    model->zero_grad();
    (ddp(x).pow(2).sum() * factor).backward();
  };
  backward(1.0);  // the first backward also rebuilds the buckets
  const long before = emu_rt::stats().host_waits;
  backward(1.0);
  CHECK(emu_rt::stats().host_waits == before + 1);  // was one per parameter more
  CHECK_FALSE(ddp.reducer().skip_step());
  backward(std::nan(""));
  CHECK(ddp.reducer().skip_step());
  backward(std::numeric_limits<double>::infinity());
  CHECK(ddp.reducer().skip_step());
  backward(1.0);
  CHECK_FALSE(ddp.reducer().skip_step());
}

TEST_CASE("emulib: the NCCL process group at world size 1 runs every collective through NCCL") {
  auto g = dist::nccl_world();
  REQUIRE(g);
  CHECK(g->backend() == "nccl");
  CHECK(g->size() == 1);
  const long before = emu_nccl::collectives();
  const Tensor x = testing::random_input({5, 7}, 9).to(kFloat32);
  for (dist::ReduceOp op : {dist::ReduceOp::SUM, dist::ReduceOp::AVG, dist::ReduceOp::MAX, dist::ReduceOp::MIN}) {
    Tensor t = x.to(kGpu);
    dist::AllreduceOptions o;
    o.op = op;
    g->allreduce(t, o)->wait();
    CHECK(testing::to_vector(t.cpu()) == testing::to_vector(x));
  }
  Tensor b = x.to(kGpu);
  g->broadcast(b, 0)->wait();
  CHECK(testing::to_vector(b.cpu()) == testing::to_vector(x));
  std::vector<Tensor> outs{zeros({5, 7}, TensorOptions(kFloat32).device(kGpu))};
  g->allgather(outs, x.to(kGpu))->wait();
  CHECK(testing::to_vector(outs[0].cpu()) == testing::to_vector(x));
  Tensor out = zeros({5, 7}, TensorOptions(kFloat32).device(kGpu));
  g->reduce_scatter(out, {x.to(kGpu)})->wait();
  CHECK(testing::to_vector(out.cpu()) == testing::to_vector(x));
  g->barrier()->wait();
  CHECK(emu_nccl::collectives() == before + 8);
  // Argument errors of the process group itself, before NCCL.
  CHECK(testing::error_message([&] { (void)g->broadcast(b, 1); }).find("root 1") != std::string::npos);
  CHECK(testing::error_message([&] { (void)g->allreduce(x); }).find("cuda:0") != std::string::npos);
}

namespace {
// The NCCL stand-in's raw calls on one rank's device: a buffer of n floats.
struct RankBuffer {
  float* d = nullptr;
  size_t n;
  explicit RankBuffer(size_t count) : n(count) { REQUIRE(cudaMalloc(&d, n * sizeof(float)) == cudaSuccess); }
  ~RankBuffer() { cudaFree(d); }
  void set(const std::vector<float>& v) const {
    REQUIRE(cudaMemcpyAsync(d, v.data(), n * sizeof(float), cudaMemcpyHostToDevice, nullptr) == cudaSuccess);
  }
  std::vector<float> get() const {
    std::vector<float> v(n);
    REQUIRE(cudaMemcpyAsync(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, nullptr) == cudaSuccess);
    return v;
  }
};
// An all-reduce (SUM) of `b` queued on `stream`, captured into a graph; the executable graph.
cudaGraphExec_t capture_allreduce(const RankBuffer& b, ncclComm_t comm, cudaStream_t stream) {
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  CHECK(ncclAllReduce(b.d, b.d, b.n, ncclFloat32, ncclSum, comm, stream) == ncclSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  return exec;
}
}  // namespace

TEST_CASE("emulib: an NCCL collective queued on a captured stream is a graph node each replay runs again") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  RankBuffer b(5);
  b.set({1, 2, 3, 4, 5});
  const long before = emu_nccl::collectives();
  cudaGraphExec_t exec = capture_allreduce(b, comm, stream);
  CHECK(emu_nccl::collectives() == before);  // recorded, not run
  for (int replay = 1; replay <= 3; ++replay) {
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    CHECK(emu_nccl::collectives() == before + replay);
  }
  CHECK(b.get() == std::vector<float>{1, 2, 3, 4, 5});
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  cudaStreamDestroy(stream);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
}

TEST_CASE("emulib: two emulated devices: NCCL ranks as threads pair their collectives, eager and in each rank's graph") {
  if (emu_rt::device_count() < 2) {
    MESSAGE("SKIPPED: one emulated device; the entry '(emu, 2 devices)' runs this with NANODDP_EMU_DEVICES=2");
    return;
  }
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<std::vector<float>> got(2);
  std::vector<ncclResult_t> mismatch(2);
  auto rank = [&](int r) {
    REQUIRE(cudaSetDevice(r) == cudaSuccess);
    ncclComm_t comm = nullptr;
    REQUIRE(ncclCommInitRank(&comm, 2, id, r) == ncclSuccess);
    cudaStream_t stream = nullptr;
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    RankBuffer b(3), out(3);
    auto mine = [&](float base) { return std::vector<float>{base + r, base - r, base * (r + 1)}; };
    b.set(mine(1));
    REQUIRE(ncclAllReduce(b.d, b.d, 3, ncclFloat32, ncclSum, comm, stream) == ncclSuccess);
    std::vector<float> all = b.get();
    b.set(mine(1));
    REQUIRE(ncclAllReduce(b.d, out.d, 3, ncclFloat32, ncclMax, comm, stream) == ncclSuccess);
    for (float v : out.get()) all.push_back(v);
    b.set(mine(4));
    REQUIRE(ncclBroadcast(b.d, out.d, 3, ncclFloat32, 1, comm, stream) == ncclSuccess);
    for (float v : out.get()) all.push_back(v);
    // Calls of one number that differ: every rank is told.
    mismatch[r] = ncclAllReduce(b.d, b.d, r == 0 ? 2 : 3, ncclFloat32, ncclSum, comm, stream);
    // Each rank captures its own graph; the replays pair up as eager calls do.
    cudaGraphExec_t exec = capture_allreduce(b, comm, stream);
    for (int replay = 0; replay < 2; ++replay) {
      b.set(mine(10.0f * (replay + 1)));
      REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
      for (float v : b.get()) all.push_back(v);
    }
    got[r] = all;
    CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
    cudaStreamDestroy(stream);
    CHECK(ncclCommDestroy(comm) == ncclSuccess);
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  // Rank r's values: {b + r, b - r, b (r + 1)}.
  const std::vector<float> expected{2 + 1, 0 + 1, 1 + 2,       // sum
                                    2, 1, 2,                   // max
                                    5, 3, 8,                   // broadcast from rank 1
                                    21, 19, 30, 41, 39, 60};   // the two replays' sums
  CHECK(got[0] == expected);
  CHECK(got[1] == expected);
  CHECK(mismatch[0] == ncclInvalidUsage);
  CHECK(mismatch[1] == ncclInvalidUsage);
}

TEST_CASE("emulib: a CUDA graph replay that does not finish is reported by the NCCL group's watchdog") {
  // Acts only in its own entry (tests/emu/CMakeLists.txt), which expects the watchdog's line:
  // the watchdog ends the process.
  const char* fault = std::getenv("NANODDP_FAULT_TEST");
  if (fault == nullptr || std::string(fault) != "replay") {
    MESSAGE("SKIPPED: runs in the entry '(emu): a replay that hangs' with NANODDP_FAULT_TEST=replay");
    return;
  }
  auto g = dist::nccl_world();
  g->set_timeout(std::chrono::milliseconds(300));
  Tensor t = full({4}, 1.0, TensorOptions().device(kGpu));
  cuda::Graph graph(0);
  graph.capture_begin();
  {
    dist::CollectivePurpose purpose("bucket 0 of DDP model 'mlp'");
    g->allreduce(t)->wait_on_device();
  }
  g->allreduce(t)->wait_on_device();
  graph.capture_end();
  emu_rt::set_hold_events(true);  // the "GPU" never finishes the replay
  graph.replay();
  std::this_thread::sleep_for(std::chrono::seconds(10));
  FAIL("the watchdog did not report the replay");
}
