#!/usr/bin/env bash
# One command for a session that has the device tool (an H200 for 15 minutes):
# prints the GPU and toolkit, builds the CUDA targets (or reuses a carried build dir),
# runs every CUDA test and any GPU benchmark binary, writes logs to $OUT and prints a
# short table last (the device tool returns at most 8 files from $OUT: env.txt,
# build.log, ctest.log, one log per CUDA test binary, bench_kernels.{txt,jsonl}).
# Budget: well inside 8 minutes (configure + build about 3, tests about 1); every
# phase has its own timeout.
#
#   bash bench/gpu_check.sh                # fresh build in build-gpu/
#   bash bench/gpu_check.sh build-gpu      # reuse a build dir carried with the call
#
# The device image lacks Eigen3, doctest and zlib headers: run bench/gpu_deps.sh here
# first and carry .gpu-deps/ with the call (this script uses it when present).
#
# See bench/GPU.md for the device-tool invocation and what to look at first.
set -uo pipefail

cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
OUT=${OUT:-/tmp/nanoddp_gpu_check}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
declare -a ROWS=()
row() { ROWS+=("$(printf '%-28s %-8s %6ss  %s' "$1" "$2" "$3" "$4")"); }
now() { date +%s; }

echo "== GPU"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi | tee "$OUT/env.txt"
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)
  row "gpu" "found" 0 "$gpu"
else
  echo "nvidia-smi not found: no NVIDIA driver here; CUDA tests will report SKIPPED"
  row "gpu" "none" 0 "nvidia-smi not found"
fi

echo "== toolkit"
{
  command -v nvcc && nvcc --version | tail -2
  cmake --version | head -1
  for lib in cudart cublas cublasLt nccl cudnn; do
    found=$(ldconfig -p 2>/dev/null | grep -o "lib$lib\.so[^ ]*" | head -1)
    [ -z "$found" ] && found=$(ls /usr/local/cuda/lib64/lib$lib.so* /usr/lib/x86_64-linux-gnu/lib$lib.so* 2>/dev/null | head -1)
    echo "lib$lib: ${found:-NOT FOUND}"
  done
} 2>&1 | tee -a "$OUT/env.txt"

# CUDA test targets: tests/cuda/*_test.cpp and any tests/**/*cuda*_test.cpp.
TARGETS=$(find tests -name '*_test.cpp' \( -path 'tests/cuda/*' -o -name '*cuda*' \) -exec basename {} .cpp \; | sort -u)
[ -f bench/bench_kernels.cpp ] && TARGETS="$TARGETS bench_kernels"
echo "== build ($BUILD): $TARGETS"
t=$(now)
DEPS_ARGS=()
if [ -d .gpu-deps ]; then
  DEPS=$PWD/.gpu-deps
  DEPS_ARGS=(-DEigen3_DIR="$DEPS/share/eigen3/cmake" -Ddoctest_DIR="$DEPS/lib/cmake/doctest"
    -DZLIB_INCLUDE_DIR="$DEPS/include" -DZLIB_LIBRARY="$DEPS/lib/libz.so")
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$DEPS/lib"
fi
if [ ! -f "$BUILD/build.ninja" ]; then
  timeout 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNANODDP_CUDA=ON -DNANODDP_NATIVE=OFF \
    -DNANODDP_MPI=OFF -DNANODDP_BUILD_APPS=OFF "${DEPS_ARGS[@]}" >"$OUT/build.log" 2>&1
  rc=$?
  grep "nanoddp:" "$OUT/build.log"
  [ $rc -ne 0 ] && row "configure" "FAIL" $(($(now) - t)) "see build.log"
fi
# shellcheck disable=SC2086
timeout 360 ninja -C "$BUILD" -j "$JOBS" $TARGETS >>"$OUT/build.log" 2>&1
rc=$?
tail -3 "$OUT/build.log"
if [ $rc -eq 0 ]; then row "build" "ok" $(($(now) - t)) "$(echo $TARGETS | wc -w) target(s)"; else
  grep -m 5 -E "error|Error" "$OUT/build.log"
  row "build" "FAIL" $(($(now) - t)) "rc=$rc, see build.log"
fi

echo "== CUDA tests"
t=$(now)
timeout 240 ctest --test-dir "$BUILD" -R cuda --output-on-failure --timeout 120 >"$OUT/ctest.log" 2>&1
rc=$?
grep -E "tests passed|Skipped|Failed|\*\*\*" "$OUT/ctest.log" | tail -15
summary=$(grep -E "tests passed" "$OUT/ctest.log" | tail -1)
skipped=$(grep -c "(Skipped)" "$OUT/ctest.log")
row "ctest -R cuda" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" $(($(now) - t)) "${summary:-no summary} ($skipped skipped)"
for bin in $TARGETS; do
  exe="$BUILD/tests/$bin"
  [ -x "$exe" ] || continue
  timeout 120 "$exe" -s -d >"$OUT/$bin.log" 2>&1  # full doctest output, durations per case
done

echo "== GPU benchmarks"
if [ -x "$BUILD/bench/bench_kernels" ]; then
  t=$(now)
  timeout 180 "$BUILD/bench/bench_kernels" --device cuda >"$OUT/bench_kernels.txt" 2>&1
  rc=$?
  grep '^{' "$OUT/bench_kernels.txt" >"$OUT/bench_kernels.jsonl"
  row "bench_kernels" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" $(($(now) - t)) "$(wc -l <"$OUT/bench_kernels.jsonl") JSON rows"
else
  row "bench_kernels" "absent" 0 "no GPU benchmark binary yet"
fi

echo
echo "== summary (logs in $OUT)"
printf '%-28s %-8s %7s  %s\n' "step" "status" "time" "detail"
printf '%s\n' "${ROWS[@]}"
