#!/usr/bin/env bash
# Resource budgets of the CUDA kernels, from the compiler, no GPU needed: compiles every
# kernels/cuda/*.cu for sm_90 as the nanoddp_cuda target does (device code only), reads
# ptxas's report for every kernel (registers, spill stores and loads, stack frame, static
# shared memory) and the PTX (__launch_bounds__, which kernels use extern __shared__), finds
# each kernel's launch in the source (block size, dynamic shared memory), computes the
# theoretical occupancy per SM of an H200, and writes bench/kernel_resources.md.
#
#   bash bench/kernel_resources.sh           # regenerate bench/kernel_resources.md
#   bash bench/kernel_resources.sh --check   # regenerate into a temporary file; also fail
#                                            # when the committed table differs (CI)
#   ... --cubins DIR                         # also keep each file's cubin as DIR/X.cubin
#   bash bench/kernel_resources.sh --compile DIR [kernels/cuda/X.cu...]
#                                            # only compile (every file, or those) into DIR
# The cubins are what bench/kernel_sass.py disassembles: CI compiles once for both.
#
# Fails (exit 1, naming the kernel) when a kernel spills (spill stores or loads > 0 bytes),
# has more than 48 KiB of static shared memory (only dynamic shared memory may go beyond,
# after cudaFuncSetAttribute(MaxDynamicSharedMemorySize)), takes more than 48 KiB in all
# without that opt-in in its file, more than 227 KiB in all, or cannot run one block on an
# SM at its block size; on a compile error or a missing nvcc, exit 2. The table is written
# even when a budget fails, so the failure can be read in it.
#
# Occupancy is the CUDA occupancy calculator's arithmetic (cuda_occupancy.h) for sm_90:
# 65536 registers per SM in 4 sub-partitions, allocated per warp in units of 256; at most
# 64 warps and 32 blocks per SM; 228 KiB of shared memory per SM (the largest carveout),
# allocated per block in units of 128 bytes with 1 KiB reserved per block; 227 KiB at
# most per block. Block size: the launch's, when the source gives it as constants; else
# the __launch_bounds__ maximum; else 256; the table says which. Dynamic shared memory
# counts only where the launch gives it as constants.
#
# Flags mirror CMakeLists.txt's nanoddp_cuda target (Release: -O3 -DNDEBUG; CUDA_STANDARD 17;
# CMAKE_CUDA_ARCHITECTURES 90; -DNANODDP_WITH_CUDA=1; the repository root on the include
# path); the script stops when those lines of CMakeLists.txt change, so the two stay in step.
# Cost: about 110 CPU-seconds, a minute on 2 idle cores (bench/README.md). NVCC=path overrides
# the compiler.
set -euo pipefail
invoked_from=$PWD
cd "$(dirname "$0")/.."
export LC_ALL=C  # the same sort order, glob order and number format everywhere

