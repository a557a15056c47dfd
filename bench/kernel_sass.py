#!/usr/bin/env python3
"""The machine code of the hot CUDA kernels, no GPU needed: disassembles their sm_90 cubins
(nvdisasm), finds each one's main loop and counts what one iteration of it issues, and
writes bench/kernel_sass.md.

    python3 bench/kernel_sass.py                # regenerate bench/kernel_sass.md
    python3 bench/kernel_sass.py --check        # regenerate into memory; fail when a budget
                                                # is exceeded or the committed table differs (CI)
    python3 bench/kernel_sass.py --cubins DIR   # disassemble DIR/X.cubin, as written by
                                                # bench/kernel_resources.sh --cubins DIR (CI
                                                # compiles once for both); without it, the hot
                                                # files are compiled by kernel_resources.sh
                                                # --compile, with the same flags
    python3 bench/kernel_sass.py --nvdisasm     # print the nvdisasm it would use

nvdisasm: $NVDISASM, else on PATH, else /usr/local/cuda/bin, else PyPI's
nvidia-cuda-nvdisasm (`pip install nvidia-cuda-nvdisasm`, site-packages/nvidia/cu13/bin),
else Triton's copy; exit 2 when there is none, or on a compile error.

What is counted (the reader is kernel_sass_loops.py, whose comment gives the algorithm):
- Main loop: the innermost loop (natural loop of the control-flow graph) holding both mma
  (HMMA) and cp.async (LDGSTS): the K/V-tile loop of the attention kernels, the depth-step
  loop of the tensor-core conv.
- One iteration: a path through the loop body from its header back to it, with the most
  HMMA, then MUFU.EX2, then the fewest instructions, among those issuing exactly the cp.async
  (LDGSTS) one thread issues per iteration (from the tile shape, HOT below): a full tile
  through the fast side of each branch. Blocks off that path (edge tiles, unaligned copies,
  a diverged warp's fallback, the prologue's Q fragments) are not counted; the static size
  of the whole loop is given beside it.
- Nested loops count trips x one iteration of theirs. A trip count is not in the SASS: the
  conv's rows give theirs (its 16-deep mma loop: kTcTileK / 16 = 2 trips; its copy loops:
  16 copies per thread and operand, unrolled by 4: 4 trips), and the path must then come to
  the row's mma and cp.async, else the check fails; a copy loop without given trips (the
  attention kernels': ptxas splits `for (idx = tid; ...; idx += threads)` into up to 3 peeled
  copies and a loop unrolled by 4) counts as often as the cp.async count allows, and where
  several splits of the copies fit, the cheapest counts (an under-estimate of at most a few
  percent: a peeled copy costs about half a looped one).
- Instructions are issue slots of one warp: a predicated-off instruction still issues, so
  it counts; a CALL counts one (the callee is not followed). Unrolled loops are straight code
  and count as such. LDS RZ, [RZ] (no data: what nvcc puts beside zero-filling cp.async)
  counts as an instruction, not as a shared-memory load.
- Softmax: the path's MUFU.EX2 and the instructions from the HMMA before the first of them to
  the HMMA after the last, less the HMMA and LDSM among them (ptxas interleaves a full tile's
  P V products with its exponentials; the backward's two stretches at D = 128 and the
  products between them count as one); instructions per exp2 = those over the MUFU.EX2.
Budgets (HOT below: the counts when set, times 1.05, so a regression fails CI) on instructions per
mma, LDS + LDSM per mma and instructions per exp2; the design target per mma (the conv's: 8
issue slots) is printed beside them. Exit 1 on a budget exceeded or a stale table (the table is compared
only when it was made with the same nvcc, as kernel_resources.sh does).
Cost: nvdisasm and the reader, about 8 CPU-seconds for the three files; compiling them
without --cubins, about 56 CPU-seconds more.
"""
import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_sass_loops as sass  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join("bench", "kernel_sass.md")


class Hot:
    """A kernel of the table: its file, its name as kernel_resources.md writes it, the
    expected mma (per warp) and cp.async (per thread) of one main-loop iteration (None: not
    checked), the nested loops' trips by kind, budgets (instructions per mma, LDS + LDSM per
    mma, softmax instructions per exp2; None: no budget) and the target per mma."""

    def __init__(self, file, name, mma, copies=None, trips=None, budget=(None, None, None), target=None):
        self.file, self.name, self.mma, self.copies = file, name, mma, copies
        self.trips, self.budget, self.target = trips, budget, target


