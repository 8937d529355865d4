#!/bin/sh
# `generate --pixel-values FILE` (ADR 0087): the image-text golden cases run from the CLI give
# transformers' greedy ids (one image; two images in one prompt); the same prompt with its
# images' placeholders collapsed to the start-of-image token is expanded to the same ids; a
# prompt with no place for its image, a pixel_values of the wrong shape, a text model given
# pixels, and --image (no image processor yet) are clear errors.
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
# --image waits for the image processor
run "$BIN" generate -m $G --prompt-ids 2,297 --image tests/fixtures/images/photo.jpg -n 1 --output-ids
expect_rc 2 "--image"
grep -q "pixel-values" "$T/err" || fail "--image: $(cat "$T/err")"
"$BIN" generate --help | grep -q -- "--pixel-values FILE" || fail "--help lacks --pixel-values"
"$BIN" generate --help | grep -q -- "--image FILE" || fail "--help lacks --image"
# inspect says what the tower is
"$BIN" inspect -m $G | grep -q "^vision  *gemma3: a ViT 32 wide, 2 layers, 64 px in 8 px patches; 16 rows per image" ||
    fail "inspect: $("$BIN" inspect -m $G)"
echo "ok generate_image"
