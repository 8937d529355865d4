#!/bin/bash
# dev/bench/vision-llamacpp/run.sh: image encode time and time to first token of mlxcel against
# llama.cpp's multimodal tool (llama-mtmd-cli), on the CPU or (--gpu) on an NVIDIA GPU, for issue
# 43: one 896 x 896 image and 32 text tokens on Gemma-3-4B's and Qwen2.5-VL-7B's shapes, made
# from nothing. Not run by CI.
# Companion of scripts/bench-embed-spec-vs-llamacpp.sh (the same llama.cpp: the source bundled in
# the npm package node-llama-cpp@3.22.1, GGML_NATIVE=ON with AMX off on the CPU, see that file).
set -euo pipefail

usage() {
    cat <<'EOF'
usage: dev/bench/vision-llamacpp/run.sh [OPTIONS]

  -o, --out DIR        output folder: runs.jsonl, summary.md, check.txt, device.txt, logs/
                       (default /tmp/bench-vision)
      --shapes LIST    comma-separated, from gemma3-4b, qwen2.5-vl-7b (default: both), or
                       gemma3-small, qwen2.5-vl-small (a few MB: a check that everything runs)
      --small          the two small shapes, 2 rounds, a 224 x 224 image (the check run)
      --gpu            on the GPU: mlxcel `--device cuda` (its vision tower, projector and
                       language model all run on the CUDA backend; the image's decoding,
                       processor and patch layout on the host, outside the timed encode but
                       the patches' upload), llama-mtmd-cli `-ngl 99` (its mmproj on the GPU
                       too: its default). Builds nothing: needs LLAMA_BUILD (a CUDA build
                       holding bin/llama-mtmd-cli and bin/llama-tokenize) and MLXCEL (its CUDA
                       plugin's environment set)
      --llama-fa LIST  llama.cpp's flash attention in the timed runs, comma-separated from
                       auto (its default), on, off: each a row of its own (default auto; with
                       --gpu auto,off)
  -t, --threads N      CPU threads of both engines' runs (default 2); the setup (synth,
                       hf2gguf) takes all cores
  -r, --rounds N       interleaved rounds per shape (default 3): mlxcel, llama.cpp (each
                       --llama-fa), mlxcel, ..., mlxcel
      --side N         the image's side in pixels (default 896; the small shapes: 224)
      --setup-only     build and write the models, then stop
      --keep-models    keep each shape's models after its runs (default: deleted, for disk)
      --no-check       skip the twin check (below) before the timed runs
      --dry-run        print the commands of each step (setup, check, runs) with placeholders
                       for what the models decide (the prompt), after the checks of what the
                       run needs; run nothing
  -h, --help           this help

What it does, per shape (a shape that fails is reported, the next one goes on):
  1. the checkpoint with `mlxcel synth` of the published config (make_vlm.py says which
     values): the language model and the vision tower and projector, in transformers 5's
     layout; bf16 for the twin, then with -q (the language model 4-bit g64, the bytes
     `mlxcel convert -q` makes of the bf16 one; the tower stays bf16, as mlx-vlm converts it,
     the same values in both); the image processor's configs and the tokenizer beside them
     (make_vlm.py extras: tests/fixtures/tokenizers/qwen3, Gemma 3's image tokens added at its
     ids);
  2. the llama.cpp twin of the bf16 folder with scripts/hf2gguf.py (quantizing on all cores):
     the language model as Q4_0 (--outtype q4_0: the bytes `llama-quantize --pure Q4_0` makes
     of its F16 GGUF) and the tower as an F16 mmproj (clip GGUF; F32 where llama.cpp's
     converter keeps F32); then the bf16 folder is deleted. With --gpu the -q synth runs
     beside hf2gguf, and every shape is set up before the first timed run, the shapes at once
     when the disk holds them (else one after the other);
  3. the image (make_vlm.py image: a deterministic picture of the tower's size, so neither
     engine resizes it) and 32 text tokens (a sentence cut to 32 ids of the tokenizer, checked
     to tokenize the same in llama-tokenize);
  4. the twin check: both engines' image embeddings (the projector's output) for that image,
     on the device of the timed runs, mlxcel `generate --image-embd-out` against
     llama-mtmd-cli's MTMD_DEBUG_EMBEDDINGS dump (flash attention off there: its F16 K/V in
     the tower costs a few % on a wide image), must agree (least row cosine >= 0.999, max
     |diff| <= 1% of the largest value: make_vlm.py compare) with the same number of image
     tokens; the result goes to check.txt and summary.md. If they disagree, the shape stops
     on the CPU (its runs take an hour); with --gpu its runs are made (seconds) and marked;
  5. rounds of mlxcel / llama.cpp / mlxcel, the same prompt (the image first, then the text;
     no chat template, no BOS), greedy, one token generated, the load average read before and
     after each run.

