#include "collectives/mpi_calls.h"

#include <chrono>
#include <climits>
#include <cstdio>
#include <thread>
#include <type_traits>

#include "engine/error.h"
#include "engine/ops/common.h"

namespace nd::dist {

MPI_Datatype mpi_datatype(ScalarType t) {
  switch (t) {
    case kFloat32: return MPI_FLOAT;
    case kFloat64: return MPI_DOUBLE;
    case kInt64: return MPI_INT64_T;
    case kInt32: return MPI_INT32_T;
    case kUInt8: return MPI_UINT8_T;
    case kBool: return MPI_C_BOOL;
    case kBFloat16:
    case kFloat16: return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG: return MPI_SUM;
    case ReduceOp::MAX: return MPI_MAX;
    case ReduceOp::MIN: return MPI_MIN;
  }
  return MPI_SUM;
}

bool is_16bit_float(ScalarType t) { return t == kBFloat16 || t == kFloat16; }

int int_count(const char* op, int64_t numel) {
  ND_CHECK(numel <= INT_MAX, op, ": ", numel, " elements exceed MPI's int count (", INT_MAX,
           "); split the tensor");
  return static_cast<int>(numel);
}

std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  return std::string(text, length);
}

void check_mpi(int rc, const CollectiveInfo& info, const char* call) {
  if (rc == MPI_SUCCESS) return;
  int error_class = MPI_ERR_OTHER;
  MPI_Error_class(rc, &error_class);
  // Every error OpenMPI raised in our experiments came from ranks that disagreed on a
  // collective (collectives/README.md "Errors"); truncation says which way.
  const char* meaning = error_class == MPI_ERR_TRUNCATE ? "this rank received more data than it posted for it: " : "";
  throw Error(nd::detail::str_cat(info.describe(), " failed: ", call, ": ", mpi_error_text(rc), ": ", meaning,
                                  "ranks must issue the same collectives, with the same sizes, dtypes and roots, in "
                                  "the same order; set NANODDP_DISTRIBUTED_DEBUG=DETAIL to name the rank that differs"));
}

// The worker thread polls, then yields, then sleeps briefly. A blocking MPI call
// busy-waits inside the library, which on a machine with one core per rank steals the
// core that backward runs on (measured with bench_ddp: DDP steps 13-50% slower than
// local ones while the all-reduces themselves took under 2% of a step). While a caller
// is blocked in Work::wait its core is idle, so the worker polls without backing off:
// MPI's shared-memory transport only progresses inside MPI_Test.
void complete(MPI_Request& request, const CollectiveInfo& info, const char* call) {
  for (int polls = 0;; ++polls) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), info, call);
    if (done) return;
    if (polls < 64 || AsyncWork::blocked_waiters() > 0)
      continue;
    else if (polls < 1024)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

namespace {

thread_local bool t_checks_mpi_errors = false;

void world_error_handler(MPI_Comm* comm, int* code, ...) {
  if (t_checks_mpi_errors) return;  // MPI returns the code to the caller, which checks it (check_mpi)
  // Anyone else's call: what MPI_ERRORS_ARE_FATAL did, with a line saying so.
  std::fprintf(stderr, "nanoddp: MPI error on MPI_COMM_WORLD outside nanoddp's collectives: %s; aborting the job "
               "(MPI_ERRORS_ARE_FATAL)\n", mpi_error_text(*code).c_str());
  std::fflush(stderr);
  MPI_Abort(*comm, *code);
}

}  // namespace

void this_thread_checks_mpi_errors() { t_checks_mpi_errors = true; }

void install_world_error_handler() {
  MPI_Errhandler current = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &current);
  const bool fatal = current == MPI_ERRORS_ARE_FATAL;
  MPI_Errhandler_free(&current);
  if (!fatal) return;  // the program's own choice, or ours from an earlier group
  MPI_Errhandler ours = MPI_ERRHANDLER_NULL;
  MPI_Comm_create_errhandler(world_error_handler, &ours);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, ours);
  MPI_Errhandler_free(&ours);  // MPI_COMM_WORLD keeps its own reference
}

std::vector<float> widen(const void* p, ScalarType t, int64_t n) {
  std::vector<float> out(n);
  dispatch_all(t, [&]<class T>() {
    if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>)
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<const T*>(p)[i];
  });
  return out;
}

void narrow_into(const std::vector<float>& src, void* p, ScalarType t) {
  dispatch_all(t, [&]<class T>() {
    if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>)
      for (size_t i = 0; i < src.size(); ++i) static_cast<T*>(p)[i] = T(src[i]);
  });
}

void divide(void* p, ScalarType t, int64_t n, int world_size) {
  dispatch_all(t, [&]<class T>() {
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      T* q = static_cast<T*>(p);
      for (int64_t i = 0; i < n; ++i) q[i] = static_cast<T>(q[i] / static_cast<T>(world_size));
    }
  });
}

void reduce_16bit(const void* runs, int ranks, int64_t n, ScalarType t, ReduceOp op, void* out) {
  dispatch_all(t, [&]<class T>() {
    if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
      const T* in = static_cast<const T*>(runs);
      T* o = static_cast<T*>(out);
      for (int64_t i = 0; i < n; ++i) {
        float acc = static_cast<float>(in[i]);
        for (int r = 1; r < ranks; ++r) {
          const float x = static_cast<float>(in[r * n + i]);
          if (op == ReduceOp::MAX)
            acc = acc > x ? acc : x;
          else if (op == ReduceOp::MIN)
            acc = acc < x ? acc : x;
          else
            acc += x;
        }
        if (op == ReduceOp::AVG) acc /= static_cast<float>(ranks);
        o[i] = T(acc);
      }
    }
  });
}

}  // namespace nd::dist
