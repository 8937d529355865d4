#!/bin/sh
# Qwen2-VL / Qwen2.5-VL / Qwen3-VL from the CLI (issue 43; ADR 0094, 0095, 0120): `mlxcel arch`
# lists the image-text wrappers; `generate --image` on each Qwen golden case (tests/fixtures/gen/
# gen_qwen_vl.py and gen_qwen3_vl.py: its tokenizer, chat template and image processor are in the
# folder) with the prompt transformers
# rendered (--no-chat: its <|image_pad|> placeholders expanded by the processor's rule, then the
# whole text tokenized) gives transformers' greedy ids; the same with the chat template (one image
# before the text, as typed content puts it) runs; --pixel-values is refused for these models.
# --ignore-eos: the reference greedy loop goes on past <|im_end|> (qwen3_vl writes it 4th).
# Usage (from the repo root): sh tests/cli/qwen_vl.sh path/to/mlxcel
BIN=${1:?usage: qwen_vl.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL qwen_vl: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
# golden.json fields (no jq on every machine)
field() { python3 -c "import json,sys; v=json.load(open(sys.argv[1]))[sys.argv[2]]; print(','.join(str(i) for i in v) if isinstance(v, list) else v, end='')" "$1" "$2"; }

run "$BIN" arch
expect_rc 0 "arch"
grep -q "^qwen2_vl .*qwen2_vl_text.*images:" "$T/out" || fail "arch lists no qwen2_vl: $(cat "$T/out")"
grep -q "^qwen2_5_vl .*qwen2_vl_text.*images:" "$T/out" || fail "arch lists no qwen2_5_vl"
grep -q "^qwen3_vl .*qwen3_vl_text.*images:" "$T/out" || fail "arch lists no qwen3_vl"
grep -q "^qwen3_vl_moe .*qwen3_vl_moe_text.*images:" "$T/out" || fail "arch lists no qwen3_vl_moe"

n=0
for G in tests/fixtures/golden/qwen2_vl tests/fixtures/golden/qwen2_vl_2img tests/fixtures/golden/qwen2_5_vl \
         tests/fixtures/golden/qwen2_5_vl_2img tests/fixtures/golden/qwen3_vl tests/fixtures/golden/qwen3_vl_2img \
         tests/fixtures/golden/qwen3_vl_moe; do
    [ -f $G/golden.json ] || continue
    n=$((n + 1))
    WANT=$(field $G/golden.json greedy_ids)
    N=$(echo "$WANT" | tr ',' '\n' | wc -l)
    field $G/golden.json prompt >"$T/prompt"
    set --
    for im in $(field $G/golden.json images | tr ',' ' '); do
        set -- "$@" --image tests/fixtures/images/$im
    done
    run "$BIN" generate -m $G "$@" -f "$T/prompt" --no-chat -n "$N" --temp 0 --output-ids --ignore-eos
    expect_rc 0 "$G"
    [ "$(tr -d ' []\n' <"$T/out")" = "$WANT" ] || fail "$G: $(cat "$T/out"), reference [$WANT]"
    # the chat template places the image itself
    run "$BIN" generate -m $G --image tests/fixtures/images/wide.jpg -p "What is this?" -n 3 --temp 0 --output-ids \
        --stats
    expect_rc 0 "$G with the chat template"
    # --stats times the image of its own size too (the grid path)
    grep -Eq "^image: 1 image, [1-9][0-9]* tokens; preprocess [0-9.]+ ms, encode [0-9.]+ ms$" "$T/err" &&
        grep -q "^time to first token: [0-9.]* ms" "$T/err" || fail "$G --stats: $(cat "$T/err")"
    # fixed-size pixel tensors are not these models' input
    run "$BIN" generate -m $G --prompt-ids 1,2 --pixel-values $G/golden.safetensors -n 1 --output-ids
    expect_rc 1 "$G --pixel-values"
    grep -q "own size" "$T/err" || fail "$G --pixel-values: $(cat "$T/err")"
done
[ $n -gt 0 ] || fail "no Qwen image golden case (cmake unpacks tests/fixtures/golden/*.tar.xz)"
echo "qwen_vl: $n cases OK"
