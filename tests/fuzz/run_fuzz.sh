#!/usr/bin/env bash
# Builds tests/fuzz/safetensors_header_fuzz.cpp with libFuzzer + AddressSanitizer and
# runs it for a bounded time (default 60 s; FUZZ_SECONDS=N to change). Exits non-zero
# on a crash; prints SKIPPED and exits 0 when clang cannot build fuzzers here.
# Usage: tests/fuzz/run_fuzz.sh [extra libFuzzer flags]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
seconds="${FUZZ_SECONDS:-60}"
cxx="${CXX_FUZZ:-$(command -v clang++ || command -v clang++-14 || true)}"
work="${FUZZ_WORK_DIR:-$root/build-fuzz}"
mkdir -p "$work/corpus"

if [[ -z "$cxx" ]] || ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    "$cxx" -x c++ -fsanitize=fuzzer,address - -o "$work/probe" >/dev/null 2>&1; then
  echo "SKIPPED: no clang++ able to build -fsanitize=fuzzer,address (install clang and libclang-rt-dev)"
  exit 0
fi

# checkpoint.cpp and json.cpp get coverage instrumentation; the rest of the engine (which the parser
# does not run, but load()/save() link against) only AddressSanitizer. Objects are cached.
common=(-std=c++20 -O1 -g -fopenmp -I"$root" -I"$root/include" $(pkg-config --cflags eigen3 2>/dev/null || echo -I/usr/include/eigen3))
mkdir -p "$work/obj"
# An object is rebuilt when its source or any header is newer.
stamp="$work/obj/.newest_header"
touch -r "$(find "$root/engine" "$root/kernels" "$root/include" -name '*.h' -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)" "$stamp"
compile() {  # source, extra flags...
  local src="$1" obj="$work/obj/$(echo "${1#$root/}" | tr / _).o"
  shift
  if [[ ! "$obj" -nt "$src" || ! "$obj" -nt "$stamp" ]]; then "$cxx" "${common[@]}" "$@" -c "$src" -o "$obj"; fi
  echo "$obj"
}
export -f compile; export root work cxx stamp
echo "building $work/safetensors_header_fuzz with $cxx ..."
engine=$(find "$root/engine" "$root/kernels/cpu" "$root/kernels/cuda" -name '*.cpp' ! -path '*/io/checkpoint.cpp' ! -path '*/io/json.cpp' | sort)
# In an archive, so the linker takes only what the target reaches.
rm -f "$work/engine.a"
echo "$engine" | COMMON="${common[*]}" xargs -P "$(nproc)" -I{} bash -c 'common=($COMMON); compile {} -fsanitize=address' |
  xargs ar rcs "$work/engine.a"
sanitize=(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined)
objs=("$(compile "$root/tests/fuzz/safetensors_header_fuzz.cpp" "${sanitize[@]}")"
      "$(compile "$root/io/checkpoint.cpp" "${sanitize[@]}")"
      "$(compile "$root/io/json.cpp" "${sanitize[@]}")")
"$cxx" -fopenmp -fsanitize=fuzzer,address,undefined "${objs[@]}" "$work/engine.a" -lz -o "$work/safetensors_header_fuzz"

# Seeds: the golden files and a few small valid and broken headers.
cp "$root"/tests/golden/*.safetensors "$work/corpus/" 2>/dev/null || true
seed() { python3 - "$work/corpus/$1" "$2" "$3" <<'PY'
import sys
h, data = sys.argv[2].encode(), bytes(int(sys.argv[3]))
open(sys.argv[1], "wb").write(len(h).to_bytes(8, "little") + h + data)
PY
}
seed seed_empty '{}' 0
seed seed_meta '{"__metadata__":{"a":"b"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' 8
seed seed_two '{"a":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"I64","shape":[],"data_offsets":[1,9]}}' 9
seed seed_esc '{"\u00e9\ud83d\ude00":{"dtype":"BF16","shape":[0,4],"data_offsets":[0,0]}}' 0

echo "fuzzing for ${seconds}s ..."
"$work/safetensors_header_fuzz" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$work/" "$@" "$work/corpus"
echo "fuzz: no crash in ${seconds}s"
