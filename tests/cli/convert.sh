#!/bin/sh
# `mlxcel convert`: -q on phixtral-tiny reproduces the published
# phixtral-tiny-4bit file byte for byte and generates the same ids; every
# affine bits x group converts, loads and generates; the fp modes write
# U8 scales and no biases, load and generate; float conversion of a sharded checkpoint keeps the
# outputs; hostile arguments are one-line errors with exit 1; --json; no
# progress output in a pipe.
# Usage (from the repo root): sh tests/cli/convert.sh path/to/mlxcel
BIN=${1:?usage: convert.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL convert: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
# one-line error, exit 1, stdout empty, message containing $2
expect_error() {
    expect_rc 1 "$1"
    [ "$(wc -l <"$T/err")" -eq 1 ] || fail "$1: stderr is not one line: $(cat "$T/err")"
    grep -q -- "$2" "$T/err" || fail "$1: stderr lacks '$2': $(cat "$T/err")"
    [ -s "$T/out" ] && fail "$1: wrote to stdout: $(cat "$T/out")"
    return 0
}
ids() { "$BIN" generate -m "$1" --prompt-ids 1,2,3,4,5 -n 8 --temp 0 --output-ids 2>"$T/gen.err" ||
    fail "generate -m $1: $(cat "$T/gen.err")"; }

SRC=tests/fixtures/models/phixtral-tiny
PUB=models/phixtral-tiny-4bit

# ---- the published 4-bit upload, byte for byte ----
run "$BIN" convert -m $SRC -o "$T/q4" -q
expect_rc 0 "convert -q"
[ -s "$T/err" ] && fail "convert wrote to stderr in a pipe: $(cat "$T/err")"
# the published file's SHA-256 (models/phixtral-tiny-4bit.derive: the build makes that file with
# this same conversion and checks it against the hash too)
want=$(sed -n 's/^sha256[[:space:]]*//p' $PUB.derive)
[ ${#want} -eq 64 ] || fail "no sha256 in $PUB.derive"
got=$(sha256sum <"$T/q4/model.safetensors" | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "model.safetensors (SHA-256 $got) differs from the published $PUB ($want)"
[ "$(ids "$T/q4")" = "$(ids $PUB)" ] || fail "converted and published 4-bit models generate different ids"
for f in tokenizer.json tokenizer_config.json generation_config.json; do
    cmp -s "$T/q4/$f" "$SRC/$f" || fail "$f was not copied"
done
tr -d ' \t\n' <"$T/q4/config.json" >"$T/flat"
grep -q '"quantization":{"group_size":64,"bits":4,"mode":"affine"}' "$T/flat" || fail "config quantization: $(cat "$T/flat")"
grep -q '"quantization_config":{"group_size":64,"bits":4,"mode":"affine"}' "$T/flat" || fail "config quantization_config"
grep -q '_name_or_path' "$T/flat" && fail "config keeps _name_or_path (mlx-lm drops it)"

# ---- every affine bits x group: converts, loads, generates 8 ids ----
for b in 2 3 5 6 8; do
    for g in 32 128; do
        run "$BIN" convert -m $SRC -o "$T/a$b$g" -q --q-bits $b --q-group-size $g --json
        expect_rc 0 "convert -q --q-bits $b --q-group-size $g"
        tr -d ' \t\n' <"$T/out" >"$T/flat"
        grep -q "\"bits\":$b,\"group_size\":$g" "$T/flat" || fail "--json bits/group: $(cat "$T/flat")"
        # n_embd 192 divides by 32 but not 128: at g128 only the experts' fc2 (in 768) quantize
        want=22; [ $g -eq 128 ] && want=4
        grep -q "\"quantized\":$want," "$T/flat" || fail "--json quantized count: $(cat "$T/flat")"
        n=$(ids "$T/a$b$g" | tr ',' '\n' | grep -c '[0-9]')
        [ "$n" -eq 8 ] || fail "$b-bit g$g: generated $n ids"
        rm -rf "$T/a$b$g"
    done
done
# the CPU variant differs from the GPU one (ties, all-negative groups) but loads the same way
run "$BIN" convert -m $SRC -o "$T/cpu" -q --q-variant cpu
expect_rc 0 "convert --q-variant cpu"
cmp -s "$T/cpu/model.safetensors" $PUB/model.safetensors && fail "cpu variant is byte-identical to the gpu one"
[ "$(ids "$T/cpu" | tr ',' '\n' | grep -c '[0-9]')" -eq 8 ] || fail "cpu variant does not generate"

# ---- fp modes: U8 scales, no .biases; they load and generate ----
for m in mxfp4 mxfp8 nvfp4; do
    run "$BIN" convert -m $SRC -o "$T/$m" -q --q-mode $m
    expect_rc 0 "convert --q-mode $m"
    head -c 20000 "$T/$m/model.safetensors" | tr -d '\0' >"$T/hdr"
    grep -q '"transformer.h.0.mixer.Wqkv.scales":{"dtype":"U8"' "$T/hdr" || fail "$m: scales are not U8"
    grep -q '\.biases"' "$T/hdr" && fail "$m: has .biases"
    tr -d " \t\n" <"$T/$m/config.json" | grep -q "\"mode\":\"$m\"" || fail "$m: config mode"
    [ "$(ids "$T/$m" | tr ',' '\n' | grep -c '[0-9]')" -eq 8 ] || fail "$m: does not generate"
done

# ---- float conversion of a sharded checkpoint: same ids ----
run "$BIN" convert -m tests/fixtures/golden/llama -o "$T/llama"
expect_rc 0 "convert golden/llama (9 shards)"
[ "$(ids "$T/llama")" = "$(ids tests/fixtures/golden/llama)" ] || fail "float llama generates other ids"
# --dtype f32 keeps the values (bf16 -> f32 is exact)
run "$BIN" convert -m tests/fixtures/golden/mixtral -o "$T/mix32" --dtype f32
expect_rc 0 "convert --dtype f32"
[ "$(ids "$T/mix32")" = "$(ids tests/fixtures/golden/mixtral)" ] || fail "f32 mixtral generates other ids"
head -c 4000 "$T/mix32/model.safetensors" | grep -q 'switch_mlp.gate_proj.weight":{"dtype":"F32","shape":\[4,' ||
    fail "mixtral experts are not stacked F32"

# ---- hostile arguments ----
run "$BIN" convert -m $SRC -o "$T/x1" -q --q-bits 7
expect_error "--q-bits 7" "bits = 7"
run "$BIN" convert -m $SRC -o "$T/x2" -q --q-group-size 48
expect_error "group 48" "group_size = 48"
run "$BIN" convert -m $SRC -o "$T/x3" -q --q-mode xyz
expect_error "mode xyz" "'xyz'"
run "$BIN" convert -m $SRC -o "$T/x4" -q --q-mode nvfp4 --q-group-size 32
expect_error "nvfp4 g32" "nvfp4 needs group_size 16"
run "$BIN" convert -m $SRC -o "$T/x5" --q-bits 4
expect_error "--q-bits without -q" "need -q"
run "$BIN" convert -m "$T/missing" -o "$T/x6"
expect_error "missing src" "missing"
run "$BIN" convert -m $SRC -o /proc/mlxcel-no/such
expect_error "unwritable dst" "cannot create"
run "$BIN" convert -m $SRC -o "$T/q4"
expect_error "non-empty dst" "not empty"
run "$BIN" convert -m $PUB -o "$T/x7" -q
expect_error "already quantized" "already quantized"
run "$BIN" convert -m $SRC -o "$T/x8" --dtype f8
expect_error "--dtype f8" "'f8'"
for d in x1 x2 x3 x4 x5 x6 x7 x8; do [ -e "$T/$d" ] && fail "failed convert left $d behind"; done
run "$BIN" convert -o "$T/x9"
expect_rc 2 "no -m"
run "$BIN" convert --help
expect_rc 0 "--help"
grep -q '^usage: mlxcel convert' "$T/out" || fail "--help"
exit 0
