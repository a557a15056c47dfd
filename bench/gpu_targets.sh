# shellcheck shell=bash
# Sourced by gpu_check.sh and gpu_prebuild.sh: the GPU check's build targets, so the two
# build (and the bundle carries) the same binaries. gpu_targets prints them: every CUDA test
# (tests/cuda/*_test.cpp and any tests/**/*cuda*_test.cpp), bench_kernels, bench_train,
# collectives_test (it holds the NCCL process group's test, run at world size 1), and the
# apps train_gan and train_mae (bench/gpu_train_check.py's training runs).
gpu_targets() {
  local t
  t=$(find tests -name '*_test.cpp' \( -path 'tests/cuda/*' -o -name '*cuda*' \) -exec basename {} .cpp \; | sort -u)
  [ -f bench/bench_kernels.cpp ] && t="$t bench_kernels"
  [ -f bench/bench_train.cpp ] && t="$t bench_train"
  [ -f tests/dist/collectives_test.cpp ] && t="$t collectives_test"
  [ -f apps/train_gan.cpp ] && t="$t train_gan"
  [ -f apps/train_mae.cpp ] && t="$t train_mae"
  # shellcheck disable=SC2086  # one line: the names unquoted
  echo $t
}
