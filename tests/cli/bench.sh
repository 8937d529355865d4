#!/bin/sh
# `mlxcel bench` on the embedded llama-tiny with tiny sizes: the --json array
# (keys, test names, sample counts, positive rates, the memory figures), the
# llama-bench style table, -p 0 / -n 0 skipping a test, and the stderr footer.
# Usage (from the repo root): sh tests/cli/bench.sh path/to/mlxcel
BIN=${1:?usage: bench.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL bench: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
has() { grep -q -- "$2" "$T/out" || fail "$1: no line matching '$2' in: $(cat "$T/out")"; }
flat() { tr -d ' \t\n\r' <"$T/out" >"$T/flat"; }
jhas() { grep -q -- "$2" "$T/flat" || fail "$1: JSON lacks '$2': $(cat "$T/flat")"; }
# last value of a numeric key in the flattened JSON
jnum() { sed -n "s/.*\"$1\":\([0-9.eE+-]*\).*/\1/p" "$T/flat"; }

# ---- --json ----
run "$BIN" bench -m models/llama-tiny -p 8 -n 4 -r 2 -t 1 --json
expect_rc 0 "bench --json"
flat
case "$(cat "$T/flat")" in
    '[{'*'}]') ;;
    *) fail "--json is not an array of objects: $(cat "$T/flat")" ;;
esac
for k in model family params backend threads test n_tokens reps ts_mean ts_sd samples_ts \
    peak_rss_bytes; do
    n=$(grep -o "\"$k\":" "$T/flat" | wc -l | tr -d ' ')
    [ "$n" -eq 2 ] || fail "key $k appears $n times, expected once per test (2)"
done
jhas "pp test" '"test":"pp8","n_tokens":8,"n_seqs":1,"n_depth":0,"reps":2,'
jhas "tg test" '"test":"tg4","n_tokens":4,"n_seqs":1,"n_depth":0,"reps":2,'
jhas "model" '"model":"models/llama-tiny","family":"llama","params":3672320,'
jhas "threads" '"threads":1,'
jhas "backend" '"backend":"cpu-[a-z0-9]*"'
# two positive samples per test
n=$(grep -o '"samples_ts":\[[0-9.eE+-]*[1-9][0-9.eE+-]*,[0-9.eE+-]*[1-9][0-9.eE+-]*\]' "$T/flat" | wc -l | tr -d ' ')
[ "$n" -eq 2 ] || fail "samples_ts: expected two non-zero samples per test: $(cat "$T/flat")"
grep -q '"ts_mean":0[,}]' "$T/flat" && fail "ts_mean is 0"
grep -q '"ts_mean":[0-9][0-9.eE+-]*,"ts_sd":[0-9][0-9.eE+-]*,' "$T/flat" || fail "ts_mean/ts_sd not numbers"
grep -q 'peak RSS' "$T/err" || fail "no peak RSS footer on stderr"
grep -q 'peak RSS' "$T/out" && fail "footer leaked into the --json stdout"

# peak RSS within weights + KV cache + 64 MiB (the memory budget of the issue);
# sanitizer builds carry shadow memory, so they may skip this with MLXCEL_SKIP_RSS=1
rss=$(jnum peak_rss_bytes)
wb=$(jnum weight_bytes)
kv=$(jnum kv_bytes)
[ -n "$rss" ] && [ "$rss" -gt 0 ] || fail "peak_rss_bytes '$rss' is not positive"
[ -n "$wb" ] && [ "$wb" -gt 0 ] || fail "weight_bytes '$wb' is not positive"
[ "$kv" = 65536 ] || fail "kv_bytes '$kv', expected one 16-token block x 4 layers x 2 x 4 heads x 32 x 4 B = 65536"
if [ "${MLXCEL_SKIP_RSS:-0}" != 1 ]; then
    budget=$((wb + kv + 64 * 1024 * 1024))
    [ "$rss" -le "$budget" ] || fail "peak RSS $rss exceeds weights + KV + 64 MiB = $budget"
fi

# ---- the warm-up runs from an empty cache, without the -d depth (as llama-bench's): a
# -d 8192 -r 1 run prefilled the depth twice before, once for the warm-up ----
run "$BIN" bench -m models/llama-tiny -p 8 -n 2 -d 40 -r 1 -t 1 -v
expect_rc 0 "bench -d 40 -v"
grep -q 'warm-up forwarded 9 rows' "$T/err" ||
    fail "warm-up at -d 40 (8 prompt rows + 1 generated expected): $(grep -i 'warm-up' "$T/err")"
has "pp at depth" '| *pp8 @ d40 |'
has "tg at depth" '| *tg2 @ d40 |'

# ---- --kv-type: the cache's element type, its bytes in kv_bytes and in the table ----
run "$BIN" bench -m models/llama-tiny -p 4 -n 2 -r 1 --kv-type f16 --json
expect_rc 0 "bench --kv-type f16"
flat
jhas "kv_type" '"kv_type":"f16","kv_bytes":32768,'
run "$BIN" bench -m models/llama-tiny -p 0 -n 2 -r 1 --kv-type=bf16
expect_rc 0 "bench --kv-type=bf16"
has "bf16 row" '^| models/llama-tiny | *3\.7M | cpu-[a-z0-9]* kv bf16 | *[0-9][0-9]* | *tg2 |'
run "$BIN" bench -m models/llama-tiny -p 0 -n 2 -r 1 --kv-type f8
expect_rc 1 "bench --kv-type f8"
grep -q -- "--kv-type: 'f8' is not one of f32, f16, bf16" "$T/err" || fail "--kv-type f8: $(cat "$T/err")"
run "$BIN" bench -m models/llama-tiny --kv-type
expect_rc 2 "bench --kv-type without a value"
grep -q -- "--kv-type needs a value" "$T/err" || fail "--kv-type without a value: $(cat "$T/err")"

