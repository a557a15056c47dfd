// Process groups: every collective, op and dtype against closed forms computed from
// rank-dependent inputs (so a mismatched or reordered exchange fails), at any world
// size (1 alone; 2 and 4 under mpirun), plus Work semantics and argument errors.
#include "harness.h"

#include <algorithm>
#include <cmath>

#include "collectives/dist.h"
#ifdef NANODDP_WITH_MPI
#include "collectives/mpi_process_group.h"
#endif

using namespace nd;
using nd::testing::error_message;
using nd::testing::to_vector;

namespace {

const std::vector<ScalarType> kDtypes = {kFloat32, kFloat64, kInt64, kInt32, kUInt8, kBFloat16, kFloat16};
const std::vector<int64_t> kSizes = {1, 7, 1001};

// Rank r's i-th value: small integers (exact in every dtype, sums of 4 ranks fit u8 and
// bf16) that differ by rank and position.
double value(int r, int64_t i) { return static_cast<double>((r * 5 + 1 + i % 7 + (i * (r + 3)) % 4) % 13); }

Tensor rank_tensor(int r, int64_t n, ScalarType dtype, int64_t base = 0) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = value(r, base + i);
  return tensor(v, dtype);
}

bool is_integral(ScalarType t) { return t == kInt64 || t == kInt32 || t == kUInt8; }

double reduce_expected(dist::ReduceOp op, int world, int64_t i, ScalarType dtype) {
  double acc = op == dist::ReduceOp::MAX ? -1e300 : op == dist::ReduceOp::MIN ? 1e300 : 0;
  for (int r = 0; r < world; ++r) {
    const double v = value(r, i);
    acc = op == dist::ReduceOp::MAX ? std::max(acc, v) : op == dist::ReduceOp::MIN ? std::min(acc, v) : acc + v;
  }
  if (op == dist::ReduceOp::AVG) acc = is_integral(dtype) ? std::trunc(acc / world) : acc / world;
  return acc;
}

double tolerance(ScalarType dtype) { return dtype == kBFloat16 ? 1e-2 : dtype == kFloat16 ? 1e-3 : 1e-6; }

std::string label(const char* op, ScalarType dtype, int64_t n) {
  return std::string(op) + " " + dtype_name(dtype) + " x" + std::to_string(n);
}

std::shared_ptr<dist::ProcessGroup> world() { return dist::world(); }

}  // namespace

TEST_CASE("world: rank, size, local rank and backend") {
  auto w = world();
  CHECK(w->size() >= 1);
  CHECK(w->rank() >= 0);
  CHECK(w->rank() < w->size());
  CHECK(dist::local_rank() >= 0);
  CHECK(dist::local_rank() < w->size());
  CHECK(dist::get_rank() == w->rank());
  CHECK(dist::get_world_size() == w->size());
  CHECK(w.get() == dist::world().get());
#ifdef NANODDP_WITH_MPI
  CHECK(w->backend() == "mpi");
#else
  CHECK(w->backend() == "local");
#endif
}

TEST_CASE("allreduce: SUM, AVG, MAX, MIN for every dtype and awkward sizes") {
  auto w = world();
  for (dist::ReduceOp op : {dist::ReduceOp::SUM, dist::ReduceOp::AVG, dist::ReduceOp::MAX, dist::ReduceOp::MIN}) {
    for (ScalarType dtype : kDtypes) {
      for (int64_t n : kSizes) {
        Tensor t = rank_tensor(w->rank(), n, dtype);
        w->allreduce(t, {op})->wait();
        std::vector<double> expected(n);
        for (int64_t i = 0; i < n; ++i) expected[i] = reduce_expected(op, w->size(), i, dtype);
        nd::testing::check_close(t, expected, tolerance(dtype), tolerance(dtype),
                                 label("allreduce", dtype, n) + " " + dist::reduce_op_name(op));
      }
    }
  }
}

