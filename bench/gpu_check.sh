#!/usr/bin/env bash
# One command for a session that has the device tool (an H200 for 15 minutes):
# prints the GPU and toolkit, builds the CUDA targets (or reuses a carried build dir),
# runs every CUDA test (ctest: tests/cuda/*, and collectives_test's NCCL case at world
# size 1), then bench_kernels and (when torch sees the GPU) its PyTorch twin
# bench_kernels_torch.py, then the cost model's estimates beside bench_kernels' "model"
# rows (bench/model_join.py), then bench_train --device cuda and bench_train_torch.py --device
# cuda (training steps of the DCGAN and the MAE, ours vs PyTorch eager, in f32 and under
# --amp bf16), then train_gan and train_mae for 300 steps on the GPU and on the CPU
# (bench/gpu_train_check.py: the loss curves side by side, cudaMalloc calls in the steady
# state), then each CUDA test binary again with full doctest output, and prints a short
# table last.
# Files in $OUT (the device tool returns at most 8): env.txt, build.log, ctest.log, one
# <test binary>.log for the first two CUDA test binaries (any further ones append to
# cuda_tests_more.log), bench_kernels.txt (both benchmarks' tables and messages) and
# bench_kernels.jsonl (every JSON row: ours, the baselines, then impl "pytorch", then ours
# again with "baseline":"pytorch" and the ratio, from bench_kernels_torch.py --join, then
# impl "measured_vs_model" (bench_kernels' "model" rows beside the cost model's estimates of
# bench/cost_model.jsonl, from bench/model_join.py, its table in bench_kernels.txt), then
# the train_step rows of bench_train and bench_train_torch.py, then the train_curve rows of
# gpu_train_check.py; their tables also go to bench_kernels.txt).
# Budget: well inside 8 minutes. Every phase has its own timeout, and no phase runs past
# BUDGET_S seconds (default 420) from the start: a phase that would start with less than
# 15 s left is skipped and says so in the table.
#
#   bash bench/gpu_check.sh                # fresh build in build-gpu/
#   bash bench/gpu_check.sh .gpu-bin       # the bundle bench/gpu_prebuild.sh made here: no build
#   bash bench/gpu_check.sh build-gpu      # reuse a build dir carried with the call
#
# The device image lacks Eigen3, doctest and zlib headers: run bench/gpu_deps.sh here
# first and carry .gpu-deps/ with the call (this script uses it when present; a bundle whose
# libraries the device lacks falls back to a fresh build with it).
#
# See bench/GPU.md for the device-tool invocation and what to look at first.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
BUILD=${1:-build-gpu}
OUT=${OUT:-/tmp/nanoddp_gpu_check}
JOBS=${JOBS:-$(nproc)}
BUDGET_S=${BUDGET_S:-420}
mkdir -p "$OUT"
declare -a ROWS=()
row() { ROWS+=("$(printf '%-28s %-8s %6ss  %s' "$1" "$2" "$3" "$4")"); }
now() { date +%s; }
status() { case $1 in 0) echo ok ;; 124 | 137) echo timeout ;; *) echo FAIL ;; esac; }
DEADLINE=$(($(now) + BUDGET_S))
# limit CAP: the timeout for the next phase, CAP seconds at most and never past the
# deadline; prints 0 when less than 15 s are left: the caller skips the phase (never
# passes 0 to timeout, which would mean no limit).
limit() {
  local left=$((DEADLINE - $(now)))
  if [ "$left" -lt 15 ] || [ "$1" -lt 15 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

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
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())" 2>&1 | tail -1
} 2>&1 | tee -a "$OUT/env.txt"

