// NANODDP_DISTRIBUTED_DEBUG=DETAIL's check of the optimizers (collective_check.h): at each
// optimizer's first step, its name and every group's options and parameter count are
// compared across ranks on dist::control_world(): one all-reduce (MAX) of a hash and its
// negation, and only when they differ one fixed-size all-gather of each rank's account, so
// every rank throws the same nd::Error naming rank 0's and the first differing rank's.
#include <charconv>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/collective_check.h"
#include "engine/error.h"
#include "engine/factories.h"
#include "engine/optim/optimizer.h"

namespace nd::dist {

namespace {

constexpr size_t kAccount = 480;  // bytes of each rank's account in the all-gather

std::string shortest(double v) {
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof(buf), v).ptr;
  return std::string(buf, end);
}

// "Adam, 1 param group(s): group 0 (4 parameters): amsgrad 0, beta1 0.9, ..., lr 0.001, weight_decay 0"
std::string describe_optimizer(const optim::Optimizer& opt) {
  const auto& groups = opt.param_groups();
  std::string s = opt.name() + ", " + std::to_string(groups.size()) + " param group(s)";
  for (size_t g = 0; g < groups.size(); ++g) {
    s += (g == 0 ? ": group " : "; group ") + std::to_string(g) + " (" + std::to_string(groups[g].params().size()) +
         " parameters):";
    bool first = true;
    for (const auto& [name, value] : groups[g].options().to_map()) {
      s += (first ? " " : ", ") + name + " " + shortest(value);
      first = false;
    }
  }
  return s;
}

void check_optimizer_options(const optim::Optimizer& opt) {
  const std::shared_ptr<ProcessGroup> group = control_world();
  if (group->size() == 1) return;
  const std::string mine = describe_optimizer(opt);
  CollectivePurpose purpose("the check of " + opt.name() + "'s options across ranks (NANODDP_DISTRIBUTED_DEBUG=DETAIL)");
  // std::hash as DDP's fingerprint uses it: every rank runs the same binary. >> 2: -h cannot overflow.
  const int64_t h = static_cast<int64_t>(std::hash<std::string>{}(mine) >> 2);
  const Tensor verdict = empty({2}, kInt64);
  verdict.data_ptr<int64_t>()[0] = h, verdict.data_ptr<int64_t>()[1] = -h;
  group->allreduce(verdict, {ReduceOp::MAX})->wait();
  if (verdict.data_ptr<int64_t>()[0] == -verdict.data_ptr<int64_t>()[1]) return;
  const int W = group->size();
  Tensor sent = zeros({static_cast<int64_t>(kAccount)}, kUInt8);
  std::memcpy(sent.data_ptr(), mine.data(), std::min(mine.size(), kAccount - 1));
  std::vector<Tensor> received;
  for (int r = 0; r < W; ++r) received.push_back(empty({static_cast<int64_t>(kAccount)}, kUInt8));
  group->allgather(received, sent)->wait();
  std::vector<std::string> all;
  for (const Tensor& t : received) {
    const char* text = static_cast<const char*>(t.data_ptr());
    all.emplace_back(text, strnlen(text, kAccount));
  }
  int other = 1;  // the first rank that differs from rank 0 (rank 1 if none does: a hash collision)
  for (int r = 1; r < W; ++r)
    if (all[r] != all[0]) {
      other = r;
      break;
    }
  throw Error(opt.name() + ": the ranks' optimizers differ at their first step: rank " + std::to_string(other) +
              " has other options than rank 0.\n  rank 0: " + all[0] + "\n  rank " + std::to_string(other) + ": " +
              all[other] + "\nEvery rank must build its optimizer with the same options (checked because "
              "NANODDP_DISTRIBUTED_DEBUG=DETAIL)");
}

}  // namespace

void enable_optimizer_check() {
  static std::once_flag once;
  std::call_once(once, [] { optim::register_first_step_hook(check_optimizer_options); });
}

}  // namespace nd::dist
