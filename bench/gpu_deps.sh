#!/usr/bin/env bash
# Run HERE (not on the device machine) before a GPU check: the device machine's image
# has nvcc, CMake and Ninja but not the C++ packages nanoddp configures against, and
# nothing can be installed there. This copies Eigen3, doctest and zlib (headers, CMake
# configs, libz) from this machine into .gpu-deps/ (git-ignored through
# .git/info/exclude), which the device-tool call then carries:
#
#   bash bench/gpu_deps.sh
#   run(command="bash bench/gpu_check.sh", carry=[".gpu-deps"], timeout_s=540)
set -euo pipefail
cd "$(dirname "$0")/.."
D=.gpu-deps
grep -qxF "/$D/" .git/info/exclude 2>/dev/null || echo "/$D/" >>.git/info/exclude
rm -rf "$D"
mkdir -p "$D/include" "$D/share/eigen3" "$D/lib/cmake"
cp -r /usr/include/eigen3 "$D/include/"
cp -r /usr/share/eigen3/cmake "$D/share/eigen3/"
cp -r /usr/include/doctest "$D/include/"
cp -r /usr/lib/cmake/doctest "$D/lib/cmake/"
cp /usr/include/zlib.h /usr/include/zconf.h "$D/include/"
so=$(readlink -f /usr/lib/x86_64-linux-gnu/libz.so)
cp "$so" "$D/lib/libz.so"     # link time (its SONAME is libz.so.1)
cp "$so" "$D/lib/libz.so.1"   # run time, through LD_LIBRARY_PATH, if the image lacks it
du -sh "$D"
