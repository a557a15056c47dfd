// bench_kernels' command line (bench/bench_kernels_options.h) without a GPU: the rows that the
// filters of bench/gpu_check.sh keep under std::regex (ECMAScript, lookaheads included; the
// Python side, re.search, is tests/bench/gpu_check_test.py's), and the errors for bad flags.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "bench/bench_kernels_options.h"

using nd::bench::KernelsOptions;

namespace {

KernelsOptions parse(std::vector<std::string> args) {
  std::vector<char*> argv{const_cast<char*>("bench_kernels")};
  for (std::string& a : args) argv.push_back(a.data());
  return KernelsOptions::parse(int(argv.size()), argv.data(), {"model", "attention", "conv2d", "adamw"});
}

}  // namespace

TEST_CASE("bench_kernels options: gpu_check.sh's filters keep exactly its rows") {
  const KernelsOptions attention = parse({"attention", "--dtype", "bf16", "--shape", " D=(64|128)$"});
  CHECK(attention.runs("attention"));
  CHECK_FALSE(attention.runs("conv2d"));
  CHECK(attention.keeps("B=8 H=8 S=1024 D=64", "bf16"));
  CHECK(attention.keeps("B=2 H=16 S=4096 D=128", "bf16"));
  CHECK_FALSE(attention.keeps("B=128 H=6 S=13 D=32", "bf16"));  // the MAE's
  CHECK_FALSE(attention.keeps("B=8 H=8 S=1024 D=64", "f16"));
  CHECK_FALSE(attention.keeps("B=8 H=8 S=1024 D=64", "f32"));

  const KernelsOptions norms = parse({"adamw", "--shape", "^(?!params=100000000$)"});
  CHECK(norms.keeps("params=10000000", "f32"));
  CHECK_FALSE(norms.keeps("params=100000000", "f32"));
  CHECK(norms.keeps("[102400, 1024]", "f32"));
  CHECK(norms.keeps("1 GiB", "f32"));

  const KernelsOptions conv = parse({"conv2d", "--dtype", "bf16", "--shape", "^N=64 "});
  CHECK(conv.keeps("N=64 1->64 k4 s2 p1 28x28", "bf16"));
  CHECK_FALSE(conv.keeps("N=256 1->64 k4 s2 p1 28x28", "bf16"));
  CHECK_FALSE(conv.keeps("N=32 64->64 k3 s1 p1 56x56", "bf16"));
  CHECK_FALSE(conv.keeps("N=64 1->64 k4 s2 p1 28x28", "f32"));

  const KernelsOptions ncu = parse({"attention", "--dtype", "bf16", "--shape", "S=4096 D=128$"});
  CHECK(ncu.keeps("B=2 H=16 S=4096 D=128", "bf16"));
  CHECK_FALSE(ncu.keeps("B=2 H=16 S=4096 D=64", "bf16"));

  const KernelsOptions model = parse({"model", "--shape", "^(?!.*fill-sms)"});
  CHECK(model.keeps("N=64 32x14^2->64 k4s2", "bf16"));
  CHECK_FALSE(model.keeps("N=64 32x14^2->64 k4s2 fill-sms", "bf16"));

  const KernelsOptions all = parse({"--dtype", "f32,f16"});
  CHECK(all.runs("model"));
  CHECK(all.keeps("anything", "f16"));
  CHECK_FALSE(all.keeps("anything", "bf16"));
  CHECK(parse({"--device", "cuda:1"}).device == "cuda:1");
}

TEST_CASE("bench_kernels options: a bad name or flag is an nd::Error naming what was expected and found") {
  CHECK_THROWS_WITH_AS(parse({"conv"}),
                       "bench_kernels: expected a benchmark name (model attention conv2d adamw), found 'conv'",
                       nd::Error);
  CHECK_THROWS_WITH_AS(parse({"--dtype", "bf16,"}),
                       "bench_kernels: --dtype expects f32, bf16, f16 (comma-separated), found '' in 'bf16,'",
                       nd::Error);
  CHECK_THROWS_WITH_AS(parse({"--only", "attention"}),
                       "bench_kernels: expected a flag of --device, --dtype, --shape, or a benchmark name, found "
                       "'--only'",
                       nd::Error);
  CHECK_THROWS_WITH_AS(parse({"attention", "--dtype"}), "bench_kernels: --dtype expects a value, found none",
                       nd::Error);
  CHECK_THROWS_WITH_AS(parse({"--shape", "S=(4096"}),
                       doctest::Contains("bench_kernels: --shape expects an ECMAScript regular expression, found "
                                         "'S=(4096' ("),
                       nd::Error);
}
