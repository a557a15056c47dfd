#!/usr/bin/env python3
"""bench/kernel_sass_loops.py (the SASS reader behind bench/kernel_sass.py) on hand-written
nvdisasm excerpts, kernel_sass_fixture.sass, with counts worked out by hand:
- two_mma_loop: a loop of 6 instructions (LDSM, 2 HMMA, IADD3, ISETP, BRA): 3 per mma, and
  nvcc's unreachable `BRA` to itself after EXIT, which is no main loop;
- nested: an outer loop (1 + copy loop 4 + 1 + mma loop 4 + 1 + 2 = 13 on the path) around a
  copy loop (LDGSTS, LDS RZ, ISETP, BRA) and an mma loop (2 LDS, HMMA, BRA), and an if whose
  2 IMAD the path skips (fewest instructions); with trips mma 2, copy 3:
  1 + 12 + 1 + 8 + 1 + 2 = 25, 2 mma, 3 cp.async, 4 LDS;
- no_loop: HMMA but no backward branch: an error naming the kernel;
- softmax: the loop's diverged-warp fallback (BRA.DIV's target) sits after its backward
  branch, so the loop is found by dominators, not by addresses (static 14 = 10 + the 4 out
  of line), and the path (10) takes the converged side; between its two HMMA, 6
  instructions with 2 MUFU.EX2: 3 per exp2;
- interleaved: P V's LDSM and HMMA scheduled between the exponentials (as ptxas does in a
  full tile): the softmax runs from the HMMA before the first MUFU.EX2 to the HMMA after the
  last, without the LDSM and HMMA inside: FMUL, MUFU.EX2, MUFU.EX2, F2FP: 4, 2 per exp2.
Also bench/kernel_sass.py's name shortening and its budget and expected-count checks."""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import kernel_sass  # noqa: E402
import kernel_sass_loops as sass  # noqa: E402

with open(os.path.join(HERE, "kernel_sass_fixture.sass")) as f:
    FIXTURE = f.read()
PARSED = sass.parse(FIXTURE)


def function(name):
    return sass.Function(name, *PARSED[name])


