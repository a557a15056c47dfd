// Watchdog: a collective that does not complete within its timeout is reported with
// what this rank waits in, then the job is aborted. In-process checks use a fake
// Work and a capturing handler; the two fault cases (a rank that never joins, a rank
// killed before a collective) run only under mpirun when NANODDP_FAULT_TEST names
// them (tests/CMakeLists.txt registers them and checks mpirun's exit and output).
#include "dist/fault_case.h"
#include "harness.h"

#include <atomic>
#include <cstdlib>
#include <thread>

#include "collectives/dist.h"

using namespace nd;
using namespace std::chrono_literals;

namespace {

class FakeWork : public dist::Work {
 public:
  explicit FakeWork(dist::CollectiveInfo info) { info_ = std::move(info); }
  void wait() override {}
  bool is_completed() override { return done; }
  std::exception_ptr error() override { return nullptr; }
  std::atomic<bool> done{false};
};

dist::CollectiveInfo info(const char* op, uint64_t sequence, int64_t numel, int64_t bucket = -1) {
  dist::CollectiveInfo i;
  i.op = op;
  i.sequence = sequence;
  i.numel = numel;
  i.bucket = bucket;
  return i;
}

}  // namespace

TEST_CASE("watchdog: the message names rank, collective and timeout") {
  CHECK(dist::Watchdog::timeout_message(3, info("allreduce", 12, 262144, 3), 300s) ==
        "nanoddp watchdog: rank 3: allreduce #12 (bucket 3, 262144 x f32) has not completed after 300 s; "
        "aborting the job");
  CHECK(dist::Watchdog::timeout_message(0, info("barrier", 4, 0), 2500ms) ==
        "nanoddp watchdog: rank 0: barrier #4 has not completed after 2.5 s; aborting the job");
}

TEST_CASE("watchdog: the message says what the collective was for (CollectivePurpose)") {
  dist::CollectiveInfo i = info("allreduce", 12, 262144, 3);
  i.purpose = "bucket 3 of DDP model 'D'";
  CHECK(dist::Watchdog::timeout_message(1, i, 300s) ==
        "nanoddp watchdog: rank 1: allreduce #12 (bucket 3 of DDP model 'D', 262144 x f32) has not completed after "
        "300 s; aborting the job");
  // The purpose in force on the issuing thread is recorded; purposes nest.
  dist::LocalProcessGroup g;
  Tensor t = ones({3});
  {
    dist::CollectivePurpose outer("SyncBatchNorm statistics of 'D.main.3'");
    CHECK(g.allreduce(t)->info().purpose == "SyncBatchNorm statistics of 'D.main.3'");
    {
      dist::CollectivePurpose inner("the per-iteration check of DDP model 'D'");
      CHECK(g.barrier()->info().describe() == "barrier #1 (the per-iteration check of DDP model 'D')");
    }
    CHECK(g.broadcast(t)->info().purpose == "SyncBatchNorm statistics of 'D.main.3'");
  }
  CHECK(g.allreduce(t)->info().purpose.empty());
}

TEST_CASE("watchdog: fires once for a stuck collective, not for completed ones") {
  std::vector<std::string> fired;
  std::mutex m;
  {
    dist::Watchdog dog(1, [&](const std::string& msg) {
      std::lock_guard lock(m);
      fired.push_back(msg);
    });
    auto quick = std::make_shared<FakeWork>(info("broadcast", 0, 7));
    auto stuck = std::make_shared<FakeWork>(info("allreduce", 1, 1001, 2));
    dog.watch(quick, 200ms);
    dog.watch(stuck, 200ms);
    quick->done = true;
    for (int i = 0; i < 100; ++i) {
      std::this_thread::sleep_for(20ms);
      std::lock_guard lock(m);
      if (!fired.empty()) break;
    }
    std::this_thread::sleep_for(200ms);  // no second report
    CHECK(dog.in_flight() == 1);
  }
  REQUIRE(fired.size() == 1);
  CHECK(fired[0] == "nanoddp watchdog: rank 1: allreduce #1 (bucket 2, 1001 x f32) has not completed after 0.2 s; "
                    "aborting the job");
}

