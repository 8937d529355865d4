#!/bin/sh
# llama-server's environment variables for `mlxcel serve` (src/cli/llama_env.def): each sets
# its flag when the command line does not give it, a flag wins over its variable (and the
# variable is then not read at all), a bad value is a usage error (exit 2) naming the variable.
# Read through the ready line: "(model ID, N parallel, M tokens per request)".
# Usage (from the repo root): sh tests/cli/llama_env.sh path/to/mlxcel
BIN=${1:?usage: llama_env.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
PID=
stop() { [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null; PID=; }
trap 'stop; rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL llama_env: $*" >&2; exit 1; }
M=models/llama-tiny
# the variables of the caller must not leak into the cases
for v in $(env | sed -n 's/^\(LLAMA_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

# serve with the environment given before the command: waits (bounded, 60 s) for the ready
# line or the exit; $ready holds the line, $rc the exit status when it exited first
serve() {
    ready=; rc=
    : >"$T/out"; : >"$T/err"  # emptied here: the child's own truncation may come after a first look
    env "$@" >>"$T/out" 2>>"$T/err" &
    PID=$!
    i=0
    while [ $i -lt 600 ]; do
        ready=$(grep -m1 "listening on" "$T/out")
        [ -n "$ready" ] && break
        if ! kill -0 "$PID" 2>/dev/null; then
            wait "$PID"
            rc=$?
            PID=
            return
        fi
        sleep 0.1
        i=$((i + 1))
    done
    [ -n "$ready" ] || fail "no ready line within 60 s: $(cat "$T/err")"
    stop
}

# the variables alone
serve LLAMA_ARG_N_PARALLEL=3 LLAMA_ARG_CTX_SIZE=96 LLAMA_ARG_ALIAS=from-env "$BIN" serve -m $M --port 0
echo "$ready" | grep -q "(model from-env, 3 parallel, 96 tokens per request" || fail "variables not applied: $ready"
# flags win
serve LLAMA_ARG_N_PARALLEL=3 LLAMA_ARG_CTX_SIZE=96 LLAMA_ARG_ALIAS=from-env \
    "$BIN" serve -m $M --port 0 -np 2 --ctx-size 128 --alias from-flag
echo "$ready" | grep -q "(model from-flag, 2 parallel, 128 tokens per request" || fail "flags did not win: $ready"
# --served-model-name is the same flag as --alias
serve LLAMA_ARG_ALIAS=from-env "$BIN" serve -m $M --port 0 --served-model-name other
echo "$ready" | grep -q "(model other," || fail "--served-model-name did not replace LLAMA_ARG_ALIAS: $ready"
# LLAMA_ARG_MODEL stands for -m; -m wins over it (the variable's folder is never opened)
serve LLAMA_ARG_MODEL=$M "$BIN" serve --port 0
echo "$ready" | grep -q "(model llama-tiny," || fail "LLAMA_ARG_MODEL not applied: $ready"
serve LLAMA_ARG_MODEL=/nonexistent/model "$BIN" serve -m $M --port 0
echo "$ready" | grep -q "(model llama-tiny," || fail "-m did not win over LLAMA_ARG_MODEL: $ready"
# --port 0 wins over LLAMA_ARG_PORT (port 1 would be refused or privileged)
serve LLAMA_ARG_PORT=1 LLAMA_ARG_HOST=::1 "$BIN" serve -m $M --port 0 --host 127.0.0.1
echo "$ready" | grep -Eq "http://127\.0\.0\.1:[0-9]+ " || fail "--port/--host did not win: $ready"
echo "$ready" | grep -q "127.0.0.1:1 " && fail "LLAMA_ARG_PORT won over --port: $ready"

# a bad value: exit 2 naming the variable; the same value under its flag is not read
serve LLAMA_ARG_CTX_SIZE=abc "$BIN" serve -m $M --port 0
[ "$rc" = 2 ] || fail "LLAMA_ARG_CTX_SIZE=abc: exit '$rc' (ready: $ready), expected 2"
grep -q "LLAMA_ARG_CTX_SIZE='abc'" "$T/err" || fail "the error does not name the variable: $(cat "$T/err")"
serve LLAMA_ARG_CTX_SIZE=abc "$BIN" serve -m $M --port 0 -c 64
echo "$ready" | grep -q "64 tokens per request" || fail "-c did not replace a bad LLAMA_ARG_CTX_SIZE: $ready $(cat "$T/err")"
serve LLAMA_ARG_N_PARALLEL=0 "$BIN" serve -m $M --port 0
[ "$rc" = 2 ] && grep -q "LLAMA_ARG_N_PARALLEL" "$T/err" || fail "LLAMA_ARG_N_PARALLEL=0: exit '$rc': $(cat "$T/err")"
# on/off variables take llama.cpp's words only
serve LLAMA_ARG_ENDPOINT_SLOTS=maybe "$BIN" serve -m $M --port 0
[ "$rc" = 2 ] && grep -q "LLAMA_ARG_ENDPOINT_SLOTS='maybe' is neither on nor off" "$T/err" ||
    fail "LLAMA_ARG_ENDPOINT_SLOTS=maybe: exit '$rc': $(cat "$T/err")"
serve LLAMA_ARG_ENDPOINT_PROPS=enabled LLAMA_ARG_ENDPOINT_SLOTS=disabled "$BIN" serve -m $M --port 0
[ -n "$ready" ] || fail "on/off words refused: $(cat "$T/err")"
# an empty variable is unset
serve LLAMA_ARG_CTX_SIZE= "$BIN" serve -m $M --port 0 -c 80
echo "$ready" | grep -q "80 tokens per request" || fail "an empty LLAMA_ARG_CTX_SIZE was read: $ready $(cat "$T/err")"
# --help names the variables
"$BIN" serve --help >"$T/help" 2>&1 || fail "serve --help failed"
for v in LLAMA_ARG_MODEL LLAMA_ARG_CTX_SIZE LLAMA_ARG_N_PARALLEL LLAMA_ARG_HOST LLAMA_ARG_PORT LLAMA_API_KEY \
    LLAMA_ARG_ENDPOINT_SLOTS LLAMA_ARG_ENDPOINT_PROPS; do
    grep -q "$v" "$T/help" || fail "serve --help does not name $v"
done
echo "ok llama_env"
