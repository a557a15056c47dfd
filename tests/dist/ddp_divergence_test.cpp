// DistributedDataParallel's divergence check, run at 1, 2 and 4 ranks: ranks that run
// different backward passes, or issue different collectives (count, op, element count,
// dtype, order) on their process group between two backwards, get an error on every rank
// at the next backward naming rank 0 and the first rank that differs, not a hang.
#include "collectives/ddp.h"
#include "dist/ddp_test_util.h"
#include "harness.h"

using namespace nd;
using dist::DistributedDataParallel;
using dist::DistributedDataParallelOptions;
using namespace nd::testing::ddp;

TEST_CASE("ddp: ranks in different backward passes get an error, not a hang") {
  if (skip_at_one_rank()) return;
  manual_seed(12);
  nn::Sequential A(nn::Linear(nn::LinearOptions(3, 2)));
  nn::Sequential B(nn::Linear(nn::LinearOptions(3, 2)));
  DistributedDataParallel a(A, "A"), b(B, "B");
  Tensor x = randn({2, 3});
  // Rank 0 runs A's backward while the others run B's.
  const std::string msg = nd::testing::error_message([&] { (rank() == 0 ? a(x) : b(x)).sum().backward(); });
  CHECK(contains(msg, "ranks diverged"));
  CHECK(contains(msg, "rank 0: backward of DDP model 'A'"));
  CHECK(contains(msg, "rank 1: backward of DDP model 'B'"));
}


// --- Ranks that diverge in the collectives they issue get an error naming both
// --- sides at the next backward, on every rank, not a hang.
//
// The data group is the world; the check travels on dist::control_world(), its own
// communicator. MPI still pairs the divergent collectives on the world, so they keep
// equal byte counts pairwise (a different dtype of the same width, the same two in
// another order); the extra collective is left pending and matched after the error;
// a pure size difference goes through a group that only records (RecordingGroup).

namespace {
// A process group of the world's size that moves no data: it records what is issued
// and completes it at once. DDP's reduction through it is wrong (each rank keeps its own
// sums, so every parameter looks used on one rank only: find_unused_parameters(true));
// its checks are not.
class RecordingGroup : public dist::ProcessGroup {
 public:
  int rank() const override { return dist::world()->rank(); }
  int size() const override { return dist::world()->size(); }
  std::string backend() const override { return "recording"; }
  std::shared_ptr<dist::Work> allreduce(const Tensor& t, const dist::AllreduceOptions& o = {}) override {
    return issue("allreduce", t, o.bucket);
  }
  std::shared_ptr<dist::Work> broadcast(const Tensor& t, int) override { return issue("broadcast", t); }
  std::shared_ptr<dist::Work> allgather(const std::vector<Tensor>&, const Tensor& t) override {
    return issue("allgather", t);
  }
  std::shared_ptr<dist::Work> reduce_scatter(const Tensor& t, const std::vector<Tensor>&, dist::ReduceOp) override {
    return issue("reduce_scatter", t);
  }
  std::shared_ptr<dist::Work> barrier() override { return issue("barrier", Tensor()); }

 private:
  std::shared_ptr<dist::Work> issue(const char* op, const Tensor& t, int64_t bucket = -1) {
    dist::CollectiveInfo info{op, sequence_++, t.defined() ? t.numel() : 0, t.defined() ? t.dtype() : kFloat32,
                              bucket, {}};
    note_issued(info);
    auto work = std::make_shared<dist::AsyncWork>(info);
    work->mark_done();
    return work;
  }
  uint64_t sequence_ = 0;
};

DistributedDataParallelOptions recorded(const std::shared_ptr<dist::ProcessGroup>& group) {
  return DistributedDataParallelOptions().find_unused_parameters(true).process_group(group);
}

// True (after printing SKIPPED) unless several ranks have dist::control_world() apart from
// the world, which the MPI cases need (the check must not travel on the diverged group).
bool skip_without_control_group() {
  if (world_size() > 1 && dist::control_world() != dist::world()) return false;
  MESSAGE("SKIPPED: needs 2 or more ranks and MPI_THREAD_MULTIPLE (run under mpirun)");
  return true;
}

// An f64 copy of make_mlp(), seeded: one bucket of 168 values under DDP's defaults.
nn::Sequential f64_mlp(uint64_t seed) {
  manual_seed(seed);
  nn::Sequential model = make_mlp();
  model->to(kFloat64);
  return model;
}

// The MLP's one bucket: 163 gradients and 4 + 1 status slots, f64.
const char* kMlpBucket = "(bucket 0, 168 x f64)";
}  // namespace

TEST_CASE("ddp divergence: a rank that issues one extra all-reduce on the data group") {
  if (skip_without_control_group()) return;
  nn::Sequential model = f64_mlp(50);
  DistributedDataParallel ddp(model, "extra");
  Tensor x = randn({4, 6}, kFloat64);
  ddp(x).sum().backward();  // iteration 0: checked, then its bucket all-reduce
  const uint64_t bucket_seq = dist::world()->record().count - 1;
  Tensor out = ddp(x).sum();
  Tensor extra = ones({3});
  std::shared_ptr<dist::Work> work;
  if (rank() == 1) work = dist::world()->allreduce(extra);  // unmatched until the others issue theirs below
  const std::string msg = nd::testing::error_message([&] { out.backward(); });
  if (rank() != 1) work = dist::world()->allreduce(extra);
  work->wait();
  nd::testing::check_close(extra, std::vector<double>(3, world_size()), 0, 0, "the extra all-reduce, matched late");
  const std::string since = " on the mpi group since the backward of iteration 0, ";
  CHECK(contains(msg, "ranks diverged: rank 1 differs from rank 0"));
  CHECK(contains(msg, "rank 0: backward of DDP model 'extra', iteration 1, 1 bucket(s), 4 parameter(s); issued 1 "
                      "collective(s)" + since + "the last allreduce #" + std::to_string(bucket_seq) + " " + kMlpBucket));
  CHECK(contains(msg, "rank 1: backward of DDP model 'extra', iteration 1, 1 bucket(s), 4 parameter(s); issued 2 "
                      "collective(s)" + since + "the last 2: allreduce #" + std::to_string(bucket_seq) + " " +
                      kMlpBucket + ", then allreduce #" + std::to_string(bucket_seq + 1) + " (3 x f32)"));
}

