# shellcheck shell=bash
# Sourced by gpu_check.sh (which defines row, limit, now, status, $OUT, $BUILD, $SMOKE,
# $SANITIZE, $LINES): its phase 0 (setup_env, setup_binaries) and its tool phases 7 and 8
# (run_sanitizer, run_ncu).

# setup_env: the GPU, driver, toolkit, tools and torch into env.txt. Sets GPU_NAME (nvidia-smi's
# name, empty without a driver), TORCH_CUDA (True when torch imports and sees the GPU), SANITIZER
# and NCU (their paths, empty when absent).
# shellcheck disable=SC2034  # GPU_NAME is gpu_check.sh's
setup_env() {
  local t0 lib found
  t0=$(now)
  : >"$OUT/env.txt"
  GPU_NAME=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi >>"$OUT/env.txt" 2>&1
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    row "gpu" "found" 0 "$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | head -1)"
  else
    row "gpu" "none" 0 "nvidia-smi not found: no NVIDIA driver here; every GPU step says SKIPPED or skipped"
  fi
  SANITIZER=$(find_tool compute-sanitizer)
  NCU=$(find_tool ncu)
  {
    command -v nvcc && nvcc --version | tail -2
    for lib in cudart cublas cublasLt nccl cudnn; do
      found=$(ldconfig -p 2>/dev/null | grep -o "lib$lib\.so[^ ]*" | head -1)
      [ -z "$found" ] && found=$(ls /usr/local/cuda/lib64/lib$lib.so* /usr/lib/x86_64-linux-gnu/lib$lib.so* 2>/dev/null | head -1)
      echo "lib$lib: ${found:-NOT FOUND}"
    done
    echo "compute-sanitizer: ${SANITIZER:-NOT FOUND}"
    echo "ncu: ${NCU:-NOT FOUND}"
  } >>"$OUT/env.txt" 2>&1
  local torch
  torch=$(timeout 30 python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())" 2>&1 | tail -1)
  echo "$torch" >>"$OUT/env.txt"
  TORCH_CUDA=$(sed -n 's/.* available \(True\|False\)$/\1/p' <<<"$torch")
  row "toolkit" "ok" $(($(now) - t0)) "nvcc $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p'); torch sees the GPU: ${TORCH_CUDA:-no torch}; compute-sanitizer ${SANITIZER:+found}${SANITIZER:-absent}; ncu ${NCU:+found}${NCU:-absent}"
}

