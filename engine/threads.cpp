#include "engine/threads.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

namespace nd {

namespace {

constexpr const char* kMarker = "NANODDP_SET_OMP_WAIT_POLICY";  // we set OMP_WAIT_POLICY, not the user

// CPUs of this machine that the job may use: the cgroup's cpuset (a container's share), else
// the CPUs online. Parses the kernel's list format, "0-3,8".
int machine_cores() {
  for (const char* path : {"/sys/fs/cgroup/cpuset.cpus.effective", "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"}) {
    std::ifstream in(path);
    std::string list;
    if (!(in >> list)) continue;
    int n = 0;
    for (size_t at = 0; at < list.size();) {
      const size_t end = std::min(list.find(',', at), list.size());
      const std::string part = list.substr(at, end - at);
      const size_t dash = part.find('-');
      n += dash == std::string::npos ? 1 : std::atoi(part.c_str() + dash + 1) - std::atoi(part.c_str()) + 1;
      at = end + 1;
    }
    if (n > 0) return n;
  }
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

int affinity_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return machine_cores();
  return std::max(1, CPU_COUNT(&set));
}

int local_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = std::getenv(name)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  return 1;
}

// Executes this program again with the current environment. Returns only when it cannot.
void exec_self() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (cmdline.empty()) return;
  std::vector<char*> argv;
  for (size_t at = 0; at < cmdline.size(); at += std::strlen(cmdline.data() + at) + 1)
    argv.push_back(const_cast<char*>(cmdline.data() + at));
  argv.push_back(nullptr);
  // The binary's own path, not /proc/self/exe: the process name (ps, /proc/<pid>/comm) is
  // taken from the path given to exec.
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return;
  path[n] = '\0';
  execv(path, argv.data());
}

}  // namespace

std::string ThreadConfig::describe() const {
  std::string s = std::to_string(threads) + " OpenMP thread" + (threads == 1 ? "" : "s") + " (";
  if (threads_from_env)
    s += "OMP_NUM_THREADS";
  else
    s += std::to_string(machine_cores) + " core" + (machine_cores == 1 ? "" : "s") + " / " +
         std::to_string(local_ranks) + " local rank" + (local_ranks == 1 ? "" : "s") +
         (cores < machine_cores ? ", " + std::to_string(cores) + " bound to this one" : "");
  s += "), ";
  if (wait_policy.empty()) return s + "spinning wait (the runtime's default; OMP_WAIT_POLICY could not be set)";
  return s + wait_policy + " wait" + (wait_policy_from_env ? " (OMP_WAIT_POLICY)" : "");
}

ThreadConfig choose_threads(int cores, int machine_cores, int local_ranks, const char* omp_num_threads,
                            const char* omp_wait_policy, bool set_by_nanoddp) {
  ThreadConfig c;
  c.cores = std::max(1, cores);
  c.machine_cores = std::max(1, machine_cores);
  c.local_ranks = std::max(1, local_ranks);
  const int from_env = omp_num_threads ? std::atoi(omp_num_threads) : 0;
  c.threads_from_env = from_env > 0;
  c.threads = c.threads_from_env ? from_env : std::max(1, std::min(c.cores, c.machine_cores / c.local_ranks));
  if (omp_wait_policy && *omp_wait_policy) {
    std::string p = omp_wait_policy;
    for (char& ch : p) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    c.wait_policy = p;
    c.wait_policy_from_env = !set_by_nanoddp;
  }
  return c;
}

const ThreadConfig& configure_threads() {
  static const ThreadConfig config = [] {
    if (!std::getenv("OMP_WAIT_POLICY")) {
      setenv("OMP_WAIT_POLICY", "passive", 1);
      setenv(kMarker, "1", 1);
      exec_self();  // returns only if it failed: go on with the runtime's default
      unsetenv("OMP_WAIT_POLICY");
      unsetenv(kMarker);
    }
    ThreadConfig c = choose_threads(affinity_cores(), machine_cores(), local_ranks(), std::getenv("OMP_NUM_THREADS"),
                                    std::getenv("OMP_WAIT_POLICY"), std::getenv(kMarker) != nullptr);
    if (!c.threads_from_env) omp_set_num_threads(c.threads);
    return c;
  }();
  return config;
}

}  // namespace nd