# shellcheck source=bench/gpu_targets.sh
source bench/gpu_targets.sh
TARGETS=$(gpu_targets)
DEPS_ARGS=()
if [ -d .gpu-deps ]; then
  DEPS=$PWD/.gpu-deps
  DEPS_ARGS=(-DEigen3_DIR="$DEPS/share/eigen3/cmake" -Ddoctest_DIR="$DEPS/lib/cmake/doctest"
    -DZLIB_INCLUDE_DIR="$DEPS/include" -DZLIB_LIBRARY="$DEPS/lib/libz.so")
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$DEPS/lib"
fi
# cuDNN for bench_kernels' baselines: the CUDA toolkit's, else the one PyTorch's wheels
# bring (nvidia.cudnn). cuDNN 9 loads its sub-libraries (libcudnn_cnn, _ops, ...) with
# dlopen, so bench_kernels runs with their folder on LD_LIBRARY_PATH (bench_kernels only:
# the toolkit's libraries must not shadow PyTorch's own).
CUDNN_ARGS=()
BENCH_LIBS=/usr/local/cuda/lib64:/usr/local/cuda/lib
if ! ls /usr/local/cuda/include/cudnn.h /usr/include/cudnn.h >/dev/null 2>&1; then
  cudnn=$(python3 -c "import nvidia.cudnn as m; print(list(m.__path__)[0])" 2>/dev/null)
  cudnn_lib=$(ls "$cudnn"/lib/libcudnn.so* 2>/dev/null | head -1)
  if [ -n "$cudnn" ] && [ -f "$cudnn/include/cudnn.h" ] && [ -n "$cudnn_lib" ]; then
    CUDNN_ARGS=(-DNANODDP_CUDNN_INCLUDE_DIR="$cudnn/include" -DNANODDP_CUDNN_LIBRARY="$cudnn_lib")
    BENCH_LIBS="$BENCH_LIBS:$cudnn/lib"
  fi
fi

# A bundle of gpu_prebuild.sh ($BUILD/BUNDLE: binaries and lib/libnanoddp.so, no CTest files)
# runs as it is when the loader finds every library its binaries need. One it misses is
# looked for in the CUDA toolkit's folders, then in the Python path's nvidia wheels (NCCL,
# cuDNN, cuBLAS come with PyTorch there), and its folder goes on OURS_LD, the library path
# our binaries run with (not exported: the toolkit's copies must not shadow PyTorch's own).
# Anything still missing: say so and build from source in build-gpu/ as without a bundle.
OURS_LD=${LD_LIBRARY_PATH:-}
PREBUILT=0
find_lib() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/$1" ] && { echo "$d"; return; }
  done
  python3 -c 'import glob, os, sys