TEST_CASE("allreduce of 16-bit floats: every rank's value widened, reduced in f32 in rank order, rounded once") {
  // Random values (not the small integers above, whose sums are exact): the result must equal
  // reducing the all-gathered 16-bit inputs in f32, rank 0 first, and rounding once, bit for
  // bit (the rounding PyTorch's bf16 / fp16 hooks give on a group that sums in f32).
  auto w = world();
  const int W = w->size();
  for (ScalarType dtype : {kBFloat16, kFloat16})
    for (dist::ReduceOp op : {dist::ReduceOp::SUM, dist::ReduceOp::AVG, dist::ReduceOp::MAX})
      for (int64_t n : kSizes) {
        Generator gen{static_cast<uint64_t>(40 + w->rank()), 0};
        const Tensor input = randn({n}, kFloat32, &gen).to(dtype);
        std::vector<Tensor> all;
        for (int r = 0; r < W; ++r) all.push_back(zeros({n}, dtype));
        w->allgather(all, input)->wait();
        Tensor acc = all[0].to(kFloat32);
        for (int r = 1; r < W; ++r)
          acc = op == dist::ReduceOp::MAX ? acc.maximum(all[r].to(kFloat32)) : acc + all[r].to(kFloat32);
        if (op == dist::ReduceOp::AVG) acc = acc / static_cast<double>(W);
        const Tensor result = input.clone();
        w->allreduce(result, {op})->wait();
        CAPTURE(label("allreduce", dtype, n));
        CHECK(to_vector(result) == to_vector(acc.to(dtype)));
      }
}

TEST_CASE("broadcast: every root, every dtype") {
  auto w = world();
  for (int root = 0; root < w->size(); ++root) {
    for (ScalarType dtype : {kFloat32, kFloat64, kInt64, kInt32, kUInt8, kBFloat16, kFloat16, kBool}) {
      for (int64_t n : kSizes) {
        std::vector<double> v(n), expected(n);
        for (int64_t i = 0; i < n; ++i) {
          v[i] = dtype == kBool ? (value(w->rank(), i) > 6) : value(w->rank(), i);
          expected[i] = dtype == kBool ? (value(root, i) > 6) : value(root, i);
        }
        Tensor t = tensor(v, dtype).view({n});
        w->broadcast(t, root)->wait();
        nd::testing::check_close(t, expected, 0, 0, label("broadcast", dtype, n) + " root " + std::to_string(root));
      }
    }
  }
}

TEST_CASE("allgather: equal and unequal sizes") {
  auto w = world();
  for (ScalarType dtype : kDtypes) {
    for (bool equal : {true, false}) {
      // Unequal: rank r contributes 3r + 1 values (1, 4, 7, 10).
      auto count = [&](int r) { return equal ? int64_t{7} : int64_t{3 * r + 1}; };
      Tensor input = rank_tensor(w->rank(), count(w->rank()), dtype);
      std::vector<Tensor> outputs;
      for (int r = 0; r < w->size(); ++r) outputs.push_back(zeros({count(r)}, dtype));
      w->allgather(outputs, input)->wait();
      for (int r = 0; r < w->size(); ++r) {
        std::vector<double> expected(count(r));
        for (int64_t i = 0; i < count(r); ++i) expected[i] = value(r, i);
        nd::testing::check_close(outputs[r], expected, 0, 0,
                                 label("allgather", dtype, count(r)) + " from rank " + std::to_string(r));
      }
    }
  }
}

TEST_CASE("reduce_scatter: every op and dtype, unequal chunks") {
  auto w = world();
  // Chunk q has 2q + 1 values; rank s puts value(s, 100q + i) in chunk q.
  auto count = [](int q) { return int64_t{2 * q + 1}; };
  for (dist::ReduceOp op : {dist::ReduceOp::SUM, dist::ReduceOp::AVG, dist::ReduceOp::MAX, dist::ReduceOp::MIN}) {
    for (ScalarType dtype : kDtypes) {
      std::vector<Tensor> inputs;
      for (int q = 0; q < w->size(); ++q) inputs.push_back(rank_tensor(w->rank(), count(q), dtype, 100 * q));
      Tensor output = zeros({count(w->rank())}, dtype);
      w->reduce_scatter(output, inputs, op)->wait();
      std::vector<double> expected(count(w->rank()));
      for (int64_t i = 0; i < count(w->rank()); ++i)
        expected[i] = reduce_expected(op, w->size(), 100 * w->rank() + i, dtype);
      nd::testing::check_close(output, expected, tolerance(dtype), tolerance(dtype),
                               label("reduce_scatter", dtype, count(w->rank())) + " " + dist::reduce_op_name(op));
    }
  }
}

