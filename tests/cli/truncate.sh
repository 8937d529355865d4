#!/bin/sh
# `generate --truncate` keeps what llama.cpp's --keep keeps: the head of the
# prompt (--keep N; by default a chat prompt's system message and user header,
# else BOS) and a chat template's generation prompt, and leaves room for the
# -n tokens asked for (at most half the context). Each truncated run is checked
# against a run of exactly the ids it should have kept (--prompt-ids), so the
# cut is checked token by token; and a context overflow says what to do.
# Usage (from the repo root): sh tests/cli/truncate.sh path/to/mlxcel
BIN=${1:?usage: truncate.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL truncate: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
M=models/llama-tiny
# ids a..b (1-based, inclusive) of a comma list
pick() { echo "$1" | cut -d, -f"$2"; }

# ---- ids: --keep N keeps the first N, left drops the oldest after them ----
LONG=$(seq 10 49 | paste -sd, -)        # 40 ids; ctx 16, -n 4: 12 kept
run "$BIN" generate -m $M --prompt-ids "$LONG" -n 4 --temp 0 --ctx 16 --output-ids --truncate left --keep 3
expect_rc 0 "--truncate left --keep 3"
grep -q "dropped 28 of 40 tokens (the oldest, keeping the first 3) .* room for 4" "$T/err" ||
    fail "--keep 3: $(cat "$T/err")"
cp "$T/out" "$T/cut"
run "$BIN" generate -m $M --prompt-ids "$(pick "$LONG" 1-3),$(pick "$LONG" 32-40)" -n 4 --temp 0 --ctx 16 --output-ids
cmp -s "$T/out" "$T/cut" || fail "--keep 3 left: $(cat "$T/cut"), the kept ids give $(cat "$T/out")"
# nothing protected: the message says only what was dropped, not "the first 0 and the last 0"
run "$BIN" generate -m $M --prompt-ids "$LONG" -n 4 --temp 0 --ctx 16 --output-ids --truncate left --keep 0
expect_rc 0 "--truncate left --keep 0"
grep -q "dropped 28 of 40 tokens (the oldest) to fit the context of 16 with room for 4" "$T/err" ||
    fail "--keep 0: $(cat "$T/err")"
# -n larger than half the context: half of it stays for the prompt
run "$BIN" generate -m $M --prompt-ids "$LONG" -n 100 --temp 0 --ctx 16 --output-ids --truncate right
expect_rc 0 "--truncate right -n 100"
grep -q "dropped 32 of 40" "$T/err" || fail "-n 100 into ctx 16: $(cat "$T/err")"

# ---- a chat prompt: the system message and the generation prompt stay ----
SYS="You are a terse assistant who answers in one word."
USER=$(seq 1 200 | paste -sd' ' -)
printf '[{"role":"system","content":"%s"},{"role":"user","content":"%s"}]' "$SYS" "$USER" >"$T/msgs.json"
run "$BIN" template -m $M --messages "$T/msgs.json" --add-generation-prompt
expect_rc 0 "template"
cp "$T/out" "$T/rendered"   # exactly the rendered text
run "$BIN" tokenize -m $M -f "$T/rendered"
expect_rc 0 "tokenize the rendered chat"
FULL=$(tr -d '[] \n' <"$T/out")
N=$(echo "$FULL" | tr ',' '\n' | wc -l)
[ "$N" -gt 128 ] || fail "the chat prompt has only $N tokens"
run "$BIN" generate -m $M --system "$SYS" -p "$USER" -n 8 --temp 0 --ctx 128 --output-ids --truncate left
expect_rc 0 "chat --truncate left"
H=$(sed -n 's/.*keeping the first \([0-9]*\) and the last \([0-9]*\).*/\1/p' "$T/err")
TL=$(sed -n 's/.*keeping the first \([0-9]*\) and the last \([0-9]*\).*/\2/p' "$T/err")
[ -n "$H" ] && [ "$H" -gt 10 ] || fail "chat: the system message was not kept: $(cat "$T/err")"
[ -n "$TL" ] && [ "$TL" -gt 0 ] || fail "chat: the generation prompt was not kept: $(cat "$T/err")"
cp "$T/out" "$T/cut"
fit=$((128 - 8))
run "$BIN" generate -m $M --prompt-ids "$(pick "$FULL" 1-"$H"),$(pick "$FULL" $((N - fit + H + 1))-"$N")" -n 8 --temp 0 \
    --ctx 128 --output-ids
cmp -s "$T/out" "$T/cut" || fail "chat left: $(cat "$T/cut"), the kept ids give $(cat "$T/out")"
# right: the beginning up to the kept tail, then the generation prompt
run "$BIN" generate -m $M --system "$SYS" -p "$USER" -n 8 --temp 0 --ctx 128 --output-ids --truncate right
expect_rc 0 "chat --truncate right"
cp "$T/out" "$T/cut"
run "$BIN" generate -m $M --prompt-ids "$(pick "$FULL" 1-$((fit - TL))),$(pick "$FULL" $((N - TL + 1))-"$N")" -n 8 \
    --temp 0 --ctx 128 --output-ids
cmp -s "$T/out" "$T/cut" || fail "chat right: $(cat "$T/cut"), the kept ids give $(cat "$T/out")"

# ---- an overflow without --truncate names the remedies ----
run "$BIN" generate -m $M --prompt-ids "$LONG" -n 4 --ctx 16 --output-ids
expect_rc 1 "overflow"
grep -q "use --ctx-size N (up to 512 for this model) or --truncate left" "$T/err" || fail "overflow: $(cat "$T/err")"
echo "truncate: ok"
