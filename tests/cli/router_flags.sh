#!/bin/sh
# serve's router-mode flags refused before anything listens (docs/server.md, "Router mode";
# the running router is tests/server/router.test.mjs):
#   - a --models-dir that does not exist, or that holds no model and no -m, names the folder;
#   - a directory of more entries than the scan reads is refused, not walked;
#   - --memory-budget takes a byte count with K/M/G/T, nothing else;
#   - --models-preset outside router mode, a preset naming no model or a bad value (file and
#     line), --model-draft and --served-model-name in router mode, two models of one name;
#   - serve --help lists every router flag.
# Usage (from the repo root): sh tests/cli/router_flags.sh path/to/mlxcel
BIN=${1:?usage: router_flags.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL router_flags: $*" >&2; exit 1; }
run() { timeout 60 "$@" >"$T/out" 2>"$T/err" </dev/null; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
err_has() { grep -qF -- "$2" "$T/err" || fail "$1: stderr lacks '$2': $(cat "$T/err")"; }
A=models/llama-tiny
B=tests/fixtures/models/phixtral-tiny

run "$BIN" serve --port 0 --models-dir "$T/nowhere"
expect_rc 1 "a missing --models-dir"
err_has "a missing --models-dir" "$T/nowhere"
mkdir "$T/empty"
run "$BIN" serve --port 0 --models-dir "$T/empty"
expect_rc 1 "an empty --models-dir"
err_has "an empty --models-dir" "no folder holding a config.json"
err_has "an empty --models-dir" "no model to serve"
mkdir "$T/many"
seq 0 8192 | sed "s|^|$T/many/d|" | xargs mkdir || fail "mkdir of 8193 folders"
run "$BIN" serve --port 0 --models-dir "$T/many"
expect_rc 1 "a --models-dir of too many entries"
err_has "a --models-dir of too many entries" "more than 8192 entries"

for v in 0 -5 12Q 1.5G "" 99999999999999T; do
    run "$BIN" serve --port 0 -m $A -m $B --memory-budget "$v"
    expect_rc 2 "--memory-budget '$v'"
    err_has "--memory-budget '$v'" "is not a byte count"
done

echo "[*]
temp = 0.5" >"$T/p.ini"
run "$BIN" serve --port 0 -m $A --models-preset "$T/p.ini"
expect_rc 2 "--models-preset with one -m"
err_has "--models-preset with one -m" "presets are for router mode"
printf '[llama-tiny]\ntemp = 0.5\ntop-p = 7\n' >"$T/bad.ini"
run "$BIN" serve --port 0 -m $A -m $B --models-preset "$T/bad.ini"
expect_rc 1 "a bad preset value"
err_has "a bad preset value" "bad.ini:3: 'top-p' = '7'"
run "$BIN" serve --port 0 -m $A -m $B --model-draft $A
expect_rc 2 "--model-draft in router mode"
err_has "--model-draft in router mode" "router mode"
run "$BIN" serve --port 0 -m $A -m $B --served-model-name x
expect_rc 2 "--served-model-name in router mode"
run "$BIN" serve --port 0 -m $A -m llama-tiny=$B
expect_rc 1 "two models of one name"
err_has "two models of one name" "two models are named 'llama-tiny'"

run "$BIN" serve --help
expect_rc 0 "serve --help"
for f in --models-dir --models-max --max-loaded --memory-budget --no-models-autoload --models-autoload \
         --models-preset --models-load-timeout "NAME=MODEL"; do
    grep -qF -- "$f" "$T/out" || fail "serve --help lacks $f"
done
echo "ok router_flags"
