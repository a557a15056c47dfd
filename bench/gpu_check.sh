#!/usr/bin/env bash
# The GPU check: one run of at most ~9 minutes on the device tool's H100 (or H200) that
# answers, in order of importance, the phases of the PHASES table below, each under its own
# cap and never past BUDGET_S (default 520) seconds from the start. Every phase writes to
# $OUT as it goes and the summary table grows a row per step, so a run cut short keeps
# everything measured before the cut.
#
#   bash bench/gpu_check.sh --plan       # the phases in order, each with its cap, and the total
#   bash bench/gpu_check.sh .gpu-bin     # the bundle bench/gpu_prebuild.sh made here: no build
#   bash bench/gpu_check.sh [BUILD_DIR]  # a build dir (default build-gpu: configured and built
#                                        # here when it has no build.ninja, from the budget)
#
# The device-tool call (bench/GPU.md; gpu_deps.sh and gpu_prebuild.sh run here first):
#   run(command="bash bench/gpu_check.sh .gpu-bin", carry=[".gpu-bin", ".gpu-deps"], timeout_s=570)
#
# Files in $OUT (the device tool returns at most 8): summary.txt (the table, a row per step as
# it ends; printed again last), env.txt (GPU, driver, toolkit, tools, bundle, libraries),
# build.log (only when it builds), tests.log (phases 1 and 6: doctest output with durations),
# bench_kernels.txt (every benchmark's messages and tables) and bench_kernels.jsonl (every JSON
# row, as printed: ours and the baselines, impl "pytorch", the ours-vs-PyTorch join, the
# train_step rows, the cost-model join, the train_curve rows), sanitizer.log (phase 7), ncu.txt
# (phase 8). The phases' commands and filters are below; GPU.md says what each answers.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# name|cap in seconds|what it answers. The one table of the caps: --plan prints it, the run
# gives each phase its cap. The last phase also gets what the earlier ones left unspent.
PHASES=(
  "setup|15|the GPU, driver and toolkit; the bundle's libraries found (a build, if any, comes on top)"
  "smoke|60|every CUDA op family against the CPU, and NCCL at world size 1"
  "attention|55|bf16 flash attention fwd, fwd+bwd (D 64, 128; S 512-4096): ours vs PyTorch's flash SDPA"
  "norms|30|batch norm, layer norm, AdamW 10M against the measured copy bandwidth"
  "conv|50|DCGAN's conv layers at batch 64 in bf16 against cuDNN bf16"
  "train|140|bench_train f32 and bf16 steps (DCGAN, MAE), then bf16 at the papers' sizes (DCGAN-64, ViT-B MAE at batch 64, peak memory): ours vs PyTorch eager"
  "tests|50|the remaining CUDA test cases"
  "sanitizer|60|compute-sanitizer memcheck and racecheck on a small attention, conv and batch-norm test"
  "ncu|40|ncu on the attention forward at S=4096 D=128: shared-memory bound or issue bound?"
  "model|20|measured vs the cost model at this GPU's rates, then 100-step train_gan/train_mae GPU vs CPU"
)
BUDGET_S=${BUDGET_S:-520}

# Phase 1's cases per binary (a doctest -tc filter: names with * wildcards, comma-separated);
# phase 6 runs each CUDA test binary's other cases (-tce, the same filter).
SMOKE=(
  "cuda_ops_test|cuda ops: elementwise*,cuda ops: reductions*,cuda ops: SGD and Adam*,cuda autocast: bf16 and f16*"
  "cuda_conv_test|cuda conv: conv2d forward*,cuda conv: conv_transpose2d forward*,cuda conv: under autocast all six*"
  "cuda_batch_norm_test|cuda batch_norm: training and eval*"
  "cuda_nn_ops_test|cuda nn ops: softmax and log_softmax*,cuda nn ops: layer_norm*,cuda nn ops: dropout draws*,cuda nn ops: embedding*,cuda nn ops: every loss*"
  "cuda_attention_test|cuda attention: forward and backward match the CPU (f32)*,cuda attention: bf16 tensor-core*"
  "collectives_test|nccl*"
)
# Phase 7's cases: one small test of each, under memcheck, then racecheck.
SANITIZE=(
  "cuda_attention_test|cuda attention: bf16 tensor-core*"
  "cuda_conv_test|cuda conv: conv2d forward*"
  "cuda_batch_norm_test|cuda batch_norm: training and eval*"
)
ATTENTION_SHAPES=' D=(64|128)$'  # the target shapes (B H S D), not the MAE's D=32 ones

