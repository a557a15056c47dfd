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
#include <future>
#include <limits>
#include <string>
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
