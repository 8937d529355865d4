#!/bin/sh
# Values from files and the environment follow the same rules as the flags:
#   - on/off variables (MLXCEL_FAST, MLXCEL_MMAP, ...) take 1/0, true/false,
#     yes/no, on/off in any case; MLXCEL_FAST=no is off (it was on), a word
#     that is none of these is refused (exit 2) naming the variable;
#   - generation_config.json's sampling values are checked as --temp, --min-p,
#     ... are, naming the file and key, when do_sample uses them; without
#     do_sample they are unused, so greedy runs are not broken by them;
#   - a dtype that is no torch dtype ("float8") is refused, "dtype" (the key
#     transformers 5 writes) is read too;
#   - model_type alone picks the family: llama4 with LlamaForCausalLM is
#     refused naming it and `mlxcel arch`; a missing model_type is an error.
# Usage (from the repo root): sh tests/cli/config_values.sh path/to/mlxcel
BIN=${1:?usage: config_values.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL config_values: $*" >&2; exit 1; }
run() { timeout 30 "$@" >"$T/out" 2>"$T/err" </dev/null; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
err_has() { grep -qF -- "$2" "$T/err" || fail "$1: stderr lacks '$2': $(cat "$T/err")"; }
M=models/llama-tiny
fresh() { rm -rf "$T/m"; cp -r $M "$T/m"; }

# ---- on/off environment variables ----
fast_of() { tr -d ' \t\n' <"$T/out" | grep -o '"fast":[a-z]*' | head -1; }
MLXCEL_FAST=1 run "$BIN" bench -m $M -p 4 -n 1 -r 1 -t 1 --json
expect_rc 0 "MLXCEL_FAST=1"
ON=true
# a CPU without AVX2 has no fast mode: every spelling is then off
[ "$(fast_of)" = '"fast":true' ] || { ON=false; echo "config_values: no fast mode on this CPU" >&2; }
for v in 1 true TRUE yes On; do
    MLXCEL_FAST=$v run "$BIN" bench -m $M -p 4 -n 1 -r 1 -t 1 --json
    expect_rc 0 "MLXCEL_FAST=$v"
    [ "$(fast_of)" = "\"fast\":$ON" ] || fail "MLXCEL_FAST=$v is not on: $(fast_of)"
done
for v in 0 false no OFF ""; do
    MLXCEL_FAST=$v run "$BIN" bench -m $M -p 4 -n 1 -r 1 -t 1 --json
    expect_rc 0 "MLXCEL_FAST='$v'"
    [ "$(fast_of)" = '"fast":false' ] || fail "MLXCEL_FAST='$v' is not off: $(fast_of)"
done
for var in MLXCEL_FAST MLXCEL_MMAP MLXCEL_REPACK; do
    env "$var=maybe" timeout 30 "$BIN" inspect -m $M >"$T/out" 2>"$T/err"
    rc=$?
    expect_rc 2 "$var=maybe"
    err_has "$var=maybe" "$var='maybe' is neither on nor off"
done

# ---- generation_config.json ----
gen() { printf '%s' "$1" >"$T/m/generation_config.json"; }
fresh
for c in '"temperature": -1|temperature (--temp) = -1' '"min_p": -1|min_p (--min-p) = -1' \
    '"top_p": 2|top_p (--top-p) = 2' '"top_k": -3|top_k (--top-k) = -3'; do
    gen "{\"do_sample\": true, ${c%%|*}}"
    run "$BIN" generate -m "$T/m" -p hi -n 1 --no-chat
    expect_rc 1 "generation_config ${c%%|*}"
    err_has "generation_config ${c%%|*}" "generation_config.json: ${c#*|}"
done
# do_sample false: transformers decodes greedily and never reads them
gen '{"do_sample": false, "top_p": 2, "temperature": -1, "min_p": -1}'
run "$BIN" generate -m "$T/m" -p hi -n 2 --no-chat
expect_rc 0 "greedy with unused sampling values"
gen '{"do_sample": true, "temperature": 0.5, "top_p": 0.9}'
run "$BIN" generate -m "$T/m" -p hi -n 2 --no-chat
expect_rc 0 "valid sampling values"

# ---- dtype ----
fresh
sed 's/"torch_dtype": *"[a-z0-9]*"/"torch_dtype": "float8"/' $M/config.json >"$T/m/config.json"
grep -q float8 "$T/m/config.json" || fail "could not write torch_dtype float8"
for cmd in inspect generate convert; do
    case $cmd in
    inspect) run "$BIN" inspect -m "$T/m" ;;
    generate) run "$BIN" generate -m "$T/m" -p hi -n 1 ;;
    convert) run "$BIN" convert -m "$T/m" -o "$T/conv" ;;
    esac
    expect_rc 1 "torch_dtype float8 ($cmd)"
    err_has "torch_dtype float8 ($cmd)" "'float8' is not a torch dtype"
done
[ -e "$T/conv" ] && fail "convert wrote a folder for a bad dtype"
# transformers 5's "dtype" is read (and wins over torch_dtype)
sed 's/"torch_dtype": *"[a-z0-9]*"/"dtype": "float16", "torch_dtype": "bfloat16"/' $M/config.json >"$T/m/config.json"
run "$BIN" convert -m "$T/m" -o "$T/conv" --json
expect_rc 0 "convert with dtype"
tr -d ' \t\n' <"$T/out" | grep -q '"dtype":"F16"' || fail "convert did not cast to the config's dtype: $(cat "$T/out")"

# ---- model_type ----
fresh
sed 's/"model_type": *"[a-z0-9_]*"/"model_type": "llama4"/' $M/config.json >"$T/m/config.json"
grep -q LlamaForCausalLM "$T/m/config.json" || fail "llama-tiny's config lost its architectures"
run "$BIN" generate -m "$T/m" -p hi -n 1
expect_rc 1 "model_type llama4"
err_has "model_type llama4" "unsupported model_type 'llama4'"
err_has "model_type llama4" "mlxcel arch"
grep -v '"model_type"' $M/config.json >"$T/m/config.json"
run "$BIN" inspect -m "$T/m"
expect_rc 1 "no model_type"
err_has "no model_type" "config.json has no model_type"
err_has "no model_type" '"model_type": "llama"'
echo "config_values: ok"
