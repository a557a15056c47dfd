"""The SASS reader behind bench/kernel_sass.py: nvdisasm's text of a cubin -> functions ->
basic blocks -> natural loops -> the instructions one iteration of a kernel's main loop
issues. Plain Python 3, no packages; tested on committed excerpts by
tests/bench/kernel_sass_test.py.

Method (bench/kernel_sass.py's header says what the numbers mean and their limits):
- parse(): `nvdisasm -c` output. A function starts at its `.text.<mangled>:` line; an
  instruction is `/*addr*/ [@[!]P] OPCODE operands ;`; a label `.L_x_N:` names the next one.
- Basic blocks: a block ends at a branch (BRA, BRX, JMP, JMX), EXIT or RET; a branch target
  starts one. A predicated branch, and BRA.DIV (taken only by a diverged warp: the compiler's
  fallback for warp-collective code), also fall through. CALL returns, so it ends nothing.
  An indirect branch (BRX, JMX: a jump table) has no known target, so a loop closed only
  through one is not found; nvcc emits none in the hot kernels.
- Loops are natural loops: an edge u -> h is a back edge when h dominates u (every path from
  the entry to u passes h); the loop is h and every block that reaches u without passing h.
  Loops found this way need not be contiguous in the address order: nvcc places blocks of a
  loop's body (divergent fallbacks, rare cases) after its backward branch.
- The main loop of a kernel: the innermost loop holding both HMMA (mma.sync) and LDGSTS
  (cp.async) instructions, or, in a kernel without cp.async, the innermost loop holding HMMA.
- One iteration is one path through the loop's body from its header back to it. Nested loops
  are collapsed into one node each, costed as trips x one iteration of theirs (trips given by
  the nested loop's kind, else 1; or, when the caller asks for a number of LDGSTS, a copy
  loop as often as fits). Of all paths (with exactly that many LDGSTS, when asked), the one
  with the most HMMA, then the most MUFU.EX2, (then the most LDGSTS,) then the fewest
  instructions: the full tile, with every exponential and every copy, through the fast side
  of each branch that changes neither.
"""
import re
from collections import Counter

FUNCTION = re.compile(r"^\.text\.(\S+):\s*$")
LABEL = re.compile(r"^(\.L_x_\d+):\s*$")
INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(@!?U?P[0-9T]+\s+)?([A-Z][A-Z0-9_.]*)\s*(.*?)\s*;\s*$")
TARGET = re.compile(r"`\((\.L_x_\d+)\)")
ENDS_BLOCK = ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET")

# What each counted kind of instruction is, by opcode (the part before the first dot, or the
# whole opcode for MUFU.EX2).
KINDS = {"HMMA": "mma", "LDS": "lds", "LDSM": "ldsm", "LDGSTS": "copy", "MUFU.EX2": "exp2"}


class SassError(ValueError):
    """Input that is not what nvdisasm writes, or a kernel without what is asked of it."""


class Instruction:
    __slots__ = ("address", "predicate", "opcode", "operands")

    def __init__(self, address, predicate, opcode, operands):
        self.address, self.predicate, self.opcode, self.operands = address, predicate, opcode, operands

    @property
    def base(self):
        return self.opcode.split(".")[0]

    @property
    def kind(self):
        """'mma', 'lds', 'ldsm', 'copy', 'exp2' or None."""
        if self.opcode.startswith("MUFU.EX2"):
            return "exp2"
        if self.base == "LDS" and self.operands.startswith("RZ,"):
            return None  # LDS RZ, [RZ]: no data (nvcc puts it beside zero-filling cp.async)
        return KINDS.get(self.base)

    @property
    def unconditional(self):
        # BRA.DIV / BRA.CONV: taken only by a diverged / converged warp, so both ways go on.
        return self.predicate in ("", "@PT", "@UPT") and self.opcode not in ("BRA.DIV", "BRA.CONV")


def parse(text):
    """{mangled name: (instructions, {label: index of the instruction it names})}."""
    functions = {}
    current = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FUNCTION.match(line)
        if m:
            current = ([], {})
            functions[m.group(1)] = current
            continue
        if current is None:
            continue
        m = LABEL.match(line)
        if m:
            current[1][m.group(1)] = len(current[0])
            continue
        m = INSTRUCTION.match(line)
        if m:
            current[0].append(Instruction(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4)))
        elif line.lstrip().startswith("/*"):
            raise SassError(f"line {number}: expected an instruction '/*address*/ [@P] OPCODE operands ;', found {line.strip()!r}")
    return functions


