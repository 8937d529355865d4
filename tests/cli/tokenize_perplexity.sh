#!/bin/sh
# `mlxcel tokenize` on a folder holding only tokenizer files, from -p and -f;
# `mlxcel perplexity` with --ids-file as a JSON array and as whitespace-separated
# ids (same result), with -f text, and with windows smaller than the input;
# `generate --prompt-ids` on the default model and the context-overflow error.
# Usage (from the repo root): sh tests/cli/tokenize_perplexity.sh path/to/mlxcel
BIN=${1:?usage: tokenize_perplexity.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL tokenize_perplexity: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }

# ---- tokenize: a folder with only the tokenizer ----
mkdir "$T/tok"
cp models/llama-tiny/tokenizer.json models/llama-tiny/tokenizer_config.json "$T/tok/"
run "$BIN" tokenize -m "$T/tok" -p "ROMEO:
"
expect_rc 0 "tokenize -p"
[ "$(cat "$T/out")" = "[818, 30, 203]" ] || fail "tokenize -p gave $(cat "$T/out")"
printf 'ROMEO:\n' >"$T/prompt.txt"
run "$BIN" tokenize -m "$T/tok" -f "$T/prompt.txt"
expect_rc 0 "tokenize -f"
[ "$(cat "$T/out")" = "[818, 30, 203]" ] || fail "tokenize -f gave $(cat "$T/out")"
run "$BIN" tokenize -m "$T/tok" -f "$T/missing.txt"
expect_rc 1 "tokenize -f missing"
grep -q "missing.txt" "$T/err" || fail "missing file not named: $(cat "$T/err")"

# ---- perplexity: both id-file forms agree ----
ids="35 203 203 1700 1517 30 203 1279 266 785 16 433 783 70 330 544 69 637 738 69 18 203"
echo "$ids" >"$T/ids.txt"
echo "[$(echo "$ids" | sed 's/ /, /g')]" >"$T/ids.json"
run "$BIN" perplexity -m models/llama-tiny --ids-file "$T/ids.txt" --json
expect_rc 0 "perplexity whitespace ids"
a=$(cat "$T/out")
run "$BIN" perplexity -m models/llama-tiny --ids-file "$T/ids.json" --json
expect_rc 0 "perplexity JSON ids"
[ "$a" = "$(cat "$T/out")" ] || fail "JSON and whitespace id files differ: $a vs $(cat "$T/out")"
case "$a" in *'"tokens": 21}'*) ;; *) fail "expected 21 scored tokens: $a" ;; esac
# windows of 8: 22 ids -> 8 + 8 + 6, scoring 7 + 7 + 5 = 19 positions
run "$BIN" perplexity -m models/llama-tiny --ids-file "$T/ids.txt" --ctx 8 --json
expect_rc 0 "perplexity --ctx 8"
case "$(cat "$T/out")" in *'"tokens": 19}'*) ;; *) fail "--ctx 8 should score 19: $(cat "$T/out")" ;; esac
# text input
run "$BIN" perplexity -m models/llama-tiny -f "$T/prompt.txt" --json
expect_rc 0 "perplexity -f"
case "$(cat "$T/out")" in *'"tokens": 2}'*) ;; *) fail "-f prompt should score 2: $(cat "$T/out")" ;; esac
echo "[1, 2" >"$T/bad.json"
run "$BIN" perplexity -m models/llama-tiny --ids-file "$T/bad.json"
expect_rc 1 "perplexity unterminated JSON"
echo "1 5000000" >"$T/oov.txt"
run "$BIN" perplexity -m models/llama-tiny --ids-file "$T/oov.txt"
expect_rc 1 "perplexity id outside the vocabulary"
grep -q "vocabulary" "$T/err" || fail "out-of-vocabulary id not explained: $(cat "$T/err")"

# ---- generate: default model, raw ids, context limits ----
# the default is models/phixtral-tiny-4bit (its continuations are checked against
# the float64 reference in the models suite): the same ids with and without -m
run "$BIN" generate -m models/phixtral-tiny-4bit --prompt-ids 818,30,203 -n 5 --temp 0 --ignore-eos --output-ids
expect_rc 0 "generate -m models/phixtral-tiny-4bit"
cp "$T/out" "$T/explicit"
run "$BIN" generate --prompt-ids 818,30,203 -n 5 --temp 0 --ignore-eos --output-ids
expect_rc 0 "generate default model"
grep -q '^\[[0-9]*, [0-9]*, [0-9]*, [0-9]*, [0-9]*\]$' "$T/out" || fail "default model greedy ids: $(cat "$T/out")"
cmp -s "$T/out" "$T/explicit" || fail "default model is not phixtral-tiny-4bit: $(cat "$T/out") vs $(cat "$T/explicit")"
run "$BIN" generate --prompt-ids 818,30,203 -n 5 --ctx 2
expect_rc 1 "prompt longer than --ctx"
grep -q "context" "$T/err" || fail "context overflow not explained: $(cat "$T/err")"
run "$BIN" generate --prompt-ids 818,30,203 -n 10 --ctx 6 --temp 0 --ignore-eos --output-ids
expect_rc 0 "generation stops when the context is full"
grep -q "context of 6 tokens is full" "$T/err" || fail "full context not reported: $(cat "$T/err")"
exit 0
