#!/bin/sh
# `mlxcel tokenize` on the committed SentencePiece-style (llama2) and
# byte-level (gpt2) fixtures: default ids have no special tokens, --special
# adds the template's BOS, --no-special still works, --json carries ids and
# pieces, --stats reports on stderr, and errors are one line with exit 1.
# Expected ids are the HF reference values of
# tests/fixtures/tokenizers/*/golden.json ("Hello world").
# Usage (from the repo root): sh tests/cli/tokenize.sh path/to/mlxcel
BIN=${1:?usage: tokenize.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL tokenize: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
expect_out() { [ "$(cat "$T/out")" = "$1" ] || fail "$2: got '$(cat "$T/out")', want '$1'"; }

# unpack a fixture folder: tokenizer.json.xz -> tokenizer.json
unpack() {
    mkdir "$T/$1"
    xz -dc "tests/fixtures/tokenizers/$1/tokenizer.json.xz" >"$T/$1/tokenizer.json" ||
        fail "cannot unpack $1"
    cp "tests/fixtures/tokenizers/$1/tokenizer_config.json" "$T/$1/"
}
unpack llama2
unpack gpt2

run "$BIN" tokenize -m "$T/llama2" -p "Hello world"
expect_rc 0 "llama2 default"
expect_out "[15043, 3186]" "llama2 default"
run "$BIN" tokenize -m "$T/llama2" -p "Hello world" --special
expect_rc 0 "llama2 --special"
expect_out "[1, 15043, 3186]" "llama2 --special"
run "$BIN" tokenize -m "$T/llama2" -p "Hello world" --no-special
expect_rc 0 "llama2 --no-special"
expect_out "[15043, 3186]" "llama2 --no-special"
printf 'Hello world' >"$T/in.txt"
run "$BIN" tokenize -m "$T/gpt2" -f "$T/in.txt" --special
expect_rc 0 "gpt2 -f"
expect_out "[15496, 995]" "gpt2 -f"

# --json: ids, pieces in the vocab's alphabet, n_tokens
run "$BIN" tokenize -m "$T/gpt2" -p "Hello world" --json
expect_rc 0 "--json"
tr -d ' \t\n' <"$T/out" >"$T/flat"
grep -q '"ids":\[15496,995\]' "$T/flat" || fail "--json ids: $(cat "$T/out")"
grep -q '"pieces":\["Hello","Ġworld"\]' "$T/flat" || fail "--json pieces: $(cat "$T/out")"
grep -q '"n_tokens":2' "$T/flat" || fail "--json n_tokens: $(cat "$T/out")"

# --stats: one line on stderr with the load time and throughput; stdout unchanged
run "$BIN" tokenize -m "$T/gpt2" -f "$T/in.txt" --stats --repeat 2
expect_rc 0 "--stats"
expect_out "[15496, 995]" "--stats stdout"
grep -q '^load [0-9.]* s (cpu [0-9.]* s), 11 bytes -> 2 tokens in .* (best of 2): .* MB/s$' "$T/err" ||
    fail "--stats line: $(cat "$T/err")"
run "$BIN" tokenize -m "$T/gpt2" -p "x" --stats --json
grep -q '"mb_per_s"' "$T/out" || fail "--stats --json: $(cat "$T/out")"

# errors: invalid UTF-8 text, missing tokenizer, bad --repeat
printf 'ab\377cd' >"$T/bad.txt"
run "$BIN" tokenize -m "$T/gpt2" -f "$T/bad.txt"
expect_rc 1 "invalid UTF-8"
grep -q 'not valid UTF-8 at byte 2' "$T/err" || fail "invalid UTF-8 message: $(cat "$T/err")"
[ "$(wc -l <"$T/err")" -eq 1 ] || fail "invalid UTF-8: more than one line on stderr"
mkdir "$T/empty"
run "$BIN" tokenize -m "$T/empty" -p "x"
expect_rc 1 "no tokenizer.json"
grep -q 'tokenizer.json' "$T/err" || fail "missing tokenizer not named: $(cat "$T/err")"
run "$BIN" tokenize -m "$T/gpt2" -p "x" --stats --repeat 0
expect_rc 2 "--repeat 0"
echo "ok tokenize"
