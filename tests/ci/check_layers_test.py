#!/usr/bin/env python3
""".ci/check_layers.py: the repository passes, and planted upward includes fail, naming them.

The planted cases run on a copy of a few of the repository's own files in a temporary git
repository: a kernel including the engine, the engine's core including an op, a model
including the umbrella header, the collectives including a kernel. Plain Python 3 and git.
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, ".ci", "check_layers.py")


def run(root):
    return subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)


def planted(files):
    """A temporary git repository holding `files` ({path: text}); returns its path."""
    d = tempfile.mkdtemp(prefix="nd_layers_")
    for path, text in files.items():
        os.makedirs(os.path.join(d, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(d, path), "w") as f:
            f.write(text)
    subprocess.run(["git", "init", "-q", d], check=True)
    return d


def main():
    failures = []

    def expect(cond, what):
        if not cond:
            failures.append(what)

    r = run(ROOT)
    expect(r.returncode == 0, f"the repository itself fails:\n{r.stdout}{r.stderr}")
    expect("every include goes to its own layer or one below" in r.stdout, f"no summary line: {r.stdout!r}")

    ok = {
        "kernels/common/a.h": "#pragma once\n#include <cstdint>\n",
        "kernels/cpu/b.h": '#include "kernels/common/a.h"\n',
        "engine/tensor.h": '#include "kernels/cpu/b.h"\n',
        "engine/ops/x.h": '#include "engine/tensor.h"\n',
        "engine/autograd.cpp": '#include "engine/ops/x.h"\n',  # a core .cpp may use the engine
        "collectives/c.cpp": '#include "engine/ops/x.h"\n',
        "models/m.h": '#include "collectives/c.h"\n',
        "apps/app.cpp": "#include <nanoddp.h>\n",
        "tests/t.cpp": '#include "kernels/cpu/b.h"\n',
    }
    d = planted(ok)
    r = run(d)
    expect(r.returncode == 0, f"a clean planted tree fails:\n{r.stdout}{r.stderr}")
    shutil.rmtree(d)

    bad = {
        "kernels/cuda/alloc.cpp": ('#include "engine/error.h"\n', "layer kernels/cuda may not include layer engine/core"),
        "kernels/common/idx.h": ('#include "kernels/cpu/conv.h"\n', "layer kernels/common may not include layer kernels/cpu"),
        "kernels/cuda/conv.h": ('#include "kernels/cpu/conv.h"\n', "layer kernels/cuda may not include layer kernels/cpu"),
        "engine/autograd.h": ('#include "engine/ops/elementwise.h"\n', "layer engine/core may not include layer engine"),
        "models/dcgan.h": ("#include <nanoddp.h>\n", "layer models may not include layer include"),
        "collectives/sync.cpp": ('#include "kernels/cpu/batch_norm.h"\n', "layer collectives may not include layer kernels/cpu"),
        "engine/ops/conv.cpp": ('#include "collectives/ddp.h"\n', "layer engine may not include layer collectives"),
    }
    for path, (text, message) in bad.items():
        d = planted(dict(ok, **{path: text}))
        r = run(d)
        expect(r.returncode == 1, f"{path}: expected exit 1, got {r.returncode}")
        expect(f"{path}:1: includes" in r.stdout and message in r.stdout,
               f"{path}: expected '{message}' naming the file, got {r.stdout!r}")
        shutil.rmtree(d)

    for f in failures:
        print("FAIL:", f)
    print(f"check_layers_test: {len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
