#!/bin/sh
# Every golden checkpoint (tests/fixtures/golden/*, transformers' greedy ids)
# generates its greedy ids with 1, 2, 3 and 4 threads (3 and 4 are more than
# this host's CPUs on a 2-CPU machine), and with 2 threads beside a process
# that spins on a CPU: the pool's parts may run on any thread (ADR 0052), and
# the bits must not depend on which, or on how busy the machine is.
# Usage (from the repo root): sh tests/cli/threads.sh path/to/mlxcel
BIN=${1:?usage: threads.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
HOG=
trap '[ -n "$HOG" ] && kill "$HOG" 2>/dev/null; rm -rf "$T"' EXIT
trap 'exit 1' INT TERM

fail() { echo "FAIL threads: $*" >&2; exit 1; }
field() { tr -d ' \n\r\t' <"$1/golden.json" | sed -n "s/.*\"$2\":\\[\\([0-9,]*\\)\\].*/\\1/p"; }
check() {  # DIR THREADS LABEL
    out=$(timeout 120 "$BIN" generate -m "$1" --prompt-ids "$IN" -n "$n" --output-ids --temp 0 --ignore-eos \
        -t "$2" -c 64 2>"$T/err") || fail "$(basename "$1") $3: $(cat "$T/err")"
    [ "$out" = "$want" ] || fail "$(basename "$1") $3: $out, transformers: $want"
}
runs=0
for d in tests/fixtures/golden/*/; do
    d=${d%/}
    # image cases need their images (the vision and qwen_vl suites, generate_image.sh, qwen_vl.sh)
    grep -q '"n_images"' "$d/golden.json" 2>/dev/null && continue
    IN=$(field "$d" input_ids)
    G=$(field "$d" greedy_ids)
    [ -n "$IN" ] && [ -n "$G" ] || continue
    n=$(echo "$G" | tr ',' '\n' | wc -l)
    want="[$(echo "$G" | sed 's/,/, /g')]"
    for t in 1 2 3 4; do
        check "$d" $t "-t $t"
        runs=$((runs + 1))
    done
done
[ "$runs" -ge 40 ] || fail "only $runs runs: the goldens were not found"
# two threads beside a spinning process
sh -c 'while :; do :; done' &
HOG=$!
for d in tests/fixtures/golden/llama tests/fixtures/golden/phixtral_mlx_q4 tests/fixtures/golden/qwen3_moe; do
    IN=$(field "$d" input_ids)
    G=$(field "$d" greedy_ids)
    n=$(echo "$G" | tr ',' '\n' | wc -l)
    want="[$(echo "$G" | sed 's/,/, /g')]"
    check "$d" 2 "-t 2 beside a busy CPU"
done
echo "threads: ok ($runs runs)"
