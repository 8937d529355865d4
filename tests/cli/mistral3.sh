#!/bin/sh
# Mistral 3 and LLaVA-Pixtral from the CLI (issue 43; ADR 0123): `mlxcel arch` lists the mistral3
# wrapper; `generate --image` on each golden case (tests/fixtures/gen/gen_mistral3.py: its tokenizer,
# chat template, PixtralImageProcessor and processor_config.json are in the folder) with the prompt
# transformers rendered (--no-chat: its [IMG] placeholder expanded by PixtralProcessor's rule, per
# merged patch row [IMG] x cols then [IMG_BREAK], the last [IMG_END], then the whole text tokenized)
# gives transformers' greedy ids; the chat template placing an image of another size runs; an image
# that shrinks to no patch row is refused, naming the file.
# Usage (from the repo root): sh tests/cli/mistral3.sh path/to/mlxcel
BIN=${1:?usage: mistral3.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL mistral3: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
# golden.json fields (no jq on every machine)
field() { python3 -c "import json,sys; v=json.load(open(sys.argv[1]))[sys.argv[2]]; print(','.join(str(i) for i in v) if isinstance(v, list) else v, end='')" "$1" "$2"; }

run "$BIN" arch
expect_rc 0 "arch"
grep -q "^mistral3 .*images:" "$T/out" || fail "arch lists no mistral3: $(cat "$T/out")"

n=0
for G in tests/fixtures/golden/mistral3 tests/fixtures/golden/pixtral; do
    [ -f $G/golden.json ] || continue
    n=$((n + 1))
    WANT=$(field $G/golden.json greedy_ids)
    N=$(echo "$WANT" | tr ',' '\n' | wc -l)
    field $G/golden.json prompt >"$T/prompt"
    IM=tests/fixtures/images/$(field $G/golden.json images)
    run "$BIN" generate -m $G --image "$IM" -f "$T/prompt" --no-chat -n "$N" --temp 0 --output-ids
    expect_rc 0 "$G"
    [ "$(tr -d ' []\n' <"$T/out")" = "$WANT" ] || fail "$G: $(cat "$T/out"), reference [$WANT]"
    # the chat template places the image itself (another size: its own grid)
    run "$BIN" generate -m $G --image tests/fixtures/images/photo.jpg -p "What is this?" -n 3 --temp 0 --output-ids
    expect_rc 0 "$G with the chat template"
    # 3000 x 17 shrinks to no patch row within longest_edge (transformers fails on it too): an error
    # naming the image, exit 1, nothing generated
    run "$BIN" generate -m $G --image tests/fixtures/images/wide.jpg -p "What is this?" -n 3 --temp 0
    [ "$rc" -ne 0 ] || fail "$G: a 3000x17 image ran: $(cat "$T/out")"
    grep -q "wide.jpg" "$T/err" || fail "$G: the error does not name the image: $(cat "$T/err")"
done
[ $n -gt 0 ] || fail "no mistral3 golden case (cmake unpacks tests/fixtures/golden/*.tar.xz)"
echo "mistral3: $n cases OK"