TEST_CASE("barrier and Work: completion, info, sequence numbers") {
  auto w = world();
  auto b = w->barrier();
  b->wait();
  CHECK(b->is_completed());
  CHECK(b->error() == nullptr);
  CHECK(b->info().op == "barrier");

  Tensor t = ones({5});
  auto a = w->allreduce(t, {dist::ReduceOp::SUM, /*bucket=*/3});
  a->wait();
  CHECK(a->is_completed());
  CHECK(a->error() == nullptr);
  CHECK(a->info().op == "allreduce");
  CHECK(a->info().sequence == b->info().sequence + 1);
  CHECK(a->info().numel == 5);
  CHECK(a->info().dtype == kFloat32);
  CHECK(a->info().bucket == 3);
  CHECK(a->info().describe() == "allreduce #" + std::to_string(a->info().sequence) + " (bucket 3, 5 x f32)");
  CHECK(b->info().describe() == "barrier #" + std::to_string(b->info().sequence));
  a->wait();  // waiting again is fine
}

TEST_CASE("CollectiveRecord: count, order-sensitive rolling hash, the part since a snapshot, the last few") {
  auto info = [](const char* op, int64_t numel, ScalarType dtype, uint64_t sequence) {
    dist::CollectiveInfo i;
    i.op = op;
    i.numel = numel;
    i.dtype = dtype;
    i.sequence = sequence;
    return i;
  };
  const auto a = info("allreduce", 4, kFloat32, 0), b = info("allreduce", 4, kInt32, 1),
             c = info("broadcast", 4, kFloat32, 2), d = info("allreduce", 5, kFloat32, 3);
  // Each of op, element count and dtype changes a collective's hash.
  CHECK(dist::CollectiveRecord::collective_hash(a) != dist::CollectiveRecord::collective_hash(b));
  CHECK(dist::CollectiveRecord::collective_hash(a) != dist::CollectiveRecord::collective_hash(c));
  CHECK(dist::CollectiveRecord::collective_hash(a) != dist::CollectiveRecord::collective_hash(d));
  // The sequence number and bucket do not (the count and the order cover them).
  dist::CollectiveInfo a2 = a;
  a2.sequence = 9;
  a2.bucket = 2;
  CHECK(dist::CollectiveRecord::collective_hash(a) == dist::CollectiveRecord::collective_hash(a2));

  dist::CollectiveRecord ab, ba;
  ab.add(a), ab.add(b), ba.add(b), ba.add(a);
  CHECK(ab.count == 2);
  CHECK(ab.hash != ba.hash);  // order matters
  // The part after a snapshot hashes like a record that holds only that part.
  dist::CollectiveRecord prefix, whole, tail;
  prefix.add(c), prefix.add(d);
  whole = prefix;
  for (int k = 0; k < 6; ++k) whole.add(k % 2 ? a : b), tail.add(k % 2 ? a : b);
  CHECK(whole.count == 8);
  CHECK(whole.hash_since(prefix) == tail.hash);
  CHECK(whole.hash_since(whole) == 0);
  CHECK(whole.hash_since(dist::CollectiveRecord{}) == whole.hash);
  // The last few, oldest first, within the part since the snapshot and the kept depth.
  auto last = whole.last_since(prefix, 2);
  REQUIRE(last.size() == 2);
  CHECK(last[0].numel == b.numel);
  CHECK(last[0].dtype == kInt32);
  CHECK(last[1].dtype == kFloat32);
  CHECK(whole.last_since(prefix, 10).size() == dist::CollectiveRecord::kDepth);
  CHECK(prefix.last_since(dist::CollectiveRecord{}, 10).size() == 2);
  CHECK(whole.last_since(whole, 3).empty());
}

