// engine/threads.h: the thread count from the cores, the local ranks and this process's
// affinity, a user's OMP_NUM_THREADS and OMP_WAIT_POLICY kept, the startup description;
// and configure_threads() running this test binary again (under its own name) with
// OMP_WAIT_POLICY=passive, which the OpenMP runtime then applies (its spin count becomes 0).
#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "harness.h"

using namespace nd;

TEST_CASE("threads: the count from cores, local ranks and affinity, and a user's settings kept") {
  struct Case {
    int cores, machine, local;
    const char *num_threads, *wait_policy;
    bool ours;
    int threads;
    std::string described;
  };
  const std::vector<Case> cases = {
      {2, 2, 1, nullptr, "passive", true, 2, "2 OpenMP threads (2 cores / 1 local rank), passive wait"},
      {16, 16, 4, nullptr, "passive", true, 4, "4 OpenMP threads (16 cores / 4 local ranks), passive wait"},
      {2, 2, 4, nullptr, "passive", true, 1, "1 OpenMP thread (2 cores / 4 local ranks), passive wait"},
      // mpirun binds each of 2 ranks to a core: the affinity mask caps the count.
      {1, 2, 2, nullptr, "passive", true, 1, "1 OpenMP thread (2 cores / 2 local ranks, 1 bound to this one), passive wait"},
      {4, 16, 1, nullptr, "passive", true, 4, "4 OpenMP threads (16 cores / 1 local rank, 4 bound to this one), passive wait"},
      {2, 2, 1, "3", "ACTIVE", false, 3, "3 OpenMP threads (OMP_NUM_THREADS), active wait (OMP_WAIT_POLICY)"},
      {2, 2, 1, nullptr, nullptr, false, 2,
       "2 OpenMP threads (2 cores / 1 local rank), spinning wait (the runtime's default; OMP_WAIT_POLICY could not be set)"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.described);
    const ThreadConfig got = choose_threads(c.cores, c.machine, c.local, c.num_threads, c.wait_policy, c.ours);
    CHECK(got.threads == c.threads);
    CHECK(got.describe() == c.described);
  }
}

TEST_CASE("threads: configure_threads runs the program again with a passive wait, which OpenMP applies") {
  if (std::getenv("OMP_WAIT_POLICY") && !std::getenv("NANODDP_SET_OMP_WAIT_POLICY")) {
    MESSAGE("SKIPPED: OMP_WAIT_POLICY is set by the user, so configure_threads keeps it");
    return;
  }
  const ThreadConfig& config = configure_threads();  // the first call executes this binary again
  CHECK(config.wait_policy == "passive");
  CHECK(!config.wait_policy_from_env);
  CHECK(std::string(std::getenv("OMP_WAIT_POLICY")) == "passive");
  if (!config.threads_from_env) CHECK(omp_get_max_threads() == config.threads);
  // The runtime read it at load: omp_display_env (to stderr) shows a spin count of 0.
  char path[] = "/tmp/nanoddp_threads_test_XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  std::fflush(stderr);
  const int saved = dup(2);
  dup2(fd, 2);
  omp_display_env(1);
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  std::ifstream in(path);
  std::stringstream shown;
  shown << in.rdbuf();
  std::remove(path);
  CHECK(shown.str().find("GOMP_SPINCOUNT = '0'") != std::string::npos);
  CHECK(&configure_threads() == &config);  // once per process
  // Run again under its own name (ps and tools that find a rank by name see the program).
  std::ifstream comm("/proc/self/comm");
  std::string name;
  std::getline(comm, name);
  CHECK(name == "threads_test");
}