usage() {
  echo "usage: bench/kernel_resources.sh [--check] [--cubins DIR] | --compile DIR [kernels/cuda/X.cu...]" >&2
  exit 2
}
mode=write
cubins=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --check) [[ $mode == write ]] || usage; mode=check; shift ;;
    --cubins) [[ $# -ge 2 && -z $cubins ]] || usage; cubins=$2; shift 2 ;;
    --compile) [[ $# -ge 2 && $mode == write && -z $cubins ]] || usage; mode=compile; cubins=$2; shift 2; break ;;
    *) usage ;;
  esac
done
[[ $mode == compile || $# -eq 0 ]] || usage
[[ -z $cubins || $cubins == /* ]] || cubins=$invoked_from/$cubins
die() { echo "kernel_resources: $*" >&2; exit 2; }

nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[[ -x $nvcc ]] || die "no nvcc (looked on PATH and at /usr/local/cuda/bin/nvcc; or set NVCC)"
command -v c++filt >/dev/null || die "c++filt (binutils) is needed to demangle kernel names"
for line in 'set(CMAKE_CUDA_ARCHITECTURES 90)' 'CUDA_STANDARD 17' 'target_compile_definitions(nanoddp_cuda PRIVATE NANODDP_WITH_CUDA=1)'; do
  grep -qF "$line" CMakeLists.txt ||
    die "CMakeLists.txt no longer has '$line': update this script's nvcc flags to match the nanoddp_cuda target"
done
flags=(-cubin -arch=sm_90 -O3 -DNDEBUG -DNANODDP_WITH_CUDA=1 -I. -std=c++17 -Xptxas -v)
table=bench/kernel_resources.md
nvcc_version=$("$nvcc" --version | grep -o 'release [0-9.]*, V[0-9.]*' || echo unknown)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# ---- compile: ptxas's report and the PTX of every file, 2 at a time -------------------------
# One job: kernels/cuda/X.cu -> $work/X.log (ptxas -v), $work/X/X.ptx (--keep), $work/X.rc.
compile_one() {
  local src=$1 name
  name=$(basename "$src" .cu)
  mkdir -p "$work/$name"
  local rc=0
  "$nvcc" "${flags[@]}" --keep --keep-dir "$work/$name" -o "$work/$name/$name.cubin" "$src" \
    >"$work/$name.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$name.rc"
}
export -f compile_one
export nvcc work
export flags_string="${flags[*]}"
sources=(kernels/cuda/*.cu)
[[ -e ${sources[0]} ]] || die "no kernels/cuda/*.cu"
if [[ $mode == compile && $# -gt 0 ]]; then
  sources=("$@")
  for src in "${sources[@]}"; do [[ $src == kernels/cuda/*.cu && -f $src ]] || die "--compile: $src is not a kernels/cuda/*.cu file"; done
fi
# Arrays do not cross `export`; the job rebuilds them from the string (no flag has a space).
printf '%s\n' "${sources[@]}" |
  xargs -P2 -n1 bash -c 'read -ra flags <<<"$flags_string"; compile_one "$1"' _
for src in "${sources[@]}"; do
  name=$(basename "$src" .cu)
  if [[ $(cat "$work/$name.rc") != 0 ]]; then
    cat "$work/$name.log" >&2
    die "$src does not compile: $nvcc ${flags[*]}"
  fi
done
if [[ -n $cubins ]]; then
  mkdir -p "$cubins"
  for src in "${sources[@]}"; do
    name=$(basename "$src" .cu)
    cp "$work/$name/$name.cubin" "$cubins/"
  done
  echo "$nvcc_version" >"$cubins/nvcc_version.txt"
  [[ $mode != compile ]] || { echo "kernel_resources: compiled ${#sources[@]} file(s) into $cubins"; exit 0; }
fi

# ---- ptxas report -> one line per kernel ------------------------------------------------------
# file, mangled name, registers, stack frame, spill stores, spill loads, static shared memory.
# Functions ptxas did not inline (no "Compiling entry function") go to $work/functions.tsv.
: >"$work/functions.tsv"
for src in "${sources[@]}"; do
  name=$(basename "$src" .cu)
  awk -v file="$name.cu" -v functions="$work/functions.tsv" -F"\047" '
    /Compiling entry function/ { entry = $2; next }
    /Function properties for / { sub(/.*Function properties for /, ""); props = $0; next }
    /bytes stack frame/ {
      stack = $0 + 0
      st = $0; sub(/.*frame, /, "", st); st += 0
      ld = $0; sub(/.*stores, /, "", ld); ld += 0
      if (props != entry) printf "%s\t%s\t%d\t%d\t%d\n", file, props, stack, st, ld >> functions
      next
    }
    /Used [0-9]+ registers/ {
      regs = $0; sub(/.*Used /, "", regs); regs += 0
      smem = 0; if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART) + 0
      printf "%s\t%s\t%d\t%d\t%d\t%d\t%d\n", file, entry, regs, stack, st, ld, smem
    }' "$work/$name.log"
done >"$work/ptxas.tsv"
[[ -s $work/ptxas.tsv ]] || die "ptxas reported no kernels (did its -v format change?)"

# ---- PTX -> __launch_bounds__ and extern __shared__ per kernel ---------------------------------
# file, mangled name, max threads (.maxntid x*y*z, or -), min blocks per SM (.minnctapersm, or
# -), 1 when the kernel's body names an extern .shared array (dynamic shared memory).
for src in "${sources[@]}"; do
  name=$(basename "$src" .cu)
  awk -v file="$name.cu" '
    /^\.extern \.shared/ { s = $NF; sub(/\[\].*/, "", s); shared[s] = 1; next }
    /\.entry / {
      k = $0; sub(/.*\.entry /, "", k); sub(/\(.*/, "", k)
      order[++n] = k; bound[k] = "-"; min[k] = "-"; dyn[k] = 0; inside = 1; next
    }
    inside && /^\.maxntid/ { gsub(/[^0-9,]/, ""); split($0, d, ","); bound[k] = d[1] * d[2] * d[3]; next }
    inside && /^\.minnctapersm/ { gsub(/[^0-9]/, ""); min[k] = $0; next }
    inside && /^}/ { inside = 0; next }
    inside { for (s in shared) if (index($0, s)) dyn[k] = 1 }
    END { for (i = 1; i <= n; ++i) printf "%s\t%s\t%s\t%s\t%d\n", file, order[i], bound[order[i]], min[order[i]], dyn[order[i]] }
  ' "$work/$name/$name.ptx"
done >"$work/ptx.tsv"

# ---- launches in the source -> block size and dynamic shared memory per kernel name ---------
# The .cu with its quoted #includes expanded in place (each once, as #pragma once does) and
# comments removed; every `name<...><<<grid, block, shared, stream>>>` gives a line:
# file, kernel name, block expression, its value (or -), shared expression, its value (or -),
# 1 when the file opts in to more than 48 KiB of dynamic shared memory. Expressions are
# evaluated when they are integer arithmetic over constants (constexpr, or const locals; the
# nearest definition before the launch wins) and dim3(...) (the product).
for src in "${sources[@]}"; do
  awk -v src="$src" '
    function expand(path,   line, inc) {
      while ((getline line < path) > 0) {
        if (line ~ /^[ \t]*#[ \t]*include[ \t]*"/) {
          inc = line; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
          if (!(inc in seen) && (getline probe < inc) >= 0) { close(inc); seen[inc] = 1; expand(inc) }
          continue
        }
        sub(/\/\/.*/, "", line)
        text = text line "\n"
      }
      close(path)
    }
    function strip_block_comments(s,   out, i, j) {
      out = ""
      while ((i = index(s, "/*")) > 0) {
        j = index(substr(s, i + 2), "*/")
        out = out substr(s, 1, i - 1)
        s = j ? substr(s, i + 2 + j + 1) : ""
      }
      return out s
    }
    function trim(s) { gsub(/^[ \t\n]+|[ \t\n]+$/, "", s); return s }
    # Constant definitions: statements (between ; { }) that are constexpr, or begin with
    # const, declaring NAME = EXPR[, NAME = EXPR...].
    function collect_definitions(   i, c, start, stmt, decl, n, parts, p, name, depth, cur, ch) {
      start = 1
      for (i = 1; i <= length(text); ++i) {
        c = substr(text, i, 1)
        if (c != ";" && c != "{" && c != "}") continue
        stmt = substr(text, start, i - start)
        if (stmt ~ /(^|[^A-Za-z0-9_])constexpr[ \t\n]/ || stmt ~ /^[ \t\n]*const[ \t\n]/) {
          # split at commas outside () and <>
          n = 0; depth = 0; cur = ""
          for (p = 1; p <= length(stmt); ++p) {
            ch = substr(stmt, p, 1)
            if (ch == "(" || ch == "<") depth++
            else if (ch == ")" || ch == ">") depth--
            if (ch == "," && depth == 0) { parts[++n] = cur; cur = "" } else cur = cur ch
          }
          parts[++n] = cur
          for (p = 1; p <= n; ++p) {
            decl = parts[p]
            if (!match(decl, /[A-Za-z_][A-Za-z0-9_]*[ \t\n]*=[^=]/)) continue
            name = substr(decl, RSTART, RLENGTH); sub(/[ \t\n]*=.*/, "", name)
            ndef++; def_name[ndef] = name; def_pos[ndef] = start
            def_expr[ndef] = trim(substr(decl, RSTART + RLENGTH - 1))
          }
        }
        start = i + 1
      }
    }
    function definition(name, pos,   d, best) {
      best = 0
      for (d = 1; d <= ndef; ++d)
        if (def_name[d] == name && (def_pos[d] < pos || !best)) best = d
      return best ? "(" def_expr[best] ")" : ""
    }
    # Integer value of a constant expression, or "" when it is not one.
    function value(e, pos,   rounds, id, d, before, after, lit) {
      e = " " e " "
      for (rounds = 0; rounds < 20; ++rounds) {
        while (match(e, /[0-9][uUlL]+/)) {  # integer literal suffixes
          lit = substr(e, RSTART, RLENGTH); gsub(/[uUlL]/, "", lit)
          e = substr(e, 1, RSTART - 1) lit substr(e, RSTART + RLENGTH)
        }
        gsub(/static_cast<[^<>]*>/, "", e)
        gsub(/(size_t|int64_t|int|unsigned)[ \t]*\(/, "(", e)
        while (match(e, /dim3[ \t]*\([^()]*\)/)) {
          d = substr(e, RSTART, RLENGTH); sub(/^dim3[ \t]*\(/, "((", d); sub(/\)$/, "))", d); gsub(/,/, ")*(", d)
          e = substr(e, 1, RSTART - 1) d substr(e, RSTART + RLENGTH)
        }
        if (!match(e, /[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*/)) break
        id = substr(e, RSTART, RLENGTH); before = substr(e, 1, RSTART - 1); after = substr(e, RSTART + RLENGTH)
        sub(/.*::/, "", id)
        if (after ~ /^[ \t\n]*[(<]/) return ""  # a function call or a template: not a constant
        d = definition(id, pos)
        if (d == "") return ""
        e = before d after
      }
      if (e ~ /[A-Za-z_]/) return ""
      gsub(/[ \t\n]/, "", e)
      if (e !~ /^[0-9()*\/+-]+$/) return ""
      return arith(e)
    }
    # + - * / and parentheses over integers (C++ division: truncation).
    function arith(e,   i, c, depth, pos) {
      while (e ~ /^\(.*\)$/ && balanced(substr(e, 2, length(e) - 2))) e = substr(e, 2, length(e) - 2)
      for (c = 1; c <= 2; ++c) {  # lowest precedence first, rightmost operator at depth 0
        depth = 0; pos = 0
        for (i = length(e); i > 1; --i) {
          if (substr(e, i, 1) == ")") depth++
          else if (substr(e, i, 1) == "(") depth--
          else if (depth == 0 && index(c == 1 ? "+-" : "*/", substr(e, i, 1)) && substr(e, i - 1, 1) !~ /[*\/+(-]/) { pos = i; break }
        }
        if (pos) {
          if (substr(e, pos, 1) == "+") return arith(substr(e, 1, pos - 1)) + arith(substr(e, pos + 1))
          if (substr(e, pos, 1) == "-") return arith(substr(e, 1, pos - 1)) - arith(substr(e, pos + 1))
          if (substr(e, pos, 1) == "*") return arith(substr(e, 1, pos - 1)) * arith(substr(e, pos + 1))
          return int(arith(substr(e, 1, pos - 1)) / arith(substr(e, pos + 1)))
        }
      }
      if (substr(e, 1, 1) == "-") return -arith(substr(e, 2))
      return e + 0
    }
    function balanced(s,   i, depth) {
      depth = 0
      for (i = 1; i <= length(s); ++i) {
        if (substr(s, i, 1) == "(") depth++
        else if (substr(s, i, 1) == ")" && --depth < 0) return 0
      }
      return depth == 0
    }
    # Arguments of the launch that starts at text position pos (just after <<<).
    function launch_arguments(pos,   end, s, i, ch, depth, n, cur) {
      end = index(substr(text, pos), ">>>")
      s = substr(text, pos, end - 1)
      n = 0; depth = 0; cur = ""
      for (i = 1; i <= length(s); ++i) {
        ch = substr(s, i, 1)
        if (ch == "(" || ch == "[" || ch == "{") depth++
        else if (ch == ")" || ch == "]" || ch == "}") depth--
        if (ch == "," && depth == 0) { args[++n] = trim(cur); cur = "" } else cur = cur ch
      }
      args[++n] = trim(cur)
      return n
    }
    # Name of the kernel launched at the <<< at text position pos.
    function kernel_before(pos,   i, depth, name) {
      i = pos - 1
      while (i > 0 && substr(text, i, 1) ~ /[ \t\n]/) i--
      if (substr(text, i, 1) == ">") {
        depth = 0
        for (; i > 0; --i) {
          if (substr(text, i, 1) == ">") depth++
          else if (substr(text, i, 1) == "<" && --depth == 0) break
        }
        i--
      }
      while (i > 0 && substr(text, i, 1) ~ /[ \t\n]/) i--
      name = ""
      while (i > 0 && substr(text, i, 1) ~ /[A-Za-z0-9_:]/) { name = substr(text, i, 1) name; i-- }
      sub(/.*::/, "", name)
      return name
    }
    function show(e) { gsub(/[ \t\n]+/, " ", e); return e }
    # The expression, and for a lone name its definition: "bytes = TcLayout<D>::forward".
    function explain(e, pos,   d) {
      if (e ~ /^[A-Za-z_][A-Za-z0-9_]*$/ && (d = definition(e, pos)) != "") e = e " = " substr(d, 2, length(d) - 2)
      return show(e)
    }
    BEGIN {
      text = ""; seen[src] = 1; expand(src)
      text = strip_block_comments(text)
      collect_definitions()
      file = src; sub(/.*\//, "", file)
      optin = index(text, "cudaFuncAttributeMaxDynamicSharedMemorySize") ? 1 : 0
      offset = 0
      while ((i = index(substr(text, offset + 1), "<<<")) > 0) {
        at = offset + i
        kernel = kernel_before(at)
        n = launch_arguments(at + 3)
        block = n >= 2 ? args[2] : "?"; shared = n >= 3 ? args[3] : "0"
        b = value(block, at); s = value(shared, at)
        printf "%s\t%s\t%s\t%s\t%s\t%s\t%d\n", file, kernel, show(block), b == "" ? "-" : b, explain(shared, at), s == "" ? "-" : s, optin
        offset = at + 3
      }
    }'
done >"$work/launches.tsv"

# ---- one table ---------------------------------------------------------------------------------
cut -f2 "$work/ptxas.tsv" | c++filt >"$work/demangled.txt"
paste "$work/ptxas.tsv" "$work/demangled.txt" >"$work/kernels.tsv"
generated="Generated $(date -u +%Y-%m-%d) from commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n $(git status --porcelain -- kernels/cuda 2>/dev/null) ]]; then
  generated+=" with uncommitted changes in kernels/cuda"
fi
out=$work/kernel_resources.md
awk -F'\t' -v ptx="$work/ptx.tsv" -v launches="$work/launches.tsv" -v functions="$work/functions.tsv" \
    -v violations="$work/violations.txt" -v generated="$generated" -v nvcc_version="$nvcc_version" \
    -v flags="${flags[*]}" '
  function ceil_div(a, b) { return int((a + b - 1) / b) }
  function round_up(a, b) { return ceil_div(a, b) * b }
  # "kernel_name<args>" without return type, parameters, or the namespaces every kernel shares.
  function short_name(d,   depth, i, ch) {
    sub(/^void /, "", d)
    depth = 0
    for (i = 1; i <= length(d); ++i) {  # the parameter list: the first ( outside <>
      ch = substr(d, i, 1)
      if (ch == "<") depth++
      else if (ch == ">") depth--
      else if (ch == "(" && depth == 0 && substr(d, i, 20) != "(anonymous namespace") { d = substr(d, 1, i - 1); break }
    }
    gsub(/\(anonymous namespace\)::/, "", d)
    gsub(/nd::kernels::cuda::/, "", d); gsub(/nd::kernels::/, "", d); gsub(/nd::/, "", d)
    gsub(/CUB_[0-9]+_SM_[0-9]+::/, "", d)
    while (gsub(/> >/, ">>", d)) {}
    return d
  }
  function base_name(s) { sub(/<.*/, "", s); sub(/.*::/, "", s); return s }
  # Blocks per SM for sm_90 (cuda_occupancy.h); sets limit to the limits that bind.
  function blocks_per_sm(regs, smem, threads,   warps, per_warp, by_regs, by_smem, by_warps, m, alloc) {
    warps = ceil_div(threads, 32)
    per_warp = round_up(regs * 32, 256)
    if (per_warp * round_up(warps, 4) > 65536) by_regs = 0
    else by_regs = per_warp ? int(int(16384 / per_warp) * 4 / warps) : 32
    alloc = round_up(smem + 1024, 128)
    by_smem = smem > 227 * 1024 ? 0 : int(228 * 1024 / alloc)
    by_warps = int(64 / warps)
    m = 32
    if (by_regs < m) m = by_regs
    if (by_smem < m) m = by_smem
    if (by_warps < m) m = by_warps
    limit = ""
    if (by_regs == m) limit = limit ", registers"
    if (by_smem == m) limit = limit ", shared memory"
    if (by_warps == m) limit = limit ", warps"
    if (m == 32) limit = limit ", 32 blocks"
    limit = substr(limit, 3)
    return m
  }
  function fail(msg) { print msg > violations }
  BEGIN {
    while ((getline line < ptx) > 0) {
      split(line, f, "\t"); k = f[1] SUBSEP f[2]
      bound[k] = f[3]; minblocks[k] = f[4]; dyn[k] = f[5]
    }
    while ((getline line < launches) > 0) {
      split(line, f, "\t"); key = f[1] SUBSEP f[2]
      optin[f[1]] = f[7]
      if (!(key in block_expr)) { block_expr[key] = f[3]; block_val[key] = f[4]; shared_expr[key] = f[5]; shared_val[key] = f[6]; continue }
      if (index(" " block_expr[key] " / ", " " f[3] " /") == 0) { block_expr[key] = block_expr[key] " / " f[3]; if (f[4] != block_val[key]) block_val[key] = "-" }
      if (index(" " shared_expr[key] " / ", " " f[5] " /") == 0) { shared_expr[key] = shared_expr[key] " / " f[5]; if (f[6] != shared_val[key]) shared_val[key] = "-" }
    }
    while ((getline line < functions) > 0) {
      split(line, f, "\t")
      if (f[4] || f[5]) fail(sprintf("%s: device function %s spills: %d bytes spill stores, %d bytes spill loads (budget: 0)", f[1], f[2], f[4], f[5]))
    }
  }
  {
    file = $1; mangled = file SUBSEP $2; regs = $3; stack = $4; st = $5; ld = $6; smem = $7
    name = short_name($8); key = file SUBSEP base_name(name)
    ++n; row_file[n] = file; row_name[n] = name; row_full[n] = $8
    if ((file SUBSEP name) in taken) ambiguous[file SUBSEP name] = 1
    taken[file SUBSEP name] = 1

    b = bound[mangled]
    bounds = b == "-" || b == "" ? "none" : b (minblocks[mangled] != "-" && minblocks[mangled] != "" ? ", min " minblocks[mangled] " blocks/SM" : "")
    launch = (key in block_expr) ? "launch `" block_expr[key] "`" : "no launch in our source"
    if ((key in block_val) && block_val[key] != "-") { threads = block_val[key]; basis = launch }
    else if (b != "-" && b != "") { threads = b; basis = "launch bounds; " launch }
    else { threads = 256; basis = "assumed; " launch }

    dynamic = 0; dyn_note = ""
    if (dyn[mangled]) {
      if ((key in shared_val) && shared_val[key] != "-") dynamic = shared_val[key]
      ndyn++
      dyn_row[ndyn] = sprintf("| `%s` | %s | %s | %s | %s |", name, file,
        (key in shared_expr) ? "`" shared_expr[key] "`" : "(no launch in our source)",
        (key in shared_val) && shared_val[key] != "-" ? shared_val[key] " B" : "launch-dependent",
        optin[file] ? "yes (cudaFuncSetAttribute in " file ")" : "no")
      dyn_note = (key in shared_val) && shared_val[key] != "-" ? "; with " shared_val[key] " B dynamic" : "; dynamic shared memory not counted"
    }
    blocks = blocks_per_sm(regs, smem + dynamic, threads)
    warps = blocks * ceil_div(threads, 32)
    occ = sprintf("%d block%s, %d warps (%d%%)", blocks, blocks == 1 ? "" : "s", warps, int(100 * warps / 64 + 0.5))
    row[n] = sprintf("%s | %d | %s | %d | %s | %s | %d (%s) | %s | %s |", file, regs, st "/" ld, stack, smem, bounds, threads, basis,
                     occ dyn_note, limit)

    if (st || ld) {
      fail(sprintf("%s: %s spills: %d bytes spill stores, %d bytes spill loads (budget: 0; stack frame %d bytes)", file, name, st, ld, stack))
      spills = spills sprintf("\n- `%s` (%s): %d bytes spill stores, %d bytes spill loads", name, file, st, ld)
    }
    if (smem > 48 * 1024)
      fail(sprintf("%s: %s has %d bytes of static shared memory; above 48 KiB only dynamic shared memory is allowed (extern __shared__ and cudaFuncSetAttribute(MaxDynamicSharedMemorySize))", file, name, smem))
    if (smem + dynamic > 48 * 1024 && dynamic && !optin[file])
      fail(sprintf("%s: %s takes %d bytes of shared memory (%d static + %d dynamic) without cudaFuncSetAttribute(MaxDynamicSharedMemorySize) in %s", file, name, smem + dynamic, smem, dynamic, file))
    if (smem + dynamic > 227 * 1024)
      fail(sprintf("%s: %s takes %d bytes of shared memory (%d static + %d dynamic), above sm_90'"'"'s 227 KiB per block", file, name, smem + dynamic, smem, dynamic))
    if (blocks == 0)
      fail(sprintf("%s: %s cannot run one block of %d threads on an SM (%d registers, %d bytes shared memory)", file, name, threads, regs, smem + dynamic))

    files[file]++
    if (regs > max_regs) { max_regs = regs; max_regs_at = "`" name "` (" file ")" }
    if (!(file in file_regs) || regs > file_regs[file]) file_regs[file] = regs
    if (!(file in file_occ) || warps / 64 < file_occ[file]) file_occ[file] = warps / 64
    if (smem > file_smem[file] + 0) file_smem[file] = smem
    if (lowest == "" || warps / 64 < lowest) { lowest = warps / 64; lowest_at = "`" name "` (" file ", " occ ")" }
  }
  END {
    for (i = 1; i <= n; ++i) if ((row_file[i] SUBSEP row_name[i]) in ambiguous) { row_name[i] = row_full[i]; sub(/^void /, "", row_name[i]) }
    nfiles = 0; for (fn in files) nfiles++
    print "# CUDA kernel resources (sm_90)"
    print ""
    print "Written by `bench/kernel_resources.sh` (do not edit by hand); regenerate with"
    print "`bash bench/kernel_resources.sh`. CI runs it with `--check`, which fails when this file is"
    print "stale or a kernel breaks a budget: spill stores or loads above 0 bytes, static shared memory"
    print "above 48 KiB, more than 48 KiB in all without cudaFuncSetAttribute(MaxDynamicSharedMemorySize),"
    print "more than 227 KiB in all, or no block fitting on an SM."
    print ""
    print generated "."
    print ""
    print "- Compiler: nvcc " nvcc_version "; each `kernels/cuda/*.cu` compiled as"
    print "  `nvcc " flags "`"
    print "  (device code only, with the nanoddp_cuda target'"'"'s flags). Every template instantiation is a"
    print "  row; a kernel defined in a header appears once per file that instantiates it."
    print "- Occupancy: theoretical, per SM of an H200 (sm_90), as the CUDA occupancy calculator computes it:"
    print "  65536 registers in 4 sub-partitions allocated per warp in units of 256, at most 64 warps and"
    print "  32 blocks, 228 KiB of shared memory (the largest carveout; the driver may pick a smaller one)"
    print "  in units of 128 bytes with 1 KiB reserved per block. It ignores the grid (a small grid"
    print "  fills fewer SMs), dynamic shared memory the source does not give as a constant, memory"
    print "  bandwidth and latency: it bounds how many warps can be resident, not how fast a kernel runs."
    print "- Block size: the launch'"'"'s, where the source gives it as constants (`launch ...`); else the"
    print "  `__launch_bounds__` maximum; else an assumed 256. Launch bounds `none`: no `__launch_bounds__`."
    print ""
    print "## Summary"
    print ""
    printf "%d kernels in %d files. Most registers: %d, %s. Lowest occupancy: %s.\n", n, nfiles, max_regs, max_regs_at, lowest_at
    printf "Spills: %s\n", spills == "" ? "none." : "(budget: 0 bytes)\n" spills
    print ""
    print "| file | kernels | most registers | most static shared memory (B) | lowest occupancy |"
    print "|------|--------:|---------------:|------------------------------:|-----------------:|"
    fflush(); cmd = "sort"
    for (fn in files) printf "| %s | %d | %d | %d | %d%% |\n", fn, files[fn], file_regs[fn], file_smem[fn], int(100 * file_occ[fn] + 0.5) | cmd
    close(cmd)
    print ""
    print "## Dynamic shared memory"
    print ""
    if (!ndyn) print "No kernel uses `extern __shared__`."
    else {
      print "Kernels with `extern __shared__`; the size is set at launch (third launch argument)."
      print "Launch-dependent sizes are not in the occupancy column."
      print ""
      print "| kernel | file | launch size | bytes | opt-in above 48 KiB |"
      print "|--------|------|-------------|------:|---------------------|"
      fflush(); cmd = "sort -t\"|\" -k3,3 -k2,2"
      for (i = 1; i <= ndyn; ++i) print dyn_row[i] | cmd
      close(cmd)
    }
    print ""
    print "## Kernels"
    print ""
    print "| kernel | file | registers | spill stores/loads (B) | stack frame (B) | static shared (B) | launch bounds (max threads) | block size (basis) | occupancy per SM | limited by |"
    print "|--------|------|----------:|-----------------------:|----------------:|------------------:|-----------------------------|--------------------|------------------|------------|"
    fflush(); cmd = "sort -t\"|\" -k3,3 -k2,2"
    for (i = 1; i <= n; ++i) printf "| `%s` | %s\n", row_name[i], row[i] | cmd
    close(cmd)
  }' "$work/kernels.tsv" >"$out"

# ---- write or check ------------------------------------------------------------------------------
status=0
if [[ $mode == write ]]; then
  cp "$out" "$table"
  echo "kernel_resources: wrote $table: $(grep -m1 ' kernels in ' "$table")"
else
  committed_version=$(grep -o 'nvcc release [0-9.]*, V[0-9.]*' "$table" 2>/dev/null | head -1 || true)
  if [[ ! -f $table ]]; then
    echo "kernel_resources: $table is missing; run bash bench/kernel_resources.sh and commit it" >&2
    status=1
  elif [[ $committed_version != "nvcc $nvcc_version" ]]; then
    echo "kernel_resources: $table was made with ${committed_version:-an unknown nvcc}, this is nvcc $nvcc_version:" \
      "not compared (budgets still checked)"
  elif ! diff -u --label "$table (committed)" --label "$table (regenerated)" \
      <(grep -v '^Generated ' "$table") <(grep -v '^Generated ' "$out"); then
    echo "kernel_resources: $table is stale (diff above); run bash bench/kernel_resources.sh and commit it" >&2
    status=1
  else
    echo "kernel_resources: $table is up to date"
  fi
fi
if [[ -s $work/violations.txt ]]; then
  echo "kernel_resources: $(wc -l <"$work/violations.txt") kernel budget violation(s):" >&2
  sed 's/^/  /' "$work/violations.txt" >&2
  status=1
fi
exit "$status"
