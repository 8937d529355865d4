#!/bin/sh
# `generate --pixel-values FILE` (ADR 0087): the image-text golden cases run from the CLI give
# transformers' greedy ids (one image; two images in one prompt); the same prompt with its
# images' placeholders collapsed to the start-of-image token is expanded to the same ids; a
# prompt with no place for its image, a pixel_values of the wrong shape and a text model given
# pixels are clear errors. `generate --image FILE` (issue 43 item 4): on a checkpoint made from the
# golden (tests/cli/make_vision_checkpoint.py: tokenizer, chat template, image processor), the
# prompt is expanded as transformers' Gemma3Processor does and the run equals --pixel-values of
# the processor's output with those ids; hostile images and a text model are clear errors.
# Usage (from the repo root): sh tests/cli/generate_image.sh path/to/mlxcel
BIN=${1:?usage: generate_image.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL generate_image: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }

# a JSON array of golden.json, as comma-separated ids (no jq on every machine)
ids() { python3 -c "import json,sys; print(','.join(str(i) for i in json.load(open(sys.argv[1]))[sys.argv[2]]))" "$1" "$2"; }

# embeds_close MLXCEL_FILE GOLDEN: image_embeds of the first within 1e-3 x max of the golden's image_features
embeds_close() {
    python3 - "$1" "$2" <<'PY'
import array, json, struct, sys
def rd(p, name):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; t = json.loads(b[8:8 + n])[name]
    a, c = t["data_offsets"]; raw = b[8 + n + a:8 + n + c]
    if t["dtype"] == "F32":
        return list(array.array("f", raw)), t["shape"]
    if t["dtype"] == "F64":
        return list(array.array("d", raw)), t["shape"]
    sys.exit(f"{p}: {name} is {t['dtype']}")
x, xs = rd(sys.argv[1], "image_embeds")
r, rs = rd(sys.argv[2], "image_features")
assert len(x) == len(r) and xs[-1] == rs[-1], (xs, rs)
big = max(abs(v) for v in r)
d = max(abs(a - b) for a, b in zip(x, r))
assert big > 0 and d <= 1e-3 * big, (d, big)
PY
}

n=0
for G in tests/fixtures/golden/gemma3_vision tests/fixtures/golden/gemma3_vision_2img; do
    [ -f $G/golden.json ] || continue
    n=$((n + 1))
    P=$(ids $G/golden.json input_ids)
    WANT=$(ids $G/golden.json greedy_ids)
    N=$(echo "$WANT" | tr ',' '\n' | wc -l)
    run "$BIN" generate -m $G --prompt-ids "$P" --pixel-values $G/golden.safetensors -n "$N" --temp 0 --output-ids
    expect_rc 0 "$G"
    [ "$(tr -d ' []\n' <"$T/out")" = "$WANT" ] || fail "$G: $(cat "$T/out"), reference [$WANT]"
    # each image as its start-of-image token alone: expanded to boi, image x 16, eoi
    SHORT=$(echo "$P" | sed 's/,299//g; s/,298//g')
    run "$BIN" generate -m $G --prompt-ids "$SHORT" --pixel-values $G/golden.safetensors -n "$N" --temp 0 --output-ids
    expect_rc 0 "$G collapsed placeholders"
    [ "$(tr -d ' []\n' <"$T/out")" = "$WANT" ] || fail "$G collapsed: $(cat "$T/out"), reference [$WANT]"
    # no start-of-image token: no place for the images
    NOIMG=$(echo "$SHORT" | sed 's/,297//g')
    run "$BIN" generate -m $G --prompt-ids "$NOIMG" --pixel-values $G/golden.safetensors -n 2 --output-ids
    expect_rc 1 "$G without a place for the image"
    grep -q "start-of-image" "$T/err" || fail "$G no place: $(cat "$T/err")"
done
[ $n -gt 0 ] || fail "no image golden case (cmake unpacks tests/fixtures/golden/*.tar.xz)"

