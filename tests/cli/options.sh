#!/bin/sh
# Options are arguments, not the environment (ADR 0056):
#   - no code under src/ but the CLI's one config reader (src/cli/config.c) reads or
#     writes the process environment (getenv, setenv, unsetenv, putenv);
#   - a global flag wins over its variable (--device, --kv-type, --fast, --mmap), and a
#     flag makes the variable's value unused (MLXCEL_FAST=maybe --fast runs);
#   - the developer variables reach the backend through the reader: MLXCEL_ISA picks the
#     ISA, a cpu-<isa> device wins over it, MLXCEL_REPACK=0 keeps the stored layout;
#   - a bad on/off developer variable is refused before anything runs (exit 2).
# Usage (from the repo root): sh tests/cli/options.sh path/to/mlxcel
BIN=${1:?usage: options.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL options: $*" >&2; exit 1; }
run() { timeout 60 "$@" >"$T/out" 2>"$T/err" </dev/null; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
err_has() { grep -qF -- "$2" "$T/err" || fail "$1: stderr lacks '$2': $(cat "$T/err")"; }
out_has() { grep -qF -- "$2" "$T/out" || fail "$1: stdout lacks '$2': $(head -c 600 "$T/out")"; }
M=models/llama-tiny

# ---- the environment is read in one place ----
grep -rnE '\b(getenv|secure_getenv|setenv|unsetenv|putenv)[[:space:]]*\(' src \
    --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' | grep -v '^src/cli/config\.c:' >"$T/env"
[ -s "$T/env" ] && fail "the environment is read or written outside src/cli/config.c:
$(cat "$T/env")"

# ---- flags win over variables ----
run env MLXCEL_DEVICE=cpu-scalar MLXCEL_KV_TYPE=f16 "$BIN" generate -m $M -p hi -n 1 --no-chat -v \
    --device cpu-scalar --kv-type bf16
expect_rc 0 "--device / --kv-type over the variables"
err_has "--kv-type over MLXCEL_KV_TYPE" "backend cpu-scalar, 2 threads, KV cache bf16"
run env MLXCEL_KV_TYPE=f16 "$BIN" generate -m $M -p hi -n 1 --no-chat -v --device cpu-scalar
expect_rc 0 "MLXCEL_KV_TYPE alone"
err_has "MLXCEL_KV_TYPE alone" "KV cache f16"
run env MLXCEL_FAST=maybe "$BIN" inspect -m $M --fast
expect_rc 0 "MLXCEL_FAST=maybe with --fast (the flag decides)"
run env MLXCEL_MMAP=maybe "$BIN" inspect -m $M --no-mmap
expect_rc 0 "MLXCEL_MMAP=maybe with --no-mmap"

# ---- developer variables reach the backend ----
run env MLXCEL_ISA=scalar "$BIN" generate -m $M -p hi -n 1 --no-chat -v
expect_rc 0 "MLXCEL_ISA=scalar"
err_has "MLXCEL_ISA=scalar" "backend cpu-scalar"
run env MLXCEL_ISA=bogus "$BIN" generate -m $M -p hi -n 1 --no-chat
expect_rc 1 "MLXCEL_ISA=bogus"
err_has "MLXCEL_ISA=bogus" "unknown ISA 'bogus'"
run env MLXCEL_ISA=bogus "$BIN" generate -m $M -p hi -n 1 --no-chat --device cpu-scalar
expect_rc 0 "a cpu-<isa> device over MLXCEL_ISA"
for var in MLXCEL_FUSED_MOE MLXCEL_CUDA_QI MLXCEL_CUDA_PDL MLXCEL_CUDA_ATTN_SPLIT MLXCEL_CUDA_ATTN_FLASH MLXCEL_CUDA_GRAPHS MLXCEL_CUDA_MMA MLXCEL_CUDA_CHUNKED; do
    run env "$var=maybe" "$BIN" inspect -m $M
    expect_rc 2 "$var=maybe"
    err_has "$var=maybe" "$var='maybe' is neither on nor off"
done
for var in MLXCEL_CUDA_MMA_MAX_TOKENS MLXCEL_CUDA_QI_MIN_ROWS; do
    run env $var=lots "$BIN" inspect -m $M
    expect_rc 2 "$var=lots"
    err_has "$var=lots" "$var: 'lots' is not an integer"
    run env $var=-1 "$BIN" inspect -m $M
    expect_rc 2 "$var=-1"
    run env $var=256 "$BIN" inspect -m $M
    expect_rc 0 "$var=256"
done
# the same greedy text with the stored layout and with panels (MLXCEL_REPACK), one sequence
run "$BIN" generate -m models/phixtral-tiny-4bit -p hello -n 8 --no-chat --temp 0
expect_rc 0 "repack on"
cp "$T/out" "$T/packed"
run env MLXCEL_REPACK=0 "$BIN" generate -m models/phixtral-tiny-4bit -p hello -n 8 --no-chat --temp 0
expect_rc 0 "MLXCEL_REPACK=0"
cmp -s "$T/out" "$T/packed" || fail "MLXCEL_REPACK=0 changed the greedy text"
echo "options: ok"