TEST_CASE("watchdog: completed collectives are dropped") {
  dist::Watchdog dog(0, [](const std::string&) { FAIL("watchdog fired for a completed collective"); });
  auto work = std::make_shared<FakeWork>(info("allreduce", 0, 1));
  dog.watch(work, 10s);
  work->done = true;
  for (int i = 0; i < 100 && dog.in_flight() > 0; ++i) std::this_thread::sleep_for(10ms);
  CHECK(dog.in_flight() == 0);
}

TEST_CASE("timeout: default 5 minutes, NANODDP_COLLECTIVE_TIMEOUT_S, per group") {
  const char* saved = std::getenv("NANODDP_COLLECTIVE_TIMEOUT_S");
  const std::string restore = saved ? saved : "";
  unsetenv("NANODDP_COLLECTIVE_TIMEOUT_S");
  CHECK(dist::ProcessGroup::default_timeout() == std::chrono::milliseconds(300000));
  setenv("NANODDP_COLLECTIVE_TIMEOUT_S", "2.5", 1);
  CHECK(dist::ProcessGroup::default_timeout() == std::chrono::milliseconds(2500));
  setenv("NANODDP_COLLECTIVE_TIMEOUT_S", "soon", 1);
  CHECK(nd::testing::error_message([] { dist::ProcessGroup::default_timeout(); })
            .find("NANODDP_COLLECTIVE_TIMEOUT_S: expected a positive number of seconds, found 'soon'") !=
        std::string::npos);
  if (saved) setenv("NANODDP_COLLECTIVE_TIMEOUT_S", restore.c_str(), 1);
  else unsetenv("NANODDP_COLLECTIVE_TIMEOUT_S");

  dist::LocalProcessGroup g;
  g.set_timeout(1500ms);
  CHECK(g.timeout() == 1500ms);
}

TEST_CASE("fault: a collective that rank 1 never joins aborts the job") {
  auto w = dist::world();
  if (!nd::testing::fault_case("stuck")) return;
  w->set_timeout(2s);
  if (w->rank() == 1) {
    std::this_thread::sleep_for(60s);  // never joins; the watchdog on rank 0 ends the job first
    std::_Exit(0);
  }
  Tensor t = ones({7});
  w->allreduce(t)->wait();
  FAIL("the allreduce completed although rank 1 never joined");
}

TEST_CASE("fault: a DDP backward rank 1 never joins names the model in the watchdog's message") {
  auto w = dist::world();
  if (!nd::testing::fault_case("stuck_ddp")) return;
  manual_seed(1);
  nn::Sequential model(nn::Linear(nn::LinearOptions(4, 3)));
  dist::DistributedDataParallel ddp(model, "D");  // every rank: the layout check and broadcast
  if (w->rank() == 1) {
    std::this_thread::sleep_for(60s);  // never runs backward; the watchdog on rank 0 ends the job
    std::_Exit(0);
  }
  ddp(ones({2, 4})).sum().backward();
  FAIL("the backward's all-reduces completed although rank 1 never joined");
}

TEST_CASE("fault: ZeRO on rank 0 and a plain optimizer on rank 1 name the ZeRO ownership check") {
  auto w = dist::world();
  if (!nd::testing::fault_case("zero_vs_plain")) return;
  manual_seed(1);
  nn::Sequential model(nn::Linear(nn::LinearOptions(4, 3)));
  dist::DistributedDataParallel ddp(model, "D");
  std::unique_ptr<optim::Optimizer> opt;
  if (w->rank() == 0)  // waits in its construction check, which rank 1 never joins
    opt = dist::ZeroRedundancyOptimizer::make<optim::Adam>(model->parameters(), optim::AdamOptions(1e-3),
                                                           dist::ZeroRedundancyOptimizerOptions().ddp(&ddp.reducer()));
  else
    opt = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions(1e-3));
  ddp(ones({2, 4})).sum().backward();
  opt->step();
  FAIL("the ranks went on although only rank 0 built a ZeroRedundancyOptimizer");
}

TEST_CASE("fault: a rank killed before a collective ends the job") {
  auto w = dist::world();
  if (!nd::testing::fault_case("killed")) return;
  w->set_timeout(30s);  // mpirun tears the job down long before
  w->barrier()->wait();
  if (w->rank() == 1) std::_Exit(3);
  Tensor t = ones({7});
  w->allreduce(t)->wait();
  FAIL("the allreduce completed although rank 1 died");
}
