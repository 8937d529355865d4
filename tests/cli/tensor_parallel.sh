#!/bin/sh
# --tensor-parallel / -tp (models/tp.h, ADR 0139) through the CLI: greedy generation of the
# embedded llama-tiny and of phixtral-tiny (MoE) gives the same text unsplit and over 2 and 4
# CPU ranks; bench names the ranks (table and --json); perplexity over 2 ranks is the unsplit
# one within 1e-5; values out of range, a missing value and the commands that split no model are
# refused with a message and exit 2.
# Usage (from the repo root): sh tests/cli/tensor_parallel.sh path/to/mlxcel
BIN=${1:?usage: tensor_parallel.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL tensor_parallel: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }

for m in models/llama-tiny tests/fixtures/models/phixtral-tiny; do
    run "$BIN" generate -m "$m" -p "The king said" -n 16 --temp 0 -t 2
    expect_rc 0 "generate $m"
    cp "$T/out" "$T/ref"
    [ -s "$T/ref" ] || fail "generate $m: no text"
    for tp in 2 4; do
        run "$BIN" generate -m "$m" -p "The king said" -n 16 --temp 0 -t 2 --tensor-parallel $tp
        expect_rc 0 "generate $m --tensor-parallel $tp"
        cmp -s "$T/out" "$T/ref" || fail "generate $m over $tp ranks: '$(cat "$T/out")', unsplit '$(cat "$T/ref")'"
    done
done

run "$BIN" bench -m models/llama-tiny -p 8 -n 4 -r 1 -t 2 -tp 2
expect_rc 0 "bench -tp 2"
grep -q "x2 |" "$T/out" || fail "bench -tp 2: the backend column does not name the ranks: $(cat "$T/out")"
run "$BIN" bench -m models/llama-tiny -p 8 -n 0 -r 1 -t 2 -tp 2 --json
expect_rc 0 "bench -tp 2 --json"
tr -d ' \t\n' <"$T/out" | grep -q '"tensor_parallel":2' || fail "bench --json: no tensor_parallel 2: $(cat "$T/out")"

printf 'The king said unto the people that the land was theirs, and the people answered him.\n' >"$T/text"
run "$BIN" perplexity -m models/llama-tiny -f "$T/text" -t 2
expect_rc 0 "perplexity"
grep -o "[0-9]*\.[0-9]*" "$T/out" | head -1 >"$T/p1"
run "$BIN" perplexity -m models/llama-tiny -f "$T/text" -t 2 -tp 2
expect_rc 0 "perplexity -tp 2"
grep -o "[0-9]*\.[0-9]*" "$T/out" | head -1 >"$T/p2"
# the ranks' partial sums meet in another order than one product's (ADR 0139: within 1e-5 of
# the unsplit run; on AVX2 135.9038 against 135.9039), so the two agree to 1e-5 relative
[ -s "$T/p1" ] && [ -s "$T/p2" ] && awk -v a="$(cat "$T/p1")" -v b="$(cat "$T/p2")" \
    'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 1e-5 * a) }' ||
    fail "perplexity over 2 ranks $(cat "$T/p2"), unsplit $(cat "$T/p1")"

for bad in 0 9 two; do
    run "$BIN" generate -m models/llama-tiny -p hi -n 1 --tensor-parallel $bad
    expect_rc 2 "--tensor-parallel $bad"
    grep -q "tensor-parallel" "$T/err" || fail "--tensor-parallel $bad: the message does not name the flag: $(cat "$T/err")"
done
run "$BIN" generate -m models/llama-tiny -p hi -n 1 --tensor-parallel
expect_rc 2 "--tensor-parallel without a value"
for cmd in embed tokenize inspect; do
    run "$BIN" $cmd -m models/llama-tiny -tp 2
    expect_rc 2 "$cmd -tp 2"
    grep -q "splits no model" "$T/err" || fail "$cmd -tp 2: $(cat "$T/err")"
done
"$BIN" generate --help | grep -q -- "--tensor-parallel" || fail "generate --help does not list --tensor-parallel"
echo "tensor_parallel: ok"
