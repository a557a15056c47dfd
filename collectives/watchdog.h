#pragma once
// Watchdog: one thread per process group that watches its in-flight collectives.
//
// Why: a rank that never joins a collective (crashed, took another code path, is
// stuck in I/O) leaves every other rank blocked inside MPI or NCCL forever, with
// nothing on screen. The watchdog turns that into a message naming what this rank
// waits in, then ends the job:
//   nanoddp watchdog: rank 0: allreduce #12 (bucket 3, 262144 x f32) has not
//   completed after 300 s; aborting the job
// The timeout counts from the moment the collective was issued (as PyTorch does).
// Tests: tests/dist/watchdog_test.cpp.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/process_group.h"

namespace nd::dist {

class Watchdog {
 public:
  // Called once, from the watchdog thread, with the message, when a collective times
  // out. The default prints the message to stderr and calls abort_job().
  using TimeoutHandler = std::function<void(const std::string& message)>;

  explicit Watchdog(int rank, TimeoutHandler on_timeout = {});
  ~Watchdog();  // stops the thread (pending collectives are no longer watched)
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches `work` until it completes; it must complete within `timeout` from now.
  void watch(std::shared_ptr<Work> work, std::chrono::milliseconds timeout);
  // Collectives being watched (completed ones are dropped on the next tick).
  size_t in_flight();

  // "nanoddp watchdog: rank R: <info.describe()> has not completed after T s; aborting the job"
  static std::string timeout_message(int rank, const CollectiveInfo& info, std::chrono::milliseconds timeout);

 private:
  struct Entry {
    std::shared_ptr<Work> work;
    std::chrono::steady_clock::time_point deadline;
    std::chrono::milliseconds timeout;
  };
  void run();

  int rank_;
  TimeoutHandler on_timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Entry> entries_;
  bool stop_ = false;
  bool fired_ = false;
  std::thread thread_;
};

}  // namespace nd::dist
