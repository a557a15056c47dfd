#pragma once
// The MPI calls behind MpiProcessGroup's collectives: element types and reduce ops,
// completing a request without spinning a core, and MPI errors as nd::Error.
//
// Why errors need care: our communicators use MPI_ERRORS_RETURN, but OpenMPI 4.1 reports
// a failed non-blocking collective (MPI_ERR_TRUNCATE when ranks disagree on sizes) from
// MPI_Test on MPI_COMM_WORLD, whose default handler, MPI_ERRORS_ARE_FATAL, aborts the job
// with a message that names no collective. install_world_error_handler() makes such
// errors return to the threads that check every return code (the groups' workers), so
// they become an nd::Error naming the collective; MPI errors of anyone else's calls on
// MPI_COMM_WORLD still abort the job as before. MPI_Abort (the watchdog) is unaffected.
// Internal to collectives/; tests: tests/dist/mpi_errors_test.cpp.
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "collectives/process_group.h"

namespace nd::dist {

// MPI's element type for raw transfers and for the reductions MPI does natively;
// 16-bit floats travel as raw 16-bit words (reduce them on f32 copies: widen(), reduce_16bit()).
MPI_Datatype mpi_datatype(ScalarType t);
MPI_Op mpi_op(ReduceOp op);
bool is_16bit_float(ScalarType t);
// numel as MPI's int count, or an nd::Error naming `op`.
int int_count(const char* op, int64_t numel);

// "MPI_ERR_TRUNCATE: message truncated"
std::string mpi_error_text(int rc);
// Throws nd::Error "<info.describe()> failed: <call>: <MPI's text>[: what it means and what to do]".
void check_mpi(int rc, const CollectiveInfo& info, const char* call);
// Completes a non-blocking MPI request, polling without spinning a core when no caller waits.
void complete(MPI_Request& request, const CollectiveInfo& info, const char* call);

// Once per process, after MPI_Init: unless the program installed its own handler on
// MPI_COMM_WORLD, replace MPI_ERRORS_ARE_FATAL there with one that returns the error to
// threads marked by this_thread_checks_mpi_errors() and aborts for every other thread.
void install_world_error_handler();
void this_thread_checks_mpi_errors();

// f32 working copy of n 16-bit floats at p, and back.
std::vector<float> widen(const void* p, ScalarType t, int64_t n);
void narrow_into(const std::vector<float>& src, void* p, ScalarType t);
// AVG = SUM / world size, in the reduced type (f32 for 16-bit floats).
void divide(void* p, ScalarType t, int64_t n, int world_size);
// Reduces `ranks` runs of n 16-bit floats (t) at `runs`, rank 0's first, element by element on
// f32 copies in rank order (MAX / MIN keep the earlier value unless a later one is larger /
// smaller, as MPI's do), AVG divided by `ranks` in f32, and rounds each result once into `out`.
void reduce_16bit(const void* runs, int ranks, int64_t n, ScalarType t, ReduceOp op, void* out);

}  // namespace nd::dist
