#!/bin/sh
# Hybrid decode at depth on the CPU (docs/benchmarks.md, "Hybrid decode at depth on the CPU"):
# synthesizes the three 4-bit checkpoints of this folder's configs into $OUT (default /tmp/hb)
# and runs mlxcel bench at depth 0 and 8192. Usage: dev/bench/hybrid-350m/run.sh [path/to/mlxcel]
set -eu
B=${1:-build/mlxcel}
D=$(dirname "$0")
OUT=${OUT:-/tmp/hb}
mkdir -p "$OUT"
for m in lfm2-350m granite-h-350m llama-350m; do
  [ -d "$OUT/$m-q4" ] || "$B" synth -c "$D/$m.json" -o "$OUT/$m-q4" -q
done
for m in lfm2-350m-q4 granite-h-350m-q4 llama-350m-q4; do
  echo "== $m $(date +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
  "$B" bench -m "$OUT/$m" -p 512 -n 32 -r 2 -t 2 2>&1 | grep -E "\| |RSS|KV|kv"
  "$B" bench -m "$OUT/$m" -p 0 -n 32 -d 8192 -r 2 -t 2 2>&1 | grep -E "\| |RSS|KV|kv"
done
echo "== end $(date +%H:%M:%S)"
