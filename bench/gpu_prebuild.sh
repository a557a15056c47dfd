#!/usr/bin/env bash
# Run HERE (no device time) before a GPU check, after bench/gpu_deps.sh: builds the check's
# targets (gpu_targets.sh) with nvcc for sm_90 + PTX (Release, portable CPU code, MPI off)
# with libnanoddp SHARED, so the kernels' device code is in one file and not in
# each of nine binaries, and packs what they run into the git-ignored .gpu-bin/, laid out as
# a build dir (tests/, bench/, apps/, lib/libnanoddp.so; stripped; RUNPATH $ORIGIN/../lib first,
# then the build dir and the CUDA libraries' folder here, which the device lacks or has):
#
#   bash bench/gpu_deps.sh && bash bench/gpu_prebuild.sh
#   run(command="bash bench/gpu_check.sh .gpu-bin", carry=[".gpu-bin", ".gpu-deps"], timeout_s=570)
#
# gpu_check.sh then runs the bundle's binaries with no configure and no build, once every
# library they need is found on the device (it looks in the CUDA toolkit and PyTorch's
# nvidia wheels for what the loader misses); else it says what is missing and builds from
# source as without a bundle. The bundle holds this machine's libstdc++ and glibc needs
# (Debian 12: GCC 12, glibc 2.36; the device image is newer). Last, this script checks that
# the working tree, .gpu-deps and .gpu-bin fit the device tool's 64 MiB.
#   bash bench/gpu_prebuild.sh [BUILD_DIR]   (default build-gpu-shared; JOBS=N for ninja)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-gpu-shared}
D=.gpu-bin
JOBS=${JOBS:-$(nproc)}
# shellcheck source=bench/gpu_targets.sh
source bench/gpu_targets.sh
TARGETS=$(gpu_targets)
# shellcheck disable=SC2016  # $ORIGIN is the loader's, not the shell's
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNANODDP_CUDA=ON -DNANODDP_NATIVE=OFF -DNANODDP_MPI=OFF \
  -DNANODDP_BUILD_APPS=ON -DNANODDP_SHARED=ON -DCMAKE_BUILD_RPATH='$ORIGIN/../lib' | grep "nanoddp:"
# shellcheck disable=SC2086
ninja -C "$B" -j "$JOBS" $TARGETS

rm -rf "$D"
mkdir -p "$D/tests" "$D/bench" "$D/apps" "$D/lib"
for t in $TARGETS; do
  found=0
  for dir in tests bench apps; do
    if [ -x "$B/$dir/$t" ]; then cp "$B/$dir/$t" "$D/$dir/" && found=1; fi
  done
  [ $found -eq 1 ] || { echo "gpu_prebuild: $t was not built in $B" >&2; exit 1; }
done
cp -L "$B/libnanoddp.so" "$D/lib/"
strip --strip-unneeded "$D"/tests/* "$D"/bench/* "$D"/apps/* "$D"/lib/*
{
  echo "nanoddp GPU bundle: commit $(git describe --always --dirty --abbrev=12), built $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "built with: $(nvcc --version | tail -1); $(g++ --version | head -1); $(ldd --version | head -1)"
  echo "binaries: $TARGETS"
} >"$D/BUNDLE"
git diff --quiet HEAD || echo "gpu_prebuild: the working tree has uncommitted changes; the bundle says -dirty" >&2

# The device tool carries the working tree (tracked and untracked-not-ignored files) and
# the carried paths, 64 MiB in all.
tree=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
bundle=$(du -sb "$D" | cut -f1)
deps=$( [ -d .gpu-deps ] && du -sb .gpu-deps | cut -f1 || echo 0)
total=$((tree + bundle + deps))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "gpu_prebuild: $D $(mib "$bundle") (lib/libnanoddp.so $(mib "$(stat -c %s "$D/lib/libnanoddp.so")")), .gpu-deps $(mib "$deps"), working tree $(mib "$tree"): $(mib "$total") of 64 MiB"
if [ "$total" -gt $((64 * 1048576)) ]; then
  echo "gpu_prebuild: over the device tool's 64 MiB: carry .gpu-bin without .gpu-deps (no fallback build), or build there" >&2
  exit 1
fi
