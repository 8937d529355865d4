#!/bin/sh
# Hybrid models on the GPU (issues 41, 42; ADR 0132): the chunked prefill of the recurrent
# layers against the recurrence, and decode at depth. Synthesizes this folder's two 4-bit
# shapes into $OUT (default /tmp/hg; skipped when there) and runs `mlxcel bench --device cuda`:
#   granite-h-tiny-10l  Granite-4.0-H-Tiny's published proportions cut to 10 layers: hidden
#                       1536, 9 Mamba-2 layers of 48 heads x 64 (state 128, 1 group) + 1 NoPE
#                       GQA 12/4 attention layer (index 5), 64 experts top-6 of 512 + shared
#                       1024, vocab 100352 (1.7 B parameters, 1.0 GB at 4 bits)
#   qwen3-next-8l       Qwen3-Next-80B-A3B's proportions cut to 8 layers and 64 of its 512
#                       experts: hidden 2048, 6 gated-DeltaNet layers (16 key / 32 value heads
#                       of 128) + 2 gated attention layers 16/2 of 256, 64 experts top-10 of
#                       512 + shared 512, vocab 151936 (2.5 B parameters, 1.4 GB at 4 bits)
# Per model: pp512 + tg64 at depth 0 and at depth 8192 (chunked prefill, the default), then
# pp512 and pp4096 with MLXCEL_CUDA_CHUNKED=0 (the recurrence for every row: the A/B) and
# pp4096 chunked. About 2-3 minutes of device time on an H100 (synthesis ~15 s a model with
# 16 cores, each bench 10-40 s, mostly the load and the depth-8192 prefills).
# Usage, from the repository root: dev/bench/hybrid-gpu/run.sh [path/to/mlxcel | PACKDIR]
# PACKDIR: a folder of `scripts/gpu-loop.sh pack` (bin/, lib/ or pack.tar.xz; unpacked here,
# its libraries and plugin used).
set -u
B=${1:-build/mlxcel}
if [ -d "$B" ]; then
  [ -x "$B/bin/mlxcel" ] || tar -C "$B" -xJf "$B/pack.tar.xz"
  P=$(cd "$B" && pwd)
  export LD_LIBRARY_PATH="$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export MLXCEL_CUDA_PLUGIN="$P/bin/libmlxcel-cuda.so"
  B="$P/bin/mlxcel"
fi
D=$(dirname "$0")
OUT=${OUT:-/tmp/hg}
mkdir -p "$OUT"
for m in granite-h-tiny-10l qwen3-next-8l; do
  [ -d "$OUT/$m-q4" ] || "$B" synth -c "$D/$m.json" -o "$OUT/$m-q4" -q ||
    echo "!! synth $m failed"
done
bench() {  # 1 (chunked) or 0 (the recurrence), a label, then bench's arguments
  c=$1
  l=$2
  shift 2
  echo "== $l (MLXCEL_CUDA_CHUNKED=$c) $(date +%H:%M:%S)"
  MLXCEL_CUDA_CHUNKED=$c "$B" bench --device cuda "$@" 2>&1 | grep -E "\| |RSS|KV|kv|rror" ||
    echo "!! $l failed"
}
for m in granite-h-tiny-10l qwen3-next-8l; do
  M="$OUT/$m-q4"
  [ -d "$M" ] || continue
  bench 1 "$m d0" -m "$M" -p 512 -n 64 -r 2
  bench 1 "$m d8192" -m "$M" -p 512 -n 64 -d 8192 -r 2
  bench 1 "$m pp4096" -m "$M" -p 4096 -n 0 -r 1
  bench 0 "$m d0" -m "$M" -p 512 -n 0 -r 2
  bench 0 "$m pp4096" -m "$M" -p 4096 -n 0 -r 1
done
echo "== end $(date +%H:%M:%S)"