# find_tool NAME: the path of a CUDA tool: on PATH, in the toolkit, or in Nsight Compute's folder.
find_tool() {
  command -v "$1" 2>/dev/null && return
  ls /usr/local/cuda/bin/"$1" /usr/local/cuda/compute-sanitizer/"$1" /opt/nvidia/nsight-compute/*/"$1" 2>/dev/null | head -1
}

# find_lib FILE: the folder of a library the loader misses: the CUDA toolkit's, else the Python
# path's nvidia wheels (NCCL, cuDNN, cuBLAS come with PyTorch there).
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

# setup_binaries: TARGETS (gpu_targets.sh), OURS_LD (the library path our binaries run with),
# BENCH_LD (OURS_LD and cuDNN's folder, for bench_kernels). A bundle of gpu_prebuild.sh
# ($BUILD/BUNDLE) runs as it is when the loader finds every library its binaries need, a
# missing one looked for with find_lib; else (or without a bundle) a build in build-gpu/.
setup_binaries() {
  local t0 lib dir left cudnn cudnn_lib cap rc deps_args=() cudnn_args=()
  # shellcheck source=bench/gpu_targets.sh
  source bench/gpu_targets.sh
  TARGETS=$(gpu_targets)
  if [ -d .gpu-deps ]; then
    local deps=$PWD/.gpu-deps
    deps_args=(-DEigen3_DIR="$deps/share/eigen3/cmake" -Ddoctest_DIR="$deps/lib/cmake/doctest"
      -DZLIB_INCLUDE_DIR="$deps/include" -DZLIB_LIBRARY="$deps/lib/libz.so")
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$deps/lib"
  fi
  # cuDNN for bench_kernels' baselines: the toolkit's, else the one PyTorch's wheels bring.
  # cuDNN 9 loads its sub-libraries (libcudnn_cnn, _ops) with dlopen: their folder goes on
  # bench_kernels' path only (the toolkit's libraries must not shadow PyTorch's own).
  local bench_libs=/usr/local/cuda/lib64:/usr/local/cuda/lib
  if ! ls /usr/local/cuda/include/cudnn.h /usr/include/cudnn.h >/dev/null 2>&1; then
    cudnn=$(python3 -c "import nvidia.cudnn as m; print(list(m.__path__)[0])" 2>/dev/null)
    cudnn_lib=$(ls "$cudnn"/lib/libcudnn.so* 2>/dev/null | head -1)
    if [ -n "$cudnn" ] && [ -f "$cudnn/include/cudnn.h" ] && [ -n "$cudnn_lib" ]; then
      cudnn_args=(-DNANODDP_CUDNN_INCLUDE_DIR="$cudnn/include" -DNANODDP_CUDNN_LIBRARY="$cudnn_lib")
      bench_libs="$bench_libs:$cudnn/lib"
    fi
  fi
  OURS_LD=${LD_LIBRARY_PATH:-}
  local prebuilt=0
  if [ -f "$BUILD/BUNDLE" ]; then
    t0=$(now)
    cat "$BUILD/BUNDLE" >>"$OUT/env.txt"
    OURS_LD="$PWD/$BUILD/lib${OURS_LD:+:$OURS_LD}"
    for lib in $(missing_libs); do
      dir=$(find_lib "$lib")
      [ -n "$dir" ] && echo "$lib: $dir" >>"$OUT/env.txt" && OURS_LD="$OURS_LD:$dir"
    done
    left=$(missing_libs | tr '\n' ' ')
    if [ -z "$left" ]; then
      prebuilt=1
      row "bundle" "ok" $(($(now) - t0)) "$(head -1 "$BUILD/BUNDLE" | sed 's/^nanoddp GPU bundle: //')"
    else
      row "bundle" "FAIL" $(($(now) - t0)) "missing ${left}-> built from source in build-gpu"
      BUILD=build-gpu
    fi
  fi
  BENCH_LD="${OURS_LD:+$OURS_LD:}$bench_libs"
  [ $prebuilt -eq 1 ] && return
  # A build: on top of the phases' caps (it takes from the later phases' time), 300 s at most.
  t0=$(now)
  if [ ! -f "$BUILD/build.ninja" ]; then
    timeout 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNANODDP_CUDA=ON -DNANODDP_NATIVE=OFF \
      -DNANODDP_MPI=OFF -DNANODDP_BUILD_APPS=ON "${deps_args[@]}" "${cudnn_args[@]}" >"$OUT/build.log" 2>&1 ||
      row "configure" "FAIL" $(($(now) - t0)) "see build.log"
  fi
  cap=$((DEADLINE - $(now) - 120))
  [ "$cap" -gt 300 ] && cap=300
  if [ "$cap" -lt 15 ]; then row "build" "skipped" 0 "the budget is spent"; return; fi
  # shellcheck disable=SC2086
  timeout "$cap" ninja -C "$BUILD" -j "$JOBS" $TARGETS >>"$OUT/build.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then row "build" "ok" $(($(now) - t0)) "$(echo "$TARGETS" | wc -w) target(s) in $BUILD"; else
    row "build" "$(status $rc)" $(($(now) - t0)) "rc=$rc: $(grep -m 1 -E "error|Error" "$OUT/build.log")"
  fi
}

# run_sanitizer: each SANITIZE case under compute-sanitizer's memcheck, then racecheck, into
# sanitizer.log; a row each with the tool's summary line.
run_sanitizer() {
  local e bin filter exe tool cap t0 rc summary out
  if [ -z "$SANITIZER" ]; then row "compute-sanitizer" "skipped" 0 "not found (PATH, /usr/local/cuda)"; return; fi
  for e in "${SANITIZE[@]}"; do
    bin=${e%%|*} filter=${e#*|} exe=$BUILD/tests/${e%%|*}
    for tool in memcheck racecheck; do
      if [ ! -x "$exe" ]; then row "$tool $bin" "absent" 0 "not built: $exe"; continue; fi
      cap=$(limit 30)
      if [ "$cap" -eq 0 ]; then row "$tool $bin" "skipped" 0 "the phase's time is spent"; continue; fi
      t0=$(now)
      out=$(mktemp)
      echo "=== $tool $bin -tc=$filter" >>"$OUT/sanitizer.log"
      timeout -k 5 "$cap" env LD_LIBRARY_PATH="$OURS_LD" "$SANITIZER" --tool "$tool" --error-exitcode 9 \
        --print-limit 20 "$exe" -tc="$filter" 2>&1 | tee -a "$OUT/sanitizer.log" >"$out"
      rc=${PIPESTATUS[0]}
      summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|not supported|test cases:" "$out" | sed 's/^\[doctest\] //' |
        tr -s ' =' ' ' | tr '\n' ';')
      row "$tool $bin" "$(status $rc)" $(($(now) - t0)) "rc=$rc, ${summary:-no summary (sanitizer.log)}"
      rm -f "$out"
    done
  done
}

# run_ncu: one profile of the bf16 attention forward kernel at S=4096 D=128 (bench_kernels'
# row), clocks left as they are, with the sections that tell shared-memory bound (MIO stalls,
# shared throughput and bank conflicts) from issue bound (issue slots, scheduler) into ncu.txt.
run_ncu() {
  local cap t0 rc
  if [ -z "$NCU" ]; then row "ncu attention fwd" "skipped" 0 "ncu not found (PATH, /usr/local/cuda, /opt/nvidia)"; return; fi
  if [ ! -x "$BUILD/bench/bench_kernels" ]; then row "ncu attention fwd" "absent" 0 "not built: bench_kernels"; return; fi
  cap=$(limit 600)
  if [ "$cap" -eq 0 ]; then row "ncu attention fwd" "skipped" 0 "the phase's time is spent"; return; fi
  t0=$(now)
  timeout -k 5 "$cap" env LD_LIBRARY_PATH="$BENCH_LD" "$NCU" --clock-control none --kernel-name regex:tc_forward_kernel \
    --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis --section SchedulerStats \
    --section WarpStateStats --section Occupancy --section LaunchStats \
    "$BUILD/bench/bench_kernels" attention --dtype bf16 --shape 'S=4096 D=128$' >"$OUT/ncu.txt" 2>&1
  rc=$?
  if grep -q "ERR_NVGPUCTRPERM\|LibraryNotLoaded\|Failed to initialize" "$OUT/ncu.txt"; then
    row "ncu attention fwd" "skipped" $(($(now) - t0)) "not permitted here: $(grep -m 1 "ERR_NVGPUCTRPERM\|LibraryNotLoaded\|Failed to initialize" "$OUT/ncu.txt")"
    return
  fi
  row "ncu attention fwd" "$(status $rc)" $(($(now) - t0)) "$(grep -E '^ +(Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Shared Memory)' "$OUT/ncu.txt" | head -5 | tr -s ' ' | tr '\n' ';')"
}
