#!/bin/sh
# bench-vs-llamacpp.sh: the comparison of docs/benchmarks.md ("Phixtral-4x2_8 in MLX 4-bit and
# 8-bit, against llama.cpp"), both engines back to back on one quiet machine. Not run by CI.
#
# Needs (outside the repository):
#   MODELS/phixtral-4x2_8-q4, -q8   mlxcel synth -c CONFIG -q --q-bits {4,8} --q-group-size 64 --seed 1
#                                   (CONFIG: phixtral-4x2_8-l8 of make-bench-models.sh, n_layer 32)
#   GGUF/phixtral-proxy-phi2dense-q4_0.gguf, -q8_0.gguf
#                                   scripts/make-proxy-gguf.py --variant phi2dense (llama.cpp's gguf-py
#                                   on PYTHONPATH), then llama-quantize --pure to Q4_0 / Q8_0
#   LLAMA_BENCH                     a llama.cpp build's llama-bench
# and /tmp/membw (gcc -O2 -march=native -pthread -o /tmp/membw dev/membw.c).
# Each weight file is dropped from the page cache and read back before its run (see Method).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
B=${MLXCEL:-$root/build/mlxcel}
L=${LLAMA_BENCH:-/work/llamacpp/build/bin/llama-bench}
M=${MODELS:-/work/bench-models}
G=${GGUF:-/work/bench-models/llamacpp}
refresh() {
    python3 -c "import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)" "$1"
    cat "$1" > /dev/null
}
date -u; uptime
/tmp/membw -r 5 | tail -2
for q in q4 q8; do
    f=$M/phixtral-4x2_8-$q/model.safetensors
    refresh "$f"
    /tmp/membw -r 3 -f "$f" | tail -1
    echo "== mlxcel $q"; date -u; uptime
    "$B" bench -m "$M/phixtral-4x2_8-$q" -p 512 -n 128 -r 3 -t 2 2>&1
    g=$G/phixtral-proxy-phi2dense-$([ "$q" = q4 ] && echo q4_0 || echo q8_0).gguf
    refresh "$g"
    echo "== llama.cpp $g"; date -u; uptime
    "$L" -m "$g" -p 512 -n 128 -t 2 -r 3 -o md 2>&1 | grep -v '^$'
done
date -u