Disk and time (docs/benchmarks.md has the measurements behind them): Qwen2.5-VL-7B's shape
peaks near 22 GB while its bf16 folder and its Q4_0 twin exist together (28 GB with --gpu: its
-q folder is written meanwhile), Gemma-3-4B's near 12 GB (15 GB); a shape's models are deleted
after its runs unless --keep-models. On the 2-core host: Gemma-3-4B about 35 minutes at 3
rounds (setup ~6, each llama.cpp run ~10 at its default flash attention), Qwen2.5-VL-7B about
70, estimated (setup ~12, each llama.cpp run ~14, each mlxcel run ~2.5; -r 1: ~40). With --gpu on 16 cores: about 4-5 minutes for both
shapes at 3 rounds, mostly the setup (~3 minutes: both shapes at once), the runs a few seconds
each (loading the model).

What is timed:
  mlxcel     `generate --stats`: "image: ... preprocess P ms, encode E ms" (decode + processor;
             vision tower + projector) and "time to first token: T ms" (P + E + the prompt's
             prefill + the first token); TTFT in the table is T - P. The encode is the
             process's first use of the tower: its buffers' allocation and (--gpu) its
             kernels' first launches are inside it.
  llama.cpp  llama-mtmd-cli -v: "mtmd batch encoding done in E ms" (clip: tower + projector),
             "image decoded ... in D ms" (the image rows' prefill); TTFT from the log's
             timestamps, the encode's start to llama_perf's report after the one token
             (llama_perf's "prompt eval time", kept as prompt_eval_ms, ended before the image
             rows' decode); its preprocessing from the log's timestamps: the chat prompt
             formatted to the image's "add_media" line (tokenizing, resize + normalize inside
             mtmd_tokenize; the file's decoding, before it, is not seen). Its warmup at load
             runs the language model once (an empty batch) and only reserves the tower's
             buffers: its encode is cold too. runs.jsonl also has the clip's backend, the
             layers offloaded to the GPU and whether the clip graph had ops its backend lacks.
  Both: the time to first token without preprocessing, so the two measure the same work.
Noise: on 2 cores, another busy process makes ggml's spinning thread pool wait a time slice at
each barrier (the small Gemma shape's llama-mtmd-cli prompt eval took 1105 ms, then 10 ms a
second later, at a load average of 4): run in a quiet window, and read load1_before /
load1_after in runs.jsonl.

Environment:
  BENCH_CACHE  cache folder (default ~/.cache/mlxcel-bench): npm package, llama.cpp source
  LLAMA_BUILD  llama.cpp CMake build folder (default $BENCH_CACHE/llama.cpp-build); on the CPU
               built or completed with llama-mtmd-cli and llama-tokenize when they are missing,
               under the lock file LLAMA_BUILD.lock (waited for while another build holds it);
               --gpu needs it set, built with CUDA
  GGUF_PY      the gguf-py folder hf2gguf.py imports (default: the gguf-py of LLAMA_BUILD's
               source, else the Python's own gguf package); for --gpu with a source without
               gguf-py, a copy of the same llama.cpp's gguf-py
  MODELS       model folder (default $BENCH_CACHE/models)
  MLXCEL       an mlxcel binary to use instead of building build/mlxcel (--gpu needs it)
  PYTHON       a Python 3 with numpy (default /usr/bin/python3)
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
# the tokenizer fixtures are archives the build unpacks (scripts/fixtures.sh): unpacked here too
sh "$root/scripts/fixtures.sh" unpack >/dev/null || { echo "$0: scripts/fixtures.sh unpack failed" >&2; exit 1; }
out=/tmp/bench-vision
shapes=gemma3-4b,qwen2.5-vl-7b
threads=2
rounds=3
side=""
setup_only=0
keep=0
check=1
gpu=0
llama_fa=""
dry=0
die() { echo "bench-vision: $*" >&2; exit 1; }
log() { echo "== $(date -u +%H:%M:%S) $*" >&2; }
warn() { echo "bench-vision: warning: $*" >&2; }

while [ $# -gt 0 ]; do
    case $1 in
    -o|--out) out=${2:?}; shift ;;
    --shapes) shapes=${2:?}; shift ;;
    --small) shapes=gemma3-small,qwen2.5-vl-small rounds=2 ;;
    --gpu) gpu=1 ;;
    --llama-fa) llama_fa=${2:?}; shift ;;
    -t|--threads) threads=${2:?}; shift ;;
    -r|--rounds) rounds=${2:?}; shift ;;
    --side) side=${2:?}; shift ;;
    --setup-only) setup_only=1 ;;
    --keep-models) keep=1 ;;
    --no-check) check=0 ;;
    --dry-run) dry=1 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
    esac
    shift
done
for s in ${shapes//,/ }; do
    case $s in gemma3-4b|qwen2.5-vl-7b|gemma3-small|qwen2.5-vl-small) ;; *) die "unknown shape '$s'" ;; esac
done
[ -n "${shapes//,/}" ] || die "--shapes: no shape"
for v in "$threads" "$rounds" ${side:+"$side"}; do
    case $v in ''|*[!0-9]*|0) die "not a positive number: '$v'" ;; esac
