#!/bin/sh
# NUL bytes in prompts are kept where the pipeline carries lengths and refused
# (naming the byte offset) where it cannot, never silently cut:
#   - tokenize / perplexity / generate --no-chat read -f files with their
#     length: a NUL is a character the tokenizer encodes (as transformers
#     does), so the text after it counts;
#   - detokenize prints the NUL a byte-level vocabulary decodes (text output
#     and --json's "\u0000"), so tokenize -> detokenize gives the bytes back;
#   - chat templates render NUL-terminated strings (cJSON's): a prompt with a
#     NUL under a chat template, and --messages / --var JSON with \u0000 or a
#     raw NUL, are refused naming the offset;
#   - perplexity --ids-file is text of ids: a NUL in it is refused (it cut the
#     list there: "1 2<NUL> 3 4" scored 2 ids).
# Usage (from the repo root): sh tests/cli/nul_bytes.sh path/to/mlxcel
BIN=${1:?usage: nul_bytes.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL nul_bytes: $*" >&2; exit 1; }
run() { timeout 30 "$@" >"$T/out" 2>"$T/err" </dev/null; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
err_has() { grep -qF -- "$2" "$T/err" || fail "$1: stderr lacks '$2': $(cat "$T/err")"; }
M=models/llama-tiny
CHAT=tests/fixtures/models/phixtral-tiny
printf 'hello\000world' >"$T/nul.txt"
printf 'hello' >"$T/head.txt"

# ---- kept: tokenize, detokenize, perplexity, generate --no-chat ----
run "$BIN" tokenize -m $M -f "$T/nul.txt" --no-special
expect_rc 0 "tokenize -f with a NUL"
ids=$(tr -d '[] \n' <"$T/out")
run "$BIN" tokenize -m $M -f "$T/head.txt" --no-special
head_ids=$(tr -d '[] \n' <"$T/out")
[ "$ids" != "$head_ids" ] || fail "tokenize cut the text at the NUL: $ids"
case $ids in "$head_ids",*) ;; *) fail "tokenize: $ids does not start with hello's $head_ids" ;; esac
run "$BIN" detokenize -m $M --ids "$ids"
expect_rc 0 "detokenize"
printf 'hello\000world\n' >"$T/want"
cmp -s "$T/out" "$T/want" || fail "detokenize lost the NUL: $(od -c "$T/out" | head -3)"
run "$BIN" detokenize -m $M --ids "$ids" --json --stream
expect_rc 0 "detokenize --json"
grep -q '"text":.*"hello\\u0000world"' "$T/out" || fail "detokenize --json: $(cat "$T/out")"
grep -q '"\\u0000"' "$T/out" || fail "detokenize --json pieces: $(cat "$T/out")"
run "$BIN" perplexity -m $M -f "$T/nul.txt" --json
expect_rc 0 "perplexity -f with a NUL"
n_nul=$(tr -d ' \n' <"$T/out" | sed 's/.*"tokens":\([0-9]*\).*/\1/')
run "$BIN" perplexity -m $M -f "$T/head.txt" --json
n_head=$(tr -d ' \n' <"$T/out" | sed 's/.*"tokens":\([0-9]*\).*/\1/')
[ "$n_nul" -gt "$n_head" ] || fail "perplexity scored $n_nul tokens with the NUL, $n_head without"
run "$BIN" generate -m $CHAT -f "$T/nul.txt" --no-chat -n 2 --output-ids
expect_rc 0 "generate --no-chat with a NUL"

# ---- refused: through a chat template ----
run "$BIN" generate -m $CHAT -f "$T/nul.txt" -n 2
expect_rc 1 "generate (chat) with a NUL"
err_has "generate (chat) with a NUL" "NUL byte at byte 5"
err_has "generate (chat) with a NUL" "--no-chat"
printf '[{"role": "user", "content": "hel\\u0000lo"}]' >"$T/esc.json"
run "$BIN" template -m $CHAT --messages "$T/esc.json"
expect_rc 1 "--messages with \\u0000"
err_has "--messages with \\u0000" "(NUL) character at byte 33"
# an escaped backslash before u0000 is text, not a NUL
printf '[{"role": "user", "content": "a\\\\u0000"}]' >"$T/bs.json"
run "$BIN" template -m $CHAT --messages "$T/bs.json"
expect_rc 0 "--messages with \\\\u0000 (a backslash, then text)"
grep -qF 'a\u0000' "$T/out" || fail "the escaped backslash was not rendered: $(cat "$T/out")"
printf '[{"role": "user", "content": "hel\000lo"}]' >"$T/raw.json"
run "$BIN" template -m $CHAT --messages "$T/raw.json"
expect_rc 1 "--messages with a raw NUL"
err_has "--messages with a raw NUL" "NUL byte at byte 33"
echo '[{"role": "user", "content": "hi"}]' >"$T/ok.json"
run "$BIN" template -m $CHAT --messages "$T/ok.json" --var 'x="a\u0000b"'
expect_rc 1 "--var with \\u0000"
err_has "--var with \\u0000" "--var x: a \\u0000 (NUL) character at byte 2"

# ---- refused: a NUL in a token-id file (the ids after it were dropped) ----
printf '1 2\000 3 4 5 6' >"$T/ids.txt"
run "$BIN" perplexity -m $M --ids-file "$T/ids.txt"
expect_rc 1 "perplexity --ids-file with a NUL"
err_has "perplexity --ids-file with a NUL" "NUL byte at byte 3"
printf '[1, 2]\000[' >"$T/ids.json"
run "$BIN" perplexity -m $M --ids-file "$T/ids.json"
expect_rc 1 "perplexity --ids-file (JSON) with a NUL"
err_has "perplexity --ids-file (JSON) with a NUL" "NUL byte at byte 6"
echo "nul_bytes: ok"
