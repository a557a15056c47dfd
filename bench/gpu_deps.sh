#!/usr/bin/env bash
# Run HERE (not on the device machine) before a GPU check: the device machine's image
# has nvcc, CMake and Ninja but not the C++ packages nanoddp configures against, and
# nothing can be installed there. This copies Eigen3, doctest and zlib (headers, CMake
# configs, libz) from this machine into .gpu-deps/ (git-ignored), with a slice of
# Fashion-MNIST for the check's training runs, which the device-tool call then carries
# (with the bundle of bench/gpu_prebuild.sh, GPU.md):
#
#   bash bench/gpu_deps.sh && bash bench/gpu_prebuild.sh
#   run(command="bash bench/gpu_check.sh .gpu-bin", carry=[".gpu-bin", ".gpu-deps"], timeout_s=570)
set -euo pipefail
cd "$(dirname "$0")/.."
D=.gpu-deps
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
# Fashion-MNIST for the check's training runs (train_gan, train_mae on cuda and cpu,
# bench/gpu_train_check.py): the first 12800 training and 1000 test images and their labels
# as IDX files (gzip), 5.8 MB instead of the whole 30 MB, from the Debian package's copy.
FMNIST=${FMNIST:-/usr/share/datasets/fashion-mnist}
mkdir -p "$D/fashion-mnist"
python3 - "$FMNIST" "$D/fashion-mnist" <<'PY'
import gzip, struct, sys
src, dst = sys.argv[1], sys.argv[2]
for split, keep in (("train", 12800), ("t10k", 1000)):
    for kind in ("images-idx3", "labels-idx1"):
        name = "%s-%s-ubyte.gz" % (split, kind)
        data = gzip.open("%s/%s" % (src, name)).read()
        dims = data[3]  # IDX: 0, 0, type, number of dimensions, then one big-endian u32 per dimension
        sizes = list(struct.unpack(">%dI" % dims, data[4:4 + 4 * dims]))
        record = 1
        for n in sizes[1:]:
            record *= n
        head = 4 + 4 * dims
        sizes[0] = min(keep, sizes[0])
        out = data[:4] + struct.pack(">%dI" % dims, *sizes) + data[head:head + sizes[0] * record]
        with gzip.open("%s/%s" % (dst, name), "wb") as f:
            f.write(out)
PY
du -sh "$D"
