// The Reducer's divergence check (ddp.h, collectives/README.md "Divergence check"): each
// backward starts with a 4-number fingerprint all-reduce on the control group; only when it
// fails does one fixed-size all-gather tell every rank what each one did, and every rank throws
// an error naming rank 0 and the first rank that differs from it.
#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "collectives/ddp.h"
#include "engine/error.h"
#include "engine/factories.h"

namespace nd::dist {

namespace {

// One rank's account of a failed fingerprint check: fixed size and trivially copyable,
// so every rank sends it with one all-gather of bytes (every rank runs the same binary).
struct RankAccount {
  static constexpr int kLast = 2;  // collectives described in the message
  char model[64];
  char hook[256];  // the communication hook and its settings
  int64_t iteration, buckets, params;
  int64_t base_iteration;  // the previous check (-1: DDP construction)
  uint64_t count, hash;    // data-group collectives since then
  int64_t n_last;
  struct Last {
    char op[24];
    int64_t sequence, numel, dtype, bucket;
  } last[kLast];
};
static_assert(std::is_trivially_copyable_v<RankAccount>);

template <size_t N>
void copy_text(char (&dst)[N], const std::string& src) {
  std::memset(dst, 0, N);
  std::memcpy(dst, src.data(), std::min(src.size(), N - 1));
}

template <size_t N>
std::string text(const char (&src)[N]) {
  return std::string(src, strnlen(src, N));
}

std::string describe_account(const RankAccount& a, const std::string& group) {
  std::string s = "backward of DDP model '" + std::string(a.model) + "', iteration " + std::to_string(a.iteration) +
                  ", " + std::to_string(a.buckets) + " bucket(s), " + std::to_string(a.params) + " parameter(s); ";
  const std::string since =
      a.base_iteration < 0 ? "DDP construction" : "the backward of iteration " + std::to_string(a.base_iteration);
  s += "issued " + std::to_string(a.count) + " collective(s) on the " + group + " group since " + since;
  for (int64_t k = 0; k < a.n_last; ++k) {
    CollectiveInfo info;
    info.op = a.last[k].op;
    info.sequence = static_cast<uint64_t>(a.last[k].sequence);
    info.numel = a.last[k].numel;
    info.dtype = static_cast<ScalarType>(a.last[k].dtype);
    info.bucket = a.last[k].bucket;
    s += k == 0 ? (a.n_last == 1 ? ", the last " : ", the last " + std::to_string(a.n_last) + ": ") : ", then ";
    s += info.describe();
  }
  return s;
}

bool same_account(const RankAccount& x, const RankAccount& y) {
  return text(x.model) == text(y.model) && text(x.hook) == text(y.hook) && x.iteration == y.iteration && x.buckets == y.buckets &&
         x.params == y.params && x.count == y.count && x.hash == y.hash;
}

}  // namespace

void Reducer::check_fingerprint() {
  if (!fingerprint_work_) return;
  fingerprint_work_->wait();
  fingerprint_work_.reset();
  // From here on the fingerprint covers what the data group issues after this point,
  // whatever the verdict (a rank that diverged starts a fresh comparison).
  const CollectiveRecord base = base_record_;
  const int64_t base_iteration = base_iteration_;
  base_record_ = record_now_;
  base_iteration_ = iteration_;
  const int64_t* f = fingerprint_.data_ptr<int64_t>();
  if (f[0] == -f[2] && f[1] == -f[3]) return;
  // Every rank got the same maxima, so every rank is here: one fixed-size all-gather
  // tells each what the others were doing.
  active_ = false;
  RankAccount mine{};
  copy_text(mine.model, name_);
  copy_text(mine.hook, comm_hook_description_);
  mine.iteration = iteration_;
  mine.buckets = static_cast<int64_t>(buckets_.size());
  mine.params = static_cast<int64_t>(params_.size());
  mine.base_iteration = base_iteration;
  mine.count = record_now_.count - base.count;
  mine.hash = record_now_.hash_since(base);
  const std::vector<CollectiveInfo> last = record_now_.last_since(base, RankAccount::kLast);
  mine.n_last = static_cast<int64_t>(last.size());
  for (size_t k = 0; k < last.size(); ++k) {
    copy_text(mine.last[k].op, last[k].op);
    mine.last[k].sequence = static_cast<int64_t>(last[k].sequence);
    mine.last[k].numel = last[k].numel;
    mine.last[k].dtype = static_cast<int64_t>(last[k].dtype);
    mine.last[k].bucket = last[k].bucket;
  }
  const int W = control_->size();
  const int64_t bytes = static_cast<int64_t>(sizeof(RankAccount));
  Tensor sent = empty({bytes}, kUInt8);
  std::memcpy(sent.data_ptr(), &mine, sizeof(RankAccount));
  std::vector<Tensor> received;
  for (int r = 0; r < W; ++r) received.push_back(empty({bytes}, kUInt8));
  control_->allgather(received, sent)->wait();
  std::vector<RankAccount> all(W);
  for (int r = 0; r < W; ++r) std::memcpy(&all[r], received[r].data_ptr(), sizeof(RankAccount));
  int other = 1;  // the first rank that differs from rank 0 (rank 1 if none does: a hash collision)
  for (int r = 1; r < W; ++r)
    if (!same_account(all[0], all[r])) {
      other = r;
      break;
    }
  const std::string hook0 = text(all[0].hook), hook = text(all[other].hook);
  if (hook0 != hook)
    throw Error("DistributedDataParallel: ranks diverged: rank " + std::to_string(other) + " reduces DDP model '" +
                name_ + "' with another communication hook than rank 0 (found in iteration " +
                std::to_string(iteration_) + ", before any bucket was reduced).\n  rank 0: " + hook0 +
                "\n  rank " + std::to_string(other) + ": " + hook +
                "\nEvery rank must register the same hook with the same settings (register_comm_hook), or none.");
  const std::string group = pg_->backend();
  std::string msg = "DistributedDataParallel: ranks diverged: rank " + std::to_string(other) +
                    " differs from rank 0 in the backward it runs or in the collectives it issued before it.";
  msg += "\n  rank 0: " + describe_account(all[0], group);
  msg += "\n  rank " + std::to_string(other) + ": " + describe_account(all[other], group);
  msg += "\nEvery rank must run the same forward/backward sequence for each DDP model and issue the same "
         "collectives (op, element count, dtype, order) on its process group.";
  throw Error(msg);
}

}  // namespace nd::dist
