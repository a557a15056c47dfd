#pragma once
// The cross-rank check of every collective before it runs (NANODDP_DISTRIBUTED_DEBUG=DETAIL),
// nanoddp's counterpart of PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL.
//
// Why: MPI pairs the k-th collective of every rank, whatever each rank meant by it. On
// OpenMPI 4.1 only a rank that receives more bytes than it posted sees an error
// (MPI_ERR_TRUNCATE); fewer bytes, another dtype of the same byte size, another reduce op
// or another root complete with garbage, and the rank on the other side of a truncation
// often waits for data that never comes (collectives/README.md "Errors" has the table).
// With DETAIL each group first all-gathers a fixed-size CollectiveSignature of the
// collective on a communicator of its own, so every rank sees every rank's signature,
// reaches a verdict from the same data, and either all run the collective or all throw
// (each naming its own collective and the first rank that differs from it). The exchange
// itself cannot be mismatched: it is the same 48 bytes on every rank.
// Tests: tests/dist/collective_check_test.cpp.
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/process_group.h"

namespace nd::dist {

// NANODDP_DISTRIBUTED_DEBUG: unset, "" or "OFF": no check; "DETAIL": check every
// collective. Anything else throws nd::Error. Read when a group is created.
enum class DebugLevel { OFF, DETAIL };
DebugLevel debug_level();

// Under DETAIL (registered once, when the first MPI group is created with it): each
// optimizer's name, options and parameter counts per group are compared across ranks on
// control_world() at its first step (optimizer_check.cpp); ranks that differ all throw an
// nd::Error naming rank 0's optimizer and the first differing rank's.
void enable_optimizer_check();

// What must agree across ranks, as 6 int64 so that one MPI_INT64_T all-gather moves it.
struct CollectiveSignature {
  int64_t op = 0;        // index of CollectiveInfo::op in {allreduce, broadcast, allgather, reduce_scatter, barrier}
  int64_t sequence = 0;  // CollectiveInfo::sequence
  int64_t dtype = 0;     // ScalarType
  // Elements of this rank's tensor; for allgather and reduce_scatter, of this rank's part
  // (its input, its output), which legitimately differ across ranks.
  int64_t numel = 0;
  int64_t root_or_op = -1;  // broadcast: the root; allreduce, reduce_scatter: the ReduceOp; else -1
  // allgather, reduce_scatter: a hash of the part sizes this rank expects of every rank
  // (its outputs' sizes, its inputs' sizes); else 0.
  int64_t parts_hash = 0;
};
static_assert(sizeof(CollectiveSignature) == 6 * sizeof(int64_t));

// `parts`: allgather and reduce_scatter only, the part size this rank expects of each
// rank (parts[rank] is this rank's own part).
CollectiveSignature make_signature(const CollectiveInfo& info, int rank, int64_t root_or_op,
                                   const std::vector<int64_t>& parts = {});

// The nd::Error message this rank raises, or "" when every rank's signature agrees.
// `all[r]` is rank r's signature; `info` and `parts` are this rank's collective.
// "broadcast #7 (root 0, 10 x f32) on rank 0 does not match rank 1's barrier #7: ranks
// must issue the same collectives, with the same sizes, dtypes, roots and reduce ops, in
// the same order (checked because NANODDP_DISTRIBUTED_DEBUG=DETAIL)"
std::string check_signatures(const std::vector<CollectiveSignature>& all, int rank, const CollectiveInfo& info,
                             const std::vector<int64_t>& parts);

}  // namespace nd::dist
