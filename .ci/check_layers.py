#!/usr/bin/env python3
"""Fails when a file includes from a layer above its own (docs/architecture.md "Layers").

Each layer may include itself and the layers listed for it below; a quoted or angled
include of a repository path ("engine/...", "kernels/cpu/...", <nanoddp.h>) is checked,
system and third-party headers are not. Inside the engine, its core headers (engine/*.h:
tensor, storage, autograd, ...) may not include ops/, nn/ or optim/ headers, so the core
never depends on what is built on it (.cpp files of one layer may call each other).

    python3 .ci/check_layers.py            # the repository this file is in
    python3 .ci/check_layers.py ROOT       # another checkout (the test plants a bad include)

Prints every upward include as `file:line: includes X (layer A may not include layer B)`
and exits 1 if there is any, else prints a one-line summary and exits 0.
"""
import os
import re
import subprocess
import sys

# Layer of a repository path, lowest first. A layer may include the ones it lists.
ALLOWED = {
    "kernels/common": [],
    "kernels/cpu": ["kernels/common"],
    "kernels/cuda": ["kernels/common"],
    "engine/core": ["kernels/common", "kernels/cpu", "kernels/cuda"],
    "engine": ["engine/core", "kernels/common", "kernels/cpu", "kernels/cuda"],
    "io": ["engine", "engine/core"],
    "collectives": ["io", "engine", "engine/core"],
    "data": ["collectives", "io", "engine", "engine/core"],
    "models": ["data", "collectives", "io", "engine", "engine/core"],
    "include": ["models", "collectives", "data", "io", "engine", "engine/core"],
    "apps": ["include", "models", "collectives", "data", "io", "engine", "engine/core"],
}
# Folders outside the layers (tests, benchmarks, examples, tools) may include anything.
UNCHECKED = ("tests/", "bench/", "examples/", "tools/", ".ci/", "cmake/", "docs/")
SOURCE = re.compile(r"\.(h|hpp|cpp|cc|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]')
ENGINE_CORE_HEADER = re.compile(r"^engine/[^/]+\.h$")


def layer_of(path):
    """The layer of a repository path, or None for a path outside the layers."""
    if path == "nanoddp.h" or path.startswith("include/"):
        return "include"
    if path.startswith("kernels/"):
        sub = path.split("/")[1]
        return "kernels/" + sub if "kernels/" + sub in ALLOWED else None
    if ENGINE_CORE_HEADER.match(path):
        return "engine/core"
    top = path.split("/")[0]
    return top if top in ALLOWED else None


def tracked_sources(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard"],
                         capture_output=True, text=True, check=True).stdout
    return [p for p in out.split() if SOURCE.search(p) and not p.startswith(UNCHECKED)]


def check(root):
    problems, files = [], 0
    for path in tracked_sources(root):
        mine = layer_of(path)
        if mine is None:
            continue
        files += 1
        # A .cpp of the engine's core may use the whole engine (its headers form the DAG).
        if mine == "engine/core" or (path.startswith("engine/") and "/" not in path[len("engine/"):]):
            mine = "engine/core" if path.endswith(".h") else "engine"
        with open(os.path.join(root, path), errors="replace") as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = layer_of(m.group(1))
                if target is None or target == mine or target in ALLOWED[mine]:
                    continue
                problems.append(f"{path}:{number}: includes {m.group(1)} "
                                f"(layer {mine} may not include layer {target})")
    return problems, files


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems, files = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} upward include(s) in {files} files; the layers and what "
              "each may include are in docs/architecture.md", file=sys.stderr)
        sys.exit(1)
    print(f"check_layers: {files} files, every include goes to its own layer or one below")


if __name__ == "__main__":
    main()
