// main() of the per-kernel emulation tests. They hand the kernels plain host memory as
// device memory (and emu_stubs.cpp's allocate() is not cudaMalloc), so the runtime stand-in's
// pointer checks (include/cuda_runtime.h) are off here; the emulated library's tests keep them.
#include "cuda_runtime.h"

namespace {
const bool pointer_checks_off = (emu_rt::check_pointers = false, true);
}

#include "tests/doctest_main.h"
