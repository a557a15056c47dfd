// Alpha-beta costs of NCCL's collective algorithms, the interconnect presets they run on, and
// the least-squares fit of a link's alpha and beta from measured collective times.
//
// The model (seconds for n bytes per rank, p ranks, q ranks per node, N = ceil(p / q) nodes):
//   ring all-reduce      L + (2(p-1) - 2(N-1)) a_intra + 2(N-1) a_inter + 2 (p-1)/p n / B
//   ring reduce-scatter  L + ((p-1) - (N-1)) a_intra + (N-1) a_inter    +   (p-1)/p n / B
//   ring all-gather      the same as reduce-scatter (n: the gathered size)
//   tree all-reduce      L + 2 ((q-1) a_intra + ceil(log2 N) a_inter)     + 2 n / B
//   hierarchical         reduce-scatter of n over the q ranks of a node (NVLink), ring
//                        all-reduce of n / q over the N nodes (each rank on its own share of
//                        the node's network, B_inter / q), all-gather of n over the q ranks
// with B = B_intra within one node and min(B_intra, B_inter) across nodes. The latency terms
// are NCCL's own tuning model (src/graph/tuning.cc, ncclTopoTuneModel: a ring all-reduce's
// 2(p-1) steps of which 2(N-1) cross the network, the tree's 2((q-1) intra + log2 N inter)
// hops, a base latency L per collective); B is NCCL's bus bandwidth (nccl-tests
// doc/PERFORMANCE.md): busBw = algBw 2(p-1)/p for all-reduce, algBw (p-1)/p for
// reduce-scatter and all-gather, algBw = n / t, so that a ring reaches busBw = B on large
// messages whatever p. The tree's busBw is taken equal to the ring's (NCCL caps it lower on
// some generations); "best" takes the fastest of ring, tree and hierarchical, as NCCL's tuner
// picks the fastest of its algorithms. Protocols (LL, LL128, Simple) are not modelled: one
// latency per link, NCCL's Simple-protocol ring figure.
#pragma once

#include <string>
#include <vector>

namespace nd::scale {

// One kind of link: latency per algorithm step (s) and bus bandwidth per rank (bytes/s).
struct Link {
  double alpha = 0;
  double bandwidth = 0;
};

// Ranks are packed gpus_per_node to a node; `intra` joins the ranks of one node, `inter` the
// nodes (its bandwidth: what one node's NICs carry together, the rings' bound across nodes).
struct Fabric {
  std::string name;
  Link intra, inter;
  int gpus_per_node = 8;
  double base_latency = 0;           // L: per collective launch (s)
  bool overlaps_compute = true;      // false: communication takes the cores compute runs on
};

enum class Algorithm { kRing, kTree, kHierarchical, kBest };
// "ring", "tree", "hierarchical", "best"; anything else throws nd::Error naming the choices.
Algorithm algorithm_by_name(const std::string& name);
const char* algorithm_name(Algorithm a);

// Seconds for `bytes` per rank on `ranks` ranks of `fabric` (0 for one rank or no bytes).
double ring_allreduce(double bytes, int ranks, const Fabric& fabric);
double tree_allreduce(double bytes, int ranks, const Fabric& fabric);
double hierarchical_allreduce(double bytes, int ranks, const Fabric& fabric);
double allreduce(double bytes, int ranks, const Fabric& fabric, Algorithm algorithm = Algorithm::kBest);
// `bytes`: the whole buffer (reduce-scatter's input, all-gather's output); ring, or with
// kHierarchical/kBest also the two-level variant (within the node, then across nodes).
double reduce_scatter(double bytes, int ranks, const Fabric& fabric, Algorithm algorithm = Algorithm::kBest);
double all_gather(double bytes, int ranks, const Fabric& fabric, Algorithm algorithm = Algorithm::kBest);
// A pipelined ring broadcast: L + (p-1) a + n / B.
double broadcast(double bytes, int ranks, const Fabric& fabric);

// Presets, each with where its figures come from (fabric_presets_text()):
//   "nvlink"     one node: 8 H100 SXM GPUs, NVLink 4 (450 GB/s per direction per GPU)
//   "ib400"      8-GPU NVLink nodes, 8 x 400 Gb/s InfiniBand NICs per node (400 GB/s)
//   "roce100"    8-GPU NVLink nodes, 8 x 100 Gb/s RoCE NICs per node (100 GB/s)
//   "eth25"      8-GPU NVLink nodes, one 25 Gb/s Ethernet NIC per node (3.125 GB/s)
//   "dgx1"       DGX-1: 8 V100 SXM2 per node, NVLink 2 (6 links x 25 GB/s per direction per
//                GPU, nominal), 4 x 100 Gb/s InfiniBand per node (50 GB/s): the machines of
//                PyTorch's benchmarks/distributed/ddp README (ResNet-50 at 1 to 64 GPUs)
//   "mpi-shm", "mpi-tcp": this machine's MPI transports, all ranks on one node, with alpha
//                and bandwidth fitted to bench_ddp's collective rows (bench/RESULTS.md,
//                "Scaling model vs measured MPI runs"); no overlap with compute
//   "mpi:A:B"    the same with alpha A microseconds and bandwidth B GB/s
Fabric fabric_preset(const std::string& name);
std::vector<std::string> fabric_preset_names();
std::string fabric_presets_text();

// One measured collective: time (s) of an all-reduce (or reduce-scatter / all-gather) of
// `bytes` per rank on `ranks` ranks of one node.
struct Sample {
  std::string op;  // "allreduce", "reduce_scatter", "allgather"
  double bytes = 0;
  int ranks = 0;
  double seconds = 0;
};
// Least squares for the ring model of one node, t = steps(op, p) a + volume(op, p, n) / B
// (steps: 2(p-1) or p-1; volume: 2(p-1)/p n or (p-1)/p n), weighted by 1/t so that small and
// large messages count alike. Throws nd::Error when fewer than two samples or a
// non-positive fitted value. rms_relative_error: of the fitted times against the samples.
struct Fit {
  Link link;
  double rms_relative_error = 0;
};
Fit fit_link(const std::vector<Sample>& samples);

}  // namespace nd::scale