class Reader(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(list(PARSED), ["two_mma_loop", "nested", "no_loop", "softmax", "interleaved"])
        instructions, labels = PARSED["two_mma_loop"]
        self.assertEqual(len(instructions), 9)
        self.assertEqual(labels, {".L_x_0": 1, ".L_x_100": 8})
        branch = instructions[6]
        self.assertEqual((branch.address, branch.predicate, branch.opcode), (0x60, "@P0", "BRA"))
        self.assertEqual([i.kind for i in instructions[1:4]], ["ldsm", "mma", "mma"])

    def test_loop_with_two_mma(self):
        f = function("two_mma_loop")
        header = f.main_loop()
        self.assertEqual(f.address(header), 0x10)
        counts, path = f.iteration(header)
        self.assertEqual(counts["instructions"], 6)
        self.assertEqual((counts["mma"], counts["ldsm"], counts["lds"], counts["copy"]), (2, 1, 0, 0))
        self.assertEqual([i.address for i in path], [0x10, 0x20, 0x30, 0x40, 0x50, 0x60])
        self.assertEqual(counts["instructions"] / counts["mma"], 3.0)
        self.assertEqual(counts["nested"], [])

    def test_nested_loops(self):
        f = function("nested")
        header = f.main_loop()
        self.assertEqual(f.address(header), 0x10)  # the loop with HMMA and LDGSTS, not the mma loop
        self.assertEqual(sorted(f.address(c) for c in f.children(header)), [0x20, 0x70])
        self.assertEqual(f.loop_counts(header)["instructions"], 15)
        counts, _ = f.iteration(header)
        self.assertEqual((counts["instructions"], counts["mma"], counts["copy"], counts["lds"]), (13, 1, 1, 2))
        self.assertEqual([f.loop_kind(c) for c in counts["nested"]], ["copy", "mma"])
        counts, path = f.iteration(header, {"mma": 2, "copy": 3})
        self.assertEqual((counts["instructions"], counts["mma"], counts["copy"], counts["lds"]), (25, 2, 3, 4))
        self.assertNotIn(0xc0, [i.address for i in path])
        # The cp.async count asked for sets the copy loop's trips when none are given.
        counts, _ = f.iteration(header, {"mma": 1}, copies=3)
        self.assertEqual((counts["instructions"], counts["mma"], counts["copy"]), (21, 1, 3))
        with self.assertRaisesRegex(sass.SassError, r"^nested: no path through the loop at 0x0010 with 0 cp\.async"):
            f.iteration(header, copies=0)

    def test_no_loop(self):
        with self.assertRaisesRegex(sass.SassError, r"^no_loop: no loop holds MMA instructions$"):
            function("no_loop").main_loop()

    def test_out_of_line_block_and_softmax(self):
        f = function("softmax")
        header = f.main_loop()
        self.assertEqual(f.address(header), 0x10)
        self.assertEqual(f.loop_counts(header)["instructions"], 14)
        counts, path = f.iteration(header)
        self.assertEqual(counts["instructions"], 10)
        self.assertEqual((counts["mma"], counts["exp2"], counts["copy"]), (2, 2, 1))
        self.assertEqual((counts["softmax_instructions"], counts["softmax_exp2"]), (6, 2))
        self.assertNotIn(0xc0, [i.address for i in path])

    def test_softmax_with_mma_interleaved(self):
        f = function("interleaved")
        counts, _ = f.iteration(f.main_loop())
        self.assertEqual((counts["mma"], counts["exp2"], counts["ldsm"], counts["instructions"]), (3, 2, 1, 10))
        self.assertEqual((counts["softmax_instructions"], counts["softmax_exp2"]), (4, 2))

    def test_bad_input(self):
        with self.assertRaisesRegex(sass.SassError, r"^line 2: expected an instruction .*found '/\*0000\*/ \?\?\?'"):
            sass.parse(".text.k:\n        /*0000*/ ???\n")
        text = ".text.k:\n        /*0000*/                   BRA `(.L_x_9) ;\n"
        with self.assertRaisesRegex(sass.SassError, r"^k: a branch at /\*0000\*/ to \.L_x_9, which no line defines$"):
            sass.Function("k", *sass.parse(text)["k"])


class Driver(unittest.TestCase):
    def test_short_name(self):
        self.assertEqual(kernel_sass.short_name(
            "void nd::kernels::cuda::(anonymous namespace)::tc_forward_kernel<nd::BFloat16, 64, false>"
            "(nd::kernels::cuda::(anonymous namespace)::Problem<nd::BFloat16>, long, nd::BFloat16*, float*)"),
            "tc_forward_kernel<BFloat16, 64, false>")
        self.assertEqual(kernel_sass.short_name(
            "void nd::kernels::cuda::(anonymous namespace)::tensor_core_gemm_kernel<__nv_bfloat16, int, "
            "nd::kernels::conv_index::ForwardGemm<float> >(nd::kernels::conv_index::ForwardGemm<float>, long)"),
            "tensor_core_gemm_kernel<__nv_bfloat16, int, conv_index::ForwardGemm<float>>")

    def test_row_and_budgets(self):
        violations = []
        row = kernel_sass.measure(kernel_sass.Hot("k.cu", "nested", 2, 3, {"mma": 2, "copy": 3}, (12.5, 2.0, None), 8),
                                  PARSED, violations)
        self.assertEqual(violations, [])
        self.assertEqual(row, "| `nested` | k.cu | at 0x0010, 15 instructions; passes copy loop x3, mma loop x2 | 2 | 25 |"
                              " 12.50 (12.5) | 8 | 4 + 0 | 2.00 (2.0) | 3 | - | - |")
        kernel_sass.measure(kernel_sass.Hot("k.cu", "nested", 4, 3, {"mma": 2, "copy": 3}, (12.4, 1.9, 5.0)),
                            PARSED, violations)
        self.assertEqual(violations, [
            "k.cu: nested: the main loop's iteration has 2 mma, expected 4 (the tile shape or the loop structure changed: update HOT)",
            "k.cu: nested: instructions per mma 12.50 above the budget 12.4",
            "k.cu: nested: LDS + LDSM per mma 2.00 above the budget 1.9",
            "k.cu: nested: softmax instructions per exp2 none above the budget 5.0",
        ])
        violations = []
        row = kernel_sass.measure(kernel_sass.Hot("k.cu", "nested", 2, 2, {"mma": 2, "copy": 3}), PARSED, violations)
        self.assertEqual(violations, ["k.cu: nested: no path through the loop at 0x0010 with 2 cp.async (LDGSTS) comes back"
                                      " to it (the tile shape or the loop structure changed: update HOT)"])
        self.assertEqual(row, "| `nested` | k.cu | no iteration with 2 cp.async |" + " - |" * 9)


if __name__ == "__main__":
    unittest.main()
