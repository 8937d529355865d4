#!/bin/sh
# Small things a new user meets (issue 39 item 19): every command's --help
# lists the global flags it takes; -v tells the backend, threads, load time
# and an `auto` fallback; the embedded default model is found relative to the
# executable (an installed <prefix>/bin/mlxcel finds <prefix>/share/mlxcel/
# models), not through the build path; `-f /dev/stdin` is read as `-f -`,
# other special files (FIFOs) are refused with a hint to `-f -`; the staging
# folder a killed convert left is swept by the next convert into the same
# parent (its pid gone), a live one's is kept; -r/--repetitions and
# weight_bytes mean the same in every command.
# Usage (from the repo root): sh tests/cli/papercuts.sh path/to/mlxcel
BIN=${1:?usage: papercuts.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL papercuts: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }

# ---- --help: the global flags of each command ----
for c in generate perplexity bench serve; do
    run "$BIN" $c --help
    expect_rc 0 "$c --help"
    for f in --offline --device --kv-type --fast --mmap --no-mmap; do
        grep -q -- "$f" "$T/out" || fail "$c --help does not list $f"
    done
done
run "$BIN" inspect --help
for f in --offline --kv-type; do grep -q -- "$f" "$T/out" || fail "inspect --help does not list $f"; done
for c in tokenize detokenize template convert pull; do
    run "$BIN" $c --help
    grep -q -- --offline "$T/out" || fail "$c --help does not list --offline"
done

# ---- -v: backend, threads, load time; an auto fallback ----
run "$BIN" generate -m models/llama-tiny -p hi -n 1 -v -t 1 --device cpu
expect_rc 0 "generate -v"
grep -q "info: backend cpu[-a-z0-9]*, 1 thread, KV cache f32" "$T/err" || fail "-v: no backend line: $(cat "$T/err")"
grep -q "info: loaded .*llama-tiny in [0-9.]* s" "$T/err" || fail "-v: no load time: $(cat "$T/err")"
grep -q "info: weights ready on cpu" "$T/err" || fail "-v: no weight preparation time: $(cat "$T/err")"
run "$BIN" generate -m models/llama-tiny -p hi -n 1 -v --device auto
expect_rc 0 "generate -v --device auto"
grep -q "info: backend cuda\|device auto: .*running on the CPU" "$T/err" || fail "-v auto: no word of the choice: $(cat "$T/err")"
# perplexity and bench run a model too: the same -v (they refused it as an unknown option)
printf 'hello world, and more words to score' >"$T/pp.txt"
run "$BIN" perplexity -m models/llama-tiny -f "$T/pp.txt" -v -t 1 --device cpu
expect_rc 0 "perplexity -v"
grep -q "info: backend cpu[-a-z0-9]*, 1 thread" "$T/err" || fail "perplexity -v: no backend line: $(cat "$T/err")"
grep -q "info: loaded .*llama-tiny in [0-9.]* s" "$T/err" || fail "perplexity -v: no load time: $(cat "$T/err")"
run "$BIN" bench -m models/llama-tiny -p 4 -n 2 -r 1 -v -t 1 --device cpu
expect_rc 0 "bench -v"
grep -q "info: loaded .*llama-tiny in [0-9.]* s" "$T/err" || fail "bench -v: no load time: $(cat "$T/err")"
for c in perplexity bench; do
    "$BIN" $c --help | grep -q -- "-v, --verbose" || fail "$c --help does not list -v"
done

# ---- the embedded default model, relative to the executable ----
mkdir -p "$T/prefix/bin" "$T/prefix/share/mlxcel/models"
cp "$BIN" "$T/prefix/bin/mlxcel"
cp -r models/phixtral-tiny-4bit "$T/prefix/share/mlxcel/models/"
run env -u MLXCEL_DEFAULT_MODEL "$T/prefix/bin/mlxcel" generate -p hi -n 1 -v
expect_rc 0 "installed binary without -m"
grep -q "loaded $T/prefix/bin/../share/mlxcel/models/phixtral-tiny-4bit in" "$T/err" ||
    fail "installed binary: the default model was not the one beside it: $(grep loaded "$T/err")"

# ---- -f: standard input by any name, pipes, and a hint for the rest ----
run "$BIN" tokenize -m models/llama-tiny -p "hello world"
cp "$T/out" "$T/want"
printf 'hello world' | "$BIN" tokenize -m models/llama-tiny -f /dev/stdin >"$T/out" 2>"$T/err" ||
    fail "-f /dev/stdin: $(cat "$T/err")"
cmp -s "$T/out" "$T/want" || fail "-f /dev/stdin read other text: $(cat "$T/out")"
mkfifo "$T/fifo"
run timeout 10 "$BIN" tokenize -m models/llama-tiny -f "$T/fifo"
expect_rc 1 "-f a named pipe (refused, not waited on: ADR 0017)"
grep -q '`-f -` reads standard input' "$T/err" || fail "-f FIFO: no hint: $(cat "$T/err")"
run "$BIN" tokenize -m models/llama-tiny -f /dev/null
expect_rc 1 "-f /dev/null"
grep -q '`-f -` reads standard input' "$T/err" || fail "-f /dev/null: no hint: $(cat "$T/err")"

# ---- stale staging folders of killed converts ----
mkdir "$T/out.d"
sh -c 'exit 0' &
dead=$!
wait
stale="$T/out.d/.q4.partial-$dead-abcdef"
live="$T/out.d/.other.partial-$$-ghijkl"
old="$T/out.d/.older.partial-mnopqr"
fresh="$T/out.d/.newer.partial-stuvwx"
mkdir "$stale" "$live" "$old" "$fresh"
echo x >"$stale/model.safetensors.tmp"
echo x >"$live/model.safetensors.tmp"
touch -d '3 days ago' "$old"
run "$BIN" convert -m tests/fixtures/golden/llama -o "$T/out.d/q4" -q
expect_rc 0 "convert beside stale staging folders"
[ ! -e "$stale" ] || fail "the staging folder of dead pid $dead was kept"
[ ! -e "$old" ] || fail "a staging folder untouched for 3 days was kept"
[ -d "$live" ] && [ -f "$live/model.safetensors.tmp" ] || fail "a live process's staging folder was removed"
[ -d "$fresh" ] || fail "a fresh staging folder without a pid was removed"
grep -q "removed $stale, the staging folder of a run that did not finish (its process $dead is gone)" "$T/err" ||
    fail "no word of the sweep: $(cat "$T/err")"
ls -a "$T/out.d" | grep -q "^\.q4\.partial" && fail "convert left its own staging folder"

# ---- the same names for the same things ----
run "$BIN" tokenize -m models/llama-tiny -p hi --stats --repetitions 2 --json
expect_rc 0 "tokenize --repetitions"
run "$BIN" tokenize -m models/llama-tiny -p hi --stats -r 2 --json
expect_rc 0 "tokenize -r"
echo "papercuts: ok"