CONV_TRIPS = {"mma": 2, "copy": 4}  # kTcTileK / 16; 16 copies per thread and operand / unroll 4
# mma a warp and cp.async a thread per iteration. The conv tile: 64 x 64 x 32 over 4 warps
# = 16 mma m16n8k16; 2 x 64 x 32 f32 copied by 128 threads = 32 cp.async. Attention, a
# 64-row tile of 16-byte chunks (D / 8 a row): the forward's S = Q K^T and P V (16 rows a
# warp) are D mma, its K and V tiles 2 x 64 x D / 8 chunks over 256 threads = D / 16 cp.async;
# the backward's dq kernel 1.5 D mma and dk_dv 2 D, over 128 threads 2 x 64 x D / 8 chunks =
# D / 8 cp.async, dk_dv's threads 0-63 one lse and one delta more (D / 8 + 2).
# Budgets: the counts when they were set, times 1.05, rounded up (the forward's and dk_dv's
# D = 128 softmax: 2026-12-08, with the softmax counted from the HMMA before the first
# exp2 to the HMMA after the last).
HOT = [
    Hot("attention_tc_forward.cu", "tc_forward_kernel<BFloat16, 64, false>", 64, 4, budget=(10.0, 0.53, 6.4)),
    Hot("attention_tc_forward.cu", "tc_forward_kernel<BFloat16, 128, false>", 128, 8, budget=(6.8, 0.53, 7.1)),
    Hot("attention_tc_forward.cu", "tc_forward_kernel<BFloat16, 64, true>", 64, 4, budget=(14.8, 0.53, 12.7)),
    Hot("attention_tc_forward.cu", "tc_forward_kernel<BFloat16, 128, true>", 128, 8, budget=(10.1, 0.53, 12.8)),
    Hot("attention_tc_backward.cu", "tc_dq_kernel<BFloat16, 64, false>", 96, 8, budget=(16.6, 0.53, 20.4)),
    Hot("attention_tc_backward.cu", "tc_dq_kernel<BFloat16, 128, false>", 192, 16, budget=(11.0, 0.61, 19.9)),
    Hot("attention_tc_backward.cu", "tc_dk_dv_kernel<BFloat16, 64, false>", 128, 10, budget=(16.9, 1.05, 24.9)),
    Hot("attention_tc_backward.cu", "tc_dk_dv_kernel<BFloat16, 128, false>", 256, 18, budget=(11.3, 0.93, 40.1)),
    Hot("conv.cu", "tensor_core_gemm_kernel<__nv_bfloat16, int, conv_index::ForwardGemm<float>>", 16, 32, CONV_TRIPS,
        (72.0, 3.15, None), 8),
    Hot("conv.cu", "tensor_core_gemm_kernel<__nv_bfloat16, int, conv_index::DgradGemm<float>>", 16, 32, CONV_TRIPS,
        (71.3, 3.15, None), 8),
    Hot("conv.cu", "tensor_core_gemm_kernel<__nv_bfloat16, int, conv_index::WgradGemm<float>>", 16, 32, CONV_TRIPS,
        (70.3, 2.1, None), 8),
    Hot("conv.cu", "tensor_core_gemm_kernel<__nv_bfloat16, long, conv_index::ForwardGemm<float>>", 16, 32, CONV_TRIPS,
        (72.8, 3.15, None), 8),
]


def die(message):
    print(f"kernel_sass: {message}", file=sys.stderr)
    sys.exit(2)


def find_nvdisasm():
    candidates = [os.environ.get("NVDISASM"), shutil.which("nvdisasm"), "/usr/local/cuda/bin/nvdisasm"]
    try:
        import nvidia  # PyPI's nvidia-* wheels share this namespace package
        candidates += [os.path.join(p, "cu13", "bin", "nvdisasm") for p in nvidia.__path__]
    except ImportError:
        pass
    try:
        import triton
        candidates.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm"))
    except ImportError:
        pass
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def tool_version(path):
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if "release" in line:
            return line[line.index("release"):].strip()
    return "unknown"


