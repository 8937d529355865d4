#!/bin/sh
# `mlxcel list` over a temporary MLXCEL_MODELS_DIR (owner/name folders, one a
# symlink to models/llama-tiny, one with a garbage config.json) and a fake
# Hugging Face cache (HF_HOME/hub/models--a--b with refs/main, a snapshot and
# symlinks into blobs/). Also checks that `-m owner/name` resolves through both.
# Usage (from the repo root): sh tests/cli/list.sh path/to/mlxcel
BIN=${1:?usage: list.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL list: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
has() { grep -q -- "$2" "$T/out" || fail "$1: no line matching '$2' in: $(cat "$T/out")"; }
flat() { tr -d ' \t\n\r' <"$T/out" >"$T/flat"; }
jhas() { grep -q -- "$2" "$T/flat" || fail "$1: JSON lacks '$2': $(cat "$T/flat")"; }

TINY="$PWD/models/llama-tiny"
SIZE=$(wc -c <"$TINY/model.safetensors" | tr -d ' ')

# ---- empty roots ----
run env MLXCEL_MODELS_DIR="$T/none" HF_HOME="$T/none" HF_HUB_CACHE= "$BIN" list
expect_rc 0 "list with missing roots"
has "empty" 'no models found'
run env MLXCEL_MODELS_DIR="$T/none" HF_HOME="$T/none" HF_HUB_CACHE= "$BIN" list --json
expect_rc 0 "list --json with missing roots"
flat
[ "$(cat "$T/flat")" = "[]" ] || fail "empty --json is not []: $(cat "$T/flat")"

# ---- mlxcel layout ----
MD="$T/models"
mkdir -p "$MD/acme" "$MD/bad/garbage" "$MD/stray"
ln -s "$TINY" "$MD/acme/tiny"
printf '{"model_type": "llama", ' >"$MD/bad/garbage/config.json"
echo "not a model folder" >"$MD/stray/README"
mkdir -p "$MD/stray/nocfg"

# ---- HF cache layout: refs/main -> snapshot, files are links into blobs/ ----
HUB="$T/hf/hub"
R="$HUB/models--a--b"
mkdir -p "$R/refs" "$R/blobs" "$R/snapshots/0123abcd" "$R/snapshots/ffff0000"
printf '0123abcd' >"$R/refs/main"
cp "$TINY/model.safetensors" "$R/blobs/x"
cp "$TINY/config.json" "$R/blobs/c"
ln -s ../../blobs/x "$R/snapshots/0123abcd/model.safetensors"
ln -s ../../blobs/c "$R/snapshots/0123abcd/config.json"
# an unsupported model_type, no refs/ (the only snapshot is used)
R2="$HUB/models--zed--other-model"
mkdir -p "$R2/snapshots/beef"
echo '{"model_type": "gpt_bigfoot", "quantization": {"bits": 4, "group_size": 32}}' \
    >"$R2/snapshots/beef/config.json"
# not a model repo: ignored
mkdir -p "$HUB/datasets--a--b/snapshots/1" "$HUB/models--noseparator"

export MLXCEL_MODELS_DIR="$MD" HF_HOME="$T/hf"
unset HF_HUB_CACHE

run "$BIN" list
expect_rc 0 "list"
has "mlxcel entry" "^acme/tiny  *mlxcel  *llama  *llama  *none  *7\.0 MiB  *$MD/acme/tiny\$"
has "hf entry" "^a/b  *hf  *llama  *llama  *none  *7\.0 MiB  *$R/snapshots/0123abcd\$"
has "invalid config" '^bad/garbage  *mlxcel  *-  *invalid config '
has "unsupported" '^zed/other-model  *hf  *gpt_bigfoot  *unsupported  *4-bit g32 '
grep -q stray "$T/out" && fail "folder without config.json listed"
grep -q 'datasets\|noseparator' "$T/out" && fail "non-model HF folder listed"
# sorted by name: a/b, acme/tiny, bad/garbage, zed/other-model
order=$(sed -n '2,$s/ .*//p' "$T/out" | tr '\n' ' ')
[ "$order" = "a/b acme/tiny bad/garbage zed/other-model " ] || fail "order is '$order'"

run "$BIN" list --json
expect_rc 0 "list --json"
flat
jhas "hf" "{\"name\":\"a/b\",\"source\":\"hf\",\"model_type\":\"llama\",\"family\":\"llama\",\"status\":\"ok\",\"quantization\":null,\"size_bytes\":$SIZE,"
jhas "mlxcel" "{\"name\":\"acme/tiny\",\"source\":\"mlxcel\",\"model_type\":\"llama\",\"family\":\"llama\",\"status\":\"ok\",\"quantization\":null,\"size_bytes\":$SIZE,"
jhas "invalid" '"name":"bad/garbage","source":"mlxcel","model_type":null,"family":null,"status":"invalidconfig"'
jhas "unsupported" '"name":"zed/other-model","source":"hf","model_type":"gpt_bigfoot","family":null,"status":"unsupported","quantization":{"mode":"affine","bits":4,"group_size":32,"overrides":0},"size_bytes":0'
n=$(grep -o '"name":' "$T/flat" | wc -l | tr -d ' ')
[ "$n" -eq 4 ] || fail "--json lists $n models, expected 4"

# ---- -m owner/name resolves through both roots ----
run "$BIN" inspect -m acme/tiny --json
expect_rc 0 "inspect -m acme/tiny"
flat
jhas "mlxcel path" "\"path\":\"$MD/acme/tiny\""
run "$BIN" inspect -m a/b --json
expect_rc 0 "inspect -m a/b (HF cache)"
flat
jhas "hf path" "\"path\":\"$R/snapshots/0123abcd\""
jhas "hf family" '"family":"llama"'
# offline: a model in no cache is otherwise pulled from the Hub (tests/cli/pull.sh)
run env HF_HUB_OFFLINE=1 "$BIN" inspect -m nobody/nothing
expect_rc 1 "inspect -m nobody/nothing"
grep -q "nobody/nothing" "$T/err" || fail "missing-model error does not name it: $(cat "$T/err")"

# ---- partial snapshots: listed as partial with a hint, and -m names `mlxcel pull` ----
# an index naming two shards, one absent (a huggingface_hub download cut between shards)
R3="$HUB/models--cut--sharded"
mkdir -p "$R3/refs" "$R3/blobs" "$R3/snapshots/aa11"
printf 'aa11' >"$R3/refs/main"
cp "$TINY/config.json" "$R3/blobs/c"
cp "$TINY/model.safetensors" "$R3/blobs/s1"
ln -s ../../blobs/c "$R3/snapshots/aa11/config.json"
ln -s ../../blobs/s1 "$R3/snapshots/aa11/model-00001-of-00002.safetensors"
printf '{"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}' \
    >"$R3/blobs/i"
ln -s ../../blobs/i "$R3/snapshots/aa11/model.safetensors.index.json"
# no weights yet, the download of them left behind as .incomplete
R4="$HUB/models--cut--single"
mkdir -p "$R4/blobs" "$R4/snapshots/bb22"
cp "$TINY/config.json" "$R4/snapshots/bb22/config.json"
head -c 1000 "$TINY/model.safetensors" >"$R4/blobs/$(printf x | sha256sum | cut -c1-64).incomplete"
run "$BIN" list
expect_rc 0 "list with partial snapshots"
has "partial sharded" '^cut/sharded  *hf  *llama  *partial '
has "partial single" '^cut/single  *hf  *llama  *partial '
has "whole a/b still ok" '^a/b  *hf  *llama  *llama '
grep -q "cut/sharded (hf) is partial: model-00002-of-00002.safetensors missing; \`mlxcel pull cut/sharded\` completes it" \
    "$T/err" || fail "no pull hint for cut/sharded: $(cat "$T/err")"
grep -q "cut/single (hf) is partial: .*mlxcel pull cut/single" "$T/err" || fail "no hint for cut/single: $(cat "$T/err")"
run "$BIN" list --json
flat
jhas "partial --json" '"name":"cut/sharded","source":"hf","model_type":"llama","family":"llama","status":"partial","missing":"model-00002-of-00002.safetensorsmissing"'
jhas "partial single --json" '"name":"cut/single","source":"hf","model_type":"llama","family":"llama","status":"partial"'
run env HF_HUB_OFFLINE=1 "$BIN" inspect -m cut/sharded
expect_rc 1 "inspect -m of a partial snapshot"
grep -q "mlxcel pull cut/sharded" "$T/err" || fail "partial -m: no pull hint: $(cat "$T/err")"
run env HF_HUB_OFFLINE=1 "$BIN" generate -m cut/single -p x -n 1
expect_rc 1 "generate -m of a snapshot without weights"
grep -q "mlxcel pull cut/single" "$T/err" || fail "no-weights -m: no pull hint: $(cat "$T/err")"
rm -rf "$R3" "$R4"
# the pull hint names a repository only where the folder is one: a cache snapshot or
# <models dir>/owner/name; a folder of the user's own (here $T/work/mine) is not "work/mine"
mkdir -p "$MD/acme/cut" "$T/work/mine"
cp "$TINY/config.json" "$MD/acme/cut/"
cp "$TINY/config.json" "$TINY/tokenizer.json" "$T/work/mine/"
run env HF_HUB_OFFLINE=1 "$BIN" inspect -m acme/cut
expect_rc 1 "inspect -m of a models-dir folder without weights"
grep -q "mlxcel pull acme/cut" "$T/err" || fail "models dir: no pull hint: $(cat "$T/err")"
run "$BIN" inspect -m "$T/work/mine"
expect_rc 1 "inspect of a folder of one's own without weights"
grep -q "incomplete" "$T/err" || fail "own folder: no word of what is missing: $(cat "$T/err")"
grep -q "mlxcel pull" "$T/err" && fail "own folder: a pull of an unrelated repository was suggested: $(cat "$T/err")"
rm -rf "$MD/acme/cut" "$T/work"

# HF_HUB_CACHE wins over HF_HOME
mv "$HUB" "$T/elsewhere"
run env HF_HUB_CACHE="$T/elsewhere" "$BIN" list
expect_rc 0 "list with HF_HUB_CACHE"
has "hf entry via HF_HUB_CACHE" '^a/b  *hf '

echo "list: ok"
