// bench/scale_model: the collective cost formulas and the step timeline against cases
// computed by hand (the arithmetic is in each comment), the fit of alpha and beta against
// times generated from known values, and every error path.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nanoddp.h>

#include "scale_model/collective_cost.h"
#include "scale_model/hook_cost.h"

using namespace nd::scale;

namespace {

// NVLink-like 1 us / 100 GB/s inside a node of 4, network 10 us / 25 GB/s per node, 5 us per call.
Fabric test_fabric() {
  Fabric f;
  f.name = "test";
  f.intra = Link{1e-6, 100e9};
  f.inter = Link{10e-6, 25e9};
  f.gpus_per_node = 4;
  f.base_latency = 5e-6;
  return f;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const nd::Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("collective costs: ring all-reduce inside a node and across nodes") {
  const Fabric f = test_fabric();
  // 4 ranks, one node: 5 + 2*3*1 us + 2*(3/4)*1e8/1e11 s = 11 us + 1.5 ms.
  CHECK(ring_allreduce(1e8, 4, f) == doctest::Approx(1.511e-3).epsilon(1e-12));
  // 8 ranks, 2 nodes: 14 steps, 2 across: 5 + 12*1 + 2*10 us = 37 us; 2*(7/8)*1e8 / 25e9 = 7 ms.
  CHECK(ring_allreduce(1e8, 8, f) == doctest::Approx(7.037e-3).epsilon(1e-12));
  // One rank, or nothing to send: free.
  CHECK(ring_allreduce(1e8, 1, f) == 0);
  CHECK(ring_allreduce(0, 8, f) == 0);
}

TEST_CASE("collective costs: tree and hierarchical all-reduce, and the best of the three") {
  const Fabric f = test_fabric();
  // 16 ranks = 4 nodes of 4: hops 3*1 + log2(4)*10 = 23 us, twice, + 5 us = 51 us; 2e8 / 25e9 = 8 ms.
  CHECK(tree_allreduce(1e8, 16, f) == doctest::Approx(8.051e-3).epsilon(1e-12));
  // Reduce-scatter in the node: 5 + 3 us + (3/4) 1e8 / 1e11 = 0.758 ms; all-reduce of 2.5e7 bytes over
  // 4 nodes at 25e9 / 4 per rank: 5 + 6*10 us + 2 (3/4) 2.5e7 / 6.25e9 = 6.065 ms; all-gather 0.758 ms.
  CHECK(hierarchical_allreduce(1e8, 16, f) == doctest::Approx(7.581e-3).epsilon(1e-12));
  // Ring: 30 steps, 6 across: 5 + 24 + 60 us; 2 (15/16) 1e8 / 25e9 = 7.5 ms.
  CHECK(ring_allreduce(1e8, 16, f) == doctest::Approx(7.589e-3).epsilon(1e-12));
  CHECK(allreduce(1e8, 16, f) == doctest::Approx(7.581e-3).epsilon(1e-12));
  CHECK(allreduce(1e8, 16, f, Algorithm::kTree) == doctest::Approx(8.051e-3).epsilon(1e-12));
  // One node: hierarchical is the ring.
  CHECK(hierarchical_allreduce(1e8, 4, f) == ring_allreduce(1e8, 4, f));
  // Small messages: the tree's log2 hops win. 1 KB on 16 ranks: ring 89 us + 75 ns,
  // tree 51 us + 80 ns.
  CHECK(allreduce(1e3, 16, f) == doctest::Approx(51e-6 + 2e3 / 25e9).epsilon(1e-12));
}

TEST_CASE("collective costs: reduce-scatter, all-gather and broadcast") {
  const Fabric f = test_fabric();
  // One node of 4: 5 + 3*1 us + (3/4) 1e8 / 1e11 = 0.758 ms.
  CHECK(reduce_scatter(1e8, 4, f) == doctest::Approx(0.758e-3).epsilon(1e-12));
  CHECK(all_gather(1e8, 4, f) == doctest::Approx(0.758e-3).epsilon(1e-12));
  // 16 ranks, flat ring: 5 + 12*1 + 3*10 us + (15/16) 1e8 / 25e9 = 3.797 ms; two levels: 0.758 ms in
  // the node + (5 + 3*10 us + (3/4) 2.5e7 / 6.25e9 = 3.035 ms) across = 3.793 ms.
  CHECK(reduce_scatter(1e8, 16, f, Algorithm::kRing) == doctest::Approx(3.797e-3).epsilon(1e-12));
  CHECK(reduce_scatter(1e8, 16, f, Algorithm::kHierarchical) == doctest::Approx(3.793e-3).epsilon(1e-12));
  CHECK(reduce_scatter(1e8, 16, f) == doctest::Approx(3.793e-3).epsilon(1e-12));
  // Broadcast on 8 ranks, 2 nodes: 5 + 6*1 + 1*10 us + 1e6 / 25e9 = 61 us.
  CHECK(broadcast(1e6, 8, f) == doctest::Approx(61e-6).epsilon(1e-12));
}

TEST_CASE("collective costs: a ring reaches NCCL's bus bandwidth on large messages") {
  // busBw = algBw 2(p-1)/p (all-reduce), algBw (p-1)/p (reduce-scatter), algBw = n / t.
  const Fabric f = test_fabric();
  const double n = 1e13;
  for (int p : {2, 4}) {
    CHECK(n / ring_allreduce(n, p, f) * 2 * (p - 1) / p == doctest::Approx(f.intra.bandwidth).epsilon(1e-6));
    CHECK(n / reduce_scatter(n, p, f) * (p - 1) / p == doctest::Approx(f.intra.bandwidth).epsilon(1e-6));
  }
  CHECK(n / ring_allreduce(n, 64, f) * 2 * 63 / 64 == doctest::Approx(f.inter.bandwidth).epsilon(1e-6));
}

TEST_CASE("collective costs: presets and their figures") {
  const Fabric ib = fabric_preset("ib400");
  CHECK(ib.gpus_per_node == 8);
  CHECK(ib.intra.bandwidth == 450e9);
  CHECK(ib.inter.bandwidth == 400e9);  // 8 NICs x 400 Gb/s
  CHECK(fabric_preset("roce100").inter.bandwidth == 100e9);
  CHECK(fabric_preset("eth25").inter.bandwidth == 3.125e9);
  CHECK(fabric_preset("dgx1").intra.bandwidth == 150e9);  // 6 NVLink 2 links x 25 GB/s
  CHECK(fabric_preset("dgx1").inter.bandwidth == 50e9);   // 4 x 100 Gb/s
  // 8 H100 on NVLink, 25 MiB: 8.4 + 14*3.4 us + 2 (7/8) 26214400 / 450e9.
  CHECK(ring_allreduce(26214400, 8, fabric_preset("nvlink")) ==
        doctest::Approx(8.4e-6 + 14 * 3.4e-6 + 1.75 * 26214400 / 450e9).epsilon(1e-12));
  for (const std::string& name : fabric_preset_names()) CHECK(fabric_preset(name).name == name);
  CHECK(error_of([] { fabric_preset("infiniband"); }) ==
        "unknown interconnect 'infiniband': expected one of nvlink, ib400, roce100, eth25, dgx1, mpi-shm, mpi-tcp");
  // Our MPI on one node: no overlap, every rank in one node.
  const Fabric mpi = fabric_preset("mpi:20:2.5");
  CHECK(mpi.intra.alpha == doctest::Approx(20e-6));
  CHECK(mpi.intra.bandwidth == doctest::Approx(2.5e9));
  CHECK(!mpi.overlaps_compute);
  // 4 ranks: 6 steps of 20 us + 1.5 * 1e6 / 2.5e9.
  CHECK(ring_allreduce(1e6, 4, mpi) == doctest::Approx(6 * 20e-6 + 1.5e6 / 2.5e9).epsilon(1e-12));
  CHECK(error_of([] { fabric_preset("mpi:20"); }) ==
        "interconnect 'mpi:20': expected mpi:ALPHA_US:GB_PER_S with ALPHA_US >= 0 and GB_PER_S > 0");
  CHECK(error_of([] { fabric_preset("mpi:20:0"); }) ==
        "interconnect 'mpi:20:0': expected mpi:ALPHA_US:GB_PER_S with ALPHA_US >= 0 and GB_PER_S > 0");
  CHECK(error_of([] { algorithm_by_name("rings"); }) ==
        "unknown algorithm 'rings': expected ring, tree, hierarchical or best");
  CHECK(algorithm_by_name("hierarchical") == Algorithm::kHierarchical);
  CHECK(std::string(algorithm_name(Algorithm::kTree)) == "tree");
  CHECK(error_of([] { ring_allreduce(-1, 4, test_fabric()); }) ==
        "ring_allreduce: expected ranks >= 1 and finite bytes >= 0, found 4 ranks and -1 bytes");
}

TEST_CASE("fit_link recovers alpha and bandwidth from times of the ring model") {
  const Link truth{7e-6, 3e9};
  std::vector<Sample> samples;
  for (int p : {2, 4})
    for (double n = 1024; n <= 64e6; n *= 4) {
      Fabric one_node;
      one_node.intra = truth;
      one_node.gpus_per_node = 64;
      samples.push_back({"allreduce", n, p, ring_allreduce(n, p, one_node)});
      samples.push_back({"reduce_scatter", n, p, reduce_scatter(n, p, one_node)});
      samples.push_back({"allgather", n, p, all_gather(n, p, one_node)});
    }
  const Fit fit = fit_link(samples);
  CHECK(fit.link.alpha == doctest::Approx(truth.alpha).epsilon(1e-9));
  CHECK(fit.link.bandwidth == doctest::Approx(truth.bandwidth).epsilon(1e-9));
  CHECK(fit.rms_relative_error < 1e-9);
  // 10% too slow everywhere: the fit scales, the error stays 0.
  for (Sample& s : samples) s.seconds *= 1.1;
  CHECK(fit_link(samples).link.bandwidth == doctest::Approx(truth.bandwidth / 1.1).epsilon(1e-9));

  CHECK(error_of([] { fit_link({{"allreduce", 1e6, 2, 1e-3}}); }) == "fit_link: expected at least 2 samples, found 1");
  CHECK(error_of([] { fit_link({{"allreduce", 1e6, 2, 1e-3}, {"allreduce", 1e6, 2, 1e-3}}); }) ==
        "fit_link: the samples do not separate latency from bandwidth (one message size?)");
  CHECK(error_of([] { fit_link({{"broadcast", 1e6, 2, 1e-3}, {"allreduce", 1e3, 2, 1e-3}}); }) ==
        "fit_link: unknown collective 'broadcast': expected allreduce, reduce_scatter or allgather");
  CHECK(error_of([] { fit_link({{"allreduce", 1e6, 1, 1e-3}, {"allreduce", 1e3, 2, 1e-3}}); }) ==
        "fit_link: expected samples of >= 2 ranks, bytes > 0 and seconds > 0, found allreduce of 1e+06 bytes on 1 "
        "ranks in 0.001 s");
  // Larger messages faster than small ones: no positive bandwidth fits.
  CHECK(error_of([] { fit_link({{"allreduce", 1e6, 2, 1e-3}, {"allreduce", 1e3, 2, 2e-3}}); }).rfind(
            "fit_link: the fit gives a non-positive latency", 0) == 0);
}

TEST_CASE("step timeline: buckets launch in index order, the last at the end of backward") {
  // Backward [2, 10] s of a 12 s step. Bucket 0 ready at 4 runs 4-5, bucket 1 at 6 runs 6-9, the
  // last launches at 10 and runs 10-12: the step waits 2 s.
  StepInput in;
  in.compute = 12;
  in.backwards = {Backward{2, 10, {{{4, 1, 0}, {6, 3, 0}, {9, 2, 0}}}}};
  StepResult r = simulate_step(in);
  CHECK(r.step == doctest::Approx(14));
  CHECK(r.comm == doctest::Approx(6));
  CHECK(r.exposed == doctest::Approx(2));
  CHECK(r.hidden == doctest::Approx(4));
  // The same without overlap (MPI on busy cores): all 6 s add.
  in.overlap = false;
  r = simulate_step(in);
  CHECK(r.step == doctest::Approx(18));
  CHECK(r.hidden == doctest::Approx(0));
  // Buffer broadcasts (0.5 s) first shift everything; ZeRO's all-gather (1.5 s) after:
  // 4.5-5.5, 6.5-9.5, 10.5-12.5 -> backward ends 2.5 s late; step 12 + 2.5 + 1.5.
  in.overlap = true;
  in.before = 0.5;
  in.after = 1.5;
  r = simulate_step(in);
  CHECK(r.step == doctest::Approx(16));
  CHECK(r.comm == doctest::Approx(8));
  CHECK(r.hidden == doctest::Approx(4));
}

TEST_CASE("step timeline: a later bucket ready first waits for the one before it") {
  // Bucket 1 is ready at 3 but launches after bucket 0 (ready 7): 7-8, 8-9; the last 10-11.
  StepInput in;
  in.compute = 10;
  in.backwards = {Backward{0, 10, {{{7, 1, 0}, {3, 1, 0}, {10, 1, 0}}}}};
  CHECK(simulate_step(in).step == doctest::Approx(11));
}

TEST_CASE("step timeline: second rounds run after the end of backward, in index order") {
  // PowerSGD-like: bucket 0 first round 4-5, the last 10-11; Q rounds at the wait: 11-13, 13-14.
  StepInput in;
  in.compute = 10;
  in.backwards = {Backward{0, 10, {{{4, 1, 2}, {10, 1, 1}}}}};
  const StepResult r = simulate_step(in);
  CHECK(r.step == doctest::Approx(14));
  CHECK(r.comm == doctest::Approx(5));
  CHECK(r.hidden == doctest::Approx(1));
}

TEST_CASE("step timeline: a hook's compute delays backward at the launch and runs at the wait") {
  // Backward [2, 10] of a 12 s step; each bucket's hook computes 0.5 s at its launch, 0.25 s at
  // its wait. Bucket 0 (ready 4): hook 4-4.5, collective 4.5-5.5. The backward, 0.5 s late, ends
  // at 10.5; the last bucket's hook 10.5-11, collective 11-13. The waits: bucket 0's 11-11.25,
  // the last's 13-13.25, its second round 13.25-14.25: the step ends 12 + 4.25.
  StepInput in;
  in.compute = 12;
  in.backwards = {Backward{2, 10, {{{4, 1, 0, 0.5, 0.25}, {10, 2, 1, 0.5, 0.25}}}}};
  StepResult r = simulate_step(in);
  CHECK(r.step == doctest::Approx(16.25));
  CHECK(r.comm == doctest::Approx(4));
  CHECK(r.hook == doctest::Approx(1.5));
  CHECK(r.exposed == doctest::Approx(4.25));
  CHECK(r.hidden == doctest::Approx(1.25));  // bucket 0's collective, its wait's compute
  // No overlap: everything adds; a rank 0.5 s slower is waited for once, never hidden.
  in.overlap = false;
  CHECK(simulate_step(in).step == doctest::Approx(12 + 4 + 1.5));
  in.skew = 0.5;
  r = simulate_step(in);
  CHECK(r.step == doctest::Approx(12 + 4 + 1.5 + 0.5));
  CHECK(r.hidden == doctest::Approx(0).scale(1e-12));
  in.backwards[0].models[0][0].wait_compute = -1;
  CHECK(error_of([&] { simulate_step(in); }) ==
        "simulate_step: negative cost (communication 1, 0; hook compute 0.5, -1)");
}

TEST_CASE("step timeline: two models in one backward share the channel, and backwards add up") {
  // D and G in one backward [0, 10]: D0 2-4, G0 (ready 3) 4-5, D's last 10-11, G's last 11-12.
  StepInput in;
  in.compute = 20;
  in.backwards = {Backward{0, 10, {{{2, 2, 0}, {10, 1, 0}}, {{3, 1, 0}, {10, 1, 0}}}}};
  CHECK(simulate_step(in).step == doctest::Approx(22));
  // A second backward [12, 18] with one bucket of 3 s: it starts at 14 (2 s late), ends 17 + 3 = 20 + 1.
  in.backwards.push_back(Backward{12, 18, {{{18, 3, 0}}}});
  CHECK(simulate_step(in).step == doctest::Approx(25));
  in.backwards.push_back(Backward{19, 21, {}});
  CHECK(error_of([&] { simulate_step(in); }) ==
        "simulate_step: a backward from 19 s to 21 s does not lie in a step of 20 s");
}

TEST_CASE("plan_buckets: the Reducer's rule, by hand and against a Reducer's own layout") {
  // f32 sizes 0.25, 0.5, 0.5, 3 and 1 MiB, a bf16 of 0.25 MiB; first cap 1 MiB, then 2 MiB.
  const int64_t q = 65536;  // f32 elements in 0.25 MiB
  std::vector<nd::Tensor> params = {nd::zeros({q}), nd::zeros({2 * q}), nd::zeros({2 * q}), nd::zeros({12 * q}),
                                    nd::zeros({4 * q}), nd::zeros({2 * q}, nd::kBFloat16)};
  const auto options = nd::dist::DistributedDataParallelOptions().first_bucket_cap_mb(1).bucket_cap_mb(2);
  // Reverse order 5..0: {5} (a dtype change closes it), {4} (1 MiB, and 1 + 3 > 2 MiB), {3} alone (3 MiB
  // over the cap); {2, 1, 0}: 0.5 + 0.5 + 0.25 MiB.
  using Plan = std::vector<std::vector<size_t>>;
  CHECK(nd::dist::plan_buckets(params, {5, 4, 3, 2, 1, 0}, options) == Plan{{5}, {4}, {3}, {2, 1, 0}});
  // Registration order: 0.25 + 0.5 fit the first 1 MiB, the next 0.5 does not.
  CHECK(nd::dist::plan_buckets(params, {0, 1, 2, 3, 4, 5}, options) == Plan{{0, 1}, {2}, {3}, {4}, {5}});
  CHECK(error_of([&] { nd::dist::plan_buckets(params, {6}, options); }) ==
        "plan_buckets: parameter index 6 in the order is out of range for 6 parameters");
  // A Reducer (one process: no communication) builds its buckets by the same rule.
  nd::manual_seed(0);
  nd::models::MAE mae(nd::models::MAEConfig::tiny());
  const auto small = nd::dist::DistributedDataParallelOptions().first_bucket_cap_mb(0.01).bucket_cap_mb(0.05);
  auto reducer = nd::dist::Reducer::create(*mae, "mae", small);
  std::vector<size_t> reverse(reducer->parameters().size());
  for (size_t i = 0; i < reverse.size(); ++i) reverse[i] = reverse.size() - 1 - i;
  Plan from_reducer;
  for (const auto& bucket : reducer->bucket_layout()) from_reducer.push_back(bucket.params);
  CHECK(from_reducer.size() > 3);
  CHECK(nd::dist::plan_buckets(reducer->parameters(), reverse, small) == from_reducer);
}

namespace {

// A profile written by hand: one backward [10, 20] ms of a 30 ms step, every gradient ready at
// 15 ms, one optimizer step [20, 30] ms.
Profile one_backward(const Workload& w) {
  Profile p;
  p.step = 0.030;
  p.backwards.push_back({0.010, 0.020, {}});
  for (size_t m = 0; m < w.models.size(); ++m)
    for (size_t i = w.models[m].params.size(); i-- > 0;) p.backwards[0].ready.push_back({m, i, 0.015});
  p.optimizer.emplace_back(0.020, 0.030);
  return p;
}

// What the model's buffers hold, in bytes.
double buffer_bytes(const DdpModel& m) {
  double bytes = 0;
  for (const nd::Tensor& b : m.buffers) bytes += static_cast<double>(b.numel()) * nd::element_size(b.dtype());
  return bytes;
}

// Bandwidth only (no latency), 8 ranks per node.
Fabric bandwidth_only(double bw) {
  Fabric f;
  f.intra = f.inter = Link{0, bw};
  return f;
}

}  // namespace

TEST_CASE("predict: MAE tiny's one bucket, its hooks and ZeRO, priced on a bandwidth-only fabric") {
  nd::NoGradGuard no_grad;
  const Workload w = make_workload("mae-tiny", 2);
  REQUIRE(w.models.size() == 1);
  const Profile profile = one_backward(w);
  double numel = 0;
  const double buffers = buffer_bytes(w.models[0]);
  for (const nd::Tensor& t : w.models[0].params) numel += static_cast<double>(t.numel());
  CHECK(numel == 116656);  // docs/models.md
  const double P = static_cast<double>(w.models[0].params.size());
  const Fabric f = bandwidth_only(1e9);
  DeviceModel device;
  device.memory_bandwidth = 1e300;  // the hooks' element-wise work free
  Options none;
  // One process: the step as profiled.
  CHECK(predict(w, profile, none, device, f, 1, Algorithm::kRing).step == doctest::Approx(0.030));
  // 4 ranks: the fingerprint (32 bytes) and the buffers' broadcasts first, then the one bucket (all
  // gradients and P + 1 status slots, 4 bytes each) at the end of backward: nothing hidden.
  const double ring = 2 * 3.0 / 4 / 1e9;  // seconds per byte of a 4-rank ring all-reduce
  const double before = 32 * ring + buffers / 1e9;
  const StepResult r = predict(w, profile, none, device, f, 4, Algorithm::kRing);
  CHECK(r.step == doctest::Approx(0.030 + before + (numel + P + 1) * 4 * ring).epsilon(1e-12));
  CHECK(r.hidden == doctest::Approx(0).scale(1e-12));
  // bf16: 2 bytes per gradient on the wire, the status slots in an all-reduce of their own.
  Options bf16;
  parse_hook("bf16", bf16);
  CHECK(predict(w, profile, bf16, device, f, 4, Algorithm::kRing).step ==
        doctest::Approx(0.030 + before + (numel * 2 + (P + 1) * 4) * ring).epsilon(1e-12));
  // ZeRO stage 2: a reduce-scatter ((3/4) n / B) and the status all-reduce; the optimizer's 10 ms
  // becomes 2.5 ms, then all-gathers the parameters.
  Options zero2;
  zero2.zero = 2;
  CHECK(predict(w, profile, zero2, device, f, 4, Algorithm::kRing).step ==
        doctest::Approx(0.0225 + before + numel * 4 * 0.75 / 1e9 + (P + 1) * 4 * ring + numel * 4 * 0.75 / 1e9)
            .epsilon(1e-12));
  CHECK(error_of([&] {
          Options bad = bf16;
          bad.zero = 2;
          predict(w, profile, bad, device, f, 4, Algorithm::kRing);
        }) == "ZeRO stage 2 refuses a communication hook (bf16), as ZeroRedundancyOptimizer does");
}

TEST_CASE("predict: PowerSGD sends P with the uncompressed rest, Q after the end of backward") {
  nd::NoGradGuard no_grad;
  const Workload w = make_workload("mae-tiny", 2);
  const Profile profile = one_backward(w);
  Options psgd;
  parse_hook("powersgd:4", psgd);
  CHECK(psgd.powersgd_rank == 4);
  // Elements by hand: a matrix [a, b] is compressed when (a + b) 4 * 2 < a b.
  double plain = 0, p_elems = 0, q_elems = 0;
  for (const nd::Tensor& t : w.models[0].params) {
    const double a = t.dim() >= 2 ? static_cast<double>(t.size(0)) : 0, b = a > 0 ? t.numel() / a : 0;
    if (t.dim() >= 2 && (a + b) * 4 * 2 < a * b)
      p_elems += a * 4, q_elems += b * 4;
    else
      plain += static_cast<double>(t.numel());
  }
  CHECK(p_elems > 0);
  const Fabric f = bandwidth_only(1e9);
  DeviceModel device;
  device.memory_bandwidth = 1e300;
  const double ring = 2 * 3.0 / 4 / 1e9, P = static_cast<double>(w.models[0].params.size());
  const double buffers = buffer_bytes(w.models[0]);
  CHECK(predict(w, profile, psgd, device, f, 4, Algorithm::kRing).step ==
        doctest::Approx(0.030 + 32 * ring + buffers / 1e9 + (plain + p_elems + q_elems + P + 1) * 4 * ring)
            .epsilon(1e-12));
  for (const char* bad : {"powersgd", "powersgd:0", "powersgd:x", "int8"})
    CHECK(error_of([&] { parse_hook(bad, psgd); }) == std::string("unknown comm hook '") + bad +
                                                         "': expected none, bf16, fp16 or powersgd:RANK (RANK >= 1)");
}

TEST_CASE("predict: the hooks' compute from DeviceModel::hook_cost, scaled as the profile, and timed") {
  nd::NoGradGuard no_grad;
  const Workload w = make_workload("mae-tiny", 2);
  const Profile profile = one_backward(w);
  const Fabric f = bandwidth_only(1e9);
  const double ring = 2 * 3.0 / 4 / 1e9, P = static_cast<double>(w.models[0].params.size());
  double numel = 0;
  const double buffers = buffer_bytes(w.models[0]);
  for (const nd::Tensor& t : w.models[0].params) numel += static_cast<double>(t.numel());
  Options bf16;
  parse_hook("bf16", bf16);
  DeviceModel device;
  size_t calls = 0, members = 0;
  device.hook_cost = [&](const DdpModel&, const std::vector<size_t>& bucket, const Options& o) {
    ++calls;
    members += bucket.size();
    CHECK(o.hook == "bf16");
    return HookCost{0.001, 0.002};
  };
  // The one bucket (launched at the end of backward, 20 ms): its hook's 1 ms delays the bf16
  // all-reduce, its 2 ms follow it; x2 (a profile twice as fast as the step): all of it doubles.
  const double comm = 32 * ring + buffers / 1e9 + (numel * 2 + (P + 1) * 4) * ring;
  CHECK(predict(w, profile, bf16, device, f, 4, Algorithm::kRing).step ==
        doctest::Approx(0.030 + comm + 0.003).epsilon(1e-12));
  CHECK(calls == 1);
  CHECK(members == w.models[0].params.size());
  // A 4 ms skew between the ranks adds to every multi-rank step, unscaled, not to one GPU's.
  device.rank_skew = 0.004;
  CHECK(predict(w, profile, bf16, device, f, 4, Algorithm::kRing).step ==
        doctest::Approx(0.030 + comm + 0.003 + 0.004).epsilon(1e-12));
  CHECK(predict(w, profile, bf16, device, f, 1, Algorithm::kRing).step == doctest::Approx(0.030));
  device.rank_skew = 0;
  device.time_scale = 2;
  CHECK(predict(w, profile, bf16, device, f, 4, Algorithm::kRing).step ==
        doctest::Approx(0.060 + comm + 0.006).epsilon(1e-12));
  // The library's own hooks on the bucket's real shapes: something is timed at both ends.
  std::vector<size_t> all(w.models[0].params.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  Options psgd;
  parse_hook("powersgd:4", psgd);
  for (const Options& o : {bf16, psgd}) {
    const HookCost c = time_hook(w.models[0], all, o, 1);
    CHECK((c.launch > 0 && c.wait > 0));
  }
  CHECK(error_of([&] { time_hook(w.models[0], all, Options{}); }) ==
        "time_hook: expected a hook (bf16, fp16 or powersgd), found 'none'");
}

TEST_CASE("workloads: the Reducer's buckets in gradient-ready order, and unknown names") {
  nd::NoGradGuard no_grad;
  const Workload w = make_workload("dcgan28", 2);
  REQUIRE(w.models.size() == 2);
  CHECK(w.models[0].name == "G");
  CHECK(w.models[1].name == "D");
  // D's gradients ready in registration order in its first backward: the plan follows that order.
  Profile p;
  p.step = 1;
  p.backwards.push_back({0, 1, {}});
  for (size_t i = 0; i < w.models[1].params.size(); ++i) p.backwards[0].ready.push_back({1, i, 0.5});
  const auto plan = bucket_plan(w, p, 1, 25, 1, nd::kFloat32);
  std::vector<size_t> flat;
  for (const auto& b : plan) flat.insert(flat.end(), b.begin(), b.end());
  std::vector<size_t> expected(w.models[1].params.size());
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = i;
  CHECK(flat == expected);
  // G never became ready: reverse registration order, as the Reducer starts.
  const auto g = bucket_plan(w, p, 0, 25, 1, nd::kFloat32);
  CHECK(g.front().front() == w.models[0].params.size() - 1);
  CHECK(error_of([] { make_workload("vit-h", 0); }) ==
        "unknown model 'vit-h': expected dcgan28, dcgan32, dcgan64 (models::DCGANConfig), mae-tiny, mae-small, "
        "mae-mae_vit_{base,large}_patch16_dec512d8b, mae-mae_vit_huge_patch14_dec512d8b (models::MAEConfig), "
        "shapes:PATH");
  CHECK(error_of([] { make_workload("mae-huge", 0); }).rfind("MAEConfig: unknown configuration 'huge'", 0) == 0);
  CHECK(error_of([] { make_workload("dcgan16", 0); }).rfind("DCGANConfig", 0) == 0);
}

TEST_CASE("workloads: --ready bytes spreads each backward's gradients by the elements made ready") {
  nd::NoGradGuard no_grad;
  const Workload w = make_workload("dcgan28", 2);
  // D's parameters in reverse registration order over a backward [1, 3] s.
  Profile p;
  p.step = 4;
  p.backwards.push_back({1, 3, {}});
  const auto& params = w.models[1].params;
  double total = 0;
  for (size_t i = params.size(); i-- > 0;) {
    p.backwards[0].ready.push_back({1, i, 2.5});
    total += static_cast<double>(params[i].numel());
  }
  spread_ready_by_bytes(p, w);
  double so_far = 0;
  for (const Profile::Ready& r : p.backwards[0].ready) {
    so_far += static_cast<double>(params[r.param].numel());
    CHECK(r.at == doctest::Approx(1 + 2 * so_far / total));
  }
  CHECK(p.backwards[0].ready.back().at == doctest::Approx(3));
}

TEST_CASE("predict: the buffers cost one broadcast per dtype, as DDP coalesces them, not one per buffer") {
  const std::string path = (std::filesystem::temp_directory_path() / "nanoddp_scale_model_test_buffers.txt").string();
  // Two f32 buffers (40 + 400 bytes) and two i64 counts (8 bytes each), interleaved: 2 broadcasts.
  std::ofstream(path) << "param 10\nbuffer 40 f32\nbuffer 8 i64\nbuffer 400 f32\nbuffer 8 i64\n";
  const Workload w = make_workload("shapes:" + path, 1);
  std::remove(path.c_str());
  const Profile profile = synthetic_profile(w, 0.75);
  Fabric f;
  f.intra = f.inter = Link{1e-6, 1e9};
  f.base_latency = 5e-6;
  Options on, off;
  off.broadcast_buffers = false;
  const DeviceModel device;
  // 4 ranks on one node: a broadcast costs 5 us + 3 x 1 us + n / (1 GB/s), blocking before the step.
  const double added = predict(w, profile, on, device, f, 4, Algorithm::kRing).step -
                       predict(w, profile, off, device, f, 4, Algorithm::kRing).step;
  CHECK(added == doctest::Approx(2 * 8e-6 + 456 / 1e9).epsilon(1e-9));
}

TEST_CASE("workloads: shapes:PATH, a model by its sizes, with a synthetic step") {
  const std::string path = (std::filesystem::temp_directory_path() / "nanoddp_scale_model_test_shapes.txt").string();
  auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  // 3 parameters (1000 x 2048 = 2,048,000, 1000 and 64 x 3 x 7 x 7 = 9,408 elements) and a buffer.
  write("# a comment\nparam 64 3 7 7\nbuffer 8 i64  # num_batches_tracked\n\nparam 1000 2048\nparam 1000\n");
  const Workload w = make_workload("shapes:" + path, 32);
  REQUIRE(w.models.size() == 1);
  REQUIRE(w.models[0].params.size() == 3);
  CHECK(w.models[0].params[1].numel() == 2048000);
  REQUIRE(w.models[0].buffers.size() == 1);
  CHECK(w.models[0].buffers[0].dtype() == nd::kInt64);
  CHECK(w.models[0].buffers[0].numel() == 1);
  CHECK(!w.step);
  // Backward: the last 3/4 of the 1 s step; gradients ready last-registered first, by elements.
  const Profile p = synthetic_profile(w, 0.75);
  REQUIRE(p.backwards.size() == 1);
  CHECK(p.backwards[0].start == doctest::Approx(0.25));
  const double total = 2048000 + 1000 + 9408;
  CHECK(p.backwards[0].ready[0].param == 2);
  CHECK(p.backwards[0].ready[0].at == doctest::Approx(0.25 + 0.75 * 1000 / total));
  CHECK(p.backwards[0].ready[1].at == doctest::Approx(0.25 + 0.75 * 2049000 / total));
  CHECK(p.backwards[0].ready[2].at == doctest::Approx(1));
  CHECK(error_of([&] { synthetic_profile(w, 0); }) ==
        "synthetic_profile: expected a backward fraction in (0, 1], found 0");
  Workload copy = make_workload("shapes:" + path, 32);
  CHECK(error_of([&] { profile_workload(copy, 1); }) ==
        "profile_workload: shapes:" + path + " has no step to run (synthetic_profile gives one)");
  // Each bad file and the error it gets.
  const std::vector<std::pair<std::string, std::string>> bad{
      {"param 3 x\n", path + ":1: expected sizes >= 1, found 'x'"},
      {"param 3\nweight 3\n", path + ":2: expected 'param D0 D1 ...' or 'buffer BYTES DTYPE', found 'weight 3'"},
      {"param 3\nbuffer 8\n", path + ":2: expected 'param D0 D1 ...' or 'buffer BYTES DTYPE', found 'buffer 8'"},
      {"param 3\nbuffer 8 f8\n", path + ":2: expected a dtype (f32, f64, bf16, f16, i64, i32, u8, bool), found 'f8'"},
      {"param 3\nbuffer 6 f32\n", path + ":2: 6 bytes is not a whole number of f32 elements (4 bytes each)"},
      {"buffer 8 i64\n", "shapes: " + path + " names no parameter ('param D0 D1 ...')"}};
  for (const auto& [text, message] : bad) {
    CAPTURE(text);
    write(text);
    CHECK(error_of([&] { make_workload("shapes:" + path, 0); }) == message);
  }
  std::remove(path.c_str());
  CHECK(error_of([&] { make_workload("shapes:" + path, 0); }) == "shapes: cannot read " + path);
}
