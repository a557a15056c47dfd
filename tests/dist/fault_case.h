#pragma once
// The guard of the tests/dist fault cases (watchdog_test, mpi_errors_test): each acts only
// in the run tests/CMakeLists.txt registers for it, under mpirun -np 2 with
// NANODDP_FAULT_TEST naming it, and reports itself skipped everywhere else.
#include <cstdlib>
#include <string>

#include "harness.h"

namespace nd::testing {

// True in the run of fault case `name`; otherwise reports the case skipped.
inline bool fault_case(const std::string& name) {
  const char* env = std::getenv("NANODDP_FAULT_TEST");
  if (env && env == name && dist::world()->size() == 2) return true;
  MESSAGE("SKIPPED: runs under mpirun -np 2 with NANODDP_FAULT_TEST=", name, " (tests/CMakeLists.txt)");
  return false;
}

}  // namespace nd::testing
