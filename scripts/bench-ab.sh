#!/bin/sh
# bench-ab.sh A_BIN B_BIN ROUNDS MODEL [BENCH FLAGS...]: `mlxcel bench --json` of two
# builds on one model, interleaved A B A B ... ROUNDS times in one window (this machine
# is noisy and its host CPU varies, so only a same-window ratio means anything), then
# per test the median tokens/s of each and the median of the per-round ratios B/A.
# Example (before/after a change, 2 threads):
#   scripts/bench-ab.sh /tmp/before/mlxcel build/mlxcel 5 models/llama-tiny -p 128 -n 64 -r 2 -t 2
set -eu
if [ $# -lt 4 ]; then
    echo "usage: $0 A_BIN B_BIN ROUNDS MODEL [BENCH FLAGS...]" >&2
    exit 2
fi
a=$1 b=$2 rounds=$3 model=$4
shift 4
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT INT TERM
i=0
while [ "$i" -lt "$rounds" ]; do
    "$a" bench -m "$model" "$@" --json >"$T/a$i" 2>/dev/null
    "$b" bench -m "$model" "$@" --json >"$T/b$i" 2>/dev/null
    i=$((i + 1))
done
# one line per (round, build, test): test ts_mean
for f in "$T"/a* "$T"/b*; do
    tr -d ' \t\n' <"$f" | sed 's/},{/}\n{/g' |
        sed -n 's/.*"test":"\([^"]*\)".*"ts_mean":\([0-9.eE+-]*\).*/\1 \2/p' |
        while read -r t v || [ -n "$t" ]; do echo "$(basename "$f") $t $v"; done
done >"$T/all"
awk '
{ run = $1; build = substr(run, 1, 1); round = substr(run, 2); v[build, $2, round] = $3; tests[$2] = 1; n = round + 1 > n ? round + 1 : n }
function median(arr, k,    i, j, t) {
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (arr[j] < arr[i]) { t = arr[i]; arr[i] = arr[j]; arr[j] = t }
    return k % 2 ? arr[(k + 1) / 2] : (arr[k / 2] + arr[k / 2 + 1]) / 2
}
END {
    printf "%-10s %12s %12s %10s\n", "test", "A t/s", "B t/s", "B/A"
    for (t in tests) {
        for (r = 0; r < n; r++) { A[r + 1] = v["a", t, r]; B[r + 1] = v["b", t, r]; R[r + 1] = v["b", t, r] / v["a", t, r] }
        printf "%-10s %12.2f %12.2f %10.3f\n", t, median(A, n), median(B, n), median(R, n)
    }
}' "$T/all"
