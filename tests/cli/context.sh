#!/bin/sh
# Context sizes of `generate`: a dynamic-NTK model (tests/fixtures/golden/
# llama_dynamic: max_position_embeddings 8, rope_scaling dynamic factor 2)
# runs past max_position_embeddings without --ctx (its default context is
# 8 x 2 = 16, where transformers sets no bound) and its tokens are those of
# transformers (golden.json, float64 reference): the first ones by default,
# all 16 with --ctx 28; -c / --ctx-size are --ctx (in perplexity too); a
# model without dynamic rope keeps its trained context.
# Usage (from the repo root): sh tests/cli/context.sh path/to/mlxcel
BIN=${1:?usage: context.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL context: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }

M=tests/fixtures/golden/llama_dynamic
# the golden's ids, from its JSON: "input_ids": [..], "greedy_ids": [..]
field() { tr -d ' \n\r\t' <"$M/golden.json" | sed -n "s/.*\"$1\":\\[\\([0-9,]*\\)\\].*/\\1/p"; }
IN=$(field input_ids)
GREEDY=$(field greedy_ids)
[ -n "$IN" ] && [ -n "$GREEDY" ] || fail "cannot read the golden ids"
n_in=$(echo "$IN" | tr ',' '\n' | wc -l)
[ "$n_in" -gt 8 ] || fail "the golden prompt ($n_in ids) does not pass max_position_embeddings 8"
# the first k greedy ids as generate --output-ids prints them: [a, b, c]
want() { echo "[$(echo "$GREEDY" | cut -d, -f1-"$1" | sed 's/,/, /g')]"; }

# ---- by default: past max_position_embeddings, the default context 16 ----
k=$((16 - n_in))
run "$BIN" generate -m "$M" --prompt-ids "$IN" -n "$k" --output-ids --temp 0
expect_rc 0 "dynamic NTK past max_position_embeddings by default"
[ "$(cat "$T/out")" = "$(want $k)" ] || fail "default run: $(cat "$T/out"), transformers: $(want $k)"
# a run longer than the default context stops at it and says so (the last token is
# sampled from position 16 and never stored, so one more than k)
run "$BIN" generate -m "$M" --prompt-ids "$IN" -n 16 --output-ids --temp 0
expect_rc 0 "a run to the default context"
[ "$(cat "$T/out")" = "$(want $((k + 1)))" ] || fail "run to the default context: $(cat "$T/out")"
grep -q "context of 16 tokens is full" "$T/err" || fail "no word of the full context: $(cat "$T/err")"

# ---- all 16 golden tokens with a larger context, under each spelling of the flag ----
for flag in "--ctx 28" "-c 28" "--ctx-size 28" "--ctx=28" "--ctx-size=28"; do
    # shellcheck disable=SC2086
    run "$BIN" generate -m "$M" --prompt-ids "$IN" -n 16 --output-ids --temp 0 $flag
    expect_rc 0 "generate $flag"
    [ "$(cat "$T/out")" = "$(want 16)" ] || fail "$flag: $(cat "$T/out"), transformers: $(want 16)"
done

# ---- a model without dynamic rope keeps its trained context (256) ----
LONG=$(seq 10 300 | paste -sd, -)
run "$BIN" generate -m tests/fixtures/golden/llama --prompt-ids "$LONG" -n 2 --output-ids --temp 0
expect_rc 1 "llama past its context"
grep -q "the context holds 256 (the model's limit)" "$T/err" || fail "llama past its context: $(cat "$T/err")"

# ---- perplexity takes -c / --ctx / --ctx-size alike ----
seq 1 60 | tr '\n' ' ' >"$T/ids.txt"
for flag in "--ctx 16" "-c 16" "--ctx-size 16"; do
    # shellcheck disable=SC2086
    run "$BIN" perplexity -m tests/fixtures/golden/llama --ids-file "$T/ids.txt" --json $flag
    expect_rc 0 "perplexity $flag"
    cp "$T/out" "$T/ppl.$(echo "$flag" | tr -d ' -')"
done
cmp -s "$T/ppl.ctx16" "$T/ppl.c16" && cmp -s "$T/ppl.ctx16" "$T/ppl.ctxsize16" || fail "perplexity: the spellings differ"
grep -q '"n_tokens": *[0-9]' "$T/ppl.ctx16" || fail "perplexity --json lacks n_tokens: $(cat "$T/ppl.ctx16")"
echo "context: ok"