done
if [ -n "$side" ] && [ $((side % 28)) -ne 0 ]; then die "--side must be a multiple of 28 (patch 14 x merge 2)"; fi
[ -n "$llama_fa" ] || { [ $gpu = 1 ] && llama_fa=auto,off || llama_fa=auto; }
for f in ${llama_fa//,/ }; do
    case $f in auto|on|off) ;; *) die "--llama-fa: '$f' is not auto, on or off" ;; esac
done

cache=${BENCH_CACHE:-$HOME/.cache/mlxcel-bench}
M=${MODELS:-$cache/models}
py=${PYTHON:-/usr/bin/python3}
if [ $gpu = 1 ] && [ -z "${LLAMA_BUILD:-}" ]; then
    die "--gpu builds nothing: set LLAMA_BUILD to a llama.cpp build with CUDA (bin/llama-mtmd-cli, bin/llama-tokenize)"
fi
build=${LLAMA_BUILD:-$cache/llama.cpp-build}
st=$(nproc)  # the setup's threads (synth, hf2gguf)
NLC_VERSION=3.22.1
case "$M$root$build$out" in *[[:space:]]*) die "the model, repository, build and output paths must not hold spaces" ;; esac
mkdir -p "$cache" "$M" "$out/logs"
out=$(cd "$out" && pwd)
M=$(cd "$M" && pwd)
"$py" -c 'import numpy' 2>/dev/null || die "$py cannot import numpy (PYTHON=a python3 with numpy)"
mk() { "$py" "$here/make_vlm.py" "$@"; }
# a command as it would run (--dry-run)
show() { printf '  $'; printf ' %q' "$@"; printf '\n'; }

# ---- llama.cpp (as scripts/bench-embed-spec-vs-llamacpp.sh builds it) ----

targets=(llama-mtmd-cli llama-tokenize)
llama_missing() {
    local t
    for t in "${targets[@]}"; do [ -x "$build/bin/$t" ] || return 0; done
    return 1
}
build_src() {  # the source LLAMA_BUILD was configured from, else the cache's
    if [ -f "$build/CMakeCache.txt" ]; then
        sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt"
    else
        echo "$cache/llama.cpp-src"
    fi
}
prepare_llamacpp() {
    local src pkg=$cache/node-llama-cpp-$NLC_VERSION
    llama_bin=$build/bin
    if [ $gpu = 1 ]; then
        llama_missing && die "--gpu builds nothing: LLAMA_BUILD=$build lacks bin/$(for t in "${targets[@]}"; do [ -x "$build/bin/$t" ] || echo "$t"; done | head -1)"
        grep -q '^GGML_CUDA:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null ||
            warn "$build/CMakeCache.txt does not say GGML_CUDA=ON: is it a CUDA build? (runs.jsonl's llama_offloaded tells)"
        llama_src=$(build_src)
        return 0
    fi
    src=$(build_src)
    if ! llama_missing && [ -f "$src/CMakeLists.txt" ]; then
        llama_src=$src
        return 0
    fi
    if [ $dry = 1 ]; then
        echo "would build ${targets[*]} in $build (from $src; nice, under the lock $build.lock)"
        llama_src=$src
        return 0
    fi
    # another script may be building the same folder: one build at a time (a lock directory of
    # the same name, another tool's convention, is waited for too)
    local lock=$build.lock
    while [ -d "$lock" ]; do log "waiting for $lock (a directory: another build)"; sleep 15; done
    exec 8>"$lock"
    if ! flock -n 8; then
        log "waiting for $lock (another build of $build)"
        flock 8
    fi
    src=$(build_src)
    if [ ! -f "$src/CMakeLists.txt" ]; then
        src=$cache/llama.cpp-src
        local tgz=$cache/node-llama-cpp-$NLC_VERSION.tgz
        if [ ! -f "$tgz" ]; then
            log "npm pack node-llama-cpp@$NLC_VERSION into $cache"
            (cd "$cache" && npm pack "node-llama-cpp@$NLC_VERSION" >"$cache/npm-pack.log" 2>&1) ||
                die "npm pack node-llama-cpp@$NLC_VERSION failed"
        fi
        rm -rf "$pkg" && mkdir -p "$pkg" && tar -xzf "$tgz" -C "$pkg" || die "cannot unpack $tgz"
        rm -rf "$src"
        git -c advice.detachedHead=false clone -q "$pkg/package/llama/gitRelease.bundle" "$src" ||
            die "cannot clone the llama.cpp source out of the bundle"
    fi
    llama_src=$src
    if llama_missing; then
        local noamx=""
        # AMX: ggml's AMX Q4_0 matmul dies with SIGILL on guests that do not let a process use
        # the tile registers (see scripts/bench-embed-spec-vs-llamacpp.sh)
        if echo | cc -march=native -dM -E - 2>/dev/null | grep -q __AMX_TILE__; then
            noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        fi
        log "building ${targets[*]} in $build (nice; a while)"
        nice -n 10 cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
            -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
            "-DCMAKE_C_FLAGS=$noamx" "-DCMAKE_CXX_FLAGS=$noamx" >"$build.cmake.log" 2>&1 ||
            die "llama.cpp cmake failed, see $build.cmake.log"
        nice -n 10 cmake --build "$build" --target "${targets[@]}" -j "$(nproc)" >"$build.log" 2>&1 ||
            die "llama.cpp build failed, see $build.log"
    fi
    rm -f "$lock"  # held: gone before it is let go (a tool taking a lock directory of that name waits on a file)
    flock -u 8
    exec 8>&-
}