TEST_CASE("ProcessGroup::record(): every collective issued, in order, the same on every rank") {
  auto w = world();
  const dist::CollectiveRecord before = w->record();
  Tensor t = ones({7});
  w->allreduce(t, {dist::ReduceOp::SUM, /*bucket=*/1})->wait();
  w->broadcast(ones({3}, kFloat64), 0)->wait();
  w->barrier()->wait();
  // Unequal parts (rank r sends r + 1 elements): recorded as the total, the same everywhere.
  std::vector<Tensor> parts;
  int64_t total = 0;
  for (int r = 0; r < w->size(); ++r) parts.push_back(empty({r + 1})), total += r + 1;
  auto gathered = w->allgather(parts, ones({w->rank() + 1}));
  gathered->wait();
  const dist::CollectiveRecord after = w->record();
#ifdef NANODDP_WITH_MPI
  CHECK(gathered->info().numel == total);
  CHECK(after.count == before.count + 4);
  auto last = after.last_since(before, 4);
  REQUIRE(last.size() == 4);
  CHECK(last[0].describe() == "allreduce #" + std::to_string(before.count) + " (bucket 1, 7 x f32)");
  CHECK(last[1].describe() == "broadcast #" + std::to_string(before.count + 1) + " (3 x f64)");
  CHECK(last[2].describe() == "barrier #" + std::to_string(before.count + 2));
  CHECK(last[3].describe() == "allgather #" + std::to_string(before.count + 3) + " (" + std::to_string(total) +
                                  " x f32)");
  dist::CollectiveRecord expected;
  for (const auto& i : last) expected.add(i);
  CHECK(after.hash_since(before) == expected.hash);
  // Every rank issued the same: the same count and hash (an all-gather over the world).
  Tensor mine = tensor({static_cast<double>(after.count), static_cast<double>(after.hash >> 12)}, kFloat64);
  std::vector<Tensor> all;
  for (int r = 0; r < w->size(); ++r) all.push_back(empty({2}, kFloat64));
  w->allgather(all, mine)->wait();
  for (int r = 0; r < w->size(); ++r) nd::testing::check_close(all[r], mine, 0, 0, "record of rank " + std::to_string(r));
#else
  CHECK(after.count == before.count);  // LocalProcessGroup keeps no record: nothing to compare with
#endif
}

TEST_CASE("Work: a failed collective rethrows its nd::Error from wait()") {
  dist::CollectiveInfo info;
  info.op = "allreduce";
  info.sequence = 4;
  info.numel = 7;
  dist::AsyncWork work(info);
  CHECK_FALSE(work.is_completed());
  work.mark_done(std::make_exception_ptr(Error(info.describe() + " failed: MPI_Allreduce: message truncated")));
  CHECK(work.is_completed());
  CHECK(work.error() != nullptr);
  CHECK(error_message([&] { work.wait(); }) == "allreduce #4 (7 x f32) failed: MPI_Allreduce: message truncated");
}

TEST_CASE("many collectives issued back to back complete in order") {
  auto w = world();
  // Different sizes and ops interleaved, waited for in reverse order.
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<dist::Work>> works;
  for (int k = 0; k < 60; ++k) {
    const int64_t n = 1 + (k * 37) % 101;
    tensors.push_back(rank_tensor(w->rank(), n, kFloat64, k));
    const auto op = k % 3 == 0 ? dist::ReduceOp::MAX : dist::ReduceOp::SUM;
    works.push_back(w->allreduce(tensors.back(), {op}));
  }
  for (int k = 59; k >= 0; --k) {
    works[k]->wait();
    CHECK(works[k]->info().sequence == works[0]->info().sequence + k);
    std::vector<double> expected(tensors[k].numel());
    for (size_t i = 0; i < expected.size(); ++i)
      expected[i] = reduce_expected(k % 3 == 0 ? dist::ReduceOp::MAX : dist::ReduceOp::SUM, w->size(), k + i,
                                    kFloat64);
    nd::testing::check_close(tensors[k], expected, 0, 0, "collective " + std::to_string(k));
  }
  // The same tensor five times without waiting in between: each sees the previous result.
  Tensor same = ones({13}, kInt64);
  std::vector<std::shared_ptr<dist::Work>> chain;
  for (int k = 0; k < 5; ++k) chain.push_back(w->allreduce(same));
  chain.back()->wait();
  for (auto& work : chain) CHECK(work->is_completed());
  nd::testing::check_close(same, std::vector<double>(13, std::pow(w->size(), 5)), 0, 0, "chained allreduce");
}

