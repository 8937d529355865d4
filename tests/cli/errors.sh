#!/bin/sh
# Generic CLI error handling: usage errors exit 2 with a message on stderr,
# runtime errors exit 1 with one clear message, and every command documents
# itself under --help (exit 0, "usage:" on stdout). The command list is read
# from `mlxcel --help`, so a new command is covered without editing this file.
# Usage (from the repo root): sh tests/cli/errors.sh path/to/mlxcel
BIN=${1:?usage: errors.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL errors: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
err_has() { grep -q -- "$2" "$T/err" || fail "$1: stderr lacks '$2': $(cat "$T/err")"; }
# a failing command must explain itself on stderr and leave stdout empty
quiet_stdout() { [ -s "$T/out" ] && fail "$1: wrote to stdout: $(cat "$T/out")"; return 0; }

# ---- top level ----
run "$BIN"
expect_rc 2 "no command"
err_has "no command" 'usage:'
run "$BIN" frobnicate
expect_rc 2 "unknown command"
err_has "unknown command" "unknown command 'frobnicate'"
quiet_stdout "unknown command"
run "$BIN" --help
expect_rc 0 "mlxcel --help"
grep -q 'usage:' "$T/out" || fail "mlxcel --help has no usage: line"
run "$BIN" --version
expect_rc 0 "mlxcel --version"
grep -q '^mlxcel [0-9]' "$T/out" || fail "--version: $(cat "$T/out")"

# ---- every command: --help, unknown flag, stray argument ----
run "$BIN" --help
cmds=$(sed -n '/^commands:/,/^$/s/^  \([a-z][a-z-]*\) .*/\1/p' "$T/out")
[ -n "$cmds" ] || fail "could not read the command list from mlxcel --help"
for want in generate tokenize perplexity inspect bench list arch; do
    echo "$cmds" | grep -qx "$want" || fail "mlxcel --help does not list '$want'"
done
for c in $cmds; do
    run "$BIN" "$c" --help
    expect_rc 0 "$c --help"
    grep -q '^usage: mlxcel '"$c" "$T/out" || fail "$c --help: no 'usage: mlxcel $c' line"
    run "$BIN" "$c" --no-such-flag
    expect_rc 2 "$c --no-such-flag"
    err_has "$c --no-such-flag" 'no-such-flag'
    quiet_stdout "$c --no-such-flag"
done
for c in inspect bench list; do
    run "$BIN" "$c" -h
    expect_rc 0 "$c -h"
    run "$BIN" "$c" stray-argument
    expect_rc 2 "$c stray-argument"
    err_has "$c stray-argument" "unexpected argument 'stray-argument'"
done

# ---- flag values ----
run "$BIN" bench -n
expect_rc 2 "bench -n without a value"
err_has "bench -n" 'needs a value'
run "$BIN" generate --prompt-ids 1,2 -n
expect_rc 2 "generate -n without a value"
err_has "generate -n" 'needs a value'
run "$BIN" inspect -m
expect_rc 2 "inspect -m without a value"
err_has "inspect -m" 'needs a value'
run "$BIN" bench -n abc
expect_rc 2 "bench -n abc"
err_has "bench -n abc" "'abc' is not an integer"
run "$BIN" bench -r 0
expect_rc 2 "bench -r 0"
err_has "bench -r 0" 'out of range'
run "$BIN" serve --ubatch-size 0
expect_rc 2 "serve --ubatch-size 0"
err_has "serve --ubatch-size 0" 'out of range \[1, 512\]'
run "$BIN" serve -ub 513
expect_rc 2 "serve -ub 513"
err_has "serve -ub 513" 'out of range \[1, 512\]'
# the HTTP layer's flags (docs/server.md "Limits and errors", "Host, Origin and CORS")
run "$BIN" serve --header-timeout 0
expect_rc 2 "serve --header-timeout 0"
err_has "serve --header-timeout 0" 'out of range'
run "$BIN" serve --request-timeout x
expect_rc 2 "serve --request-timeout x"
run "$BIN" serve --allowed-host http://evil.test
expect_rc 2 "serve --allowed-host URL"
err_has "serve --allowed-host URL" 'is not a host name'
run "$BIN" serve --cors-origin evil.test
expect_rc 2 "serve --cors-origin without a scheme"
err_has "serve --cors-origin without a scheme" 'is not an origin'
run "$BIN" serve --help
for f in --header-timeout --request-timeout --allowed-host --cors-origin --max-connections --timeout; do
    grep -q -- "$f" "$T/out" || fail "serve --help does not list $f"
done
run "$BIN" bench -p -5
expect_rc 2 "bench -p -5"
run "$BIN" bench -p 0 -n 0
expect_rc 2 "bench -p 0 -n 0"
err_has "bench -p 0 -n 0" 'nothing to run'
run "$BIN" bench -t 0
expect_rc 2 "bench -t 0"

# ---- runtime errors: missing model ----
for c in inspect bench generate; do
    extra=
    [ "$c" = generate ] && extra="--prompt-ids 1 --output-ids"
    # shellcheck disable=SC2086
    run "$BIN" "$c" -m /nonexistent/model-dir $extra
    expect_rc 1 "$c -m /nonexistent"
    err_has "$c -m /nonexistent" '/nonexistent/model-dir'
    err_has "$c -m /nonexistent" "^mlxcel $c: error: "
    quiet_stdout "$c -m /nonexistent"
    n=$(wc -l <"$T/err" | tr -d ' ')
    [ "$n" -eq 1 ] || fail "$c -m /nonexistent: expected one line on stderr, got $n"
done

# ---- runtime errors: corrupt config.json ----
mkdir -p "$T/corrupt"
printf '{"model_type": "llama", "hidden_size": ' >"$T/corrupt/config.json"
cp "$PWD/models/llama-tiny/model.safetensors" "$T/corrupt/model.safetensors"
for c in inspect bench; do
    run "$BIN" "$c" -m "$T/corrupt"
    expect_rc 1 "$c on a corrupt config.json"
    err_has "$c corrupt config" 'not valid JSON'
    err_has "$c corrupt config" 'config\.json'
    quiet_stdout "$c corrupt config"
done

# ---- runtime errors: unsupported model_type names the supported ones ----
mkdir -p "$T/alien"
echo '{"model_type": "gpt_bigfoot"}' >"$T/alien/config.json"
run "$BIN" inspect -m "$T/alien"
expect_rc 1 "inspect on an unsupported model_type"
err_has "unsupported" "gpt_bigfoot"
err_has "unsupported" "llama"

# ---- runtime errors: a folder without weights ----
mkdir -p "$T/noweights"
cp models/llama-tiny/config.json "$T/noweights/"
run "$BIN" inspect -m "$T/noweights"
expect_rc 1 "inspect on a folder without weights"
err_has "no weights" "$T/noweights"

echo "errors: ok"
