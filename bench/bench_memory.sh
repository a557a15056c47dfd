#!/usr/bin/env bash
# Resident memory over a long CPU training run: starts a training app for STEPS steps,
# samples its VmRSS (and VmHWM, the peak) from /proc/<pid>/status every INTERVAL seconds
# together with the step it has reached (from the app's "step N/STEPS" lines, --log-every
# 10), prints every sample, then one JSON line with the RSS at 10%, 20%, 50% and 100% of
# the steps and the growth from 20% to 100% (target: flat, within a few percent; the
# first 20% hold allocator and optimizer-state warm-up).
#   rss at X% = the first sample taken at or after step X% of STEPS; when the app exits
#   before a sample sees its last step, 100% is the last sample (its step is reported
#   as last_sample_step).
# Usage: bench/bench_memory.sh [APP [STEPS]] [-- APP_FLAGS...]
#   APP      default build/apps/train_gan (any nanoddp training app: train_mae, ...)
#   STEPS    default 1000
#   APP_FLAGS passed on, e.g. -- --batch-size 32
#   INTERVAL seconds between samples (environment, default 1)
# The app writes to a temporary --out folder, removed at the end. Linux only (/proc).
set -euo pipefail

app=build/apps/train_gan
steps=1000
if [[ $# -gt 0 && $1 != -- ]]; then app=$1; shift; fi
if [[ $# -gt 0 && $1 != -- ]]; then steps=$1; shift; fi
if [[ $# -gt 0 && $1 == -- ]]; then shift; fi
interval=${INTERVAL:-1}
[[ -x $app ]] || { echo "bench_memory: no executable at $app (build it, or pass its path)" >&2; exit 2; }
[[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "bench_memory: STEPS must be a positive integer, got '$steps'" >&2; exit 2; }

out=$(mktemp -d)
log=$out/app.log
samples=$out/samples.txt
trap 'rm -rf "$out"' EXIT

"$app" --device cpu --steps "$steps" --log-every 10 --out "$out/run" "$@" >"$log" 2>&1 &
pid=$!
name=$(basename "$app")
echo "bench_memory: $name pid $pid, $steps steps, flags: ${*:-(defaults)}, sampling every ${interval}s"
echo "# seconds step rss_kb hwm_kb"
start=$(date +%s%N)
# Seconds since start, one decimal.
seconds() { local t=$((($(date +%s%N) - start) / 100000000)); echo "$((t / 10)).$((t % 10))"; }
while kill -0 "$pid" 2>/dev/null; do
  status=$(cat "/proc/$pid/status" 2>/dev/null) || break
  rss=$(awk '/^VmRSS:/ {print $2}' <<<"$status")
  hwm=$(awk '/^VmHWM:/ {print $2}' <<<"$status")
  [[ -n $rss ]] || break  # a zombie has no VmRSS
  step=$(grep -ao 'step *[0-9]*/' "$log" 2>/dev/null | tail -n 1 | tr -dc '0-9') || true
  echo "$(seconds) ${step:-0} $rss $hwm" | tee -a "$samples"
  sleep "$interval"
done
status=0
wait "$pid" || status=$?
elapsed=$(seconds)
if [[ $status -ne 0 ]]; then
  echo "bench_memory: $name exited with status $status; its last lines:" >&2
  tail -n 20 "$log" >&2
  exit 1
fi
[[ -s $samples ]] || { echo "bench_memory: no samples (the run took less than one interval)" >&2; exit 1; }

awk -v steps="$steps" -v name="$name" -v flags="$*" -v secs="$elapsed" '
  { t[NR] = $1; s[NR] = $2; r[NR] = $3; h[NR] = $4 }
  # RSS (kB) of the first sample at or after step frac * steps; the last sample if none.
  function at(frac,   i) {
    for (i = 1; i <= NR; ++i) if (s[i] >= frac * steps) return r[i]
    return r[NR]
  }
  END {
    r10 = at(0.1); r20 = at(0.2); r50 = at(0.5); r100 = at(1.0)
    growth = 100.0 * (r100 - r20) / r20
    printf "%s: rss at 10%% %.1f MB, 20%% %.1f MB, 50%% %.1f MB, 100%% %.1f MB; growth 20%%->100%% %+.2f%%; ",
           name, r10 / 1024, r20 / 1024, r50 / 1024, r100 / 1024, growth
    printf "peak %.1f MB; %.0f s\n", h[NR] / 1024, secs
    printf "{\"op\":\"resident_memory\",\"shape\":\"%s steps=%d%s\",", name, steps, flags == "" ? "" : " " flags
    printf "\"dtype\":\"f32\",\"impl\":\"nanoddp\","
    printf "\"ms\":null,\"gflops\":null,\"gbps\":null,\"baseline\":\"rss at 20%%\",\"ratio\":%.4f,", r100 / r20
    printf "\"rss_mb_10\":%.2f,\"rss_mb_20\":%.2f,\"rss_mb_50\":%.2f,\"rss_mb_100\":%.2f,", r10 / 1024, r20 / 1024,
           r50 / 1024, r100 / 1024
    printf "\"growth_20_100_pct\":%.3f,\"peak_mb\":%.2f,\"samples\":%d,\"last_sample_step\":%d,", growth,
           h[NR] / 1024, NR, s[NR]
    printf "\"seconds\":%.1f}\n", secs
  }' "$samples"
