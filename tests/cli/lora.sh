#!/bin/sh
# LoRA adapter flags (ADR 0103): --lora PATH[:S], --lora-scaled PATH S and
# --lora-init-without-apply in generate, bench and perplexity, and convert --fuse-lora, on the
# tiny llama golden base with gen_lora.py's adapters (tests/fixtures/golden/lora_ref): an
# adapter changes the greedy ids, scale 0 and --lora-init-without-apply give the base's,
# the two flag spellings agree, the f32 merge generates what the unmerged run does, a merge into
# a quantized folder keeps its quantization, every
# --help lists the flags, and bad values or hostile adapters are one-line errors with exit 1.
# Usage (from the repo root): sh tests/cli/lora.sh path/to/mlxcel
BIN=${1:?usage: lora.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL lora: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_error() {
    [ "$rc" -eq 1 ] || fail "$1: exit $rc, expected 1; stderr: $(cat "$T/err")"
    [ "$(wc -l <"$T/err")" -eq 1 ] || fail "$1: stderr is not one line: $(cat "$T/err")"
    grep -q -- "$2" "$T/err" || fail "$1: stderr lacks '$2': $(cat "$T/err")"
    [ -s "$T/out" ] && fail "$1: wrote to stdout: $(cat "$T/out")"
    return 0
}
# a usage error (a bad flag value): exit 2, the message, then the --help hint
expect_usage() {
    [ "$rc" -eq 2 ] || fail "$1: exit $rc, expected 2; stderr: $(cat "$T/err")"
    head -1 "$T/err" | grep -q -- "$2" || fail "$1: stderr lacks '$2': $(cat "$T/err")"
    [ -s "$T/out" ] && fail "$1: wrote to stdout: $(cat "$T/out")"
    return 0
}
BASE=tests/fixtures/golden/llama
REF=tests/fixtures/golden/lora_ref
[ -d $REF/peft_a ] || fail "$REF is missing (cmake unpacks it)"
ids() { m=$1; shift; "$BIN" generate -m "$m" --prompt-ids 242,339,311,60,228,99 -n 8 --temp 0 \
    --output-ids "$@" 2>"$T/gen.err" || fail "generate $*: $(cat "$T/gen.err")"; }

# ---- generate ----
base=$(ids $BASE)
pa=$(ids $BASE --lora $REF/peft_a)
[ "$pa" != "$base" ] || fail "--lora peft_a changed nothing: $pa"
[ "$(ids $BASE --lora-scaled $REF/peft_a 1)" = "$pa" ] || fail "--lora-scaled PATH 1 differs from --lora PATH"
[ "$(ids $BASE --lora $REF/peft_a:1.0)" = "$pa" ] || fail "--lora PATH:1.0 differs from --lora PATH"
[ "$(ids $BASE --lora $REF/peft_a:0)" = "$base" ] || fail "--lora PATH:0 differs from the base"
[ "$(ids $BASE --lora $REF/peft_a --lora-init-without-apply)" = "$base" ] ||
    fail "--lora-init-without-apply differs from the base"
mx=$(ids $BASE --lora $REF/mlx_a)
[ "$mx" != "$base" ] || fail "--lora mlx_a changed nothing"
# the adapter file itself names the adapter too
[ "$(ids $BASE --lora $REF/mlx_a/adapters.safetensors)" = "$mx" ] || fail "the file path differs from the folder"

# ---- convert --fuse-lora: the f32 merge generates the unmerged ids ----
run "$BIN" convert -m $BASE -o "$T/fused" --dtype f32 --fuse-lora $REF/peft_a
[ "$rc" -eq 0 ] || fail "convert --fuse-lora: $(cat "$T/err")"
[ "$(ids "$T/fused")" = "$pa" ] || fail "the fused checkpoint generates $(ids "$T/fused"), unmerged $pa"
run "$BIN" convert -m $BASE -o "$T/fused2" --dtype f32 --fuse-lora $REF/peft_a --fuse-lora $REF/mlx_a:0
[ "$rc" -eq 0 ] || fail "convert with two adapters: $(cat "$T/err")"
[ "$(ids "$T/fused2")" = "$pa" ] || fail "an adapter fused at scale 0 changed the weights"
run "$BIN" convert -m $BASE -o "$T/fq" -q --fuse-lora $REF/peft_a
[ "$rc" -eq 0 ] || fail "convert -q --fuse-lora: $(cat "$T/err")"
# into a quantized folder (mlx-lm's fuse: dequantize, add, requantize): its quantization stays
run "$BIN" convert -m $BASE -o "$T/q4" -q
[ "$rc" -eq 0 ] || fail "convert -q: $(cat "$T/err")"
run "$BIN" convert -m "$T/q4" -o "$T/q4f" --fuse-lora $REF/peft_a
[ "$rc" -eq 0 ] || fail "convert --fuse-lora of a quantized folder: $(cat "$T/err")"
cmp -s "$T/q4/config.json" "$T/q4f/config.json" || fail "the fused folder's config.json differs"
[ "$(ids "$T/q4f")" != "$(ids "$T/q4")" ] || fail "fusing into the 4-bit folder changed nothing"
run "$BIN" convert -m "$T/q4" -o "$T/q4g" -q --fuse-lora $REF/peft_a
expect_error "-q over a quantized folder" "already quantized"
[ -e "$T/q4g" ] && fail "a failed convert left $T/q4g"

# ---- perplexity and bench take the flags ----
printf '[242,339,311,60,228,99,367,317,117,177,377,79]' >"$T/ids.json"
p0=$("$BIN" perplexity -m $BASE --ids-file "$T/ids.json" --json 2>"$T/err") || fail "perplexity: $(cat "$T/err")"
p1=$("$BIN" perplexity -m $BASE --ids-file "$T/ids.json" --json --lora $REF/peft_rs 2>"$T/err") ||
    fail "perplexity --lora: $(cat "$T/err")"
[ "$p0" != "$p1" ] || fail "perplexity --lora changed nothing: $p1"
run "$BIN" bench -m $BASE -p 8 -n 4 -r 1 --lora $REF/mlx_a --json
[ "$rc" -eq 0 ] || fail "bench --lora: $(cat "$T/err")"

# ---- --help lists the flags ----
for cmd in generate serve bench perplexity; do
    "$BIN" $cmd --help >"$T/help" 2>&1 || fail "$cmd --help"
    for f in --lora --lora-scaled --lora-init-without-apply; do
        grep -q -- "$f " "$T/help" || fail "$cmd --help does not list $f"
    done
done
"$BIN" convert --help | grep -q -- "--fuse-lora" || fail "convert --help does not list --fuse-lora"

# ---- errors ----
run "$BIN" generate -m $BASE --prompt-ids 1,2 -n 1 --output-ids --lora "$T/nowhere"
expect_error "a missing adapter" "nowhere"
run "$BIN" generate -m $BASE --prompt-ids 1,2 -n 1 --output-ids --lora-scaled $REF/peft_a
expect_usage "--lora-scaled with one value" "PATH SCALE"
run "$BIN" generate -m $BASE --prompt-ids 1,2 -n 1 --output-ids --lora $REF/peft_a:1e9
expect_usage "a scale out of range" "--lora"
run "$BIN" generate -m $BASE --prompt-ids 1,2 -n 1 --output-ids --lora-scaled $REF/peft_a nan
expect_usage "a NaN scale" "--lora-scaled"
mkdir "$T/bad" && cp $REF/peft_a/adapter_model.safetensors "$T/bad/" &&
    sed 's/"r": *4/"r": 8/' $REF/peft_a/adapter_config.json >"$T/bad/adapter_config.json"
run "$BIN" generate -m $BASE --prompt-ids 1,2 -n 1 --output-ids --lora "$T/bad"
expect_error "a rank the tensors do not have" "is \[4, 176\], expected \[8, 176\]"
run "$BIN" convert -m $BASE -o "$T/x" --fuse-lora "$T/bad"
expect_error "convert with a bad adapter" "is \[4, 176\], expected \[8, 176\]"
[ -e "$T/x" ] && fail "a failed convert left $T/x"
echo "lora: ok"