def short_name(demangled):
    """kernel_resources.sh's short name: no return type, parameters, or shared namespaces."""
    d = demangled[5:] if demangled.startswith("void ") else demangled
    depth = 0
    for i, ch in enumerate(d):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and not d.startswith("(anonymous namespace", i):
            d = d[:i]
            break
    for ns in ("(anonymous namespace)::", "nd::kernels::cuda::", "nd::kernels::", "nd::"):
        d = d.replace(ns, "")
    while "> >" in d:
        d = d.replace("> >", ">>")
    return d


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def measure(hot, listing, violations):
    """The table row of one hot kernel."""
    f = listing.get(hot.name)
    if f is None:
        die(f"{hot.file} has no kernel {hot.name} (renamed? update HOT in bench/kernel_sass.py)")
    function = sass.Function(hot.name, *f)
    header = function.main_loop()
    where = f"{hot.file}: {hot.name}"
    try:
        counts, _ = function.iteration(header, hot.trips, hot.copies)
    except sass.SassError as e:
        violations.append(f"{hot.file}: {e} (the tile shape or the loop structure changed: update HOT)")
        return f"| `{hot.name}` | {hot.file} | no iteration with {hot.copies} cp.async |" + " - |" * 9
    if hot.mma is not None and counts["mma"] != hot.mma:
        violations.append(f"{where}: the main loop's iteration has {counts['mma']} mma, expected {hot.mma} "
                          "(the tile shape or the loop structure changed: update HOT)")
    mma = counts["mma"]
    per_mma = counts["instructions"] / mma
    shared = (counts["lds"] + counts["ldsm"]) / mma
    exp2 = counts["softmax_exp2"]
    per_exp2 = counts["softmax_instructions"] / exp2 if exp2 else None
    for value, budget, what in zip((per_mma, shared, per_exp2), hot.budget,
                                   ("instructions per mma", "LDS + LDSM per mma", "softmax instructions per exp2")):
        if budget is not None and (value is None or round(value, 2) > budget):
            violations.append(f"{where}: {what} {'none' if value is None else f'{value:.2f}'} above the budget {budget}")
    kinds = [function.loop_kind(c) for c in counts["nested"]]
    loops = ", ".join(f"{kind} loop x{(hot.trips or {}).get(kind, 1)}" for kind in kinds)

    def cell(value, budget):
        return ("-" if value is None else f"{value:.2f}") + ("" if budget is None else f" ({budget})")

    static = function.loop_counts(header)["instructions"]
    return (f"| `{hot.name}` | {hot.file} | at 0x{function.address(header):04x}, {static} instructions"
            f"{'; passes ' + loops if loops else ''} | {mma} | {counts['instructions']} | {cell(per_mma, hot.budget[0])} |"
            f" {hot.target if hot.target else '-'} | {counts['lds']} + {counts['ldsm']} | {cell(shared, hot.budget[1])} |"
            f" {counts['copy']} | {exp2 if exp2 else '-'} | {cell(per_exp2, hot.budget[2])} |")