# ---- --fast: in effect where the CPU has its form (AVX2, AVX-512), else a note says so ----
run "$BIN" bench -m models/phixtral-tiny-4bit -p 4 -n 2 -r 1 --fast --json
expect_rc 0 "bench --fast"
flat
if grep -q -- "--fast changes nothing on" "$T/err"; then
    jhas "fast off" '"fast":false'
else
    jhas "fast on" '"fast":true'
    run "$BIN" bench -m models/phixtral-tiny-4bit -p 0 -n 2 -r 1 --fast
    expect_rc 0 "bench --fast table"
    has "fast row" '^| models/phixtral-tiny-4bit | *[0-9.]*M | cpu-avx\(2\|512\) fast | *[0-9][0-9]* | *tg2 |'
fi
run "$BIN" bench -m models/phixtral-tiny-4bit -p 0 -n 2 -r 1 --json
expect_rc 0 "bench without --fast"
flat
jhas "fast default off" '"fast":false'

# ---- table ----
run "$BIN" bench -m models/llama-tiny -p 8 -n 4 -r 1
expect_rc 0 "bench table"
has "header" '^| model  *| *params | backend  *| threads | *test | *t/s |$'
has "pp row" '^| models/llama-tiny | *3\.7M | cpu-[a-z0-9]* *| *[0-9][0-9]* | *pp8 | *[0-9][0-9.]* ± [0-9][0-9.]* |$'
has "tg row" '^| models/llama-tiny | *3\.7M | cpu-[a-z0-9]* *| *[0-9][0-9]* | *tg4 | *[0-9][0-9.]* ± 0\.00 |$'
grep -q 'peak RSS .*weights .*KV cache .*n_ctx 16' "$T/err" || fail "footer: $(cat "$T/err")"

# ---- -p 0 / -n 0 skip a test ----
run "$BIN" bench -m models/llama-tiny -p 0 -n 2 -r 1 --json
expect_rc 0 "bench -p 0"
flat
jhas "tg only" '"test":"tg2"'
grep -q '"test":"pp' "$T/flat" && fail "-p 0 still ran pp"
run "$BIN" bench -m models/llama-tiny -p 4 -n 0 -r 1
expect_rc 0 "bench -n 0"
has "pp only" 'pp4'
grep -q 'tg' "$T/out" && fail "-n 0 still ran tg"

# ---- -s: sequences decoding together ----
run "$BIN" bench -m models/llama-tiny -p 0 -n 4 -s 3 -r 1 --json
expect_rc 0 "bench -s 3"
flat
jhas "tg x3" '"test":"tg4x3","n_tokens":4,"n_seqs":3,'
run "$BIN" bench -m models/llama-tiny -p 0 -n 4 -s 0 -r 1
expect_rc 2 "bench -s 0"

# ---- -d: tests after a filled cache (the KV holds depth + the test's tokens) ----
run "$BIN" bench -m models/llama-tiny -p 8 -n 4 -s 2 -d 40 -r 1 --json
expect_rc 0 "bench -d 40"
flat
jhas "pp at depth" '"test":"pp8@d40","n_tokens":8,"n_seqs":1,"n_depth":40,'
jhas "tg at depth" '"test":"tg4x2@d40","n_tokens":4,"n_seqs":2,"n_depth":40,'
[ "$(jnum n_ctx)" = 96 ] || fail "-d 40 -n 4 -s 2: n_ctx $(jnum n_ctx), expected 2 x 48 (whole 16-token blocks)"
run "$BIN" bench -m models/llama-tiny -p 0 -n 4 -d 512 -r 1
expect_rc 1 "bench -d 512"
grep -q "context" "$T/err" || fail "-d 512: $(cat "$T/err")"

# ---- --no-mmap: weights copied into memory give the same greedy tokens ----
run "$BIN" generate -m models/llama-tiny -p "Once upon a time" -n 12 --temp 0
expect_rc 0 "generate (mapped)"
cp "$T/out" "$T/mapped"
run "$BIN" generate --no-mmap -m models/llama-tiny -p "Once upon a time" -n 12 --temp 0
expect_rc 0 "generate --no-mmap"
cmp -s "$T/out" "$T/mapped" || fail "--no-mmap changed the output: $(cat "$T/out") vs $(cat "$T/mapped")"
run "$BIN" bench --no-mmap -m models/llama-tiny -p 8 -n 4 -r 1
expect_rc 0 "bench --no-mmap"

# ---- sizes beyond the model's context (512) ----
run "$BIN" bench -m models/llama-tiny -p 513 -n 0 -r 1
expect_rc 1 "bench -p 513"
grep -q "context" "$T/err" || fail "-p 513: $(cat "$T/err")"

echo "bench: ok"