TEST_CASE("ddp divergence: a rank that all-reduces a different dtype, then the reducer goes on") {
  if (skip_without_control_group()) return;
  nn::Sequential model = f64_mlp(51);
  DistributedDataParallel ddp(model, "dtype");
  Tensor x = randn({4, 6}, kFloat64);
  ddp(x).sum().backward();
  const uint64_t next = dist::world()->record().count;
  // 4 x i64 on rank 1, 4 x f64 elsewhere: the same bytes, so MPI pairs them (garbage values).
  dist::world()->allreduce(rank() == 1 ? ones({4}, kInt64) : ones({4}, kFloat64))->wait();
  const std::string msg = nd::testing::error_message([&] { ddp(x).sum().backward(); });
  const std::string head = "issued 2 collective(s) on the mpi group since the backward of iteration 0, the last 2: "
                           "allreduce #" + std::to_string(next - 1) + " " + kMlpBucket + ", then allreduce #" +
                           std::to_string(next);
  CHECK(contains(msg, "ranks diverged: rank 1 differs from rank 0"));
  CHECK(contains(msg, "rank 0: backward of DDP model 'dtype', iteration 1, 1 bucket(s), 4 parameter(s); " + head +
                          " (4 x f64)"));
  CHECK(contains(msg, "rank 1: backward of DDP model 'dtype', iteration 1, 1 bucket(s), 4 parameter(s); " + head +
                          " (4 x i64)"));
  // Every rank starts a fresh comparison from the failed check: the next backward passes.
  ddp(x).sum().backward();
  ddp(x).sum().backward();
}

TEST_CASE("ddp divergence: the same collectives in another order") {
  if (skip_without_control_group()) return;
  nn::Sequential model = f64_mlp(52);
  DistributedDataParallel ddp(model, "order");
  Tensor x = randn({4, 6}, kFloat64);
  ddp(x).sum().backward();
  const uint64_t next = dist::world()->record().count;
  // 4 x f64 then 4 x i64, and on rank 1 the other way round (pairwise the same bytes).
  Tensor a = ones({4}, kFloat64), b = ones({4}, kInt64);
  auto w1 = dist::world()->allreduce(rank() == 1 ? b : a);
  auto w2 = dist::world()->allreduce(rank() == 1 ? a : b);
  w1->wait();
  w2->wait();
  const std::string msg = nd::testing::error_message([&] { ddp(x).sum().backward(); });
  const std::string head = "issued 3 collective(s) on the mpi group since the backward of iteration 0, the last 2: ";
  const std::string first = "allreduce #" + std::to_string(next), second = "allreduce #" + std::to_string(next + 1);
  CHECK(contains(msg, "rank 0: backward of DDP model 'order', iteration 1, 1 bucket(s), 4 parameter(s); " + head +
                          first + " (4 x f64), then " + second + " (4 x i64)"));
  CHECK(contains(msg, "rank 1: backward of DDP model 'order', iteration 1, 1 bucket(s), 4 parameter(s); " + head +
                          first + " (4 x i64), then " + second + " (4 x f64)"));
  ddp(x).sum().backward();
}

TEST_CASE("ddp divergence: a rank that all-reduces a different size (through a recording group)") {
  if (skip_at_one_rank()) return;
  auto group = std::make_shared<RecordingGroup>();
  nn::Sequential model = f64_mlp(53);
  DistributedDataParallel ddp(model, "sized", recorded(group));
  Tensor x = randn({4, 6}, kFloat64);
  ddp(x).sum().backward();  // construction broadcast the 4 f64 parameters as one (#0); bucket 0 all-reduced (#1)
  group->allreduce(zeros({rank() == 1 ? 6 : 4}));
  const std::string msg = nd::testing::error_message([&] { ddp(x).sum().backward(); });
  const std::string head = "issued 2 collective(s) on the recording group since the backward of iteration 0, the "
                           "last 2: allreduce #1 " + std::string(kMlpBucket) + ", then allreduce #2 ";
  CHECK(contains(msg, "rank 0: backward of DDP model 'sized', iteration 1, 1 bucket(s), 4 parameter(s); " + head +
                          "(4 x f32)"));
  CHECK(contains(msg, "rank 1: backward of DDP model 'sized', iteration 1, 1 bucket(s), 4 parameter(s); " + head +
                          "(6 x f32)"));
  // Collectives since construction count too: a rank with one more before the first backward.
  nn::Sequential other = f64_mlp(54);
  DistributedDataParallel fresh(other, "fresh", recorded(group));
  if (rank() == 1) group->barrier();
  const std::string first = nd::testing::error_message([&] { fresh(x).sum().backward(); });
  CHECK(contains(first, "rank 0: backward of DDP model 'fresh', iteration 0, 1 bucket(s), 4 parameter(s); issued 0 "
                        "collective(s) on the recording group since DDP construction"));
  CHECK(contains(first, "rank 1: backward of DDP model 'fresh', iteration 0, 1 bucket(s), 4 parameter(s); issued 1 "
                        "collective(s) on the recording group since DDP construction, the last barrier #"));
}