#ifdef NANODDP_WITH_MPI
TEST_CASE("MpiProcessGroup: destroying a group runs every collective already issued") {
  world();  // MPI is up (with MPI_THREAD_MULTIPLE, so a second group may run beside it)
  std::vector<Tensor> tensors;
  {
    dist::MpiProcessGroup group;  // a duplicate of MPI_COMM_WORLD
    CHECK(group.rank() == world()->rank());
    CHECK(group.size() == world()->size());
    for (int k = 0; k < 10; ++k) {
      tensors.push_back(full({3}, k + 1));
      group.allreduce(tensors.back());  // never waited for
    }
  }
  for (int k = 0; k < 10; ++k)
    nd::testing::check_close(tensors[k], std::vector<double>(3, (k + 1) * world()->size()), 0, 0,
                             "drained allreduce " + std::to_string(k));
}
#endif

TEST_CASE("collectives write in place and bump the version counter") {
  Tensor t = ones({3});
  const int64_t before = t._version();
  world()->allreduce(t)->wait();
  CHECK(t._version() == before + 1);
}

TEST_CASE("argument errors name the collective and the problem") {
  for (auto g : {world(), std::shared_ptr<dist::ProcessGroup>(std::make_shared<dist::LocalProcessGroup>())}) {
    CAPTURE(g->backend());
    const int W = g->size();
    Tensor strided = zeros({4, 3}).t();
    CHECK(error_message([&] { g->allreduce(strided); }).find("allreduce: expected a contiguous tensor") !=
          std::string::npos);
    CHECK(error_message([&] { g->allreduce(Tensor()); }).find("allreduce: expected a defined tensor") !=
          std::string::npos);
    CHECK(error_message([&] { g->allreduce(zeros({2}, kBool)); }).find("bool tensors cannot be reduced") !=
          std::string::npos);
    CHECK(error_message([&] { g->broadcast(zeros({2}), W); }).find("broadcast: root") != std::string::npos);
    CHECK(error_message([&] { g->allgather({}, zeros({2})); }).find("allgather: expected one output per rank") !=
          std::string::npos);
    std::vector<Tensor> wrong_dtype(W, zeros({2}, kFloat64));
    CHECK(error_message([&] { g->allgather(wrong_dtype, zeros({2})); }).find("expected every output to be f32") !=
          std::string::npos);
    std::vector<Tensor> wrong_size(W, zeros({3}));
    const std::string own_size = g->backend() == "local" ? "must hold rank 0's input" : "must hold this rank's input";
    CHECK(error_message([&] { g->allgather(wrong_size, zeros({2})); }).find(own_size) != std::string::npos);
    CHECK(error_message([&] { g->reduce_scatter(zeros({2}), {}); }).find("reduce_scatter: expected one input per "
                                                                         "rank") != std::string::npos);
    // Nothing was issued by the failed calls: the group still works.
    Tensor t = ones({2});
    g->allreduce(t)->wait();
    nd::testing::check_close(t, std::vector<double>(2, W), 0, 0, "allreduce after errors");
  }
}

TEST_CASE("LocalProcessGroup: one rank, collectives are identities") {
  dist::LocalProcessGroup g;
  CHECK(g.rank() == 0);
  CHECK(g.size() == 1);
  Tensor t = tensor({1, 2, 3});
  for (auto op : {dist::ReduceOp::SUM, dist::ReduceOp::AVG, dist::ReduceOp::MAX, dist::ReduceOp::MIN})
    g.allreduce(t, {op})->wait();
  nd::testing::check_close(t, {1, 2, 3}, 0, 0, "local allreduce");
  Tensor out = zeros({3});
  g.allgather({out}, t)->wait();
  nd::testing::check_close(out, {1, 2, 3}, 0, 0, "local allgather");
  Tensor rs = zeros({3});
  g.reduce_scatter(rs, {tensor({4, 5, 6})})->wait();
  nd::testing::check_close(rs, {4, 5, 6}, 0, 0, "local reduce_scatter");
  auto work = g.barrier();
  CHECK(work->is_completed());
  CHECK(work->info().sequence == 6);
}

