#!/bin/sh
# Output that cannot be written is an error: every command run with stdout on
# /dev/full (a full disk, as far as the program can tell) must exit non-zero
# with "writing standard output" on stderr, never 0 as if its output had been
# written. Covered: the top level (--help, --version), every command's --help
# (the command list is read from `mlxcel --help`, so a new command is covered
# without editing this file), and each command's real output: generate (text
# and --output-ids), tokenize, detokenize, template, inspect (text, -v,
# --json), list, arch, bench, perplexity, convert and synth (summary and
# --json), pull --json (against tests/hub/fakehub.mjs when node is there) and
# serve's ready line (the server must stop, not run on unseen). The same runs
# with stdout on a file still exit 0, so the check is not trivially true.
# Usage (from the repo root): sh tests/cli/output_errors.sh path/to/mlxcel
BIN=${1:?usage: output_errors.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
[ -w /dev/full ] || { echo "output_errors: no /dev/full here, skipped" >&2; exit 0; }
T=$(mktemp -d) || exit 1
HUB_PID=
trap '[ -n "$HUB_PID" ] && kill "$HUB_PID" 2>/dev/null; rm -rf "$T"' EXIT
trap 'exit 1' INT TERM

fail() { echo "FAIL output_errors: $*" >&2; exit 1; }
M=models/llama-tiny
N=0
# full WHAT CMD...: CMD with stdout on /dev/full fails with the message (and is not hung);
# with stdout on a file, it succeeds (a fresh output folder each time: OUT is substituted)
full() {
    what=$1
    shift
    N=$((N + 1))
    timeout 60 "$@" >/dev/full 2>"$T/err" </dev/null
    rc=$?
    [ "$rc" -eq 124 ] && fail "$what: hung with stdout on /dev/full"
    [ "$rc" -ne 0 ] || fail "$what: exit 0 with stdout on /dev/full; stderr: $(cat "$T/err")"
    grep -q "writing standard output: No space left on device" "$T/err" ||
        fail "$what: stderr lacks 'writing standard output': $(cat "$T/err")"
}
ok_to_file() {
    what=$1
    shift
    timeout 60 "$@" >"$T/out" 2>"$T/err" </dev/null || fail "$what (to a file): exit $?; $(cat "$T/err")"
    [ -s "$T/out" ] || fail "$what (to a file): no output"
}

# ---- the top level and every --help ----
full "mlxcel --help" "$BIN" --help
full "mlxcel --version" "$BIN" --version
ok_to_file "mlxcel --help" "$BIN" --help
cmds=$(sed -n '/^commands:/,/^$/s/^  \([a-z][a-z-]*\) .*/\1/p' "$T/out")
[ -n "$cmds" ] || fail "could not read the command list from mlxcel --help"
for c in $cmds; do
    full "$c --help" "$BIN" "$c" --help
done

# ---- each command's output ----
echo '[{"role": "user", "content": "hi"}]' >"$T/msgs.json"
printf 'hello world, hello there, hello again' >"$T/text.txt"
mkdir -p "$T/models/acme"
cp -r "$M" "$T/models/acme/tiny"
for json in "" --json; do
    full "inspect $json" "$BIN" inspect -m $M $json
    full "list $json" env MLXCEL_MODELS_DIR="$T/models" HF_HOME="$T/hf" HF_HUB_CACHE= "$BIN" list $json
    full "arch $json" "$BIN" arch $json
    full "perplexity $json" "$BIN" perplexity -m $M -f "$T/text.txt" $json
    full "bench $json" "$BIN" bench -m $M -p 4 -n 2 -r 1 -t 1 $json
    full "convert $json" "$BIN" convert -m $M -o "$T/conv$json" -q $json
    ok_to_file "convert $json" "$BIN" convert -m $M -o "$T/conv2$json" -q $json
    full "synth $json" "$BIN" synth --config $M/config.json -o "$T/syn$json" $json
done
full "inspect -v" "$BIN" inspect -m $M -v
full "generate" "$BIN" generate -m $M -p hello -n 4 --no-chat
full "generate --output-ids" "$BIN" generate -m $M --prompt-ids 1,2 -n 2 --output-ids
full "tokenize" "$BIN" tokenize -m $M -p hello
full "detokenize" "$BIN" detokenize -m $M --ids 1,2,3
full "template" "$BIN" template -m tests/fixtures/tokenizers/qwen3 --messages "$T/msgs.json"
ok_to_file "generate" "$BIN" generate -m $M -p hello -n 4 --no-chat
ok_to_file "template" "$BIN" template -m tests/fixtures/tokenizers/qwen3 --messages "$T/msgs.json"

# ---- serve: the ready line cannot be written, so the server stops ----
full "serve" "$BIN" serve -m $M --port 0

# ---- pull --json, against the fake hub ----
if command -v node >/dev/null 2>&1; then
    mkdir "$T/state"
    node tests/hub/fakehub.mjs $M tiny/llama "$T/state" 2>"$T/hub.err" &
    HUB_PID=$!
    i=0
    while [ ! -s "$T/state/port" ]; do
        i=$((i + 1))
        [ $i -le 100 ] || fail "the fake hub did not start: $(cat "$T/hub.err")"
        sleep 0.1
    done
    for json in "" --json; do
        full "pull $json" env HF_ENDPOINT="http://127.0.0.1:$(cat "$T/state/port")" HF_HOME="$T/hf" \
            HF_HUB_CACHE= HF_TOKEN= "$BIN" pull tiny/llama $json
    done
else
    echo "output_errors: no node, pull not covered" >&2
fi
echo "output_errors: ok ($N commands)"