# gguf_py: the PYTHONPATH of hf2gguf.py ("" when the Python has its own gguf package)
prepare_gguf() {
    if [ -n "${GGUF_PY:-}" ]; then
        [ -f "$GGUF_PY/gguf/__init__.py" ] || die "GGUF_PY=$GGUF_PY holds no gguf/__init__.py (a gguf-py folder)"
        gguf_py=$(cd "$GGUF_PY" && pwd)
    elif [ -f "$llama_src/gguf-py/gguf/__init__.py" ]; then
        gguf_py=$llama_src/gguf-py
    elif "$py" -c 'import gguf' 2>/dev/null; then
        gguf_py=""
        warn "no gguf-py in $llama_src: hf2gguf.py uses $py's own gguf package ($("$py" -c 'import gguf, os; print(os.path.dirname(gguf.__file__))'))"
    else
        die "no gguf-py for hf2gguf.py: $llama_src has none and $py has no gguf package; set GGUF_PY to the gguf-py folder of the same llama.cpp source (a copy of $cache/llama.cpp-src/gguf-py from the development machine)"
    fi
    local e
    e=$(PYTHONPATH=$gguf_py "$py" -c 'import gguf, gguf.quants' 2>&1) || die "$py cannot import gguf from '${gguf_py:-its packages}': $e"
}

prepare_mlxcel() {
    if [ -n "${MLXCEL:-}" ]; then
        mlxcel=$MLXCEL
        [ -x "$mlxcel" ] || die "MLXCEL=$mlxcel is not an executable"
        return 0
    fi
    [ $gpu = 1 ] && die "--gpu builds nothing: set MLXCEL to a CUDA-enabled mlxcel (with MLXCEL_CUDA_PLUGIN / LD_LIBRARY_PATH exported as it needs)"
    mlxcel=$root/build/mlxcel
    if [ $dry = 1 ]; then echo "would build $mlxcel (build/, Release)"; return 0; fi
    log "building mlxcel (build/, Release)"
    nice -n 10 cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null || die "mlxcel cmake failed"
    nice -n 10 cmake --build "$root/build" --target mlxcel -j "$(nproc)" >/dev/null || die "mlxcel build failed"
}

# the device line of device.txt, summary.md and each run's record
describe_device() {
    local cpu g
    cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
    host="${cpu:-an unknown CPU}, $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB"
    if [ $gpu = 1 ]; then
        g=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)
        device="cuda: ${g:-an NVIDIA GPU (nvidia-smi gave no name)}"
        mdev=(--device cuda)
        lgpu=(-ngl 99)
    else
        device="cpu: ${cpu:-an unknown CPU}, $threads threads"
        mdev=()
        lgpu=()
    fi
}

# ---- models ----

tok=$M/tok-qwen3
prepare_tokenizer() {
    [ -f "$tok/tokenizer.json" ] && return 0
    [ $dry = 1 ] && return 0
    mkdir -p "$tok"
    xz -dc "$root/tests/fixtures/tokenizers/qwen3/tokenizer.json.xz" >"$tok/tokenizer.json" &&
        cp "$root/tests/fixtures/tokenizers/qwen3/tokenizer_config.json" "$tok/" || die "cannot unpack the qwen3 tokenizer"
}

# disk a shape's setup takes at its peak, GB (--gpu: its -q folder beside the bf16 one)
shape_gb() {
    case $1 in
    qwen2.5-vl-7b) [ $gpu = 1 ] && echo 28 || echo 22 ;;
    gemma3-4b) [ $gpu = 1 ] && echo 15 || echo 12 ;;
    *) echo 1 ;;
    esac
}

# the setup's command lines (arrays SY, HG) for the shape's folder $1
synth_cmd() { SY=(nice -n 10 "$mlxcel" synth -c "$1/cfg/config.json" -o "$1/$2" --seed 43 -t "$st" ${3:+"$3"}); }
hf2gguf_cmd() {
    HG=(env "PYTHONPATH=$gguf_py" nice -n 10 "$py" "$root/scripts/hf2gguf.py" "$1/f" "$1/q4_0.gguf.tmp"
        --mmproj "$1/mmproj.gguf" --outtype q4_0 --threads "$st")
}

