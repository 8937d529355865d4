#!/bin/sh
# `mlxcel pull` against tests/hub/fakehub.mjs, a stand-in for the Hugging Face
# Hub on an ephemeral 127.0.0.1 port serving models/llama-tiny as tiny/llama
# (no internet needed). Checks: a fresh pull writes the exact huggingface_hub
# cache layout (blobs/<etag>, snapshots/<commit>/<file> -> ../../blobs/<etag>,
# refs/main) and generate runs from it; a second pull fetches nothing; a
# dropped connection resumes with Range, within a run and across runs; a
# wrong sha256 leaves nothing behind; 401/404/500 are one clear line with
# exit 1 and 500-then-ok recovers; tokens (HF_TOKEN, the token file);
# --include/--exclude; --revision; --offline; hostile listings and servers
# (../ and absolute names, huge sizes, endless bodies, redirect loops,
# invalid JSON, a NUL in a name) are refused with no snapshot written; a
# silent server fails within the HF_HUB_*_TIMEOUT saying each retry; a file
# size limit (ulimit -f) is an error naming the file, not a SIGXFSZ death;
# `generate -m owner/name` pulls by itself.
# Usage (from the repo root): sh tests/cli/pull.sh path/to/mlxcel
BIN=${1:?usage: pull.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
command -v node >/dev/null 2>&1 || { echo "FAIL pull: node (Node.js) is needed for the fake hub" >&2; exit 1; }
T=$(mktemp -d) || exit 1
HUB_PID=
trap '[ -n "$HUB_PID" ] && kill "$HUB_PID" 2>/dev/null; rm -rf "$T"' EXIT
trap 'exit 1' INT TERM

fail() { echo "FAIL pull: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
one_line() { [ "$(wc -l <"$T/err")" -eq 1 ] || fail "$1: stderr is not one line: $(cat "$T/err")"; }
expect_err() { grep -q "$1" "$T/err" || fail "$2: stderr lacks '$1': $(cat "$T/err")"; }
mode() { printf '%s\n' "$1" >"$T/state/mode"; : >"$T/state/log"; }

mkdir "$T/state"
node tests/hub/fakehub.mjs models/llama-tiny tiny/llama "$T/state" 2>"$T/hub.err" &
HUB_PID=$!
i=0
while [ ! -s "$T/state/port" ]; do
    i=$((i + 1))
    [ $i -le 100 ] || fail "the fake hub did not start: $(cat "$T/hub.err")"
    kill -0 "$HUB_PID" 2>/dev/null || fail "the fake hub exited: $(cat "$T/hub.err")"
    sleep 0.1
done
export HF_ENDPOINT="http://127.0.0.1:$(cat "$T/state/port")"
export MLXCEL_HUB_BACKOFF_MS=10 MLXCEL_MODELS_DIR="$T/none"
unset HF_HUB_CACHE HF_TOKEN HUGGING_FACE_HUB_TOKEN HF_TOKEN_PATH HF_HUB_OFFLINE
COMMIT=$(printf 'commit:tiny/llama' | sha1sum | cut -d' ' -f1)
SHA=$(sha256sum models/llama-tiny/model.safetensors | cut -d' ' -f1)
n=0
fresh() { n=$((n + 1)); export HF_HOME="$T/hf$n"; R="$HF_HOME/hub/models--tiny--llama"; S="$R/snapshots/$COMMIT"; }

# ---- a fresh pull: the exact layout ----
fresh
mode ok
run "$BIN" pull tiny/llama
expect_rc 0 "fresh pull"
[ "$(cat "$T/out")" = "$S" ] || fail "fresh pull printed '$(cat "$T/out")', want $S"
[ "$(cat "$R/refs/main")" = "$COMMIT" ] || fail "refs/main: '$(cat "$R/refs/main")'"
[ "$(wc -c <"$R/refs/main")" -eq 40 ] || fail "refs/main is not the bare commit"
for f in config.json generation_config.json golden.json tokenizer.json tokenizer_config.json model.safetensors; do
    [ -L "$S/$f" ] || fail "$f is not a symlink in the snapshot"
    target=$(readlink "$S/$f")
    case "$target" in ../../blobs/*) ;; *) fail "$f links to '$target'" ;; esac
    [ -f "$R/blobs/${target#../../blobs/}" ] || fail "$f: blob missing"
    cmp -s "$S/$f" "models/llama-tiny/$f" || fail "$f differs from the source"
done
[ "$(readlink "$S/model.safetensors")" = "../../blobs/$SHA" ] || fail "the weights' blob is not named by their sha256"
[ -L "$S/README.md" ] || fail "the model card was not fetched"
[ ! -e "$S/pytorch_model.bin" ] && [ ! -e "$S/images" ] || fail "the default set fetched *.bin or images"
ls "$R/blobs" | grep -q incomplete && fail "an .incomplete file stayed behind"
grep -q "^GET /api/models/tiny/llama/revision/main?blobs=true" "$T/state/log" || fail "no listing request"
grep -q "^GET /cdn/$SHA " "$T/state/log" || fail "the weights did not come through the CDN redirect"

# generate from the cache (offline, so it cannot have fetched anything)
run "$BIN" generate -m tiny/llama -p x -n 4 --offline
expect_rc 0 "generate from the pulled snapshot"

# ---- a second pull fetches nothing ----
mode ok
run "$BIN" pull tiny/llama --json
expect_rc 0 "second pull"
grep -Eq '^(GET /tiny|GET /cdn)' "$T/state/log" && fail "second pull fetched files: $(grep GET "$T/state/log")"
tr -d ' \t\n' <"$T/out" | grep -q '"n_fetched":0,"n_cached":7' || fail "second pull --json: $(cat "$T/out")"

# ---- HF_HUB_CACHE wins over HF_HOME ----
mode ok
run env HF_HUB_CACHE="$T/hubcache" "$BIN" pull tiny/llama --include config.json
expect_rc 0 "HF_HUB_CACHE"
[ -L "$T/hubcache/models--tiny--llama/snapshots/$COMMIT/config.json" ] || fail "HF_HUB_CACHE not used"

# ---- --offline: the cache only ----
mode ok
run "$BIN" pull tiny/llama --offline
expect_rc 0 "--offline with the model cached"
[ "$(cat "$T/out")" = "$S" ] || fail "--offline printed '$(cat "$T/out")'"
[ -s "$T/state/log" ] && fail "--offline made requests: $(cat "$T/state/log")"
fresh
run env HF_HUB_OFFLINE=1 "$BIN" pull tiny/llama
expect_rc 1 "HF_HUB_OFFLINE with nothing cached"
one_line "offline miss"
expect_err "offline" "offline miss"
run "$BIN" generate -m tiny/llama -p x -n 4 --offline
expect_rc 1 "generate --offline with nothing cached"
expect_err "offline, so not downloading" "generate --offline"
[ -s "$T/state/log" ] && fail "offline commands made requests"

# ---- automatic pull from generate -m owner/name ----
fresh
mode ok
run "$BIN" generate -m tiny/llama -p x -n 4
expect_rc 0 "automatic pull from generate"
expect_err "tiny/llama is not in the cache; pulling it from $HF_ENDPOINT" "automatic pull"
expect_err "fetched tiny/llama/model.safetensors" "automatic pull"
[ -L "$S/model.safetensors" ] || fail "automatic pull wrote no snapshot"

# ---- --include / --exclude, --revision ----
fresh
mode ok
run "$BIN" pull tiny/llama --include '*.json' --exclude 'golden.json' --revision "$COMMIT"
expect_rc 0 "--include/--exclude"
[ -L "$S/config.json" ] && [ -L "$S/tokenizer.json" ] || fail "--include '*.json' missed files"
[ ! -e "$S/golden.json" ] || fail "--exclude golden.json fetched it"
[ ! -e "$S/model.safetensors" ] && [ ! -e "$S/README.md" ] || fail "--include '*.json' fetched other files"
[ ! -e "$R/refs/$COMMIT" ] || fail "a commit revision wrote a ref"
run "$BIN" pull tiny/llama --include 'pytorch_model.bin'
expect_rc 0 "--include of a file outside the default set"
[ -L "$S/pytorch_model.bin" ] || fail "--include pytorch_model.bin"
run "$BIN" pull tiny/llama --include '*.gguf'
expect_rc 1 "--include matching nothing"
expect_err "no file matches" "--include matching nothing"
run "$BIN" pull tiny/llama --revision nope
expect_rc 1 "unknown revision"
one_line "unknown revision"
expect_err "HTTP 404.*no such revision" "unknown revision"

# ---- a dropped connection resumes with Range ----
fresh
mode drop
run "$BIN" pull tiny/llama
expect_rc 0 "pull with a dropped connection"
grep -q "^GET /cdn/$SHA range=bytes=1048576- " "$T/state/log" || fail "no Range resume: $(cat "$T/state/log")"
cmp -s "$S/model.safetensors" models/llama-tiny/model.safetensors || fail "resumed weights differ"

# ... and across runs (the connection drops every time, then the server heals)
fresh
mode dropall
run "$BIN" pull tiny/llama
expect_rc 1 "pull with a connection that always drops"
[ "$(grep -c 'downloading model.safetensors: .*retrying in .* (attempt [2-5] of 5)' "$T/err")" -eq 4 ] ||
    fail "always drops: the 4 retries were not said: $(cat "$T/err")"
tail -n 1 "$T/err" | grep -q "error: downloading model.safetensors" || fail "always drops: last line: $(cat "$T/err")"
[ -s "$R/blobs/$SHA.incomplete" ] || fail "no partial file to resume from"
[ ! -e "$S" ] || fail "a failed pull wrote a snapshot"
part=$(wc -c <"$R/blobs/$SHA.incomplete")
mode ok
run "$BIN" pull tiny/llama
expect_rc 0 "resumed pull"
grep -q "^GET /cdn/$SHA range=bytes=$part- " "$T/state/log" || fail "no resume from $part: $(cat "$T/state/log")"
cmp -s "$S/model.safetensors" models/llama-tiny/model.safetensors || fail "weights resumed across runs differ"

# ---- a wrong sha256 is caught and deleted ----
fresh
mode badsha
run "$BIN" pull tiny/llama
expect_rc 1 "wrong sha256"
one_line "wrong sha256"
expect_err "model.safetensors: sha256 mismatch" "wrong sha256"
[ ! -e "$R/blobs/$SHA" ] && [ ! -e "$R/blobs/$SHA.incomplete" ] || fail "the corrupt download stayed"
[ ! -e "$S" ] || fail "a snapshot was written despite the bad sha256"

# ---- HTTP errors: one line, exit 1 ----
fresh
mode 401
run "$BIN" pull tiny/llama
expect_rc 1 "401"
one_line "401"
expect_err "HTTP 401.*HF_TOKEN" "401"
mode 404
run "$BIN" pull tiny/llama
expect_rc 1 "404"
one_line "404"
expect_err "HTTP 404: repository tiny/llama" "404"
mode 500
run "$BIN" pull tiny/llama
expect_rc 1 "500"
# each retry is said, with its number, and the last line is the error
[ "$(grep -c 'retrying in .* (attempt [2-5] of 5)' "$T/err")" -eq 4 ] || fail "500: retries not said: $(cat "$T/err")"
expect_err "listing tiny/llama.*HTTP 500; retrying" "500"
[ "$(wc -l <"$T/err")" -eq 5 ] || fail "500: more than the 4 retries and the error: $(cat "$T/err")"
tail -n 1 "$T/err" | grep -q "HTTP 500: server error .* after 5 attempts" || fail "500: last line: $(cat "$T/err")"
[ "$(grep -c . "$T/state/log")" -eq 5 ] || fail "500: not 5 attempts: $(cat "$T/state/log")"
[ ! -e "$R/snapshots/$COMMIT" ] || fail "a failed pull wrote a snapshot"
mode 500twice
run "$BIN" pull tiny/llama
expect_rc 0 "500 twice, then ok"

# ---- tokens ----
fresh
mode auth
run "$BIN" pull tiny/llama
expect_rc 1 "gated without a token"
expect_err "HTTP 401.*huggingface-cli login" "gated without a token"
run env HF_TOKEN=hf_wrong "$BIN" pull tiny/llama
expect_rc 1 "a wrong token"
expect_err "the token was refused" "a wrong token"
run env HF_TOKEN=hf_secret "$BIN" pull tiny/llama --include config.json
expect_rc 0 "HF_TOKEN"
run "$BIN" pull tiny/llama --token hf_secret --include tokenizer.json
expect_rc 0 "--token"
mkdir -p "$HF_HOME" && printf 'hf_secret\n' >"$HF_HOME/token"
run "$BIN" pull tiny/llama
expect_rc 0 "the token file"

# ---- bad names and hostile servers: refused, nothing written ----
run "$BIN" pull ../etc
expect_rc 2 "a bad repository name"
run "$BIN" pull tiny/llama --revision ../../x
expect_rc 2 "a bad revision"
for m in dotdot abs nul huge bigdisk endless loop badjson; do
    fresh
    mode "$m"
    run "$BIN" pull tiny/llama
    expect_rc 1 "hostile server ($m)"
    one_line "hostile server ($m)"
    [ ! -e "$R/snapshots/$COMMIT" ] || fail "hostile server ($m): a snapshot was written"
    [ ! -e "$T/evil.json" ] && [ ! -e "$HF_HOME/hub/evil.json" ] && [ ! -e /tmp/evil.json ] ||
        fail "hostile server ($m): a file escaped"
    case $m in
    dotdot|abs) expect_err "unsafe file name" "$m" ;;
    nul) expect_err "NUL character" "$m"
        grep -q "extra.json" "$T/state/log" && fail "nul: the cut name was fetched: $(cat "$T/state/log")" ;;
    huge) expect_err "size outside" "$m" ;;
    bigdisk) expect_err "not enough disk space" "$m" ;;
    endless) expect_err "more than the 7348736 bytes declared" "$m"
        # the small files still in flight keep their partial files (a later pull resumes them)
        [ ! -e "$R/blobs/$SHA.incomplete" ] || fail "endless: the download was kept" ;;
    loop) expect_err "redirect" "$m" ;;
    badjson) expect_err "listing is not valid JSON" "$m" ;;
    esac
done
# ---- a server that accepts and never answers: short timeouts, each retry said ----
fresh
mode silent
start=$(date +%s)
run env HF_HUB_ETAG_TIMEOUT=1 timeout 100 "$BIN" pull tiny/llama
took=$(($(date +%s) - start))
expect_rc 1 "silent server"
[ "$took" -lt 60 ] || fail "silent server: took ${took}s with HF_HUB_ETAG_TIMEOUT=1"
[ "$(grep -c 'retrying in .* (attempt [2-5] of 5)' "$T/err")" -eq 4 ] || fail "silent: retries not said: $(cat "$T/err")"
tail -n 1 "$T/err" | grep -q "sent nothing for 1 s (HF_HUB_ETAG_TIMEOUT)" || fail "silent server: last line: $(cat "$T/err")"
[ ! -e "$R/snapshots/$COMMIT" ] || fail "silent server: a snapshot was written"
run "$BIN" pull tiny/llama --help
grep -q "HF_HUB_DOWNLOAD_TIMEOUT" "$T/out" || fail "pull --help does not document the timeouts"

# ---- a file size limit: an error naming the file, not a silent SIGXFSZ death ----
fresh
mode ok
run sh -c 'ulimit -f 1024 && exec "$0" pull tiny/llama' "$BIN"
expect_rc 1 "ulimit -f"
expect_err "model.safetensors.*$SHA.incomplete.*File too large" "ulimit -f"
[ ! -e "$S" ] || fail "ulimit -f: a snapshot was written"

echo "ok pull"