# --image-embd-out: the projector's output for the golden's pixels is transformers' image_features
# (within 1e-3 of the largest, the golden suite's bound)
G=tests/fixtures/golden/gemma3_vision
run "$BIN" generate -m $G --prompt-ids 2,297 --pixel-values $G/golden.safetensors -n 1 --output-ids \
    --image-embd-out "$T/emb.safetensors"
expect_rc 0 "--image-embd-out"
embeds_close "$T/emb.safetensors" $G/golden.safetensors || fail "--image-embd-out is not image_features"
run "$BIN" generate -m $G --prompt-ids 2,297 -n 1 --output-ids --image-embd-out "$T/x"
expect_rc 2 "--image-embd-out without an image"
[ -e "$T/x" ] && fail "--image-embd-out without an image wrote a file"

# a file without pixel_values (a text golden's references)
G=tests/fixtures/golden/gemma3_vision
run "$BIN" generate -m $G --prompt-ids 2,297 --pixel-values tests/fixtures/golden/gemma3_text/golden.safetensors -n 1 --output-ids
expect_rc 1 "pixel_values missing"
grep -q "pixel_values" "$T/err" || fail "missing tensor: $(cat "$T/err")"
# pixel_values of another size than the model's 3 x 64 x 64: a hand-made safetensors file
H='{"pixel_values":{"dtype":"F32","shape":[1,3,2,2],"data_offsets":[0,48]}}'
python3 -c "import struct,sys; h=sys.argv[1].encode(); sys.stdout.buffer.write(struct.pack('<Q', len(h)) + h + bytes(48))" "$H" >"$T/small.safetensors"
run "$BIN" generate -m $G --prompt-ids 2,297 --pixel-values "$T/small.safetensors" -n 1 --output-ids
expect_rc 1 "pixel_values of another size"
grep -q "\[n, 3, 64, 64\]" "$T/err" || fail "wrong size: $(cat "$T/err")"
# a text model takes no pixels
run "$BIN" generate -m tests/fixtures/golden/gemma3_text --prompt-ids 2,5 --pixel-values $G/golden.safetensors -n 1 --output-ids
expect_rc 1 "text model"
grep -q "does not take images" "$T/err" || fail "text model: $(cat "$T/err")"

# ---- --image, end to end ----
# --stats with --image: the image line (count, tokens, preprocess and encode ms) and the time to
# first token, positive and consistent: each phase no longer than the whole (not a threshold)
image_stats() {  # WHAT IMAGE_TOKENS PROMPT_TOKENS
    python3 - "$T/err" "$2" "$3" <<'PY' || fail "$1: --stats image lines: $(cat "$T/err")"
import re, sys
err = open(sys.argv[1]).read()
m = re.search(r"^image: 1 image, (\d+) tokens; preprocess ([0-9.]+) ms, encode ([0-9.]+) ms$", err, re.M)
t = re.search(r"^time to first token: ([0-9.]+) ms \(preprocess \+ encode \+ prefill of (\d+) tokens \+ first token\)$", err, re.M)
p = re.search(r"^prompt: \d+ tokens in ([0-9.]+) s", err, re.M)
assert m and t and p, "missing lines"
pre, enc, ttft, prefill = float(m[2]), float(m[3]), float(t[1]), 1e3 * float(p[1])
assert int(m[1]) == int(sys.argv[2]) and int(t[2]) == int(sys.argv[3]), (m[1], t[2])
assert pre > 0 and enc > 0 and ttft > 0, (pre, enc, ttft)
assert pre <= ttft and enc <= ttft, (pre, enc, ttft)
# the prompt line's seconds have 3 decimals: 0.5 ms of rounding, and 0.02 ms for the ms lines'
assert pre + enc + prefill <= ttft + 0.52, (pre, enc, prefill, ttft)
PY
}
CK=$T/ck
python3 tests/cli/make_vision_checkpoint.py "$CK" || fail "make_vision_checkpoint.py"
IMG=tests/fixtures/images
I16=$(python3 -c "print(','.join(['299'] * 16))")
# the chat template puts the image before the text: bos, <start_of_turn>user, then the
# processor's "\n\n" (no word for the whitespace pre-tokenizer) boi, image x 16, eoi, the text,
# <end_of_turn>, <start_of_turn>model
WANT_IDS="2,4,6,297,$I16,298,10,20,30,5,4,7"
for F in vis_photo.jpg vis_edges.png photo.webp edges.gif; do
    run "$BIN" generate -m "$CK" --image $IMG/$F -p "w10 w20 w30" -n 6 --temp 1.5 --seed 7 --output-ids \
        --pixel-values-out "$T/pv.safetensors" --stats
    expect_rc 0 "--image $F"
    A=$(tr -d ' []\n' <"$T/out")
    grep -q "^prompt: 27 tokens" "$T/err" || fail "--image $F: prompt length: $(cat "$T/err")"
    image_stats "--image $F" 16 27
    run "$BIN" generate -m "$CK" --image $IMG/$F -p "w10 w20 w30" -n 6 --temp 1.5 --seed 7 --output-ids
    [ "$(tr -d ' []\n' <"$T/out")" = "$A" ] || fail "--image $F is not deterministic: $A, then $(cat "$T/out")"
    run "$BIN" generate -m "$CK" --prompt-ids "$WANT_IDS" --pixel-values "$T/pv.safetensors" -n 6 --temp 1.5 \
        --seed 7 --output-ids
    expect_rc 0 "--pixel-values of $F's pixels"
    [ "$(tr -d ' []\n' <"$T/out")" = "$A" ] || fail "--image $F: [$A], --pixel-values with the ids: $(cat "$T/out")"