# make_shape SHAPE: $M/vlm-SHAPE/{q (mlxcel 4-bit), q4_0.gguf, mmproj.gguf}
make_shape() {
    local s=$1 d=$M/vlm-$1 qpid="" hrc=0
    if [ $dry = 1 ]; then
        if [ -f "$d/done" ]; then echo "$s: its models are there ($d)"; return 0; fi
        echo "$s: setup (peak ~$(shape_gb "$s") GB in $d)"
        show "$py" "$here/make_vlm.py" configs "$s" "$d/cfg"
        synth_cmd "$d" f
        show "${SY[@]}"
        show "$py" "$here/make_vlm.py" extras "$d/cfg/config.json" "$d/f" "$tok"
        hf2gguf_cmd "$d"
        show "${HG[@]}"
        show rm -rf "$d/f"
        [ $gpu = 1 ] && echo "  (beside hf2gguf:)"
        synth_cmd "$d" q -q
        show "${SY[@]}"
        show "$py" "$here/make_vlm.py" extras "$d/cfg/config.json" "$d/q" "$tok"
        return 0
    fi
    [ -f "$d/done" ] && return 0
    rm -rf "$d"
    mkdir -p "$d"
    mk configs "$s" "$d/cfg" || die "make_vlm.py configs $s"
    log "$s: mlxcel synth (bf16)"
    synth_cmd "$d" f
    "${SY[@]}" >/dev/null || die "synth $s (bf16) failed"
    mk extras "$d/cfg/config.json" "$d/f" "$tok" || die "make_vlm.py extras $s"
    synth_q() {
        log "$s: mlxcel synth -q (the language model 4-bit g64 of the same values, the same tower)"
        local SY
        synth_cmd "$d" q -q
        "${SY[@]}" >/dev/null && mk extras "$d/cfg/config.json" "$d/q" "$tok"
    }
    if [ $gpu = 1 ]; then synth_q & qpid=$!; fi
    log "$s: hf2gguf -> Q4_0 GGUF + F16 mmproj ($st threads)"
    hf2gguf_cmd "$d"
    "${HG[@]}" && mv "$d/q4_0.gguf.tmp" "$d/q4_0.gguf" || hrc=1
    rm -rf "$d/f"
    if [ -n "$qpid" ]; then
        wait "$qpid" || die "synth $s (4-bit) failed"
    else
        synth_q || die "synth $s (4-bit) failed"
    fi
    [ $hrc = 0 ] || die "hf2gguf $s failed"
    touch "$d/done"
    log "$s: models ready ($(du -sh "$d" | cut -f1))"
}

# ---- runs ----

load1() { cut -d' ' -f1 /proc/loadavg; }

# the engines' command lines (arrays MX, LL) for the shape's prompt
mlx_cmd() {
    MX=("$mlxcel" generate "${mdev[@]}" -m "$d/q" --no-chat --prompt-ids "$prompt_ids" --image "$img" -n 1 --temp 0
        -t "$threads")
}
llama_cmd() {  # $1: flash attention auto | on | off
    LL=("$llama_bin/llama-mtmd-cli" -m "$d/q4_0.gguf" --mmproj "$d/mmproj.gguf" --image "$img" -p "$prompt_text"
        --jinja --chat-template "$template" -n 1 --temp 0 -t "$threads" -c "$ctx" "${lgpu[@]}")
    [ "$1" = auto ] || LL+=(-fa "$1")
}

# run_mlxcel SHAPE ROUND: one record into runs.jsonl
run_mlxcel() {
    local s=$1 r=$2 lg=$out/logs/$1-mlxcel-$2.log l0 l1 t0 t1 rc=0
    mlx_cmd
    MX+=(--ignore-eos --stats --output-ids -v)
    if [ $dry = 1 ]; then show "${MX[@]}"; return 0; fi
    l0=$(load1); t0=$(date +%s.%N)
    "${MX[@]}" >"$lg" 2>&1 || rc=$?
    t1=$(date +%s.%N); l1=$(load1)
    "$py" - "$lg" "$s" "$r" "$rc" "$l0" "$l1" "$t0" "$t1" "$device" >>"$out/runs.jsonl" <<'PY'
import json, re, sys
lg, s, r, rc, l0, l1, t0, t1, dev = sys.argv[1:]
t = open(lg, errors="replace").read()
rec = {"shape": s, "engine": "mlxcel", "round": int(r), "rc": int(rc), "device": dev, "load1_before": float(l0),
       "load1_after": float(l1), "wall_s": round(float(t1) - float(t0), 3), "log": lg}
be = re.search(r"^mlxcel: info: backend ([^,\s]+)", t, re.M)
if be:
    rec["backend"] = be[1]
m = re.search(r"^image: 1 image, (\d+) tokens; preprocess ([0-9.]+) ms, encode ([0-9.]+) ms$", t, re.M)
f = re.search(r"^time to first token: ([0-9.]+) ms \(.* prefill of (\d+) tokens", t, re.M)
if int(rc) == 0 and m and f:
    pre, enc, ttft = float(m[2]), float(m[3]), float(f[1])
    rec.update(ok=True, image_tokens=int(m[1]), prompt_tokens=int(f[2]), preprocess_ms=pre, encode_ms=enc,
               ttft_ms=round(ttft - pre, 2), ttft_with_preprocess_ms=ttft)
else:
    rec["ok"] = False
print(json.dumps(rec))
PY
}