TEST_CASE("nccl: collectives on this rank's GPU match the closed forms") {
#ifndef NANODDP_WITH_NCCL
  CHECK(error_message([] { dist::nccl_world(); }).find("built without NCCL") != std::string::npos);
  MESSAGE("SKIPPED: built without NCCL");
#else
  if (!cuda::is_available()) {
    MESSAGE("SKIPPED: no CUDA device");
    return;
  }
  auto g = dist::nccl_world();
  CHECK(g->backend() == "nccl");
  CHECK(g->size() == world()->size());
  CHECK(g->rank() == world()->rank());
  const Device gpu(kCUDA, dist::local_rank() % cuda::device_count());
  for (auto op : {dist::ReduceOp::SUM, dist::ReduceOp::AVG, dist::ReduceOp::MAX, dist::ReduceOp::MIN}) {
    for (ScalarType dtype : {kFloat32, kFloat64, kInt64, kInt32, kBFloat16, kFloat16}) {
      for (int64_t n : kSizes) {
        Tensor t = rank_tensor(g->rank(), n, dtype).to(gpu);
        g->allreduce(t, {op})->wait();
        std::vector<double> expected(n);
        for (int64_t i = 0; i < n; ++i) expected[i] = reduce_expected(op, g->size(), i, dtype);
        nd::testing::check_close(t.cpu(), expected, tolerance(dtype), tolerance(dtype),
                                 label("nccl allreduce", dtype, n) + " " + dist::reduce_op_name(op));
      }
    }
  }
  for (int root = 0; root < g->size(); ++root) {
    Tensor t = rank_tensor(g->rank(), 1001, kFloat32).to(gpu);
    g->broadcast(t, root)->wait();
    std::vector<double> expected(1001);
    for (int64_t i = 0; i < 1001; ++i) expected[i] = value(root, i);
    nd::testing::check_close(t.cpu(), expected, 0, 0, "nccl broadcast root " + std::to_string(root));
  }
  auto count = [](int r) { return int64_t{3 * r + 1}; };
  std::vector<Tensor> outputs;
  for (int r = 0; r < g->size(); ++r) outputs.push_back(zeros({count(r)}, kFloat32).to(gpu));
  g->allgather(outputs, rank_tensor(g->rank(), count(g->rank()), kFloat32).to(gpu))->wait();
  for (int r = 0; r < g->size(); ++r) {
    std::vector<double> expected(count(r));
    for (int64_t i = 0; i < count(r); ++i) expected[i] = value(r, i);
    nd::testing::check_close(outputs[r].cpu(), expected, 0, 0, "nccl allgather from rank " + std::to_string(r));
  }
  std::vector<Tensor> inputs;
  for (int q = 0; q < g->size(); ++q) inputs.push_back(rank_tensor(g->rank(), 2 * q + 1, kFloat32, 100 * q).to(gpu));
  Tensor output = zeros({2 * g->rank() + 1}, kFloat32).to(gpu);
  g->reduce_scatter(output, inputs)->wait();
  std::vector<double> expected(2 * g->rank() + 1);
  for (size_t i = 0; i < expected.size(); ++i)
    expected[i] = reduce_expected(dist::ReduceOp::SUM, g->size(), 100 * g->rank() + i, kFloat32);
  nd::testing::check_close(output.cpu(), expected, 0, 0, "nccl reduce_scatter");
  auto b = g->barrier();
  b->wait();
  CHECK(b->is_completed());
  CHECK(b->error() == nullptr);
  CHECK(error_message([&] { g->allreduce(ones({2})); }).find("expects tensors on cuda") != std::string::npos);
#endif
}
