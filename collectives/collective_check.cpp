#include "collectives/collective_check.h"

#include <cstdlib>
#include <sstream>

#include "engine/error.h"

namespace nd::dist {

namespace {

const char* const kOps[] = {"allreduce", "broadcast", "allgather", "reduce_scatter", "barrier"};
constexpr int64_t kOpCount = sizeof(kOps) / sizeof(kOps[0]);
enum OpIndex : int64_t { kAllreduce, kBroadcast, kAllgather, kReduceScatter, kBarrier };

int64_t op_index(const std::string& op) {
  for (int64_t i = 0; i < kOpCount; ++i)
    if (op == kOps[i]) return i;
  throw Error("collective check: unknown collective '" + op + "'");
}

// Ops whose per-rank part sizes may differ: compared through parts_hash instead of numel.
bool has_parts(int64_t op) { return op == kAllgather || op == kReduceScatter; }

int64_t hash_parts(const std::vector<int64_t>& parts) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a over the sizes
  for (int64_t p : parts) h = (h ^ static_cast<uint64_t>(p)) * 0x100000001B3ull;
  return static_cast<int64_t>(h);
}

std::string join(const std::vector<int64_t>& values) {
  std::ostringstream os;
  for (size_t i = 0; i < values.size(); ++i) os << (i ? ", " : "") << values[i];
  return os.str();
}

// "broadcast #7 (root 0, 10 x f32)"; `parts` empty for another rank's signature, whose
// expected part sizes are known only by their hash.
std::string describe(const CollectiveSignature& s, const std::vector<int64_t>& parts, const std::string& purpose) {
  std::ostringstream os;
  const bool known = s.op >= 0 && s.op < kOpCount;
  os << (known ? kOps[s.op] : "collective") << " #" << s.sequence;
  std::vector<std::string> details;
  if (!purpose.empty()) details.push_back(purpose);
  if (known && s.op != kBarrier) {
    std::ostringstream d;
    if (s.op == kBroadcast) d << "root " << s.root_or_op << ", ";
    if (s.op == kAllreduce || s.op == kReduceScatter)
      d << reduce_op_name(static_cast<ReduceOp>(s.root_or_op)) << ", ";
    if (has_parts(s.op))
      d << (parts.empty() ? "own part " + std::to_string(s.numel) : "parts " + join(parts));
    else
      d << s.numel;
    d << " x " << dtype_name(static_cast<ScalarType>(s.dtype));
    details.push_back(d.str());
  }
  if (details.empty()) return os.str();
  os << " (";
  for (size_t i = 0; i < details.size(); ++i) os << (i ? ", " : "") << details[i];
  os << ")";
  return os.str();
}

bool same_collective(const CollectiveSignature& a, const CollectiveSignature& b) {
  return a.op == b.op && a.sequence == b.sequence && a.dtype == b.dtype && a.root_or_op == b.root_or_op &&
         (has_parts(a.op) || a.numel == b.numel);
}

constexpr const char* kSuffix = " (checked because NANODDP_DISTRIBUTED_DEBUG=DETAIL)";

}  // namespace

DebugLevel debug_level() {
  const char* env = std::getenv("NANODDP_DISTRIBUTED_DEBUG");
  const std::string value = env ? env : "";
  if (value.empty() || value == "OFF") return DebugLevel::OFF;
  if (value == "DETAIL") return DebugLevel::DETAIL;
  throw Error("NANODDP_DISTRIBUTED_DEBUG: expected OFF or DETAIL (check every collective's op, dtype and sizes "
              "across ranks before it runs), found '" + value + "'");
}

CollectiveSignature make_signature(const CollectiveInfo& info, int rank, int64_t root_or_op,
                                   const std::vector<int64_t>& parts) {
  CollectiveSignature s;
  s.op = op_index(info.op);
  s.sequence = static_cast<int64_t>(info.sequence);
  s.dtype = static_cast<int64_t>(info.dtype);
  s.numel = has_parts(s.op) ? parts.at(rank) : info.numel;
  s.root_or_op = root_or_op;
  if (has_parts(s.op)) s.parts_hash = hash_parts(parts);
  return s;
}

std::string check_signatures(const std::vector<CollectiveSignature>& all, int rank, const CollectiveInfo& info,
                             const std::vector<int64_t>& parts) {
  const CollectiveSignature& mine = all.at(rank);
  const std::string me = describe(mine, parts, info.purpose) + " on rank " + std::to_string(rank);
  for (size_t r = 0; r < all.size(); ++r) {
    if (same_collective(mine, all[r])) continue;
    return nd::detail::str_cat(me, " does not match rank ", r, "'s ", describe(all[r], {}, ""),
                               ": ranks must issue the same collectives, with the same sizes, dtypes, roots and reduce "
                               "ops, in the same order", kSuffix);
  }
  if (!has_parts(mine.op)) return "";
  // Every rank issued the same op: its part sizes must be what every rank expects. All
  // ranks compare the same numbers, so they agree on the verdict.
  std::vector<int64_t> actual(all.size());
  for (size_t r = 0; r < all.size(); ++r) actual[r] = all[r].numel;
  const int64_t actual_hash = hash_parts(actual);
  const char* rule = mine.op == kAllgather ? "outputs[r] must be sized as rank r's input on every rank"
                                           : "inputs[r] must be sized as rank r's output on every rank";
  const char* what = mine.op == kAllgather ? "inputs" : "outputs";
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].parts_hash == actual_hash) continue;
    const std::string who = static_cast<int>(r) == rank ? "this rank" : "rank " + std::to_string(r);
    return nd::detail::str_cat(me, ": ", who, " expects parts of other sizes than the ranks' ", what, " (",
                               join(actual), "): ", rule, kSuffix);
  }
  return "";
}

}  // namespace nd::dist
