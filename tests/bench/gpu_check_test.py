#!/usr/bin/env python3
"""bench/gpu_check.sh's plan and the row filters it gives the benchmarks, with no GPU:

- `gpu_check.sh --plan`: the phases in the order of the GPU issue (setup, then smoke tests,
  attention, norms, conv, training steps, the other tests, sanitizer, ncu, the model join),
  each with its cap, and a total within BUDGET_S (520 s by default); a budget below the caps'
  sum is an error;
- bench_kernels_torch.py's --dtype and --shape (re.search) keep exactly the rows gpu_check
  asks for: phase 2's filter keeps the four target attention shapes of ATTENTION in bf16
  and none of the MAE's; bad names and flags exit 2 before torch is imported;
- bench_kernels (this build's, NANODDP_BUILD_DIR): bad names and flags exit 2 naming what was
  expected and found, before the GPU check (so here too); good ones reach the check, which
  on a machine without a GPU prints SKIPPED (on one with a GPU, a shape no row has times
  nothing). Without the binary: a visible skip.
"""
import os
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
CHECK = os.path.join(ROOT, "bench", "gpu_check.sh")
TORCH_SCRIPT = os.path.join(ROOT, "bench", "bench_kernels_torch.py")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_kernels_torch as torch_bench  # noqa: E402  (imports no torch at module level)


def script_value(name):
    """A NAME='...' assignment of gpu_check.sh."""
    with open(CHECK) as f:
        return re.search(r"^%s='([^']*)'" % name, f.read(), re.M).group(1)


class Plan(unittest.TestCase):
    def test_phases_in_order_within_the_budget(self):
        p = subprocess.run(["bash", CHECK, "--plan"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.splitlines()
        phases = [line.split() for line in lines if re.match(r"^ ?\d+ ", line)]
        self.assertEqual([(int(x[0]), x[1]) for x in phases],
                         list(enumerate(["setup", "smoke", "attention", "norms", "conv", "train", "tests", "sanitizer",
                                         "ncu", "model"])))
        caps = [int(x[2]) for x in phases]
        self.assertEqual(caps[1], 60)  # the smoke tests: a minute at most
        total = next(line for line in lines if line.split()[:1] == ["total"])
        self.assertEqual(int(total.split()[1]), sum(caps))
        self.assertLessEqual(sum(caps), 520)
        self.assertIn("budget 520 s; give the device tool timeout_s=570", total)

    def test_a_budget_below_the_caps_is_an_error(self):
        p = subprocess.run(["bash", CHECK, "--plan"], capture_output=True, text=True, env=dict(os.environ, BUDGET_S="300"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("over BUDGET_S=300", p.stderr)


class TorchFilters(unittest.TestCase):
    def keeps(self, *argv):
        args = torch_bench.parse(["bench_kernels_torch.py", *argv])
        return lambda shape, dtype: torch_bench.keeps(args, shape, dtype)

    def test_phase_2_keeps_the_target_attention_shapes_in_bf16(self):
        keeps = self.keeps("attention", "--dtype", "bf16", "--shape", script_value("ATTENTION_SHAPES"))
        shapes = ["B=%d H=%d S=%d D=%d" % s for s in torch_bench.ATTENTION]
        self.assertEqual([s for s in shapes if keeps(s, "bf16")],
                         ["B=8 H=8 S=1024 D=64", "B=8 H=16 S=512 D=128", "B=2 H=16 S=4096 D=64",
                          "B=2 H=16 S=4096 D=128"])
        self.assertFalse(any(keeps(s, d) for s in shapes for d in ("f32", "f16")))

    def test_dtype_lists_and_lookaheads(self):
        keeps = self.keeps("--dtype", "f32,f16", "--shape", "^(?!params=100000000$)")
        self.assertTrue(keeps("params=10000000", "f32"))
        self.assertFalse(keeps("params=100000000", "f32"))
        self.assertTrue(keeps("N=64 C=128 7x7", "f16"))
        self.assertFalse(keeps("N=64 C=128 7x7", "bf16"))
        self.assertTrue(self.keeps()("anything", "bf16"))

    def test_bad_names_and_flags_exit_2(self):
        for argv, message in ((["conv"], "argument NAME: expected a benchmark name (attention copy matmul conv2d "
                                          "conv_transpose2d batch_norm layer_norm adamw), found 'conv'"),
                              (["--dtype", "bf16,fp8"], "argument --dtype: expected f32, bf16, f16 (comma-separated), "
                                                        "found 'fp8' in 'bf16,fp8'"),
                              (["--shape", "S=(4096"], "argument --shape: expected a regular expression, found "
                                                       "'S=(4096'"),
                              (["--join", "rows.jsonl", "attention"], "usage: bench_kernels_torch.py --join ROWS.jsonl "
                                                                      "(no names or filters)")):
            p = subprocess.run([sys.executable, TORCH_SCRIPT, *argv], capture_output=True, text=True)
            self.assertEqual(p.returncode, 2, argv)
            self.assertIn(message, p.stderr)
            self.assertNotIn("SKIPPED", p.stdout)


class KernelsFilters(unittest.TestCase):
    def setUp(self):
        self.exe = os.path.join(os.environ.get("NANODDP_BUILD_DIR", os.path.join(ROOT, "build")), "bench",
                                "bench_kernels")
        if not os.access(self.exe, os.X_OK):
            print(f"SKIPPED: bench_kernels not built ({self.exe})")
            self.skipTest("bench_kernels not built")

    def run_exe(self, *argv):
        return subprocess.run([self.exe, *argv], capture_output=True, text=True)

    def test_bad_names_and_flags_exit_2_before_the_gpu_check(self):
        for argv, message in (
                (["conv"], "bench_kernels: expected a benchmark name (model attention copy h2d matmul conv2d "
                           "conv_transpose2d batch_norm layer_norm adamw), found 'conv'"),
                (["--dtype", "bf16,fp8"], "bench_kernels: --dtype expects f32, bf16, f16 (comma-separated), found "
                                          "'fp8' in 'bf16,fp8'"),
                (["--shape", "S=(4096"], "bench_kernels: --shape expects an ECMAScript regular expression, found "
                                         "'S=(4096'"),
                (["--only", "attention"], "bench_kernels: expected a flag of --device, --dtype, --shape, or a "
                                          "benchmark name, found '--only'"),
                (["attention", "--shape"], "bench_kernels: --shape expects a value, found none")):
            p = self.run_exe(*argv)
            self.assertEqual(p.returncode, 2, argv)
            self.assertTrue(p.stderr.startswith(message), p.stderr)  # the regex's own words may follow
            self.assertEqual(len(p.stderr.splitlines()), 1)
            self.assertEqual(p.stdout, "")

    def test_good_filters_reach_the_gpu_check(self):
        # a shape no row has: on a GPU, the header and no row (nothing timed); without one, SKIPPED
        p = self.run_exe("conv2d", "attention", "--dtype", "bf16,f16", "--shape", "^no row has this shape$")
        self.assertEqual(p.returncode, 0, p.stderr)
        if p.stdout.startswith("SKIPPED"):
            self.assertIn("SKIPPED: no CUDA GPU", p.stdout)
        else:
            self.assertIn("bench_kernels: cuda:0", p.stdout)
            self.assertNotIn("{", p.stdout)


if __name__ == "__main__":
    unittest.main()
