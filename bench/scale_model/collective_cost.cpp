#include "scale_model/collective_cost.h"

#include <algorithm>
#include <cmath>

#include <nanoddp.h>

namespace nd::scale {

namespace {

int nodes_of(int ranks, const Fabric& f) { return (ranks + f.gpus_per_node - 1) / f.gpus_per_node; }
int per_node(int ranks, const Fabric& f) { return std::min(ranks, f.gpus_per_node); }
double bandwidth_of(int ranks, const Fabric& f) {
  return nodes_of(ranks, f) > 1 ? std::min(f.intra.bandwidth, f.inter.bandwidth) : f.intra.bandwidth;
}

// A ring over `ranks` ranks of which `nodes` are separate nodes: `rounds` passes of p - 1
// steps each (2 for all-reduce), moving rounds (p-1)/p n at bandwidth `bw`.
double ring(double bytes, int ranks, int nodes, int rounds, double bw, const Fabric& f) {
  if (ranks <= 1 || bytes <= 0) return 0;
  const int steps = rounds * (ranks - 1), inter_steps = rounds * (nodes - 1);
  return f.base_latency + (steps - inter_steps) * f.intra.alpha + inter_steps * f.inter.alpha +
         rounds * (ranks - 1.0) / ranks * bytes / bw;
}

void check(double bytes, int ranks, const char* what) {
  ND_CHECK(ranks >= 1 && bytes >= 0 && std::isfinite(bytes), what, ": expected ranks >= 1 and finite bytes >= 0, found ",
           ranks, " ranks and ", bytes, " bytes");
}

// Within one node only: the node's q ranks on NVLink.
Fabric node_only(const Fabric& f) {
  Fabric g = f;
  g.gpus_per_node = 1 << 30;
  return g;
}
// Across nodes only, one rank per node, each on its 1/q share of the node's network.
Fabric network_only(const Fabric& f, int q) {
  Fabric g = f;
  g.gpus_per_node = 1;
  g.intra = f.inter;
  g.inter = Link{f.inter.alpha, f.inter.bandwidth / q};
  return g;
}

}  // namespace

Algorithm algorithm_by_name(const std::string& name) {
  if (name == "ring") return Algorithm::kRing;
  if (name == "tree") return Algorithm::kTree;
  if (name == "hierarchical") return Algorithm::kHierarchical;
  if (name == "best") return Algorithm::kBest;
  throw Error("unknown algorithm '" + name + "': expected ring, tree, hierarchical or best");
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kRing: return "ring";
    case Algorithm::kTree: return "tree";
    case Algorithm::kHierarchical: return "hierarchical";
    case Algorithm::kBest: return "best";
  }
  return "?";
}

double ring_allreduce(double bytes, int ranks, const Fabric& f) {
  check(bytes, ranks, "ring_allreduce");
  return ring(bytes, ranks, nodes_of(ranks, f), 2, bandwidth_of(ranks, f), f);
}

double tree_allreduce(double bytes, int ranks, const Fabric& f) {
  check(bytes, ranks, "tree_allreduce");
  if (ranks <= 1 || bytes <= 0) return 0;
  const int nodes = nodes_of(ranks, f), q = per_node(ranks, f);
  const double hops = (q - 1) * f.intra.alpha + std::ceil(std::log2(static_cast<double>(nodes))) * f.inter.alpha;
  return f.base_latency + 2 * hops + 2 * bytes / bandwidth_of(ranks, f);
}

double hierarchical_allreduce(double bytes, int ranks, const Fabric& f) {
  check(bytes, ranks, "hierarchical_allreduce");
  const int nodes = nodes_of(ranks, f), q = per_node(ranks, f);
  if (nodes <= 1) return ring_allreduce(bytes, ranks, f);
  const Fabric node = node_only(f);
  return ring(bytes, q, 1, 1, f.intra.bandwidth, node) + ring_allreduce(bytes / q, nodes, network_only(f, q)) +
         ring(bytes, q, 1, 1, f.intra.bandwidth, node);
}

double allreduce(double bytes, int ranks, const Fabric& f, Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kRing: return ring_allreduce(bytes, ranks, f);
    case Algorithm::kTree: return tree_allreduce(bytes, ranks, f);
    case Algorithm::kHierarchical: return hierarchical_allreduce(bytes, ranks, f);
    case Algorithm::kBest: break;
  }
  return std::min({ring_allreduce(bytes, ranks, f), tree_allreduce(bytes, ranks, f),
                   hierarchical_allreduce(bytes, ranks, f)});
}

