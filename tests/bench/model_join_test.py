#!/usr/bin/env python3
"""bench/model_join.py on committed fixtures (model_join_model.jsonl: cost-model rows as
nanoddp_emu_cost_model prints them; model_join_measured.jsonl: bench_kernels output with a
text line, a baseline row, a repeated row, a row that could not run, a row of another shape
and one of another dtype). Expected values by hand: copy 0.0128 ms measured / 0.0064 ms
estimated = 2.0 (ratio 0.5); AdamW 0.00336 / 0.0042 = 0.8 (ratio 1.25), its cudaMemcpy
baseline row ignored; attention and conv not measured (null ms, wrong dtype)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "bench", "model_join.py")
MODEL = os.path.join(HERE, "model_join_model.jsonl")
MEASURED = os.path.join(HERE, "model_join_measured.jsonl")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


class ModelJoin(unittest.TestCase):
    def test_rows_joined_on_op_shape_dtype(self):
        p = run(MODEL, MEASURED)
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        self.assertEqual([(r["op"], r["shape"], r["dtype"]) for r in rows],
                         [("copy", "n=2097152", "f32"), ("adamw", "4 x 65536", "f32"),
                          ("attention_fwd", "BH=64 S=256 D=64", "bf16"),
                          ("conv2d_fwd", "N=2 64x14^2->128 k4s2", "bf16")])
        copy, adamw, attention, conv = rows
        self.assertEqual(copy["impl"], "measured_vs_model")
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

    def test_table(self):
        out = run(MODEL, MEASURED).stdout
        self.assertIn("2 of 4 model row(s) measured", out)
        lines = out.splitlines()
        copy = next(line for line in lines if line.startswith("copy "))
        self.assertEqual(copy.split()[-4:], ["6.40", "12.80", "2.00", "dram"])
        attention = next(line for line in lines if line.startswith("attention_fwd "))
        self.assertIn("not measured", attention)

    def test_errors(self):
        p = run(MODEL)
        self.assertEqual(p.returncode, 2)
        self.assertIn("usage: model_join.py MODEL.jsonl MEASURED.jsonl", p.stderr)
        p = run(MODEL, "/nonexistent/measured.jsonl")
        self.assertEqual(p.returncode, 2)
        self.assertIn("/nonexistent/measured.jsonl", p.stderr)
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write('{"op":"copy"}\n{"op": broken\n')
        try:
            p = run(MODEL, f.name)
            self.assertEqual(p.returncode, 2)
            self.assertIn(f"{f.name}:2: expected a JSON object", p.stderr)
        finally:
            os.unlink(f.name)


if __name__ == "__main__":
    unittest.main()
