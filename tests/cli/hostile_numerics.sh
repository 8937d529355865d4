#!/bin/sh
# Hostile numbers and quiet mismatches, through the real CLI on copies of
# models/llama-tiny: tiny temperatures and penalties from flags and from
# generation_config.json (one bounds table), NaN weights (generate and
# perplexity fail instead of printing garbage or nan), a context above the
# model's (an error naming both numbers), --truncate, malformed id lists
# (one escaped line naming the bad token), JSON output for a folder whose name
# is not UTF-8 (parsed by a strict parser), a config with fewer layers than
# the checkpoint (a warning naming the unused tensors), an empty chat template.
# Usage (from the repo root): sh tests/cli/hostile_numerics.sh path/to/mlxcel
BIN=${1:?usage: hostile_numerics.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL hostile_numerics: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
err_has() { grep -q -- "$2" "$T/err" || fail "$1: stderr lacks '$2': $(cat "$T/err")"; }
same_out() { cmp -s "$T/out" "$2" || fail "$1: got $(cat "$T/out"), expected $(cat "$2")"; }
# copy NAME: a fresh copy of llama-tiny at $T/NAME
copy() { rm -rf "$T/$1"; cp -r models/llama-tiny "$T/$1"; }
# strict_json WHAT: stdout must be valid UTF-8 and valid JSON (node on CI, python3 elsewhere)
strict_json() {
    if command -v node >/dev/null 2>&1; then
        node -e 'const s = new TextDecoder("utf-8", {fatal: true}).decode(require("fs").readFileSync(0));
                 JSON.parse(s);' <"$T/out" || fail "$1: not strict UTF-8 JSON: $(cat "$T/out")"
    elif command -v python3 >/dev/null 2>&1; then
        python3 -c 'import json, sys; json.loads(sys.stdin.buffer.read().decode("utf-8"))' <"$T/out" ||
            fail "$1: not strict UTF-8 JSON: $(cat "$T/out")"
    else
        echo "hostile_numerics: no node or python3, JSON not parsed" >&2
    fi
}
IDS=1,100,200,300

# ---- temperature and penalty bounds: flags and generation_config.json ----
run "$BIN" generate -m models/llama-tiny --prompt-ids $IDS -n 8 --temp 0 --output-ids
expect_rc 0 "greedy"
cp "$T/out" "$T/greedy"
run "$BIN" generate -m models/llama-tiny --prompt-ids $IDS -n 8 --temp 1e-40 --output-ids
expect_rc 0 "--temp 1e-40"
same_out "--temp 1e-40 is greedy" "$T/greedy"
copy tinyt
printf '{"do_sample": true, "temperature": 1e-45}\n' >"$T/tinyt/generation_config.json"
run "$BIN" generate -m "$T/tinyt" --prompt-ids $IDS -n 8 --output-ids
expect_rc 0 "generation_config temperature 1e-45"
same_out "generation_config temperature 1e-45 is greedy" "$T/greedy"

copy pen
printf '{"do_sample": true, "temperature": 1.0, "repetition_penalty": 1e-30}\n' >"$T/pen/generation_config.json"
run "$BIN" generate -m "$T/pen" --prompt-ids $IDS -n 4 --output-ids
expect_rc 1 "generation_config repetition_penalty 1e-30"
err_has "generation_config penalty" "generation_config.json: repetition_penalty (--repeat-penalty) = 1e-30 is out of range"
run "$BIN" generate -m "$T/pen" --prompt-ids $IDS -n 4 --output-ids --repeat-penalty 1.1
expect_rc 0 "a flag overrides a bad generation_config value"
run "$BIN" generate -m models/llama-tiny --prompt-ids $IDS -n 4 --repeat-penalty 1e-30
expect_rc 2 "--repeat-penalty 1e-30"
err_has "--repeat-penalty 1e-30" "out of range"

# ---- NaN weights: every data byte 0xff (NaN in f32, f16 and bf16) ----
copy nan
f=$T/nan/model.safetensors
h=$(od -An -tu8 -N8 "$f" | tr -d ' ')
sz=$(wc -c <"$f")
{ head -c $((8 + h)) "$f"; head -c $((sz - 8 - h)) /dev/zero | tr '\0' '\377'; } >"$T/nan.st"
mv "$T/nan.st" "$f"
run "$BIN" generate -m "$T/nan" -p "ROMEO:" -n 4 --no-chat
expect_rc 1 "generate with NaN weights"
err_has "generate NaN" "error: the model produced non-finite logits"
[ "$(grep -c 'warn: the forward produced non-finite logits' "$T/err")" -eq 1 ] ||
    fail "NaN weights: expected one warning: $(cat "$T/err")"
[ -s "$T/out" ] && fail "generate with NaN weights printed: $(cat "$T/out")"
echo "ROMEO: good morrow to you, my lord" >"$T/text.txt"
run "$BIN" perplexity -m "$T/nan" -f "$T/text.txt"
expect_rc 1 "perplexity with NaN weights"
err_has "perplexity NaN" "is not finite"
grep -qi nan "$T/out" && fail "perplexity printed nan: $(cat "$T/out")"

# ---- a context above the model's: one rule, both numbers ----
run "$BIN" generate -m models/llama-tiny --prompt-ids $IDS -n 4 --ctx 100000
expect_rc 1 "generate --ctx 100000"
err_has "generate --ctx" "context of 100000 tokens exceeds the model's context of 512"
run "$BIN" perplexity -m models/llama-tiny -f "$T/text.txt" --ctx 1000
expect_rc 1 "perplexity --ctx 1000"
err_has "perplexity --ctx" "context of 1000 tokens exceeds the model's context of 512"

# ---- --truncate: 40 ids into a context of 16 (12 kept, room for the 4 to generate) ----
LONG=$(seq 10 49 | paste -sd, -)
HEAD=$(seq 10 21 | paste -sd, -)
TAIL=$(seq 38 49 | paste -sd, -)
run "$BIN" generate -m models/llama-tiny --prompt-ids "$LONG" -n 4 --temp 0 --ctx 16 --output-ids
expect_rc 1 "a prompt longer than the context without --truncate"
run "$BIN" generate -m models/llama-tiny --prompt-ids "$TAIL" -n 4 --temp 0 --ctx 16 --output-ids
cp "$T/out" "$T/tail"
run "$BIN" generate -m models/llama-tiny --prompt-ids "$HEAD" -n 4 --temp 0 --ctx 16 --output-ids
cp "$T/out" "$T/head"
run "$BIN" generate -m models/llama-tiny --prompt-ids "$LONG" -n 4 --temp 0 --ctx 16 --output-ids --truncate left
expect_rc 0 "--truncate left"
same_out "--truncate left keeps the end" "$T/tail"
err_has "--truncate left" "dropped 28 of 40 tokens"
run "$BIN" generate -m models/llama-tiny --prompt-ids "$LONG" -n 4 --temp 0 --ctx 16 --output-ids --truncate right
expect_rc 0 "--truncate right"
same_out "--truncate right keeps the beginning" "$T/head"
run "$BIN" generate -m models/llama-tiny --prompt-ids "$LONG" --truncate middle
expect_rc 2 "--truncate middle"

# ---- malformed id lists: one line, the whole bad token, escaped ----
nl='
'
run "$BIN" generate -m models/llama-tiny --prompt-ids "[1, 2.5]$nl" --output-ids
expect_rc 1 "malformed id list"
err_has "malformed id list" "token ids: '2.5' (id 2)"
[ "$(wc -l <"$T/err")" -eq 1 ] || fail "malformed id list: not one line: $(cat "$T/err")"
run "$BIN" generate -m models/llama-tiny --prompt-ids "$(printf '1,\377\n2')" --output-ids
expect_rc 1 "id list with a non-UTF-8 byte"
err_has "non-UTF-8 id" "'\\\\xFF' (id 2)"
[ "$(wc -l <"$T/err")" -eq 1 ] || fail "non-UTF-8 id list: not one line: $(cat "$T/err")"
printf '[1, 2,\n3x]\n' >"$T/ids.txt"
run "$BIN" perplexity -m models/llama-tiny --ids-file "$T/ids.txt"
expect_rc 1 "perplexity malformed ids"
err_has "perplexity malformed ids" "'3x' (id 3)"

# ---- JSON output of a folder whose name is not UTF-8 ----
bad=$(printf 'bad\377name')
mkdir -p "$T/models/owner"
cp -r models/llama-tiny "$T/models/owner/$bad"
run "$BIN" inspect -m "$T/models/owner/$bad" --json
expect_rc 0 "inspect --json, non-UTF-8 folder"
strict_json "inspect --json"
grep -q 'bad\\ufffdname' "$T/out" || fail "inspect --json: no U+FFFD escape: $(cat "$T/out")"
MLXCEL_MODELS_DIR=$T/models HF_HUB_CACHE=$T/nohub run "$BIN" list --json
expect_rc 0 "list --json, non-UTF-8 folder"
strict_json "list --json"

# ---- fewer layers in the config than in the checkpoint ----
copy fewer
sed 's/"num_hidden_layers": 4/"num_hidden_layers": 2/' models/llama-tiny/config.json >"$T/fewer/config.json"
run "$BIN" generate -m "$T/fewer" --prompt-ids $IDS -n 2 --output-ids
expect_rc 0 "fewer layers"
err_has "fewer layers" "warn: 18 checkpoint tensors are not used"
err_has "fewer layers" "'model.layers.2."
run "$BIN" generate -m models/llama-tiny --prompt-ids $IDS -n 2 --output-ids
[ -s "$T/err" ] && fail "llama-tiny: unexpected stderr: $(cat "$T/err")"

# ---- an empty chat template ----
copy empty
sed 's/"chat_template": ".*",$/"chat_template": "",/' models/llama-tiny/tokenizer_config.json \
    >"$T/empty/tokenizer_config.json"
run "$BIN" generate -m "$T/empty" -p "hello" -n 2
expect_rc 1 "empty chat template"
err_has "empty chat template" "the chat template is empty"
exit 0