done
# the pixels are the processor's: a one-colour image is that colour everywhere after any resize,
# rescaled by 1/255 and normalized with mean 0.5, std 0.5 (as transformers' Gemma3ImageProcessor)
python3 - "$T/solid.png" <<'PY' || fail "writing a PNG"
import struct, sys, zlib
w, h = 23, 9
raw = b"".join(b"\0" + bytes([200, 100, 0]) * w for _ in range(h))
chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
open(sys.argv[1], "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                              + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
PY
run "$BIN" generate -m "$CK" --image "$T/solid.png" -p "w10" -n 1 --output-ids --pixel-values-out "$T/solid.st"
expect_rc 0 "one-colour image"
python3 - "$T/solid.st" <<'PY' || fail "one-colour image: pixel_values"
import array, json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + n])["pixel_values"]
assert hdr["dtype"] == "F32" and hdr["shape"] == [1, 3, 64, 64], hdr
a = array.array("f", b[8 + n:])
assert len(a) == 3 * 64 * 64, len(a)
for c, v in enumerate((200, 100, 0)):
    want = (v / 255 - 0.5) / 0.5
    got = a[c * 4096:(c + 1) * 4096]
    assert max(abs(x - want) for x in got) < 1e-6, (c, want, min(got), max(got))
PY
# two images before the text; then placed by the prompt's own <start_of_image> (no template):
# the run equals --pixel-values with the ids transformers' processor gives
run "$BIN" generate -m "$CK" --image $IMG/vis_photo.jpg --image $IMG/vis_edges.png -p "w10 w20" -n 5 --temp 1.5 \
    --seed 3 --output-ids --pixel-values-out "$T/pv2.safetensors"
expect_rc 0 "two images"
A=$(tr -d ' []\n' <"$T/out")
run "$BIN" generate -m "$CK" --prompt-ids "2,4,6,297,$I16,298,297,$I16,298,10,20,5,4,7" --pixel-values "$T/pv2.safetensors" \
    -n 5 --temp 1.5 --seed 3 --output-ids
[ "$(tr -d ' []\n' <"$T/out")" = "$A" ] || fail "two images: [$A], --pixel-values: $(cat "$T/out")"
run "$BIN" generate -m "$CK" --no-chat --image $IMG/vis_photo.jpg --image $IMG/vis_edges.png \
    -p "<bos>w10 <start_of_image> w20 <start_of_image> w30" -n 5 --temp 1.5 --seed 3 --output-ids
