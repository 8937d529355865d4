#!/bin/sh
# `mlxcel detokenize`: ids back to text through the decoder, with and
# without --skip-special, streamed (--stream) and as JSON (--json, with the
# streamed chunks), on the llama2 fixture (Replace/ByteFallback/Fuse/Strip
# decoder) and gpt2 (ByteLevel). Expected texts are the HF reference values
# of tests/fixtures/tokenizers/*/golden.json; errors exit 1 with one line.
# Usage (from the repo root): sh tests/cli/detokenize.sh path/to/mlxcel
BIN=${1:?usage: detokenize.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL detokenize: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
expect_out() { [ "$(cat "$T/out")" = "$1" ] || fail "$2: got '$(cat "$T/out")', want '$1'"; }

for n in llama2 gpt2; do
    mkdir "$T/$n"
    xz -dc "tests/fixtures/tokenizers/$n/tokenizer.json.xz" >"$T/$n/tokenizer.json" ||
        fail "cannot unpack $n"
    cp "tests/fixtures/tokenizers/$n/tokenizer_config.json" "$T/$n/"
done

# golden "<s>[INST] hi [/INST]</s>" (llama2 ids)
ids=1,518,25580,29962,7251,518,29914,25580,29962,2
run "$BIN" detokenize -m "$T/llama2" --ids "$ids"
expect_rc 0 "llama2"
expect_out "<s> [INST] hi [/INST]</s>" "llama2"
run "$BIN" detokenize -m "$T/llama2" --ids "$ids" --skip-special
expect_out "[INST] hi [/INST]" "llama2 --skip-special"
run "$BIN" detokenize -m "$T/llama2" --ids "$ids" --skip-special --stream
expect_out "[INST] hi [/INST]" "llama2 --stream"
# golden "\n" -> [29871, 13]: the byte-fallback newline, leading space stripped
run "$BIN" detokenize -m "$T/llama2" --ids "29871 13" --json
expect_rc 0 "llama2 --json"
tr -d ' \t\n' <"$T/out" >"$T/flat"
grep -q '"text":"\\n"' "$T/flat" || fail "--json text: $(cat "$T/out")"
grep -q '"pieces":\[' "$T/flat" || fail "--json pieces: $(cat "$T/out")"
# an emoji in byte-fallback pieces is streamed as one complete chunk
run "$BIN" detokenize -m "$T/llama2" --ids "[953,29877,2397,29871,243,162,148,142]" --stream --json
tr -d ' \t\n' <"$T/out" >"$T/flat"
grep -q '"pieces":\["em","o","ji","","","","","👋",""\]' "$T/flat" || fail "stream pieces: $(cat "$T/out")"
# gpt2: "Hello world"
run "$BIN" detokenize -m "$T/gpt2" --ids 15496,995
expect_out "Hello world" "gpt2"

# errors
run "$BIN" detokenize -m "$T/gpt2" --ids 15496,50257
expect_rc 1 "id out of range"
grep -q 'id 50257 at position 1' "$T/err" || fail "out of range message: $(cat "$T/err")"
run "$BIN" detokenize -m "$T/gpt2" --ids 1,x
expect_rc 1 "bad id list"
run "$BIN" detokenize -m "$T/gpt2"
expect_rc 2 "no --ids"
echo "ok detokenize"