double reduce_scatter(double bytes, int ranks, const Fabric& f, Algorithm algorithm) {
  check(bytes, ranks, "reduce_scatter");
  const int nodes = nodes_of(ranks, f), q = per_node(ranks, f);
  const double flat = ring(bytes, ranks, nodes, 1, bandwidth_of(ranks, f), f);
  if (nodes <= 1 || algorithm == Algorithm::kRing || algorithm == Algorithm::kTree) return flat;
  // Within the node first (each rank keeps n / q), then across the nodes on n / q.
  const Fabric net = network_only(f, q);
  const double hier = ring(bytes, q, 1, 1, f.intra.bandwidth, node_only(f)) +
                      ring(bytes / q, nodes, nodes, 1, net.inter.bandwidth, net);
  return algorithm == Algorithm::kHierarchical ? hier : std::min(flat, hier);
}

double all_gather(double bytes, int ranks, const Fabric& f, Algorithm algorithm) {
  return reduce_scatter(bytes, ranks, f, algorithm);  // the same steps and volume, reversed
}

double broadcast(double bytes, int ranks, const Fabric& f) {
  check(bytes, ranks, "broadcast");
  if (ranks <= 1 || bytes <= 0) return 0;
  const int nodes = nodes_of(ranks, f);
  return f.base_latency + (ranks - nodes) * f.intra.alpha + (nodes - 1) * f.inter.alpha + bytes / bandwidth_of(ranks, f);
}

// NVLink 4 (H100 SXM): 18 links of 25 GB/s per direction, 450 GB/s per GPU (NVIDIA's H100
// datasheet: 900 GB/s bidirectional). Latencies: NCCL's tuning model for the Simple protocol
// on a ring (src/graph/tuning.cc: hwLat NVLink 3.4 us, network 9.6 us per step, baseLat 8.4 us).
// NICs: 400 Gb/s = 50 GB/s, 100 Gb/s = 12.5 GB/s, 25 Gb/s = 3.125 GB/s per direction.
namespace {
constexpr double kNvlinkAlpha = 3.4e-6, kNetAlpha = 9.6e-6, kBaseLatency = 8.4e-6, kNvlinkBandwidth = 450e9;
constexpr Link kMpiShm{10.8e-6, 0.94e9}, kMpiTcp{20.2e-6, 0.65e9};

Fabric nvlink_node(const std::string& name, const Link& inter) {
  return Fabric{name, Link{kNvlinkAlpha, kNvlinkBandwidth}, inter, 8, kBaseLatency, true};
}
// All ranks on one node over MPI on the CPU: the collectives take the cores compute runs on
// (bench/RESULTS.md, "Scaling model vs measured MPI runs").
Fabric mpi_node(const std::string& name, double alpha, double bandwidth) {
  return Fabric{name, Link{alpha, bandwidth}, Link{alpha, bandwidth}, 1 << 20, 0, false};
}
}  // namespace

