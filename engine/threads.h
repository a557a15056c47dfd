#pragma once
// How many OpenMP threads each rank runs, and how they wait: chosen once at program start
// so that training keeps its speed beside other jobs, data loaders and other ranks.
//
// Why: libgomp's default wait spins 300000 rounds before sleeping, and a spinning thread
// stays runnable, so it loses the scheduler's priority for a thread that wakes up: with one
// of two cores taken by another process, train_gan's threads then wait for each other a
// time slice at a time (0.45 steps/s against 11 with OMP_WAIT_POLICY=passive under the same
// load; bench/RESULTS.md, "Threads under load"). A passive wait sleeps at once and is woken first. The
// runtime reads OMP_WAIT_POLICY only when it is loaded, before any code of the program
// runs, so configure_threads() sets it and executes the program again (once; same process
// id, arguments and environment otherwise). The thread count is the machine's cores (the
// container's cpuset, else the CPUs online) divided by the ranks on this machine (mpirun's
// OMPI_COMM_WORLD_LOCAL_SIZE, MPICH's MPI_LOCALNRANKS), at most the cores this process may
// run on (sched_getaffinity: mpirun binds each of 2 ranks to a core), at least 1. A user's
// OMP_NUM_THREADS or OMP_WAIT_POLICY is kept as given.
#include <string>

namespace nd {

struct ThreadConfig {
  int threads = 1;      // OpenMP threads of this rank
  int cores = 1;        // CPUs in this process's affinity mask
  int machine_cores = 1;  // CPUs of the machine (the cgroup's cpuset, else online)
  int local_ranks = 1;  // ranks on this machine, from the launcher's environment
  bool threads_from_env = false;  // OMP_NUM_THREADS was set by the user
  std::string wait_policy;        // "passive", "active", or "" (the runtime's default spin)
  bool wait_policy_from_env = false;  // OMP_WAIT_POLICY was set by the user
  // "2 OpenMP threads (2 cores / 1 local rank), passive wait", "1 OpenMP thread (2 cores /
  // 2 local ranks, 1 bound to this one), passive wait"; user settings are named as such.
  std::string describe() const;
};

// The choice from these inputs (no side effects): `omp_num_threads` and `omp_wait_policy`
// are the user's environment (null when unset); `set_by_nanoddp`: OMP_WAIT_POLICY came
// from an earlier configure_threads() of this process.
ThreadConfig choose_threads(int cores, int machine_cores, int local_ranks, const char* omp_num_threads,
                            const char* omp_wait_policy, bool set_by_nanoddp);

// Call first in main, before MPI starts and before any other thread exists: sets
// OMP_WAIT_POLICY=passive and executes the program again when the user set no wait
// policy (if that fails, it goes on with the runtime's default, and says so in
// describe()), then sets the thread count (omp_set_num_threads) unless OMP_NUM_THREADS
// is set. Later calls return the first result.
const ThreadConfig& configure_threads();

}  // namespace nd
