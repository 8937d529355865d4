#!/bin/sh
# `mlxcel inspect`: text and --json on the embedded llama-tiny, a qwen3 fixture,
# the MoE phixtral-tiny and a 4-bit MLX checkpoint; and the unused-tensor report
# on a folder whose extra shard holds 25 tensors no family consumes.
# Usage (from the repo root): sh tests/cli/inspect.sh path/to/mlxcel
BIN=${1:?usage: inspect.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL inspect: $*" >&2; exit 1; }
# run CMD...: stdout -> $T/out, stderr -> $T/err, exit status -> $rc
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
# has WHAT REGEX: stdout matches the basic regex
has() { grep -q -- "$2" "$T/out" || fail "$1: no line matching '$2' in: $(cat "$T/out")"; }
# the JSON output with all whitespace removed, for key:value greps
flat() { tr -d ' \t\n\r' <"$T/out" >"$T/flat"; }
jhas() { grep -q -- "$2" "$T/flat" || fail "$1: JSON lacks '$2': $(cat "$T/flat")"; }

# ---- text, embedded model ----
run "$BIN" inspect -m models/llama-tiny
expect_rc 0 "inspect llama-tiny"
has "family" '^family  *llama$'
has "model_type" '^model_type  *llama$'
has "n_layer" '^n_layer  *4$'
has "n_embd" '^n_embd  *256$'
has "n_kv_head" '^n_kv_head  *4$'
has "rope" '^rope  *default, theta 10000$'
has "norm" '^norm  *rmsnorm$'
has "params" '^params  *3\.7M (3672320)$'
has "dtypes" '^dtypes  *BF16 x [0-9][0-9]*$'
has "quantization" '^quantization  *none$'
has "weights" '^weights  *.*([0-9][0-9]* bytes)$'
has "kv" '^kv cache  *4\.0 KiB per token'
has "files" '^files  *1$'
has "unused" '^unused tensors  *0$'
grep -q n_expert "$T/out" && fail "dense model shows n_expert"
[ -s "$T/err" ] && fail "inspect wrote to stderr: $(cat "$T/err")"

# ---- --json, embedded model: every stable key, exact values ----
run "$BIN" inspect -m models/llama-tiny --json
expect_rc 0 "inspect --json llama-tiny"
head -c1 "$T/out" | grep -q '{' || fail "--json output does not start with {"
flat
for k in family model_type path n_vocab n_embd n_layer n_head n_kv_head head_dim n_ff n_ctx \
    n_rot n_expert n_expert_used rope norm params dtypes quantization weight_bytes \
    kv_bytes_per_token files unused_tensors; do
    jhas "key $k" "\"$k\":"
done
jhas family '"family":"llama"'
jhas n_vocab '"n_vocab":2048,'
jhas head_dim '"head_dim":32,'
jhas n_ctx '"n_ctx":512,'
jhas n_expert '"n_expert":0,'
jhas rope '"rope":{"kind":"default","theta":10000}'
jhas params '"params":3672320,'
jhas quantization '"quantization":null'
jhas kv '"kv_type":"f32","kv_bytes_per_token":4096,'

# ---- --kv-type: the cache sizes are those of that element type ----
run "$BIN" inspect -m models/llama-tiny --kv-type f16 --json
expect_rc 0 "inspect --kv-type f16 --json"
flat
jhas "kv f16" '"kv_type":"f16","kv_bytes_per_token":2048,'
jhas "kv f16 at n_ctx" '"kv_bytes_at_n_ctx":1048576,'
run "$BIN" inspect -m models/llama-tiny --kv-type bf16
expect_rc 0 "inspect --kv-type bf16"
has "kv bf16" '^kv cache  *2\.0 KiB per token; 1\.0 MiB per sequence at n_ctx 512, bf16$'
run "$BIN" inspect -m models/llama-tiny --kv-type f8
expect_rc 1 "inspect --kv-type f8"
jhas unused '"unused_tensors":\[\]'
wb=$(sed -n 's/.*"weight_bytes":\([0-9]*\).*/\1/p' "$T/flat")
sz=$(wc -c <models/llama-tiny/model.safetensors)
[ -n "$wb" ] && [ "$wb" -gt 0 ] && [ "$wb" -lt "$sz" ] || fail "weight_bytes '$wb' not in (0, file size $sz)"

# ---- qwen3 fixture ----
run "$BIN" inspect -m tests/fixtures/golden/qwen3 --json
expect_rc 0 "inspect qwen3"
flat
jhas family '"family":"qwen3"'
jhas head_dim '"head_dim":32,'
jhas n_head '"n_head":4,'
jhas n_kv_head '"n_kv_head":2,'
jhas theta '"theta":1000000'

# ---- MoE: experts shown ----
run "$BIN" inspect -m tests/fixtures/models/phixtral-tiny
expect_rc 0 "inspect phixtral-tiny"
has "family" '^family  *phixtral$'
has "n_expert" '^n_expert  *4$'
has "n_expert_used" '^n_expert_used  *2$'
run "$BIN" inspect -m tests/fixtures/models/phixtral-tiny --json
expect_rc 0 "inspect phixtral-tiny --json"
flat
jhas n_expert '"n_expert":4,'
jhas n_expert_used '"n_expert_used":2,'
jhas norm '"norm":"layernorm"'

# ---- quantized MLX checkpoint ----
run "$BIN" inspect -m tests/fixtures/golden/phixtral_mlx_q4
expect_rc 0 "inspect q4"
has "quantization" '^quantization  *affine 4-bit, group size 64$'
has "dtypes" 'U32 x [0-9]'
run "$BIN" inspect -m tests/fixtures/golden/phixtral_mlx_q4 --json
expect_rc 0 "inspect q4 --json"
flat
jhas quantization '"quantization":{"mode":"affine","bits":4,"group_size":64,"overrides":0}'
jhas dtypes '"dtypes":{[^}]*"U32":[0-9]'

# ---- unused tensors: llama-tiny plus a shard of 25 tensors nobody maps ----
# The shard is built by hand: u64 LE header length, JSON header, data.
M="$T/extra"
mkdir -p "$M"
cp "$PWD/models/llama-tiny/config.json" "$M/config.json"
cp "$PWD/models/llama-tiny/model.safetensors" "$M/model.safetensors"
hdr='{'
i=0
while [ $i -lt 25 ]; do
    n=$(printf '%02d' $i)
    [ $i -gt 0 ] && hdr="$hdr,"
    hdr="$hdr\"zz.unused.$n\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[$((i * 4)),$((i * 4 + 4))]}"
    i=$((i + 1))
done
hdr="$hdr}"
len=${#hdr}
{
    printf "\\$(printf %o $((len % 256)))\\$(printf %o $((len / 256)))\\000\\000\\000\\000\\000\\000"
    printf '%s' "$hdr"
    head -c 100 /dev/zero
} >"$M/extra.safetensors"

run "$BIN" inspect -m "$M"
expect_rc 0 "inspect with unused tensors"
has "unused count" '^unused tensors  *25$'
has "first unused" '^  zz\.unused\.00$'
has "20th unused" '^  zz\.unused\.19$'
grep -q 'zz\.unused\.20' "$T/out" && fail "text mode lists more than 20 unused tensors"
has "more" '^  \.\.\. and 5 more'
has "files" '^files  *2$'

run "$BIN" inspect -m "$M" -v
expect_rc 0 "inspect -v"
has "last unused (-v)" '^  zz\.unused\.24$'
grep -q '\.\.\. and' "$T/out" && fail "-v still truncates the unused list"
has "shard listed (-v)" 'extra\.safetensors$'

run "$BIN" inspect -m "$M" --json
expect_rc 0 "inspect --json with unused tensors"
flat
jhas files '"files":2,'
jhas "first" '"unused_tensors":\["zz.unused.00","zz.unused.01"'
jhas "last" '"zz.unused.24"\]'
n=$(tr ',' '\n' <"$T/flat" | grep -c '"zz\.unused\.')
[ "$n" -eq 25 ] || fail "unused_tensors has $n names, expected 25"

# ---- sliding-window layers: the bounded cache per layer kind (ADR 0023) ----
# gemma3_text golden: one full and one sliding layer of 2 kv heads x 32 dims (512 B a
# token each), window 8: at most 2 blocks of 16 = 32 positions; n_ctx 256
run "$BIN" inspect -m tests/fixtures/golden/gemma3_text
expect_rc 0 "inspect gemma3_text"
has "kv total" '^kv cache  *1\.0 KiB per token; 144\.0 KiB per sequence at n_ctx 256$'
has "kv full" '^  full layers  *1 layers, 512 B per token, every position (128\.0 KiB at n_ctx)$'
has "kv sliding" '^  sliding layers  *1 layers, 512 B per token, window 8: at most 32 positions (16\.0 KiB)$'
run "$BIN" inspect -m tests/fixtures/golden/gemma3_text --json
flat
jhas "sliding json" '"sliding":{"layers":1,"window":8,"bytes_per_token":512,"max_positions":32,"bytes_at_n_ctx":16384}'
jhas "bounded total" '"kv_bytes_at_n_ctx":147456'

echo "inspect: ok"