expect_rc 0 "two placeholders"
A=$(tr -d ' []\n' <"$T/out")
run "$BIN" generate -m "$CK" --prompt-ids "2,10,297,$I16,298,20,297,$I16,298,30" --pixel-values "$T/pv2.safetensors" \
    -n 5 --temp 1.5 --seed 3 --output-ids
[ "$(tr -d ' []\n' <"$T/out")" = "$A" ] || fail "two placeholders: [$A], --pixel-values: $(cat "$T/out")"
# more images than placeholders
run "$BIN" generate -m "$CK" --no-chat --image $IMG/vis_photo.jpg --image $IMG/vis_edges.png \
    -p "w10 <start_of_image> w20" -n 1
expect_rc 1 "2 images, 1 placeholder"
grep -q "2 images but the prompt has 1 place" "$T/err" || fail "2 images, 1 place: $(cat "$T/err")"
# hostile images: a clear error naming the file, exit 1
: >"$T/empty.png"
for F in $IMG/truncated.png $IMG/truncated.jpg $IMG/wrong_magic.jpg $IMG/huge_header.png $IMG/bomb.png \
         $IMG/garbage.bin "$T/empty.png" "$T/missing.png"; do
    run "$BIN" generate -m "$CK" --image "$F" -p "w10" -n 1
    expect_rc 1 "hostile $F"
    grep -q "error: --image: .*$F" "$T/err" || fail "hostile $F: $(cat "$T/err")"
done
# a text model, named; no image processor; flags that do not go together
run "$BIN" generate -m tests/fixtures/golden/gemma3_text --image $IMG/vis_photo.jpg --prompt-ids 2,5 -n 1 --output-ids
expect_rc 1 "--image on a text model"
grep -q "model tests/fixtures/golden/gemma3_text (gemma3_text) does not take images" "$T/err" ||
    fail "--image on a text model: $(cat "$T/err")"
mkdir "$T/nopp" && cp "$CK"/*.json "$CK"/model.safetensors "$T/nopp/" && rm "$T/nopp/preprocessor_config.json" "$T/nopp/processor_config.json"
run "$BIN" generate -m "$T/nopp" --image $IMG/vis_photo.jpg -p w10 -n 1
expect_rc 1 "no image processor"
grep -q "preprocessor_config.json" "$T/err" || fail "no image processor: $(cat "$T/err")"
run "$BIN" generate -m "$CK" --image $IMG/vis_photo.jpg --pixel-values "$T/pv.safetensors" -p w10 -n 1
expect_rc 2 "--image with --pixel-values"
run "$BIN" generate -m "$CK" --pixel-values-out "$T/x" -p w10 -n 1
expect_rc 2 "--pixel-values-out without --image"
"$BIN" generate --help | grep -q -- "--pixel-values-out FILE" || fail "--help lacks --pixel-values-out"
"$BIN" generate --help | grep -q -- "--pixel-values FILE" || fail "--help lacks --pixel-values"
"$BIN" generate --help | grep -q -- "--image FILE" || fail "--help lacks --image"
"$BIN" generate --help | grep -q -- "--image-embd-out FILE" || fail "--help lacks --image-embd-out"
"$BIN" generate --help | grep -q -- "time to first token" || fail "--help: --stats does not say it times images"
# no image, no image lines
run "$BIN" generate -m "$CK" -p "w10" -n 2 --stats --output-ids
expect_rc 0 "text-only --stats"
grep -q "^image:\|^time to first token" "$T/err" && fail "text-only --stats prints image lines: $(cat "$T/err")"
# inspect says what the tower is
"$BIN" inspect -m $G | grep -q "^vision  *gemma3: a ViT 32 wide, 2 layers, 64 px in 8 px patches; 16 rows per image" ||
    fail "inspect: $("$BIN" inspect -m $G)"
echo "ok generate_image"
