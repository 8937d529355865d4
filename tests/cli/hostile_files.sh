#!/bin/sh
# Hostile folders and files: every file the program reads by name goes through
# one opening rule (src/core/fileio.c, docs/adr/0017-safe-file-access.md).
#   - a FIFO wherever a file is read is refused at once, not waited on (each
#     run is under `timeout 10`, so a hang fails instead of blocking CI);
#   - a model folder's symlink that leads outside the folder (or its HF repo)
#     is refused, naming the file and its target; links inside still work;
#   - convert copies only allow-listed metadata, never through such a link,
#     never widening a file's mode;
#   - a failing synth or convert leaves no output folder (and no staging
#     folder), and a retry succeeds; `-f -` reads standard input.
# Usage (from the repo root): sh tests/cli/hostile_files.sh path/to/mlxcel
BIN=${1:?usage: hostile_files.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL hostile_files: $*" >&2; exit 1; }
run() { timeout 10 "$@" >"$T/out" 2>"$T/err" </dev/null; rc=$?; }
expect_error() {
    [ "$rc" -eq 124 ] && fail "$1: hung (killed after 10 s)"
    [ "$rc" -eq 1 ] || fail "$1: exit $rc, expected 1; stderr: $(cat "$T/err")"
    grep -q -- "$2" "$T/err" || fail "$1: stderr lacks '$2': $(cat "$T/err")"
    return 0
}
expect_ok() { [ "$rc" -eq 0 ] || fail "$1: exit $rc; stderr: $(cat "$T/err")"; }
# no_output DIR: neither DIR nor a staging folder beside it exists
no_output() {
    [ -e "$2" ] && fail "$1: $2 exists after a failure: $(ls -la "$2")"
    ls -a "$(dirname "$2")" | grep -q "^\.$(basename "$2")\.partial-" &&
        fail "$1: a staging folder was left beside $2"
    return 0
}

TINY=models/llama-tiny
cp -r "$TINY" "$T/base"
printf 'TOPSECRET\n' >"$T/secret"
mkdir "$T/outside"
cp "$TINY"/* "$T/outside/"
# fresh NAME: a copy of the tiny model at $T/NAME
fresh() { rm -rf "$T/$1"; cp -r "$T/base" "$T/$1"; }

# ---- FIFOs in place of the model folder's files ----
for f in config.json generation_config.json tokenizer.json tokenizer_config.json \
    model.safetensors; do
    fresh fifo
    rm "$T/fifo/$f"
    mkfifo "$T/fifo/$f"
    case $f in
    tokenizer*) run "$BIN" tokenize -m "$T/fifo" -p hi ;;
    model.safetensors) run "$BIN" inspect -m "$T/fifo" ;;
    *) run "$BIN" generate -m "$T/fifo" --prompt-ids 1,2 -n 1 ;;
    esac
    expect_error "FIFO $f" "$T/fifo/$f is not a regular file (a FIFO)"
done
# the index of a sharded checkpoint, and a shard it names
fresh fifo
mkfifo "$T/fifo/model.safetensors.index.json"
run "$BIN" inspect -m "$T/fifo"
expect_error "FIFO index" "model.safetensors.index.json is not a regular file"
fresh fifo
mv "$T/fifo/model.safetensors" "$T/fifo/model-00001-of-00002.safetensors"
mkfifo "$T/fifo/model-00002-of-00002.safetensors"
run "$BIN" inspect -m "$T/fifo"
expect_error "FIFO shard" "model-00002-of-00002.safetensors is not a regular file"
# chat templates: tokenizer_config.json without one, then chat_template.jinja / .json
for f in chat_template.jinja chat_template.json; do
    fresh fifo
    echo '{"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}' >"$T/fifo/tokenizer_config.json"
    mkfifo "$T/fifo/$f"
    run "$BIN" generate -m "$T/fifo" --chat -p hi -n 1
    expect_error "FIFO $f" "$f is not a regular file"
done

# ---- FIFOs named by the user ----
mkfifo "$T/pipe"
run "$BIN" generate -m "$T/base" -f "$T/pipe" -n 1
expect_error "generate -f FIFO" "$T/pipe is not a regular file"
run "$BIN" tokenize -m "$T/base" -f "$T/pipe"
expect_error "tokenize -f FIFO" "$T/pipe is not a regular file"
run "$BIN" template -m "$T/base" --messages "$T/pipe"
expect_error "template --messages FIFO" "$T/pipe is not a regular file"
echo '[{"role": "user", "content": "hi"}]' >"$T/msgs.json"
run "$BIN" template -m "$T/base" --messages "$T/msgs.json" --chat-template-file "$T/pipe"
expect_error "--chat-template-file FIFO" "$T/pipe is not a regular file"
run "$BIN" synth --config "$T/pipe" -o "$T/synth-fifo"
expect_error "synth --config FIFO" "$T/pipe is not a regular file"
no_output "synth --config FIFO" "$T/synth-fifo"
# /dev/stdin is standard input, read as `-f -` reads it (issue 39); a FIFO by another
# name is refused above, with the hint to `-f -`
printf 'hello' >"$T/stdin.txt"
timeout 10 "$BIN" generate -m "$T/base" -f /dev/stdin -n 1 --output-ids <"$T/stdin.txt" >"$T/out" 2>"$T/err" ||
    fail "-f /dev/stdin: $(cat "$T/err")"
grep -q '`-f -` reads standard input' "$T/err" && fail "-f /dev/stdin was refused"

# ---- FIFOs where `list` looks: config.json and refs/main ----
MD="$T/models"
mkdir -p "$MD/acme/fifo" "$MD/acme/ok"
mkfifo "$MD/acme/fifo/config.json"
cp "$TINY/config.json" "$MD/acme/ok/"
R="$T/hf/hub/models--a--b"
mkdir -p "$R/refs" "$R/snapshots/0123abcd"
mkfifo "$R/refs/main"
cp "$TINY/config.json" "$R/snapshots/0123abcd/"
MLXCEL_MODELS_DIR="$MD" HF_HOME="$T/hf" HF_HUB_CACHE='' run "$BIN" list
expect_ok "list with FIFOs"
grep -q "acme/ok" "$T/out" && grep -q "acme/fifo" "$T/out" && grep -q "a/b" "$T/out" ||
    fail "list with FIFOs: $(cat "$T/out")"

# ---- `-f -`: the prompt from standard input ----
printf 'hello world' | timeout 10 "$BIN" tokenize -m "$T/base" -f - >"$T/piped" 2>"$T/err" ||
    fail "tokenize -f - from a pipe: $(cat "$T/err")"
run "$BIN" tokenize -m "$T/base" -p 'hello world'
cmp -s "$T/out" "$T/piped" || fail "tokenize -f - differs from -p: $(cat "$T/piped") vs $(cat "$T/out")"
printf 'hello' | timeout 10 "$BIN" generate -m "$T/base" -f - -n 2 --no-chat >/dev/null 2>"$T/err" ||
    fail "generate -f - from a pipe: $(cat "$T/err")"
printf 'hello world, hello there' >"$T/ppl.txt"
timeout 10 "$BIN" perplexity -m "$T/base" -f "$T/ppl.txt" --json >"$T/ppl_file" 2>"$T/err" ||
    fail "perplexity -f FILE: $(cat "$T/err")"
timeout 10 "$BIN" perplexity -m "$T/base" -f - --json <"$T/ppl.txt" >"$T/ppl_pipe" 2>"$T/err" ||
    fail "perplexity -f - from standard input: $(cat "$T/err")"
cmp -s "$T/ppl_file" "$T/ppl_pipe" || fail "perplexity -f - differs from the file: $(cat "$T/ppl_pipe")"

# ---- symlinks leading out of the model folder ----
for f in config.json tokenizer.json model.safetensors; do
    fresh link
    ln -sf "$T/outside/$f" "$T/link/$f"
    case $f in
    tokenizer*) run "$BIN" tokenize -m "$T/link" -p hi ;;
    *) run "$BIN" inspect -m "$T/link" ;;
    esac
    expect_error "outside link $f" "$T/link/$f is a symlink to .*outside/$f, outside the model folder"
done
fresh link
echo '{"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}' >"$T/link/tokenizer_config.json"
echo '{{ messages[0].content }}' >"$T/outside/chat_template.jinja"
ln -s "$T/outside/chat_template.jinja" "$T/link/chat_template.jinja"
run "$BIN" template -m "$T/link" --messages "$T/msgs.json"
expect_error "outside link chat_template.jinja" "chat_template.jinja is a symlink to .*, outside the model folder"
# a relative link climbing out is the same thing
fresh link
rm "$T/link/config.json"
ln -s ../outside/config.json "$T/link/config.json"
run "$BIN" inspect -m "$T/link"
expect_error "outside ../ link" "is a symlink to .*outside/config.json, outside the model folder"
# links inside the folder are followed
fresh link
mkdir "$T/link/real"
mv "$T/link/config.json" "$T/link/model.safetensors" "$T/link/real/"
ln -s real/config.json "$T/link/config.json"
ln -s "$T/link/real/model.safetensors" "$T/link/model.safetensors"
run "$BIN" inspect -m "$T/link"
expect_ok "links inside the folder"
# Hugging Face snapshot: links into the repository's blobs/ are followed, others not
HR="$T/hub/models--acme--tiny"
mkdir -p "$HR/blobs" "$HR/snapshots/abc123"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
    cp "$TINY/$f" "$HR/blobs/$f.blob"
    ln -s "../../blobs/$f.blob" "$HR/snapshots/abc123/$f"
done
run "$BIN" generate -m "$HR/snapshots/abc123" -p hi -n 2 --no-chat
expect_ok "HF snapshot links into blobs/"
ln -sf "$T/outside/tokenizer.json" "$HR/snapshots/abc123/tokenizer.json"
run "$BIN" tokenize -m "$HR/snapshots/abc123" -p hi
expect_error "HF snapshot link outside the repo" "is a symlink to .*outside/tokenizer.json, outside the model folder $(cd "$HR" && pwd -P)"

# ---- convert copies an allow-list, through the same rule, never widening a mode ----
fresh src
ln -s "$T/secret" "$T/src/README.md"
run "$BIN" convert -m "$T/src" -o "$T/conv"
expect_error "convert README.md -> secret" "README.md is a symlink to $T/secret, outside the model folder"
no_output "convert README.md -> secret" "$T/conv"
rm "$T/src/README.md"
mkfifo "$T/src/LICENSE"
run "$BIN" convert -m "$T/src" -o "$T/conv"
expect_error "convert with a FIFO LICENSE" "LICENSE is not a regular file"
no_output "convert with a FIFO LICENSE" "$T/conv"
rm "$T/src/LICENSE"
printf 'licence text\n' >"$T/src/LICENSE.txt"
chmod 600 "$T/src/LICENSE.txt"
printf 'card\n' >"$T/src/README.md"
printf 'not metadata\n' >"$T/src/notes.txt"
ln -s "$T/secret" "$T/src/secret.txt"
run "$BIN" convert -m "$T/src" -o "$T/conv"
expect_ok "convert"
[ "$(stat -c %a "$T/conv/LICENSE.txt")" = 600 ] ||
    fail "convert widened LICENSE.txt: $(stat -c %a "$T/conv/LICENSE.txt")"
cmp -s "$T/conv/README.md" "$T/src/README.md" || fail "convert did not copy README.md"
[ -e "$T/conv/tokenizer.json" ] || fail "convert did not copy tokenizer.json"
[ -e "$T/conv/notes.txt" ] && fail "convert copied notes.txt (not on the allow-list)"
[ -e "$T/conv/secret.txt" ] && fail "convert copied secret.txt"
grep -rq TOPSECRET "$T/conv" && fail "the secret reached the converted folder"

# ---- failing synth and convert leave nothing; a retry succeeds ----
G=tests/fixtures/golden/llama/config.json
run "$BIN" synth --config $G -o "$T/syn" --tokenizer "$T/missing"
expect_error "synth --tokenizer /missing" "missing"
no_output "synth --tokenizer /missing" "$T/syn"
run "$BIN" synth --config $G -o "$T/syn"
expect_ok "synth retry"
[ -s "$T/syn/config.json" ] && [ -s "$T/syn/model.safetensors" ] || fail "synth retry is incomplete"
# an empty target folder is allowed and stays an (empty) folder on failure
mkdir "$T/syn2"
run "$BIN" synth --config $G -o "$T/syn2" --tokenizer "$T/missing"
expect_error "synth into an empty folder" "missing"
[ -z "$(ls -A "$T/syn2")" ] || fail "synth failure filled the empty target: $(ls -A "$T/syn2")"
run "$BIN" synth --config $G -o "$T/syn2"
expect_ok "synth into an empty folder"
# out of space: a file-size limit makes the weights' write fail midway
(ulimit -f 1024 && timeout 10 "$BIN" convert -m "$T/base" -o "$T/full" >"$T/out" 2>"$T/err" </dev/null)
rc=$?
expect_error "convert past the file-size limit" "model.safetensors"
no_output "convert past the file-size limit" "$T/full"
run "$BIN" convert -m "$T/base" -o "$T/full"
expect_ok "convert retry"
# SIGTERM/SIGINT mid-way (a ~32 MB synth takes about a second): the target is
# complete or absent, and no staging folder is left
sed 's/"hidden_size": 64/"hidden_size": 512/; s/"intermediate_size": 176/"intermediate_size": 2048/;
     s/"num_hidden_layers": 2/"num_hidden_layers": 4/' $G >"$T/big.json"
for sig in TERM INT; do
    rm -rf "$T/sig"
    mkdir "$T/sig"
    timeout -s $sig 0.2 "$BIN" synth --config "$T/big.json" -o "$T/sig/out" >/dev/null 2>&1
    rc=$?
    if [ -e "$T/sig/out" ]; then
        [ -s "$T/sig/out/config.json" ] || fail "SIG$sig left an incomplete $T/sig/out"
    fi
    [ "$(ls -A "$T/sig")" = "" ] || [ "$rc" -eq 0 ] ||
        fail "SIG$sig (exit $rc) left: $(ls -A "$T/sig")"
done

echo "hostile_files: ok"