Fabric fabric_preset(const std::string& name) {
  // Fitted (scale_model --fit) to bench_ddp's all-reduces, 1 KiB to 16 MiB at 2 and 4 ranks (scale.md).
  if (name == "mpi-shm") return mpi_node(name, kMpiShm.alpha, kMpiShm.bandwidth);
  if (name == "mpi-tcp") return mpi_node(name, kMpiTcp.alpha, kMpiTcp.bandwidth);
  if (name.rfind("mpi:", 0) == 0) {
    double alpha_us = 0, gbs = 0;
    char end = 0;
    if (std::sscanf(name.c_str() + 4, "%lf:%lf%c", &alpha_us, &gbs, &end) == 2 && alpha_us >= 0 && gbs > 0)
      return mpi_node(name, alpha_us * 1e-6, gbs * 1e9);
    throw Error("interconnect '" + name + "': expected mpi:ALPHA_US:GB_PER_S with ALPHA_US >= 0 and GB_PER_S > 0");
  }
  if (name == "nvlink") return nvlink_node(name, Link{kNetAlpha, kNvlinkBandwidth});
  if (name == "ib400") return nvlink_node(name, Link{kNetAlpha, 8 * 50e9});
  if (name == "roce100") return nvlink_node(name, Link{kNetAlpha, 8 * 12.5e9});
  if (name == "eth25") return nvlink_node(name, Link{kNetAlpha, 3.125e9});
  if (name == "dgx1") {  // V100 SXM2: 6 NVLink 2 links of 25 GB/s per direction per GPU; 4 x 100 Gb/s IB
    Fabric f = nvlink_node(name, Link{kNetAlpha, 4 * 12.5e9});
    f.intra.bandwidth = 150e9;
    return f;
  }
  std::string names;
  for (const std::string& n : fabric_preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw Error("unknown interconnect '" + name + "': expected one of " + names);
}

std::vector<std::string> fabric_preset_names() {
  return {"nvlink", "ib400", "roce100", "eth25", "dgx1", "mpi-shm", "mpi-tcp"};
}

std::string fabric_presets_text() {
  return "nvlink: one node of 8 H100 SXM, NVLink 4 at 450 GB/s per direction per GPU, 3.4 us per ring step, 8.4 us "
         "per collective (NCCL's tuning model, Simple protocol); more than 8 GPUs are nodes joined by the same "
         "450 GB/s (an upper bound)\n"
         "ib400: those nodes, 8 x 400 Gb/s InfiniBand NICs each (400 GB/s per node), 9.6 us per network step\n"
         "roce100: 8 x 100 Gb/s RoCE NICs per node (100 GB/s per node), 9.6 us per network step\n"
         "eth25: one 25 Gb/s Ethernet NIC per node (3.125 GB/s per node), 9.6 us per network step\n"
         "dgx1: DGX-1 nodes of 8 V100 SXM2, NVLink 2 at 150 GB/s per direction per GPU, 4 x 100 Gb/s InfiniBand "
         "(50 GB/s per node): the machines of PyTorch's published DDP benchmark\n"
         "mpi-shm, mpi-tcp: this machine's MPI over shared memory and over TCP, fitted (scale_model --fit); "
         "mpi:ALPHA_US:GB_PER_S: your own fit. One node, no overlap with compute\n";
}

Fit fit_link(const std::vector<Sample>& samples) {
  ND_CHECK(samples.size() >= 2, "fit_link: expected at least 2 samples, found ", samples.size());
  // Rows [steps / t, volume / t] . [a, 1/B] = 1: least squares of relative errors.
  double s11 = 0, s12 = 0, s22 = 0, r1 = 0, r2 = 0;
  std::vector<std::pair<double, double>> rows;
  for (const Sample& s : samples) {
    ND_CHECK(s.ranks >= 2 && s.bytes > 0 && s.seconds > 0, "fit_link: expected samples of >= 2 ranks, bytes > 0 and ",
             "seconds > 0, found ", s.op, " of ", s.bytes, " bytes on ", s.ranks, " ranks in ", s.seconds, " s");
    const double p = s.ranks;
    double rounds = 0;
    if (s.op == "allreduce")
      rounds = 2;
    else if (s.op == "reduce_scatter" || s.op == "allgather")
      rounds = 1;
    else
      throw Error("fit_link: unknown collective '" + s.op + "': expected allreduce, reduce_scatter or allgather");
    const double x1 = rounds * (p - 1) / s.seconds, x2 = rounds * (p - 1) / p * s.bytes / s.seconds;
    rows.emplace_back(x1, x2);
    s11 += x1 * x1, s12 += x1 * x2, s22 += x2 * x2, r1 += x1, r2 += x2;
  }
  const double det = s11 * s22 - s12 * s12;
  ND_CHECK(det > 0, "fit_link: the samples do not separate latency from bandwidth (one message size?)");
  const double alpha = (r1 * s22 - r2 * s12) / det, inv_bw = (s11 * r2 - s12 * r1) / det;
  ND_CHECK(alpha > 0 && inv_bw > 0, "fit_link: the fit gives a non-positive latency (", alpha,
           " s) or inverse bandwidth (", inv_bw, " s/byte); measure more sizes");
  double sq = 0;
  for (const auto& [x1, x2] : rows) sq += (x1 * alpha + x2 * inv_bw - 1) * (x1 * alpha + x2 * inv_bw - 1);
  return Fit{Link{alpha, 1 / inv_bw}, std::sqrt(sq / rows.size())};
}

}  // namespace nd::scale