for p in sys.path:
    for f in glob.glob(os.path.join(p, "nvidia", "**", sys.argv[1]), recursive=True):
        print(os.path.dirname(f))
        sys.exit()' "$1" 2>/dev/null
}
missing_libs() {
  env LD_LIBRARY_PATH="$OURS_LD" ldd "$BUILD"/tests/* "$BUILD"/bench/* "$BUILD"/apps/* "$BUILD"/lib/* 2>/dev/null |
    awk '/not found/ {print $1}' | sort -u
}
if [ -f "$BUILD/BUNDLE" ]; then
  echo "== prebuilt bundle ($BUILD)"
  t=$(now)
  tee -a "$OUT/env.txt" <"$BUILD/BUNDLE"
  OURS_LD="$PWD/$BUILD/lib${OURS_LD:+:$OURS_LD}"
  for lib in $(missing_libs); do
    dir=$(find_lib "$lib")
    [ -n "$dir" ] && echo "$lib: $dir" && OURS_LD="$OURS_LD:$dir"
  done
  left=$(missing_libs | tr '\n' ' ')
  if [ -z "$left" ]; then
    PREBUILT=1
    row "prebuilt" "ok" $(($(now) - t)) "$(head -1 "$BUILD/BUNDLE" | sed 's/^nanoddp GPU bundle: //')"
  else
    echo "missing on this machine: $left"
    row "prebuilt" "FAIL" $(($(now) - t)) "missing $left-> built from source in build-gpu"
    BUILD=build-gpu
  fi
fi

echo "== build ($BUILD): $TARGETS"
t=$(now)
if [ $PREBUILT -eq 1 ]; then
  row "build" "prebuilt" 0 "none: the bundle's binaries"
elif [ ! -f "$BUILD/build.ninja" ]; then
  timeout 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNANODDP_CUDA=ON -DNANODDP_NATIVE=OFF \
    -DNANODDP_MPI=OFF -DNANODDP_BUILD_APPS=ON "${DEPS_ARGS[@]}" "${CUDNN_ARGS[@]}" >"$OUT/build.log" 2>&1
  rc=$?
  grep "nanoddp:" "$OUT/build.log"
  [ $rc -ne 0 ] && row "configure" "FAIL" $(($(now) - t)) "see build.log"
fi
cap=$(limit $((DEADLINE - $(now) - 120)))  # leaves 2 minutes for the tests and benchmarks
if [ $PREBUILT -eq 1 ]; then :; elif [ "$cap" -eq 0 ]; then row "build" "skipped" 0 "time budget spent"; else
  # shellcheck disable=SC2086
  timeout "$cap" ninja -C "$BUILD" -j "$JOBS" $TARGETS >>"$OUT/build.log" 2>&1
  rc=$?
  tail -3 "$OUT/build.log"
  if [ $rc -eq 0 ]; then row "build" "ok" $(($(now) - t)) "$(echo "$TARGETS" | wc -w) target(s)"; else
    grep -m 5 -E "error|Error" "$OUT/build.log"
    row "build" "FAIL" $(($(now) - t)) "rc=$rc, see build.log"
  fi
fi

echo "== CUDA tests"
t=$(now)
cap=$(limit 150)
if [ "$cap" -eq 0 ]; then row "ctest -R cuda" "skipped" 0 "time budget spent"; elif [ $PREBUILT -eq 1 ]; then
  # A bundle has no CTest files: each test binary straight (collectives_test: its NCCL case
  # only, as ctest -R nccl picks), all within the phase's cap; doctest's summaries added up.
  end=$(($(now) + cap))
  rc=0
  : >"$OUT/ctest.log"
  for bin in $TARGETS; do
    exe="$BUILD/tests/$bin"
    [ -x "$exe" ] || continue
    args=()
    [ "$bin" = collectives_test ] && args=(-tc='nccl*')
    left=$((end - $(now)))
    if [ "$left" -lt 5 ]; then echo "=== $bin: skipped, the phase's time is spent" >>"$OUT/ctest.log"; rc=124; continue; fi
    echo "=== $bin" >>"$OUT/ctest.log"
    timeout "$left" env LD_LIBRARY_PATH="$OURS_LD" "$exe" "${args[@]}" >>"$OUT/ctest.log" 2>&1 || rc=$?
  done
  grep -E "^=== |test cases:|ERROR|FATAL" "$OUT/ctest.log" | tail -20
  summary=$(awk -F'|' '/test cases:/ {split($1, a, ":"); n += a[2]; p += $2; f += $3} END {printf "%d cases, %d passed, %d failed", n, p, f}' "$OUT/ctest.log")
  skipped=$(grep -c "SKIPPED" "$OUT/ctest.log")
  row "tests (bundle)" "$(status "$rc")" $(($(now) - t)) "$summary ($skipped SKIPPED lines)"
else
  # -LE emu: the emulated copies of these suites ("<suite> (emu)", label emu) match the names
  # too; they are CI's, and on the CPU they took this phase's whole 150 s (dry run, 2026-12-07).
  timeout "$cap" ctest --test-dir "$BUILD" -R "cuda|nccl" -LE emu --output-on-failure --timeout 120 \
    >"$OUT/ctest.log" 2>&1
  rc=$?
  grep -E "tests passed|Skipped|Failed|\*\*\*" "$OUT/ctest.log" | tail -15
  summary=$(grep -E "tests passed" "$OUT/ctest.log" | tail -1)
  skipped=$(grep -c "(Skipped)" "$OUT/ctest.log")
  row "ctest -R cuda" "$(status "$rc")" $(($(now) - t)) "${summary:-no summary} ($skipped skipped)"
fi

# run_bench NAME CAP DETAIL CMD...: runs CMD under `timeout` (CAP seconds at most, see
# limit; a "skipped" row when the budget is spent) into a temporary file (not in $OUT, which
# must hold 8 files at most even after a kill), appends its output to bench_kernels.txt
# and its JSON rows to bench_kernels.jsonl, and adds the table row "rc=.., <DETAIL of the
# output>".
run_bench() {
  local name=$1 cap detail=$3 t0 out rc
  cap=$(limit "$2")
  shift 3
  if [ "$cap" -eq 0 ]; then row "$name" "skipped" 0 "time budget spent"; return; fi
  t0=$(now)
  out=$(mktemp)
  echo "=== $name" >>"$BENCH_TXT"
  timeout "$cap" "$@" >"$out" 2>&1
  rc=$?
  cat "$out" >>"$BENCH_TXT"
  grep '^{' "$out" >>"$BENCH_JSON"
  row "$name" "$(status "$rc")" $(($(now) - t0)) "rc=$rc, $($detail <"$out")"
  rm -f "$out"
}
# run_built NAME CAP DETAIL EXE ARGS...: run_bench of EXE (with OURS_LD) when it was built.
run_built() {
  if [ ! -x "$4" ]; then row "$1" "absent" 0 "not built (see build.log)"; return; fi
  local name=$1 cap=$2 detail=$3
  shift 3
  run_bench "$name" "$cap" "$detail" env LD_LIBRARY_PATH="$OURS_LD" "$@"
}
# run_torch NAME CAP DETAIL SCRIPT ARGS...: run_bench of python3 SCRIPT when torch sees the GPU.
run_torch() {
  if ! python3 -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
    row "$1" "skipped" 0 "torch missing or sees no CUDA GPU"
    return
  fi
  local name=$1 cap=$2 detail=$3
  shift 3
  run_bench "$name" "$cap" "$detail" python3 "$@"
}
json_rows() { echo "$(grep -c '^{') JSON rows"; }
kernel_rows() {
  local o
  o=$(cat)
  echo "$(grep -c '^{' <<<"$o") JSON rows ($(grep -c '"note":"no CUDA kernel yet' <<<"$o") without a CUDA kernel)$(grep -q '^SKIPPED' <<<"$o" && echo ', SKIPPED')"
}
# "dcgan 12.3 ms mae 4.5 ms": the train_step rows of a bench_train(_torch) output.
train_steps() {
  python3 -c 'import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{") and "\"train_step\"" in l]
print(" ".join("%s %.2f ms" % (r["model"], r["ms"]) for r in rows if r.get("ms") is not None))' 2>/dev/null
}

echo "== GPU benchmarks"
BENCH_TXT="$OUT/bench_kernels.txt" BENCH_JSON="$OUT/bench_kernels.jsonl"
: >"$BENCH_TXT"
: >"$BENCH_JSON"
# bench_kernels' cuDNN 9 loads its sub-libraries with dlopen: their folder on its path only.
if [ -x "$BUILD/bench/bench_kernels" ]; then
  run_bench "bench_kernels" 150 kernel_rows env LD_LIBRARY_PATH="${OURS_LD:+$OURS_LD:}$BENCH_LIBS" \
    "$BUILD/bench/bench_kernels" --device cuda
else
  row "bench_kernels" "absent" 0 "not built (see build.log)"
fi
run_torch "bench_kernels_torch" 120 json_rows bench/bench_kernels_torch.py

# Ours vs PyTorch: each of our rows with the PyTorch row of the same (op, shape, dtype),
# ratio and the attention targets (bench_kernels_torch.py --join; pure Python, no GPU).
join_rows() {
  local o
  o=$(cat)
  echo "$(grep -c '^{' <<<"$o") joined rows ($(grep -c 'below the target' <<<"$o") below the target)"
}
if grep -q '"impl":"pytorch"' "$BENCH_JSON" && grep -q '"impl":"\(nd\|cuda\)::' "$BENCH_JSON"; then
  run_bench "ours vs pytorch" 30 join_rows python3 bench/bench_kernels_torch.py --join "$BENCH_JSON"
fi

# Measured next to estimated: the cost model's rows (bench/cost_model.jsonl, the emulator's
# estimates, committed: the emulator's build and run would take from the CUDA build's budget;
# GPU.md) beside bench_kernels'
# "model" rows of the same (op, shape, dtype), GPU / model per row (bench/model_join.py;
# pure Python, so the dry run joins too and reports the rows as not measured).
model_rows() {
  local o
  o=$(cat)
  echo "$(grep -c '"measured_over_model":[0-9]' <<<"$o") of $(grep -c '^{' <<<"$o") model rows measured"
}
if [ -f bench/cost_model.jsonl ]; then
  run_bench "measured vs model" 30 model_rows python3 bench/model_join.py bench/cost_model.jsonl "$BENCH_JSON"
fi

# Training steps on the GPU, ours and PyTorch eager side by side (f32, the models and
# batches of bench/bench_train.cpp; the issue's target: ours at or below PyTorch's).
run_built "bench_train cuda" 60 train_steps "$BUILD/bench/bench_train" --device cuda --steps 20
run_torch "bench_train_torch cuda" 90 train_steps bench/bench_train_torch.py --device cuda --steps 20
# The same under --amp bf16 (the apps' --amp), ours then PyTorch's torch.autocast.
run_built "bench_train cuda bf16" 45 train_steps "$BUILD/bench/bench_train" --device cuda --steps 20 --amp bf16
run_torch "bench_train_torch cuda bf16" 60 train_steps bench/bench_train_torch.py --device cuda --steps 20 --amp bf16
# Batch 1: the step is per-op host work and launches, not kernels; tells a slow step
# above apart (host overhead or kernel time).
run_built "bench_train cuda batch 1" 30 train_steps "$BUILD/bench/bench_train" --device cuda --steps 20 --batch 1
run_torch "bench_train_torch cuda b1" 45 train_steps bench/bench_train_torch.py --device cuda --steps 20 --batch 1

# Training on the GPU against the CPU (issue 21): train_gan and train_mae (tiny) for 300 steps
# on each, the same seed and data (.gpu-deps' slice of Fashion-MNIST, else the Debian
# package's), their losses side by side and cuda_mallocs from the second log to the last
# (bench/gpu_train_check.py; equal = no cudaMalloc in the steady state).
train_curves() {
  python3 -c 'import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{") and "\"train_curve\"" in l]
print(" ".join("%s follows=%s steady=%s" % (r["shape"].split()[0], r["follows"], r["steady"]) for r in rows) or "no rows")' 2>/dev/null
}
DATA=/usr/share/datasets/fashion-mnist
[ -d .gpu-deps/fashion-mnist ] && DATA=.gpu-deps/fashion-mnist
if [ -x "$BUILD/apps/train_gan" ]; then
  run_bench "train cuda vs cpu" 120 train_curves env LD_LIBRARY_PATH="$OURS_LD" \
    python3 bench/gpu_train_check.py "$BUILD" --data "$DATA" --steps 300
else
  row "train cuda vs cpu" "absent" 0 "apps not built (see build.log)"
fi

# Last, with what is left of the budget: each test binary again with full doctest output
# (ctest.log already holds the output of any test that failed).
echo "== CUDA test binaries, full output"
logs=0
for bin in $TARGETS; do
  exe="$BUILD/tests/$bin"
  [ -x "$exe" ] || continue
  logs=$((logs + 1))
  log="$OUT/$bin.log"
  [ $logs -gt 2 ] && log="$OUT/cuda_tests_more.log"
  cap=$(limit 60)
  if [ "$cap" -eq 0 ]; then row "$bin -s -d" "skipped" 0 "time budget spent"; continue; fi
  echo "=== $bin" >>"$log"
  timeout "$cap" env LD_LIBRARY_PATH="$OURS_LD" "$exe" -s -d >>"$log" 2>&1  # full doctest output, durations per case
done

echo
echo "== summary (logs in $OUT)"
printf '%-28s %-8s %7s  %s\n' "step" "status" "time" "detail"
printf '%s\n' "${ROWS[@]}"