plan() {
  local i=0 total=0 name cap what
  echo "gpu_check.sh: the phases in run order (cap: seconds at most; BUDGET_S=$BUDGET_S)"
  for p in "${PHASES[@]}"; do
    IFS='|' read -r name cap what <<<"$p"
    printf '%2d %-10s %4d s  %s%s\n' "$i" "$name" "$cap" "$what" "$([ $((i + 1)) -eq ${#PHASES[@]} ] && echo ' (+ what earlier phases left)')"
    total=$((total + cap))
    i=$((i + 1))
  done
  printf '   %-10s %4d s  (budget %d s; give the device tool timeout_s=%d)\n' total "$total" "$BUDGET_S" $((BUDGET_S + 50))
  [ "$total" -le "$BUDGET_S" ] || { echo "gpu_check.sh: the caps add up to $total s, over BUDGET_S=$BUDGET_S" >&2; return 1; }
}
if [ "${1:-}" = "--plan" ]; then plan; exit; fi

BUILD=${1:-build-gpu}
OUT=${OUT:-/tmp/nanoddp_gpu_check}
JOBS=${JOBS:-$(nproc)}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt" TESTS_LOG="$OUT/tests.log" BENCH_TXT="$OUT/bench_kernels.txt"
BENCH_JSON="$OUT/bench_kernels.jsonl"
: >"$TESTS_LOG"
: >"$BENCH_TXT"
: >"$BENCH_JSON"
printf '%-2s %-30s %-8s %6s  %s\n' "ph" "step" "status" "time" "detail" >"$SUMMARY"
now() { date +%s; }
START=$(now)
DEADLINE=$((START + BUDGET_S))
PHASE=0 PHASE_END=$DEADLINE
# row STEP STATUS SECONDS DETAIL: one line of the summary, written at once.
row() { printf '%-2s %-30s %-8s %5ss  %s\n' "$PHASE" "$1" "$2" "$3" "$4" | tee -a "$SUMMARY"; }
status() { case $1 in 0) echo ok ;; 124 | 137) echo timeout ;; *) echo FAIL ;; esac; }
# phase N: starts phase N of PHASES (its cap from now, never past the deadline; the last
# phase runs to the deadline).
phase() {
  local name cap what
  PHASE=$1
  IFS='|' read -r name cap what <<<"${PHASES[$1]}"
  PHASE_END=$(($(now) + cap))
  [ "$1" -eq $((${#PHASES[@]} - 1)) ] || [ "$PHASE_END" -gt "$DEADLINE" ] && PHASE_END=$DEADLINE
  echo "== phase $1 $name (${cap} s, $(($(now) - START)) s in): $what"
}
# limit CAP: the next step's timeout: CAP seconds at most, never past the phase's end; 0 when
# less than 5 s are left (the caller skips the step: timeout 0 would mean no limit).
limit() {
  local left=$((PHASE_END - $(now)))
  if [ "$left" -lt 5 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
# The test binaries' output line by line (doctest writes through std::cout): a killed run
# keeps what it printed.
LINES=()
command -v stdbuf >/dev/null && LINES=(stdbuf -oL -eL)

# shellcheck source=bench/gpu_check_lib.sh
source bench/gpu_check_lib.sh  # phase 0 (setup_env, setup_binaries), 7 and 8 (run_sanitizer, run_ncu)
phase 0
setup_env
setup_binaries

# ---- the tests (phases 1 and 6) ---------------------------------------------------------------
smoke_filter() {
  local e
  for e in "${SMOKE[@]}"; do [ "${e%%|*}" = "$1" ] && echo "${e#*|}"; done
}
# share N: the next of N binaries' timeout: twice an equal share of the phase's time left, 15 s
# at least (a binary that hangs takes that, not the whole phase; one that is slow may use what
# the quick ones before it left).
share() {
  local s=$((2 * (PHASE_END - $(now)) / $1))
  limit $((s < 15 ? 15 : s))
}
# run_tests STEP CAP EXE ARGS...: the binary's doctest cases (ARGS: its filter) into tests.log,
# with durations, under timeout CAP; a summary row of doctest's counts (a filter that matches
# nothing is a FAIL).
run_tests() {
  local step=$1 cap=$2 exe=$3 t0 rc n out summary
  shift 3
  if [ ! -x "$exe" ]; then row "$step" "absent" 0 "not built: $exe"; return; fi
  if [ "$cap" -eq 0 ]; then row "$step" "skipped" 0 "the phase's time is spent"; return; fi
  n=$(env LD_LIBRARY_PATH="$OURS_LD" "$exe" "$@" -ltc 2>/dev/null | sed -n 's/.*passing the current filters: \([0-9]*\).*/\1/p')
  if [ "${n:-0}" -eq 0 ]; then row "$step" "FAIL" 0 "no test case matches $*"; return; fi
  t0=$(now)
  out=$(mktemp)
  echo "=== $step: $exe $*" >>"$TESTS_LOG"
  timeout -k 5 "$cap" env LD_LIBRARY_PATH="$OURS_LD" "${LINES[@]}" "$exe" "$@" -d 2>&1 | tee -a "$TESTS_LOG" >"$out"
  rc=${PIPESTATUS[0]}
  summary=$(awk -F'|' '/test cases:/ {split($1, a, ":"); printf "%d cases: %d passed, %d failed", a[2], $2, $3}' "$out")
  row "$step" "$(status "$rc")" $(($(now) - t0)) "rc=$rc, ${summary:-no doctest summary (see tests.log)}; $(grep -c SKIPPED "$out") SKIPPED lines"
  rm -f "$out"
}

phase 1
left=${#SMOKE[@]}
for e in "${SMOKE[@]}"; do
  bin=${e%%|*}
  run_tests "smoke $bin" "$(share $left)" "$BUILD/tests/$bin" -tc="${e#*|}"
  left=$((left - 1))
done

# ---- the benchmarks (phases 2-5, 9) -------------------------------------------------------------
# run_bench STEP CAP DETAIL CMD...: CMD under timeout (CAP at most, within the phase), its output
# appended to bench_kernels.txt and its JSON rows to bench_kernels.jsonl as they come, and a row
# "rc=.., <DETAIL of the output>".
run_bench() {
  local step=$1 cap detail=$3 t0 out rc
  cap=$(limit "$2")
  shift 3
  if [ "$cap" -eq 0 ]; then row "$step" "skipped" 0 "the phase's time is spent"; return; fi
  t0=$(now)
  out=$(mktemp)
  echo "=== $step: $*" >>"$BENCH_TXT"
  timeout -k 5 "$cap" "$@" 2>&1 | tee -a "$BENCH_TXT" "$out" | grep --line-buffered '^{' >>"$BENCH_JSON"
  rc=${PIPESTATUS[0]}
  row "$step" "$(status "$rc")" $(($(now) - t0)) "rc=$rc, $($detail <"$out")"
  rm -f "$out"
}
# run_built STEP CAP DETAIL EXE ARGS...: run_bench of EXE (our library path) when it was built;
# bench_kernels also gets cuDNN's folder (cuDNN 9 loads its sub-libraries with dlopen).
run_built() {
  if [ ! -x "$4" ]; then row "$1" "absent" 0 "not built: $4"; return; fi
  local step=$1 cap=$2 detail=$3
  shift 3
  run_bench "$step" "$cap" "$detail" env LD_LIBRARY_PATH="$BENCH_LD" "$@"
}
# run_torch STEP CAP DETAIL SCRIPT ARGS...: run_bench of python3 SCRIPT when torch sees the GPU.
run_torch() {
  if [ "$TORCH_CUDA" != True ]; then row "$1" "skipped" 0 "torch missing or sees no CUDA GPU (env.txt)"; return; fi
  local step=$1 cap=$2 detail=$3
  shift 3
  run_bench "$step" "$cap" "$detail" python3 "$@"
}
kernel_rows() {
  local o
  o=$(cat)
  echo "$(grep -c '^{' <<<"$o") JSON rows ($(grep -c '"note":' <<<"$o") with a note)$(grep -q 'below the target' <<<"$o" && echo ", $(grep -c 'below the target' <<<"$o") below the target")$(grep -q '^SKIPPED' <<<"$o" && echo ', SKIPPED')"
}
json_rows() { echo "$(grep -c '^{') JSON rows"; }
join_rows() {
  local o
  o=$(cat)
  echo "$(grep -c '^{' <<<"$o") joined rows ($(grep -c 'below the target' <<<"$o") below the target)"
}
# "dcgan 12.3 ms mae 4.5 ms": the train_step rows of a bench_train(_torch) output.
train_steps() {
  python3 -c 'import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{") and "\"train_step\"" in l]
print(" ".join("%s %.2f ms" % (r["model"], r["ms"]) for r in rows if r.get("ms") is not None) or "no step rows")' 2>/dev/null
}
KERNELS=$BUILD/bench/bench_kernels

phase 2
run_built "attention ours" 30 kernel_rows "$KERNELS" attention --dtype bf16 --shape "$ATTENTION_SHAPES"
run_torch "attention pytorch" 30 json_rows bench/bench_kernels_torch.py attention --dtype bf16 --shape "$ATTENTION_SHAPES"
if grep -q '"impl":"pytorch"' "$BENCH_JSON" && grep -q '"impl":"\(nd\|cuda\)::' "$BENCH_JSON"; then
  run_bench "attention ours vs pytorch" 10 join_rows python3 bench/bench_kernels_torch.py --join "$BENCH_JSON"
else
  row "attention ours vs pytorch" "skipped" 0 "no pair of our rows and PyTorch's to join"
fi

phase 3  # AdamW: the 10M row (the 100M one left out); copy first: the ceiling the rows are read against
run_built "copy norms adamw" 30 kernel_rows "$KERNELS" copy batch_norm layer_norm adamw --shape '^(?!params=100000000$)'

phase 4
run_built "conv bf16 batch 64" 50 kernel_rows "$KERNELS" conv2d conv_transpose2d --dtype bf16 --shape '^N=64 '

phase 5
run_built "bench_train f32" 25 train_steps "$BUILD/bench/bench_train" --device cuda --steps 20
run_torch "bench_train_torch f32" 30 train_steps bench/bench_train_torch.py --device cuda --steps 20
run_built "bench_train bf16" 25 train_steps "$BUILD/bench/bench_train" --device cuda --steps 20 --amp bf16
run_torch "bench_train_torch bf16" 30 train_steps bench/bench_train_torch.py --device cuda --steps 20 --amp bf16
# The papers' sizes, bf16: DCGAN at 64x64 RGB and the ViT-B MAE at 224 (the rows carry peak_bytes).
for model in dcgan64 mae_vit_base_patch16_dec512d8b; do
  run_built "bench_train bf16 $model" 6 train_steps "$BUILD/bench/bench_train" --device cuda --steps 10 --amp bf16 --model "$model" --batch 64
  run_torch "bench_train_torch bf16 $model" 9 train_steps bench/bench_train_torch.py --device cuda --steps 10 --amp bf16 --model "$model" --batch 64
done

phase 6
# every CUDA test binary but collectives_test, whose one GPU case (nccl*) ran in phase 1
rest=$(for bin in $TARGETS; do case $bin in collectives_test) ;; *_test) echo "$bin" ;; esac; done)
left=$(wc -w <<<"$rest")
for bin in $rest; do
  filter=$(smoke_filter "$bin")
  run_tests "rest $bin" "$(share "$left")" "$BUILD/tests/$bin" ${filter:+-tce="$filter"}
  left=$((left - 1))
done

phase 7
run_sanitizer
phase 8
run_ncu

phase 9
model_rows() {
  local o
  o=$(cat)
  echo "$(grep -c '"measured_over_model":[0-9]' <<<"$o") of $(grep -c '^{' <<<"$o") model rows measured"
}
run_built "model rows" 20 kernel_rows "$KERNELS" model --shape '^(?!.*fill-sms)'
if [ -z "$GPU_NAME" ]; then
  row "measured vs model" "skipped" 0 "no GPU name (nvidia-smi): no device's rates to join against"
else
  run_bench "measured vs model" 10 model_rows python3 bench/model_join.py bench/cost_model.jsonl "$BENCH_JSON" --gpu "$GPU_NAME"
fi
# train_gan and train_mae (tiny) on the GPU and on the CPU, same seed and data: losses side
# by side, cudaMalloc calls in the steady state (bench/gpu_train_check.py).
train_curves() {
  python3 -c 'import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{") and "\"train_curve\"" in l]
print(" ".join("%s follows=%s steady=%s" % (r["shape"].split()[0], r["follows"], r["steady"]) for r in rows) or "no rows")' 2>/dev/null
}
DATA=/usr/share/datasets/fashion-mnist
[ -d .gpu-deps/fashion-mnist ] && DATA=.gpu-deps/fashion-mnist
if [ -x "$BUILD/apps/train_gan" ]; then
  run_bench "train curves cuda vs cpu" 600 train_curves env LD_LIBRARY_PATH="$OURS_LD" \
    python3 bench/gpu_train_check.py "$BUILD" --data "$DATA" --steps 100
else
  row "train curves cuda vs cpu" "absent" 0 "not built: $BUILD/apps/train_gan"
fi

echo
echo "== summary ($(($(now) - START)) s of $BUDGET_S; files in $OUT)"
cat "$SUMMARY"