# run_llama SHAPE ROUND FA: one record into runs.jsonl
run_llama() {
    local s=$1 r=$2 fa=$3 lg l0 l1 t0 t1 rc=0 eng=llama.cpp sfx=""
    [ "$fa" = auto ] || { eng="llama.cpp -fa $fa"; sfx=-fa-$fa; }
    lg=$out/logs/$s-llama.cpp$sfx-$r.log
    llama_cmd "$fa"
    LL+=(-v)
    if [ $dry = 1 ]; then show "${LL[@]}"; return 0; fi
    l0=$(load1); t0=$(date +%s.%N)
    "${LL[@]}" >"$lg" 2>&1 || rc=$?
    t1=$(date +%s.%N); l1=$(load1)
    "$py" - "$lg" "$s" "$r" "$rc" "$l0" "$l1" "$t0" "$t1" "$device" "$eng" "$fa" >>"$out/runs.jsonl" <<'PY'
import json, re, sys
lg, s, r, rc, l0, l1, t0, t1, dev, eng, fa = sys.argv[1:]
t = open(lg, errors="replace").read()
rec = {"shape": s, "engine": eng, "flash_attn": fa, "round": int(r), "rc": int(rc), "device": dev,
       "load1_before": float(l0), "load1_after": float(l1), "wall_s": round(float(t1) - float(t0), 3), "log": lg}
ts = lambda line: (lambda p: 60 * int(p[0]) + int(p[1]) + int(p[2]) / 1e3)(line.split()[0].split(".")[:3])
cb = re.search(r"CLIP using (\S+) backend", t)
off = re.search(r"offloaded (\d+)/(\d+) layers to GPU", t)
rec.update(clip_backend=cb[1] if cb else None, llama_offloaded=f"{off[1]}/{off[2]}" if off else None,
           clip_unsupported_ops="the CLIP graph uses unsupported operators" in t)
fam = re.search(r"clip_model_loader: flash attention is (\w+)|warmup: flash attention is (\w+)", t)
if fam:
    rec["clip_flash_attn"] = fam[1] or fam[2]
enc = re.search(r"mtmd batch encoding done in (\d+) ms", t)
dec = re.findall(r"image decoded \(batch \d+/\d+\) in (\d+) ms", t)
pe = re.search(r"prompt eval time =\s*([0-9.]+) ms /\s*(\d+) tokens", t)
ntok = re.search(r"mtmd_batch_encode_impl: encoding batch with 1 entries and total (\d+) tokens", t)
a = re.search(r"^.*formatted_chat\.prompt:.*$", t, re.M)
b = re.search(r"^.*add_media: preproc_out.*$", t, re.M)  # logged once the image is preprocessed
# TTFT from the log's timestamps: the encode's start to llama_perf's report after the one token
# (llama_perf's "prompt eval time" ended before the image rows' decode in a 2026-12-06 run)
e0 = re.search(r"^.*encoding mtmd batch, n_chunks.*$", t, re.M)
e1 = re.search(r"^.*llama_perf_context_print:\s+load time.*$", t, re.M)
if int(rc) == 0 and enc and dec and pe and e0 and e1:
    rec.update(ok=True, encode_ms=float(enc[1]), image_decode_ms=float(sum(int(x) for x in dec)),
               ttft_ms=round(1e3 * (ts(e1[0]) - ts(e0[0])), 1), prompt_eval_ms=float(pe[1]),
               prompt_tokens=int(pe[2]), image_tokens=int(ntok[1]) if ntok else None,
               preprocess_ms=round(1e3 * (ts(b[0]) - ts(a[0])), 1) if a and b else None)
else:
    rec["ok"] = False
print(json.dumps(rec))
PY
}

# twin_check SHAPE: both engines' image embeddings; a line into check.txt; 1 when they disagree
twin_check() {
    local s=$1 res ok=0 em=$out/emb-$1-mlxcel.safetensors el=$out/emb-$1-llama.cpp.bin
    mlx_cmd
    MX+=(--image-embd-out "$em")
    llama_cmd off
    if [ $dry = 1 ]; then
        show "${MX[@]}"
        printf '  $ MTMD_DEBUG_EMBEDDINGS=%q' "$el"; printf ' %q' "${LL[@]}"; printf '\n'
        show "$py" "$here/make_vlm.py" compare "$em" "$el"
        return 0
    fi
    log "$s: twin check (image embeddings of both engines)"
    rm -f "$em" "$el"
    if ! "${MX[@]}" >"$out/logs/$s-check-mlxcel.log" 2>&1; then
        res="mlxcel failed (logs/$s-check-mlxcel.log)"
    elif ! MTMD_DEBUG_EMBEDDINGS=$el "${LL[@]}" >"$out/logs/$s-check-llama.cpp.log" 2>&1; then
        res="llama-mtmd-cli failed (logs/$s-check-llama.cpp.log)"
    elif [ ! -s "$el" ]; then
        res="llama-mtmd-cli wrote no MTMD_DEBUG_EMBEDDINGS file (a llama.cpp without that debug dump?)"
    else
        res=$(mk compare "$em" "$el") && ok=1
    fi
    echo "$s: $res" | tee -a "$out/check.txt" >&2
    rm -f "$em" "$el"
    [ $ok = 1 ]
}

