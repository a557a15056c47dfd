#!/usr/bin/env python3
"""bench/model_join.py on committed fixtures (model_join_model.jsonl: cost-model rows as
nanoddp_emu_cost_model prints them, the same four rows for the H200 and the H100;
model_join_measured.jsonl: bench_kernels output with a text line, a baseline row, a repeated
row, a row that could not run, a row of another shape and one of another dtype). Expected
values by hand, on an H200: copy 0.0128 ms measured / 0.0064 ms estimated = 2.0 (ratio 0.5);
AdamW 0.00336 / 0.0042 = 0.8 (ratio 1.25), its cudaMemcpy baseline row ignored; attention
and conv not measured (null ms, wrong dtype). On an H100 (the H100's rows: copy 0.008,
AdamW 0.0056): 1.6 and 0.6. A GPU name naming no device, or none given: exit 2.
TorchJoin: bench_kernels_torch.py --join (ours vs PyTorch), which reads and picks rows with
model_join.py's read_rows and is_ours, on rows written here."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "bench", "model_join.py")
TORCH_SCRIPT = os.path.join(HERE, "..", "..", "bench", "bench_kernels_torch.py")
MODEL = os.path.join(HERE, "model_join_model.jsonl")
MEASURED = os.path.join(HERE, "model_join_measured.jsonl")


H200 = "NVIDIA H200"
H100 = "NVIDIA H100 80GB HBM3"


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def joined_rows(p):
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


class ModelJoin(unittest.TestCase):
    def test_rows_joined_on_op_shape_dtype(self):
        p = run(MODEL, MEASURED, "--gpu", H200)
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        self.assertEqual([(r["op"], r["shape"], r["dtype"]) for r in rows],
                         [("copy", "n=2097152", "f32"), ("adamw", "4 x 65536", "f32"),
                          ("attention_fwd", "BH=64 S=256 D=64", "bf16"),
                          ("conv2d_fwd", "N=2 64x14^2->128 k4s2", "bf16")])
        copy, adamw, attention, conv = rows
        self.assertEqual(copy["impl"], "measured_vs_model")
        self.assertEqual({r["device"] for r in rows}, {"H200"})
        self.assertEqual(copy["baseline"], "model")
        self.assertAlmostEqual(copy["ms"], 0.0128)  # the first of the repeated rows
        self.assertAlmostEqual(copy["model_ms"], 0.0064)
        self.assertAlmostEqual(copy["measured_over_model"], 2.0)
        self.assertAlmostEqual(copy["ratio"], 0.5)
        self.assertAlmostEqual(copy["gbps"], 1310.72)
        self.assertEqual(copy["bound"], "dram")
        self.assertAlmostEqual(adamw["ms"], 0.00336)  # ours, not the cudaMemcpy baseline
        self.assertAlmostEqual(adamw["measured_over_model"], 0.8)
        self.assertAlmostEqual(adamw["ratio"], 1.25)
        for r in (attention, conv):
            self.assertIsNone(r["ms"])
            self.assertIsNone(r["ratio"])
            self.assertIsNone(r["measured_over_model"])
        self.assertAlmostEqual(conv["model_ms"], 0.01074)

    def test_the_gpu_name_picks_the_device_rows(self):
        p = run(MODEL, MEASURED, "--gpu", H100)
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = joined_rows(p)
        self.assertEqual(len(rows), 4)  # the H100's four, not all eight
        self.assertEqual({r["device"] for r in rows}, {"H100"})
        copy, adamw = rows[0], rows[1]
        self.assertAlmostEqual(copy["model_ms"], 0.008)
        self.assertAlmostEqual(copy["measured_over_model"], 1.6)  # 0.0128 / 0.008
        self.assertAlmostEqual(copy["ratio"], 0.625)
        self.assertAlmostEqual(adamw["model_ms"], 0.0056)
        self.assertAlmostEqual(adamw["measured_over_model"], 0.6)  # 0.00336 / 0.0056
        self.assertIn("at the H100's rates (GPU 'NVIDIA H100 80GB HBM3'", p.stdout)
        # the name's case does not matter; the H200's rows for an H200
        self.assertEqual({r["device"] for r in joined_rows(run(MODEL, MEASURED, "--gpu", "nvidia h200 nvl"))},
                         {"H200"})

    def test_a_gpu_without_rates_or_rows_without_a_device_is_an_error(self):
        p = run(MODEL, MEASURED, "--gpu", "NVIDIA A100-SXM4-80GB")
        self.assertEqual(p.returncode, 2)
        self.assertIn("model_join.py: expected a GPU name containing exactly one of the model's devices "
                      "(H200, H100), found 'NVIDIA A100-SXM4-80GB'", p.stderr)
        self.assertEqual(p.stdout, "")
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write('{"op":"copy","shape":"n=8","dtype":"f32","impl":"model","ms":0.1}\n')
        try:
            p = run(f.name, MEASURED, "--gpu", H100)
            self.assertEqual(p.returncode, 2)
            self.assertIn('expected a "device" field in every model row, found none in copy n=8', p.stderr)
        finally:
            os.unlink(f.name)

    def test_table(self):
        out = run(MODEL, MEASURED, "--gpu", H200).stdout
        self.assertIn("2 of 4 model row(s) measured", out)
        lines = out.splitlines()
        copy = next(line for line in lines if line.startswith("copy "))
        self.assertEqual(copy.split()[-4:], ["6.40", "12.80", "2.00", "dram"])
        attention = next(line for line in lines if line.startswith("attention_fwd "))
        self.assertIn("not measured", attention)

    def test_errors(self):
        p = run(MODEL, MEASURED)
        self.assertEqual(p.returncode, 2)
        self.assertIn("the following arguments are required: --gpu", p.stderr)
        p = run(MODEL, "/nonexistent/measured.jsonl", "--gpu", H200)
        self.assertEqual(p.returncode, 2)
        self.assertIn("/nonexistent/measured.jsonl", p.stderr)
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write('{"op":"copy"}\n{"op": broken\n')
        try:
            p = run(MODEL, f.name, "--gpu", H200)
            self.assertEqual(p.returncode, 2)
            self.assertIn(f"{f.name}:2: expected a JSON object", p.stderr)
        finally:
            os.unlink(f.name)


class TorchJoin(unittest.TestCase):
    ROWS = [
        "bench_kernels: a text line",
        '{"op":"attention_fwd","shape":"B=8 H=8 S=1024 D=64","dtype":"bf16","impl":"cuda::sdpa_bf16","ms":0.5}',
        '{"op":"attention_fwd","shape":"B=8 H=8 S=1024 D=64","dtype":"bf16","impl":"cuda::sdpa_bf16","ms":9.0}',
        '{"op":"attention_fwd","shape":"B=8 H=8 S=1024 D=64","dtype":"bf16","impl":"pytorch","ms":0.2}',
        '{"op":"copy","shape":"n=8","dtype":"f32","impl":"cudaMemcpy","ms":0.1}',
        '{"op":"copy","shape":"n=8","dtype":"f32","impl":"cuda::kernels","ms":0.25}',
        '{"op":"copy","shape":"n=8","dtype":"f32","impl":"pytorch","ms":0.5}',
        '{"op":"adamw","shape":"n=8","dtype":"f32","impl":"cuda::kernels","ms":null,"note":"failed"}',
        '{"op":"adamw","shape":"n=8","dtype":"f32","impl":"pytorch","ms":0.5}',
    ]

    def join(self, lines):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write("\n".join(lines) + "\n")
        try:
            return subprocess.run([sys.executable, TORCH_SCRIPT, "--join", f.name], capture_output=True, text=True)
        finally:
            os.unlink(f.name)

    def test_ours_against_pytorch(self):
        p = self.join(self.ROWS)
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        # the first of our repeated rows; the baseline, PyTorch and failed rows are not ours
        self.assertEqual([(r["op"], r["impl"]) for r in rows],
                         [("attention_fwd", "cuda::sdpa_bf16"), ("copy", "cuda::kernels")])
        attention, copy = rows
        self.assertEqual(attention["baseline"], "pytorch")
        self.assertAlmostEqual(attention["ratio"], 0.4)  # 0.2 / 0.5
        self.assertAlmostEqual(copy["ratio"], 2.0)  # 0.5 / 0.25
        line = next(x for x in p.stdout.splitlines() if x.startswith("attention_fwd "))
        self.assertIn("below the target 1.00", line)

    def test_bad_json_names_the_line(self):
        p = self.join(self.ROWS[:2] + ['{"op": broken'])
        self.assertEqual(p.returncode, 2)
        self.assertIn(":3: expected a JSON object", p.stderr)


if __name__ == "__main__":
    unittest.main()
