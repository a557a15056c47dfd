// MPI errors as nd::Error, never MPI_ERRORS_ARE_FATAL (collectives/README.md "Errors").
// In-process: MPI_COMM_WORLD's handler after a group exists, and the message of a failed
// MPI call. The fault cases act only when NANODDP_FAULT_TEST names them, under
// mpirun -np 2 (tests/CMakeLists.txt registers each and checks mpirun's output and exit):
// what OpenMPI 4.1 does when ranks disagree on a collective or a rank dies, and that the
// job then ends with a message naming the collective or the rank, within seconds.
#include "dist/fault_case.h"
#include "harness.h"

#include <mpi.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "collectives/dist.h"
#include "collectives/mpi_calls.h"

using namespace nd;
using namespace std::chrono_literals;
using nd::testing::error_message;
using nd::testing::fault_case;

namespace {


// Fault cases end the job from elsewhere (a watchdog, mpirun): a rank that gets here waits for that.
void wait_for_the_job_to_end() {
  std::this_thread::sleep_for(30s);
  FAIL("the job was not ended within 30 s");
}

// An error printed for tests/CMakeLists.txt's PASS_REGULAR_EXPRESSION.
void print(const std::string& message) {
  std::fprintf(stderr, "rank %d: nd::Error: %s\n", dist::world()->rank(), message.c_str());
  std::fflush(stderr);
}

}  // namespace

TEST_CASE("MPI_COMM_WORLD no longer aborts on errors once a group exists") {
  dist::world();
  MPI_Errhandler handler = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &handler);
  CHECK(handler != MPI_ERRORS_ARE_FATAL);
  CHECK(handler != MPI_ERRORS_RETURN);  // ours: it still aborts for calls outside nanoddp (fault "user_world_error")
  MPI_Errhandler_free(&handler);
}

TEST_CASE("a failed MPI call names the collective, MPI's error and what to do") {
  dist::world();  // MPI is up (MPI_Error_string)
  dist::CollectiveInfo info;
  info.op = "barrier";
  info.sequence = 3;
  CHECK(error_message([&] { dist::check_mpi(MPI_ERR_TRUNCATE, info, "MPI_Ibarrier"); }) ==
        "barrier #3 failed: MPI_Ibarrier: MPI_ERR_TRUNCATE: message truncated: this rank received more data than it "
        "posted for it: ranks must issue the same collectives, with the same sizes, dtypes and roots, in the same "
        "order; set NANODDP_DISTRIBUTED_DEBUG=DETAIL to name the rank that differs");
  info.op = "allreduce";
  info.numel = 10;
  CHECK(error_message([&] { dist::check_mpi(MPI_ERR_OTHER, info, "MPI_Iallreduce"); })
            .starts_with("allreduce #3 (10 x f32) failed: MPI_Iallreduce: MPI_ERR_OTHER: known error not in list: ranks "
                         "must issue the same collectives"));
}

TEST_CASE("fault: a broadcast on rank 0 meets a barrier on rank 1") {
  auto w = dist::world();
  if (!fault_case("broadcast_barrier")) return;
  w->set_timeout(5s);
  // OpenMPI: the root only sends, so its broadcast completes; the barrier receives the
  // broadcast's bytes and fails with MPI_ERR_TRUNCATE, reported on MPI_COMM_WORLD.
  if (w->rank() == 0) {
    Tensor t = ones({10});
    w->broadcast(t, 0)->wait();
    return;
  }
  const std::string message = error_message([&] { w->barrier()->wait(); });
  print(message);
  CHECK(message.find("barrier #0 failed: MPI_Ibarrier: MPI_ERR_TRUNCATE: message truncated") == 0);
  // The group is out of step with rank 0: later collectives are refused, not paired.
  Tensor t = ones({3});
  const std::string refused = error_message([&] { w->allreduce(t)->wait(); });
  print(refused);
  CHECK(refused.starts_with("allreduce #1 (3 x f32) was not run: an earlier collective of this group failed"));
}

TEST_CASE("fault: an allreduce of 10 elements on rank 0 meets one of 15 on rank 1") {
  auto w = dist::world();
  if (!fault_case("allreduce_sizes")) return;
  w->set_timeout(2s);
  // OpenMPI: rank 0 receives more than its 10 elements and fails; rank 1 then waits for
  // data that rank 0 will not send, until its watchdog ends the job.
  Tensor t = ones({w->rank() == 0 ? 10 : 15});
  auto work = w->allreduce(t);
  if (w->rank() == 0) print(error_message([&] { work->wait(); }));
  else work->wait();
  wait_for_the_job_to_end();
}

TEST_CASE("fault: an MPI error in the program's own call on MPI_COMM_WORLD still aborts the job") {
  if (!fault_case("user_world_error")) return;
  dist::world()->barrier()->wait();
  int value = 0;
  MPI_Send(&value, 1, MPI_INT, 99, 0, MPI_COMM_WORLD);  // no rank 99
  FAIL("MPI_Send to rank 99 returned instead of aborting the job");
}

TEST_CASE("fault: a rank killed by a signal ends the job, named by mpirun") {
  auto w = dist::world();
  if (!fault_case("killed_by_signal")) return;
  w->set_timeout(30s);  // mpirun ends the job long before
  w->barrier()->wait();
  if (w->rank() == 1) std::raise(SIGKILL);
  Tensor t = ones({7});
  w->allreduce(t)->wait();
  FAIL("the allreduce completed although rank 1 was killed");
}

TEST_CASE("fault: a rank that dies while mpirun keeps the job leaves the watchdog to end it") {
  auto w = dist::world();
  if (!fault_case("died_job_kept")) return;
  // No MPI error reaches rank 0 (OpenMPI 4.1 has no fault tolerance here): its allreduce waits.
  w->set_timeout(2s);
  w->barrier()->wait();
  if (w->rank() == 1) std::_Exit(3);
  Tensor t = ones({7});
  w->allreduce(t)->wait();
  FAIL("the allreduce completed although rank 1 died");
}

TEST_CASE("fault: a rank that finishes early leaves the other waiting until the watchdog ends the job") {
  auto w = dist::world();
  if (!fault_case("finished_early")) return;
  w->set_timeout(2s);
  w->barrier()->wait();
  if (w->rank() == 1) return;  // ends normally: MPI_Finalize, exit code 0, nothing for mpirun to see
  Tensor t = ones({7});
  w->allreduce(t)->wait();
  FAIL("the allreduce completed although rank 1 had finished");
}