class Function:
    """A function's basic blocks (ranges of instruction indices), their successors and
    predecessors, and its natural loops {header block: set of blocks}."""

    def __init__(self, name, instructions, labels):
        if not instructions:
            raise SassError(f"{name}: no instructions")
        self.name, self.instructions = name, instructions

        def target(i):
            m = TARGET.search(instructions[i].operands)
            if not m:
                return None
            if m.group(1) not in labels:
                raise SassError(f"{name}: a branch at /*{instructions[i].address:04x}*/ to {m.group(1)}, which no line defines")
            return labels[m.group(1)]

        leaders = {0}
        for i, ins in enumerate(instructions):
            if ins.base in ENDS_BLOCK:
                leaders.add(i + 1)
                t = target(i)
                if t is not None:
                    leaders.add(t)
        leaders = sorted(x for x in leaders if x < len(instructions))
        block_of = {first: b for b, first in enumerate(leaders)}
        self.blocks = [(first, leaders[b + 1] if b + 1 < len(leaders) else len(instructions)) for b, first in enumerate(leaders)]
        self.succ = [[] for _ in self.blocks]
        for b, (first, end) in enumerate(self.blocks):
            last = instructions[end - 1]
            t = target(end - 1) if last.base in ENDS_BLOCK else None
            if t is not None:
                self.succ[b].append(block_of[t])
            if not (last.base in ENDS_BLOCK and last.unconditional) and end < len(instructions) and b + 1 not in self.succ[b]:
                self.succ[b].append(b + 1)
        self.pred = [[] for _ in self.blocks]
        for u, vs in enumerate(self.succ):
            for v in vs:
                self.pred[v].append(u)
        self._dominators()
        self.loops = {}
        for u in range(len(self.blocks)):
            if self.idom[u] is None:
                continue  # unreachable
            for h in self.succ[u]:
                if self.dominates(h, u):
                    body = self.loops.setdefault(h, {h})
                    stack = [u]
                    while stack:
                        v = stack.pop()
                        if v not in body:
                            body.add(v)
                            stack.extend(self.pred[v])

    def _dominators(self):
        # Cooper, Harvey, Kennedy: "A Simple, Fast Dominance Algorithm", on reverse postorder.
        n = len(self.blocks)
        order, seen, stack = [], [False] * n, [(0, iter(self.succ[0]))]
        seen[0] = True
        while stack:
            u, it = stack[-1]
            for v in it:
                if not seen[v]:
                    seen[v] = True
                    stack.append((v, iter(self.succ[v])))
                    break
            else:
                order.append(u)
                stack.pop()
        rpo = order[::-1]
        self.rpo_index = {u: i for i, u in enumerate(rpo)}
        self.idom = [None] * n
        self.idom[0] = 0

        def intersect(a, b):
            while a != b:
                while self.rpo_index[a] > self.rpo_index[b]:
                    a = self.idom[a]
                while self.rpo_index[b] > self.rpo_index[a]:
                    b = self.idom[b]
            return a

        changed = True
        while changed:
            changed = False
            for u in rpo[1:]:
                new = None
                for p in self.pred[u]:
                    if self.idom[p] is not None:
                        new = p if new is None else intersect(p, new)
                if self.idom[u] != new:
                    self.idom[u], changed = new, True

    def dominates(self, a, b):
        while True:
            if a == b:
                return True
            if b == 0 or self.idom[b] is None:
                return False
            b = self.idom[b]

    def address(self, block):
        return self.instructions[self.blocks[block][0]].address

    def block_counts(self, block):
        first, end = self.blocks[block]
        c = Counter(ins.kind for ins in self.instructions[first:end] if ins.kind)
        c["instructions"] = end - first
        return c

    def loop_counts(self, header):
        """Every instruction of the loop, once (inner loops and rare paths included)."""
        total = Counter()
        for b in self.loops[header]:
            total += self.block_counts(b)
        return total

    def children(self, header):
        """The loops directly inside loop `header`."""
        body = self.loops[header]
        inner = [h for h in self.loops if h != header and h in body]
        return [h for h in inner if not any(o != h and o in inner and h in self.loops[o] for o in inner)]

    def has(self, header, kind):
        return any(self.block_counts(b)[kind] for b in self.loops[header])

    def loop_kind(self, header):
        """What a nested loop is counted as: 'mma' (holds HMMA), else 'copy' (LDGSTS), else 'other'."""
        return "mma" if self.has(header, "mma") else "copy" if self.has(header, "copy") else "other"

    def main_loop(self):
        """The header of the innermost loop holding HMMA and LDGSTS (HMMA alone when the
        function has no LDGSTS); SassError when no loop holds HMMA."""
        kinds = ["mma", "copy"] if any(i.kind == "copy" for i in self.instructions) else ["mma"]
        holding = [h for h in self.loops if all(self.has(h, k) for k in kinds)]
        innermost = [h for h in holding if not any(o != h and o in self.loops[h] for o in holding)]
        if not innermost:
            raise SassError(f"{self.name}: no loop holds {' and '.join(k.upper() for k in kinds)} instructions")
        # Several disjoint ones (a kernel with two phases): the one with the most mma.
        return max(innermost, key=lambda h: (self.loop_counts(h)["mma"], -self.address(h)))

    def iteration(self, header, trips=None, copies=None):
        """One iteration of loop `header` (see the module comment): (counts, path) where
        counts is a Counter of 'instructions', 'mma', 'lds', 'ldsm', 'copy', 'exp2',
        'softmax_instructions', 'softmax_exp2' (the path's MUFU.EX2, and the instructions from
        the HMMA before the first of them to the HMMA after the last, HMMA and LDSM left out:
        where ptxas interleaves P V's mma with the exponentials, only theirs are left out) and
        'nested' (the nested loops' headers the path passes, in order), and path the
        instructions in order, a nested loop's repeated as many times as it is counted.
        trips: {kind: n}, the trips of nested loops by loop_kind(); a nested loop of another
        kind counts once. copies: the path must issue exactly that many LDGSTS (then nested
        copy loops without trips may count 1, 2, ... times, as fits): SassError when none
        does; without it the path takes the most LDGSTS."""
        trips = trips or {}
        body = self.loops[header]
        node_of = {}
        for c in self.children(header):
            for b in self.loops[c]:
                node_of[b] = ("loop", c)
        for b in body:
            node_of.setdefault(b, ("block", b))

        def tally(instructions):
            c = Counter(i.kind for i in instructions)
            return (c["mma"], c["exp2"], c["copy"], len(instructions))

        def alternatives(node):
            """[(tally, instructions, nested headers)] for each way the path may pass node."""
            kind, x = node
            if kind == "block":
                first, end = self.blocks[x]
                return [(tally(self.instructions[first:end]), self.instructions[first:end], [])]
            once = self.iteration(x, trips)[1]
            k = self.loop_kind(x)
            per = tally(once)
            if k in trips:
                counts = [trips[k]]
            elif copies is not None and k == "copy" and per[2]:
                counts = range(1, copies // per[2] + 1)
            else:
                counts = [1]
            return [(tuple(n * v for v in per), once * n, [x]) for n in counts]

        def node_succ(node):
            kind, x = node
            out = []
            for b in [x] if kind == "block" else self.loops[x]:
                for v in self.succ[b]:
                    if v == header and b in body:
                        out.append("back")
                    elif v in body and node_of[v] != node and node_of[v] not in out:
                        out.append(node_of[v])
            return out

        # The nodes form a DAG once the back edges to header are taken out (reducible code).
        order, seen = [], {node_of[header]}
        stack = [(node_of[header], iter(node_succ(node_of[header])))]
        while stack:
            u, it = stack[-1]
            for v in it:
                if v != "back" and v not in seen:
                    seen.add(v)
                    stack.append((v, iter(node_succ(v))))
                    break
            else:
                order.append(u)
                stack.pop()
        order.reverse()

        def better(a, b):  # tallies (mma, exp2, copies, instructions)
            if copies is None:
                return (a[0], a[1], a[2], -a[3]) > (b[0], b[1], b[2], -b[3])
            return (a[0], a[1], -a[3]) > (b[0], b[1], -b[3])

        # best[node][copies so far (0 when copies is None)] = (tally, link); a link is
        # (previous link, instructions, nested headers): the path, without copying it.
        best = {node_of[header]: {0: ((0, 0, 0, 0), None)}}
        done = None
        for u in order:
            for c, (t, link) in list(best.get(u, {}).items()):
                for add, instructions, nested in alternatives(u):
                    total = tuple(a + b for a, b in zip(t, add))
                    c2 = c + add[2] if copies is not None else 0
                    if copies is not None and c2 > copies:
                        continue
                    step = (link, instructions, nested)
                    for v in node_succ(u):
                        if v == "back":
                            if (copies is None or c2 == copies) and (done is None or better(total, done[0])):
                                done = (total, step)
                        else:
                            slot = best.setdefault(v, {})
                            if c2 not in slot or better(total, slot[c2][0]):
                                slot[c2] = (total, step)
        if done is None:
            with_copies = "" if copies is None else f" with {copies} cp.async (LDGSTS)"
            raise SassError(f"{self.name}: no path through the loop at 0x{self.address(header):04x}{with_copies} comes back to it")
        pieces, link = [], done[1]
        while link is not None:
            pieces.append(link)
            link = link[0]
        path, passed = [], []
        for _, instructions, nested in reversed(pieces):
            path += instructions
            passed += nested
        counts = Counter(i.kind for i in path if i.kind)
        counts["instructions"] = len(path)
        counts["nested"] = passed
        mmas = [k for k, i in enumerate(path) if i.kind == "mma"]
        exps = [k for k, i in enumerate(path) if i.kind == "exp2"]
        if exps and len(mmas) > 1:  # from the HMMA before the first MUFU.EX2 to the HMMA after the last
            start = max((k for k in mmas if k < exps[0]), default=-1)
            end = min((k for k in mmas if k > exps[-1]), default=len(path))
            counts["softmax_instructions"] = sum(1 for i in path[start + 1:end] if i.kind not in ("mma", "ldsm"))
            counts["softmax_exp2"] = len(exps)
        return counts, path


def functions(text):
    """[Function] of an nvdisasm listing, in its order."""
    return [Function(name, ins, labels) for name, (ins, labels) in parse(text).items()]
