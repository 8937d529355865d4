#!/bin/sh
# Untrusted strings shown on a terminal are escaped (src/core/termsafe.h): a
# checkpoint whose tensor names, model_type or folder name hold ESC (CSI/OSC
# sequences), BEL, a C1 CSI (U+009B) or a bidi override (U+202E) must not put
# those bytes on stdout or stderr, where they would drive the terminal (set
# its title, write the clipboard, hide text). What must show instead is the
# visible escape (\x1B, \x07, \u009b, \u202e). Covered: inspect (text, -v,
# --json), the unused-tensor warning of generate, list, and an error quoting
# config.json.
# Usage (from the repo root): sh tests/cli/terminal_escapes.sh path/to/mlxcel
BIN=${1:?usage: terminal_escapes.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL terminal_escapes: $*" >&2; exit 1; }
run() { timeout 30 "$@" >"$T/out" 2>"$T/err" </dev/null; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
ESC=$(printf '\033')
BEL=$(printf '\007')
C1=$(printf '\302\233')      # U+009B, a one-character CSI
RLO=$(printf '\342\200\256')  # U+202E RIGHT-TO-LEFT OVERRIDE
# raw FILE WHAT: FILE holds none of the terminal-driving bytes
raw() {
    for b in "$ESC" "$BEL" "$C1" "$RLO"; do
        grep -q -- "$b" "$T/$1" && fail "$2: raw control bytes in $1: $(od -c "$T/$1" | head -20)"
    done
    return 0
}
shows() { grep -qF -- "$3" "$T/$1" || fail "$2: $1 lacks '$3': $(cat "$T/$1")"; }

# llama-tiny plus a shard of two tensors nobody maps, their names hostile
# (JSON escapes in the safetensors header decode to the raw bytes)
M="$T/evil"
mkdir -p "$M"
cp models/llama-tiny/config.json models/llama-tiny/model.safetensors models/llama-tiny/tokenizer.json \
    models/llama-tiny/tokenizer_config.json "$M/"
hdr='{"zz.\u001b]0;PWNED\u0007.a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
hdr="$hdr"'"zz.\u009b31m\u202egnp.b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
len=${#hdr}
{
    printf "\\$(printf %o $((len % 256)))\\$(printf %o $((len / 256)))\\000\\000\\000\\000\\000\\000"
    printf '%s' "$hdr"
    head -c 8 /dev/zero
} >"$M/extra.safetensors"

run "$BIN" inspect -m "$M"
expect_rc 0 "inspect"
raw out "inspect"
shows out "inspect" 'zz.\x1B]0;PWNED\x07.a'
shows out "inspect" 'zz.\u009b31m\u202egnp.b'
run "$BIN" inspect -m "$M" -v
expect_rc 0 "inspect -v"
raw out "inspect -v"
raw err "inspect -v (log)"
shows out "inspect -v" 'zz.\x1B]0;PWNED\x07.a'
run "$BIN" inspect -m "$M" --json
expect_rc 0 "inspect --json"
raw out "inspect --json"
shows out "inspect --json" '\u001b]0;PWNED\u0007'
shows out "inspect --json" '\u009b31m\u202e'

# the warning about unused tensors quotes their names
run "$BIN" generate -m "$M" --prompt-ids 1,2 -n 1
expect_rc 0 "generate"
raw err "generate (unused-tensor warning)"
shows err "generate" 'zz.\x1B]0;PWNED\x07.a'

# model_type from config.json in an error, and in `list`
E="$T/badtype"
mkdir -p "$E"
cp "$M/model.safetensors" "$E/"
sed 's/"model_type": *"[^"]*"/"model_type": "x\\u001b[2Jy\\u009b"/' models/llama-tiny/config.json >"$E/config.json"
grep -q 'u001b' "$E/config.json" || fail "could not write the hostile model_type"
run "$BIN" inspect -m "$E"
expect_rc 1 "inspect, hostile model_type"
raw err "error quoting model_type"
shows err "error quoting model_type" 'x\x1B[2Jy\u009b'
mkdir -p "$T/models/acme"
cp -r "$E" "$T/models/acme/$(printf 'evil\033]0;T\007')"
MLXCEL_MODELS_DIR="$T/models" HF_HOME="$T/hf" HF_HUB_CACHE='' run "$BIN" list
expect_rc 0 "list"
raw out "list"
shows out "list" 'acme/evil\x1B]0;T\x07'
shows out "list" 'x\x1B[2Jy\u009b'
echo "terminal_escapes: ok"