def table(cubins, nvdisasm, nvcc_version, violations):
    rows = []
    for file in dict.fromkeys(h.file for h in HOT):
        cubin = os.path.join(cubins, file[:-3] + ".cubin")
        if not os.path.isfile(cubin):
            die(f"no {cubin} (make it with bash bench/kernel_resources.sh --compile DIR)")
        p = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True)
        if p.returncode != 0:
            die(f"{nvdisasm} -c {cubin} failed: {p.stderr.strip()}")
        try:
            parsed = sass.parse(p.stdout)
        except sass.SassError as e:
            die(f"{cubin}: {e}")
        names = list(parsed)
        listing = {short_name(d): parsed[m] for m, d in zip(names, demangle(names))}
        for hot in HOT:
            if hot.file == file:
                try:
                    rows.append(measure(hot, listing, violations))
                except sass.SassError as e:
                    die(f"{file}: {e}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "kernels"], capture_output=True, text=True, cwd=ROOT).stdout
    generated = f"Generated {datetime.date.today().isoformat()} from commit {commit or 'unknown'}"
    generated += " with uncommitted changes in kernels" if dirty.strip() else ""
    generated += f", disassembled by nvdisasm {tool_version(nvdisasm)}"
    return "\n".join([
        "# SASS of the hot CUDA kernels (sm_90)",
        "",
        "Written by `bench/kernel_sass.py` (do not edit by hand); regenerate with",
        "`python3 bench/kernel_sass.py`. CI runs it with `--check`, which fails when this file is",
        "stale or a kernel exceeds its budget (in parentheses; the script holds them).",
        "The method and its limits: the script's header and bench/README.md.",
        "",
        generated + ".",
        "",
        f"- Compiler: nvcc {nvcc_version}, the cubins of `bench/kernel_resources.sh` (its flags).",
        "- Main loop: the innermost loop holding mma (HMMA) and cp.async (LDGSTS); its address,",
        "  its static size (every block, rare paths included) and the nested loops the iteration",
        "  passes, with the trips they are counted at. One iteration: of the paths from the loop's",
        "  header back to it that issue the tile's cp.async, the one with the most HMMA, then",
        "  MUFU.EX2, then the fewest instructions (a full tile, fast paths). Instructions are one",
        "  warp's issue slots; mma are per warp, cp.async per thread.",
        "- Softmax: the path's MUFU.EX2 and the instructions from the HMMA before the first of them",
        "  to the HMMA after the last, less the HMMA and LDSM among them; per exp2: those over the",
        "  MUFU.EX2.",
        "",
        "| kernel | file | main loop | mma / iteration | instructions / iteration | instructions per mma (budget) "
        "| target per mma | LDS + LDSM / iteration | LDS + LDSM per mma (budget) | cp.async / iteration "
        "| softmax exp2 | softmax instructions per exp2 (budget) |",
        "|--------|------|-----------|----------------:|-------------------------:|------------------------------:"
        "|---------------:|-----------------------|----------------------------:|---------------------:"
        "|-------------:|--------------------------------------:|",
        *rows,
        "",
    ])


def main():
    ap = argparse.ArgumentParser(description="SASS counts of the hot CUDA kernels' main loops")
    ap.add_argument("--check", action="store_true", help="fail on a stale table or an exceeded budget")
    ap.add_argument("--cubins", help="directory of the cubins (bench/kernel_resources.sh --cubins DIR)")
    ap.add_argument("--nvdisasm", action="store_true", help="print the nvdisasm used and exit")
    args = ap.parse_args()
    nvdisasm = find_nvdisasm()
    if args.nvdisasm:
        if not nvdisasm:
            die("no nvdisasm ($NVDISASM, PATH, /usr/local/cuda/bin, pip's nvidia-cuda-nvdisasm, triton)")
        print(nvdisasm)
        return 0
    if not nvdisasm:
        die("no nvdisasm ($NVDISASM, PATH, /usr/local/cuda/bin, pip's nvidia-cuda-nvdisasm, triton): "
            "pip install nvidia-cuda-nvdisasm")
    os.chdir(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        cubins = args.cubins
        if not cubins:
            cubins = tmp
            files = [os.path.join("kernels", "cuda", f) for f in dict.fromkeys(h.file for h in HOT)]
            if subprocess.run(["bash", "bench/kernel_resources.sh", "--compile", tmp, *files]).returncode != 0:
                die("compiling the hot files failed")
        version_file = os.path.join(cubins, "nvcc_version.txt")
        if not os.path.isfile(version_file):
            die(f"no {version_file}: DIR must come from bench/kernel_resources.sh --cubins DIR")
        nvcc_version = open(version_file).read().strip()
        violations = []
        text = table(cubins, nvdisasm, nvcc_version, violations)
    status = 0
    if not args.check:
        with open(TABLE, "w") as f:
            f.write(text)
        print(f"kernel_sass: wrote {TABLE}: {len(HOT)} kernels")
    else:
        committed = open(TABLE).read() if os.path.isfile(TABLE) else None

        def body(t):
            return [line for line in t.splitlines() if not line.startswith("Generated ")]

        if committed is None:
            print(f"kernel_sass: {TABLE} is missing; run python3 bench/kernel_sass.py and commit it", file=sys.stderr)
            status = 1
        elif f"nvcc {nvcc_version}," not in committed:
            print(f"kernel_sass: {TABLE} was made with another nvcc, this is nvcc {nvcc_version}: "
                  "not compared (budgets still checked)")
        elif body(committed) != body(text):
            import difflib
            sys.stderr.writelines(difflib.unified_diff([line + "\n" for line in body(committed)],
                                                       [line + "\n" for line in body(text)],
                                                       f"{TABLE} (committed)", f"{TABLE} (regenerated)"))
            print(f"kernel_sass: {TABLE} is stale (diff above); run python3 bench/kernel_sass.py and commit it",
                  file=sys.stderr)
            status = 1
        else:
            print(f"kernel_sass: {TABLE} is up to date")
    if violations:
        print(f"kernel_sass: {len(violations)} budget violation(s):", file=sys.stderr)
        for v in violations:
            print(f"  {v}", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
