#!/usr/bin/env python3
"""bench/gpu_train_check.py (gpu_check.sh's training runs, CUDA against the CPU): its
comparison on metrics written here (values by hand), and the whole script on the CPU twice
(--devices cpu,cpu: the same bits, so a relative difference of exactly 0) with the apps of
the build dir in NANODDP_BUILD_DIR, and a device that does not exist (exit 1, the app's
error printed). The end-to-end cases skip, saying why, without the apps or the dataset."""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "bench", "gpu_train_check.py")
BUILD = os.environ.get("NANODDP_BUILD_DIR", "")
DATA = "/usr/share/datasets/fashion-mnist"

spec = importlib.util.spec_from_file_location("gpu_train_check", SCRIPT)
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def write_metrics(folder, name, rows):
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


class Compare(unittest.TestCase):
    def test_read_merges_the_lines_of_a_step(self):
        with tempfile.TemporaryDirectory() as d:
            path = write_metrics(d, "m.jsonl", [{"step": 5, "loss": 2.0}, {"step": 10, "loss": 1.0},
                                                {"step": 10, "test_loss": 1.5}])
            self.assertEqual(check.read_metrics(path),
                             [{"step": 5, "loss": 2.0}, {"step": 10, "loss": 1.0, "test_loss": 1.5}])

    def test_largest_relative_difference_at_common_steps(self):
        a = [{"step": 5, "loss_d": 1.1, "loss_g": 0.5, "steps_per_s": 9.0}, {"step": 10, "loss_d": 0.9, "loss_g": 0.02},
             {"step": 15, "loss_d": 7.0}]
        b = [{"step": 5, "loss_d": 1.0, "loss_g": 0.5, "steps_per_s": 3.0}, {"step": 10, "loss_d": 1.0, "loss_g": 0.01}]
        worst, steps, finite = check.compare(a, b)
        # loss_g at step 10: |0.02 - 0.01| / max(0.01, 0.05) = 0.2; loss_d 0.1 and 0.1; step 15 unmatched.
        self.assertAlmostEqual(worst, 0.2)
        self.assertEqual(steps, 2)
        self.assertTrue(finite)

    def test_a_nan_or_inf_loss_is_not_finite(self):
        self.assertFalse(check.compare([{"step": 1, "loss": float("nan")}], [{"step": 1, "loss": 1.0}])[2])
        self.assertFalse(check.compare([{"step": 1, "loss": 1.0}], [{"step": 1, "loss": float("inf")}])[2])

    def test_steady_reads_cuda_mallocs_from_the_second_log_to_the_last(self):
        self.assertEqual(check.steady([{"cuda_mallocs": 3}, {"cuda_mallocs": 9}, {"cuda_mallocs": 9}]), (9, 9))
        self.assertEqual(check.steady([{"cuda_mallocs": 3}, {"cuda_mallocs": 9}, {"cuda_mallocs": 11}]), (9, 11))
        self.assertEqual(check.steady([{"loss": 1}, {"loss": 1}]), (None, None))  # a CPU run logs none


@unittest.skipUnless(BUILD and os.access(os.path.join(BUILD, "apps", "train_gan"), os.X_OK)
                     and os.access(os.path.join(BUILD, "apps", "train_mae"), os.X_OK),
                     "SKIPPED: no apps/train_gan and apps/train_mae in NANODDP_BUILD_DIR (apps off?)")
@unittest.skipUnless(os.path.isdir(DATA), "SKIPPED: no Fashion-MNIST at " + DATA)
class EndToEnd(unittest.TestCase):
    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, BUILD, "--steps", "6", *args], capture_output=True, text=True)

    def test_the_cpu_twice_follows_itself_exactly(self):
        p = self.run_script("--devices", "cpu,cpu")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        self.assertEqual([r["shape"] for r in rows], ["train_gan 6 steps", "train_mae 6 steps"])
        for r in rows:
            self.assertEqual(r["impl"], "cpu vs cpu")
            self.assertEqual(r["max_rel_diff"], 0.0)
            self.assertTrue(r["follows"])
            self.assertEqual(r["logged_steps"], 6)  # --log-every 1 at 6 steps
            self.assertIsNone(r["steady"])  # no cuda_mallocs on the CPU
        self.assertEqual(sorted(rows[0]["last_losses"][0]), ["loss_d", "loss_g"])
        self.assertEqual(sorted(rows[1]["last_losses"][0]), ["loss", "test_loss"])

    def test_a_failing_run_exits_1_with_its_error(self):
        p = self.run_script("--devices", "cpu,tpu")
        self.assertEqual(p.returncode, 1)
        self.assertIn("train_gan --device tpu failed", p.stdout)
        self.assertIn("invalid device 'tpu'", p.stdout)


if __name__ == "__main__":
    unittest.main()
