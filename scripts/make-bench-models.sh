#!/bin/sh
# make-bench-models.sh OUTDIR: build mlxcel-mkcheckpoint and write the two
# random-weight benchmark models of docs/benchmarks.md into OUTDIR (keep it
# outside the repository; /work/bench-models is the usual place):
#
#   OUTDIR/llama-1b          Llama-3.2-1B proportions (hidden 2048, 16 layers,
#                            32 heads / 8 kv heads, ff 8192, tied head) with a
#                            32000 vocab: 1.1B params, 2.1 GB bf16
#   OUTDIR/phixtral-4x2_8-l8 mlabonne/phixtral-4x2_8 widths (n_embd 2560,
#                            32 heads, rotary_dim 32, n_inner 10240, 4 experts,
#                            top-2, vocab 51200) with 8 layers instead of 32:
#                            2.1B params, 4.3 GB bf16, two shards + index
#
# A folder that already has config.json (written last) is complete and is
# skipped; FORCE=1 regenerates. BUILD_DIR (default build) is the CMake tree.
# The tokenizer of models/llama-tiny is copied in so `generate` runs too
# (its 2048 ids fit both vocabularies; the text is noise, the weights random).
set -eu

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
out=$1
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
force=${FORCE:-0}

case "$(cd "$(dirname "$out")" 2>/dev/null && pwd)/" in
"$root"/*) echo "$0: $out is inside the repository; use a folder outside it" >&2; exit 2 ;;
esac

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target mlxcel-mkcheckpoint -j2 >/dev/null
mk=$build/mlxcel-mkcheckpoint
mkdir -p "$out"

# gen NAME ARGS...: one model folder, skipped when complete
gen() {
    name=$1
    shift
    dir=$out/$name
    if [ -f "$dir/config.json" ] && [ "$force" != 1 ]; then
        echo "$dir: present (FORCE=1 regenerates)"
        return
    fi
    echo "$dir: generating"
    "$mk" "$@" --seed 1 --tokenizer-from "$root/models/llama-tiny" --out "$dir" --force
}

gen llama-1b --family llama --hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ff 8192 \
    --vocab 32000 --ctx 2048 --tied
gen phixtral-4x2_8-l8 --family phixtral --n-embd 2560 --layers 8 --heads 32 --experts 4 \
    --top-k 2 --n-inner 10240 --vocab 51200 --rotary-dim 32 --ctx 2048

du -sh "$out"/*
