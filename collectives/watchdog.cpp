#include "collectives/watchdog.h"

#include <cstdio>
#include <sstream>

namespace nd::dist {

namespace {
// How often in-flight collectives are polled: often enough for short test timeouts,
// rare enough to cost nothing next to a training step.
constexpr std::chrono::milliseconds kTick{50};
}  // namespace

Watchdog::Watchdog(int rank, TimeoutHandler on_timeout) : rank_(rank), on_timeout_(std::move(on_timeout)) {
  if (!on_timeout_) {
    on_timeout_ = [](const std::string& message) {
      std::fprintf(stderr, "%s\n", message.c_str());
      std::fflush(stderr);
      abort_job(1);
    };
  }
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::watch(std::shared_ptr<Work> work, std::chrono::milliseconds timeout) {
  {
    std::lock_guard lock(mutex_);
    entries_.push_back({std::move(work), std::chrono::steady_clock::now() + timeout, timeout});
  }
  wake_.notify_all();
}

size_t Watchdog::in_flight() {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

std::string Watchdog::timeout_message(int rank, const CollectiveInfo& info, std::chrono::milliseconds timeout) {
  std::ostringstream os;
  os << "nanoddp watchdog: rank " << rank << ": " << info.describe() << " has not completed after "
     << static_cast<double>(timeout.count()) / 1000.0 << " s; aborting the job";
  return os.str();
}

void Watchdog::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (entries_.empty()) {
      wake_.wait(lock, [&] { return stop_ || !entries_.empty(); });
      continue;
    }
    wake_.wait_for(lock, kTick, [&] { return stop_; });
    if (stop_ || fired_) continue;
    // Collectives complete in issue order, so the oldest unfinished one is the one to name.
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(entries_, [](const Entry& e) { return e.work->is_completed(); });
    for (const Entry& e : entries_) {
      if (now < e.deadline) continue;
      fired_ = true;
      const std::string message = timeout_message(rank_, e.work->info(), e.timeout);
      lock.unlock();
      on_timeout_(message);
      lock.lock();
      break;
    }
  }
}

}  // namespace nd::dist