# run_shape SHAPE: the prompt, the twin check, the rounds
run_shape() {
    local s=$1 d=$M/vlm-$1 sd ids lids r f
    sd=$side
    [ -z "$sd" ] && case $s in *-small) sd=224 ;; *) sd=896 ;; esac
    img=$out/image-$sd.png
    if [ $dry = 1 ]; then
        local tmp
        tmp=$(mktemp -d)
        mk configs "$s" "$tmp/cfg" || die "make_vlm.py configs $s"
        echo "$s: the image $img ($sd x $sd), 32 text tokens ($mlxcel tokenize; llama-tokenize agrees)"
        prompt_ids=$(mk prompt-ids "$tmp/cfg/config.json" "$(seq -s, 1 32)" "$sd")
        case $s in gemma3*) n_img=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["mm_tokens_per_image"])' "$tmp/cfg/config.json") ;;
        *) n_img=$(( (sd / 28) * (sd / 28) )) ;; esac
        rm -rf "$tmp"
        prompt_ids="<the image's $n_img tokens' ids and the 32 text ids: $(echo "$prompt_ids" | tr ',' '\n' | wc -l) ids>"
        prompt_text="<the 32 text tokens>"
        ctx="<prompt tokens + 64>"
    else
        [ -f "$d/done" ] || die "$s: no models in $d"
        [ -f "$img" ] || mk image "$sd" "$sd" "$img" || die "make_vlm.py image"
        # 32 text tokens: the sentence's first 32 ids, as text, tokenized alike by both engines
        ids=$("$mlxcel" tokenize -m "$d/q" -p "$sentence" | tr -d '[] ' | cut -d, -f1-32)
        prompt_text=$("$mlxcel" detokenize -m "$d/q" --ids "$ids" 2>/dev/null || true)
        lids=$("$llama_bin/llama-tokenize" -m "$d/q4_0.gguf" -p "$prompt_text" --ids --log-disable 2>/dev/null | tr -d '[] ')
        [ "$lids" = "$ids" ] || die "$s: the 32-token prompt tokenizes differently: mlxcel [$ids], llama.cpp [$lids]"
        prompt_ids=$(mk prompt-ids "$d/cfg/config.json" "$ids" "$sd")
        ctx=$(( $(echo "$prompt_ids" | tr ',' '\n' | wc -l) + 64 ))
        # Gemma 3's prompt ids hold only <start_of_image>: both engines expand it into the image's
        # soft tokens and <end_of_image>, which the context (and llama.cpp's batch: the image is one
        # non-causal batch) must hold too
        case $s in gemma3*) ctx=$(( ctx + $("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["mm_tokens_per_image"] + 1)' "$d/cfg/config.json") )) ;; esac
    fi
    if [ $check = 1 ] && ! twin_check "$s"; then
        [ $gpu = 1 ] || die "$s: the twins' image embeddings disagree (check.txt): no timed runs"
        warn "$s: the twin check failed: its runs are made anyway and marked in summary.md"
    fi
    [ $dry = 1 ] && echo "$s: rounds 1 to $rounds of:"
    log "$s: $rounds rounds (mlxcel, llama.cpp (flash attention ${llama_fa}), mlxcel), $sd x $sd image, $threads threads, $device"
    for r in $(seq 1 "$rounds"); do
        run_mlxcel "$s" "$r"
        for f in ${llama_fa//,/ }; do run_llama "$s" "$r" "$f"; done
        [ $dry = 1 ] && { echo "$s: then mlxcel once more:"; break; }
    done
    run_mlxcel "$s" $((rounds + 1))
}

# ---- main ----

prepare_llamacpp
prepare_mlxcel
prepare_gguf
prepare_tokenizer
describe_device
llama_version=$("$llama_bin/llama-mtmd-cli" --version 2>&1 | grep -m1 '^version' || true)
template="{%- for m in messages -%}{{ m['content'] }}{%- endfor -%}"  # the content as it is
sentence=" Describe this picture in detail: the colours, the shapes, the lines and circles, where each of them lies, what it might show, and whether anything in it looks out of place or unusual to you."
list=(${shapes//,/ })

# --gpu: every shape's setup before the first timed run (none of it beside a timed run), the
# shapes at once when the disk holds them all
setup_all() {
    local s need=0 free pids=() p i=0
    for s in "${list[@]}"; do [ -f "$M/vlm-$s/done" ] || need=$((need + $(shape_gb "$s"))); done
    free=$(df -Pk "$M" | awk 'NR == 2 {print int($4 / 1048576)}')
    if [ $dry = 1 ]; then
        echo "setup of every shape first ($need GB at the peak if at once; $free GB free in $M)"
        for s in "${list[@]}"; do make_shape "$s"; done
        return 0
    fi
    if [ $((need + 4)) -le "$free" ]; then
        log "setting up ${list[*]} at once (peak ~$need GB, $free GB free; logs/SHAPE-setup.log)"
        for s in "${list[@]}"; do
            (set -e; make_shape "$s") >"$out/logs/$s-setup.log" 2>&1 &
            pids+=($!)
        done
        for s in "${list[@]}"; do
            p=${pids[$i]}; i=$((i + 1))
            if wait "$p"; then setup_ok+=("$s"); else failed+=("$s (setup: logs/$s-setup.log)"); fi
        done
    else
        log "setting up ${list[*]} one after the other (~$need GB at once would not fit in $free GB)"
        for s in "${list[@]}"; do
            set +e
            (set -e; make_shape "$s") 2>&1 | tee "$out/logs/$s-setup.log" >&2
            p=${PIPESTATUS[0]}
            set -e
            if [ "$p" = 0 ]; then setup_ok+=("$s"); else failed+=("$s (setup: logs/$s-setup.log)"); fi
        done
    fi
}

one_shape() {  # SHAPE [set up]: its setup unless done, its runs, its models deleted
    local s=$1 rc=0
    if [ "${2:-}" != "set up" ]; then
        set +e
        (set -e; make_shape "$s")
        rc=$?
        set -e
        [ $rc = 0 ] || { failed+=("$s (setup)"); [ $keep = 1 ] || rm -rf "$M/vlm-$s"; return 0; }
    fi
    [ $setup_only = 1 ] && return 0
    set +e
    (set -e; run_shape "$s")
    rc=$?
    set -e
    [ $rc = 0 ] || failed+=("$s")
    [ $keep = 1 ] || [ $dry = 1 ] || rm -rf "$M/vlm-$s"
}

failed=()
setup_ok=()
if [ $dry = 1 ]; then
    echo "device: $device; host: $host"
    echo "mlxcel: $mlxcel; llama.cpp: $llama_bin (${llama_version:-version unknown}); gguf-py: ${gguf_py:-the gguf package of $py}"
    echo "outputs: $out; models: $M; setup threads: $st"
else
    [ -f "$out/runs.jsonl" ] && mv "$out/runs.jsonl" "$out/runs.jsonl.old"
    : >"$out/runs.jsonl"
    : >"$out/check.txt"
    {
        echo "device: $device"
        echo "host: $host"
        echo "mlxcel: $mlxcel ${mdev[*]}"
        echo "llama.cpp: $llama_bin/llama-mtmd-cli ${lgpu[*]} (${llama_version:-version unknown}; flash attention in the timed runs: $llama_fa)"
        echo "threads: $threads; rounds: $rounds; started $(date -u '+%Y-%m-%d %H:%M:%S') UTC"
    } >"$out/device.txt"
fi
if [ $gpu = 1 ]; then
    setup_all
    [ $dry = 1 ] && setup_ok=("${list[@]}")
    for s in "${setup_ok[@]}"; do one_shape "$s" "set up"; done
    for s in "${list[@]}"; do  # those whose setup failed: their leftovers
        case " ${setup_ok[*]} " in *" $s "*) ;; *) [ $keep = 1 ] || [ $dry = 1 ] || rm -rf "$M/vlm-$s" ;; esac
    done
else
    for s in "${list[@]}"; do one_shape "$s"; done
fi
if [ $dry = 1 ]; then exit 0; fi
[ $setup_only = 1 ] && { log "models in $M"; [ ${#failed[@]} = 0 ] || die "failed: ${failed[*]}"; exit 0; }
{
    echo "Device: $device (host: $host); mlxcel ${mdev[*]:-on the CPU}, llama.cpp ${lgpu[*]:-on the CPU}${llama_version:+ ($llama_version)}; $threads threads"
    echo
    mk summary "$out/runs.jsonl"
    if [ -s "$out/check.txt" ]; then
        echo
        echo "Twin check (image embeddings, mlxcel against llama.cpp -fa off, on the same device):"
        sed 's/^/- /' "$out/check.txt"
        { grep -v ': agree$' "$out/check.txt" || true; } |
            sed 's/^\([^:]*\):.*/\n**\1: the twin check did not pass: its timings may compare different computations.**/'
    fi
    [ ${#failed[@]} = 0 ] || { echo; echo "**Failed: ${failed[*]}** (logs/)"; }
} >"$out/summary.md"
cat "$out/summary.md"
[ ${#failed[@]} = 0 ] || die "failed: ${failed[*]} (logs/)"
grep -q '"ok": false' "$out/runs.jsonl" && die "some runs failed (runs.jsonl, logs/)"
log "done: $out/runs.jsonl, $out/summary.md"
