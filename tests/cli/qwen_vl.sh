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
    run "$BIN" generate -m $G "$@" -f "$T/prompt" --no-chat -n "$N" --temp 0 --output-ids --ignore-eos \
        --image-embd-out "$T/emb.safetensors"
    expect_rc 0 "$G"
    # the images' rows are transformers' image_features (within 1e-3 of the largest), images in order
    python3 - "$T/emb.safetensors" $G/golden.safetensors <<'PY' || fail "$G: --image-embd-out is not image_features"
import array, json, struct, sys
def rd(p, name):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    if name not in h:
        return None, None
    t = h[name]; a, c = t["data_offsets"]; raw = b[8 + n + a:8 + n + c]
    assert t["dtype"] in ("F32", "F64"), t["dtype"]
    return list(array.array("f" if t["dtype"] == "F32" else "d", raw)), t["shape"]
r, rs = rd(sys.argv[2], "image_features")
if r is not None:
    x, xs = rd(sys.argv[1], "image_embeds")
    assert len(x) == len(r) and xs[-1] == rs[-1], (xs, rs)
    big = max(abs(v) for v in r)
    d = max(abs(a - b) for a, b in zip(x, r))
    assert big > 0 and d <= 1e-3 * big, (d, big)
PY
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
