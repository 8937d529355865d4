#!/bin/sh
# Idefics3 and SmolVLM from the CLI (issue 43; ADR 0126): `mlxcel arch` lists both wrappers over a
# llama text model; `generate --image` on each idefics3 / smolvlm golden case
# (tests/fixtures/gen/gen_idefics3.py: its tokenizer, chat template, image processor and
# processor_config.json are in the folder) with the prompt transformers rendered (--no-chat: its
# <image> placeholder expanded into the tiles' <fake_token_around_image><row_R_col_C> runs and the
# <global-img> one, then the whole text tokenized) gives transformers' greedy ids; then with the
# chat template placing the image (a 3000x17 image: many tiles), and with no placeholder at all.
# Usage (from the repo root): sh tests/cli/idefics3.sh path/to/mlxcel
BIN=${1:?usage: idefics3.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL idefics3: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
# golden.json fields (no jq on every machine)
field() { python3 -c "import json,sys; v=json.load(open(sys.argv[1]))[sys.argv[2]]; print(','.join(str(i) for i in v) if isinstance(v, list) else v, end='')" "$1" "$2"; }

run "$BIN" arch
expect_rc 0 "arch"
grep -q "^idefics3 .*llama.*images:" "$T/out" || fail "arch lists no idefics3: $(cat "$T/out")"
grep -q "^smolvlm .*llama.*images:" "$T/out" || fail "arch lists no smolvlm: $(cat "$T/out")"

n=0
for G in tests/fixtures/golden/idefics3 tests/fixtures/golden/smolvlm; do
    [ -f $G/golden.json ] || continue
    n=$((n + 1))
    WANT=$(field $G/golden.json greedy_ids)
    N=$(echo "$WANT" | tr ',' '\n' | wc -l)
    field $G/golden.json prompt >"$T/prompt"
    IM=tests/fixtures/images/$(field $G/golden.json images)
    run "$BIN" generate -m $G --image "$IM" -f "$T/prompt" --no-chat -n "$N" --temp 0 --output-ids
    expect_rc 0 "$G"
    [ "$(tr -d ' []\n' <"$T/out")" = "$WANT" ] || fail "$G: $(cat "$T/out"), reference [$WANT]"
    # the chat template places the image itself
    run "$BIN" generate -m $G --image tests/fixtures/images/wide.jpg -p "What is this?" -n 3 --temp 0 --output-ids
    expect_rc 0 "$G with the chat template"
    # a prompt without a placeholder and without the template: the image goes before the text
    run "$BIN" generate -m $G --image "$IM" -p "no image here" --no-chat -n 1 --temp 0 --output-ids
    expect_rc 0 "$G without a placeholder"
done
[ $n -gt 0 ] || fail "no idefics3 golden case (cmake unpacks tests/fixtures/golden/*.tar.xz)"
echo "idefics3: $n cases OK"
