#!/bin/bash
# dev/bench/vision-llamacpp/run.sh: image encode time and time to first token of mlxcel against
# llama.cpp's multimodal tool (llama-mtmd-cli) on the CPU, for issue 43: one 896 x 896 image and
# 32 text tokens on Gemma-3-4B's and Qwen2.5-VL-7B's shapes, made from nothing. Not run by CI.
# Companion of scripts/bench-embed-spec-vs-llamacpp.sh (the same llama.cpp: the source bundled in
# the npm package node-llama-cpp@3.22.1, CPU only, GGML_NATIVE=ON with AMX off, see that file).
set -euo pipefail

usage() {
    cat <<'EOF'
usage: dev/bench/vision-llamacpp/run.sh [OPTIONS]

  -o, --out DIR        output folder: runs.jsonl, summary.md, logs/ (default /tmp/bench-vision)
      --shapes LIST    comma-separated, from gemma3-4b, qwen2.5-vl-7b (default: both), or
                       gemma3-small, qwen2.5-vl-small (a few MB: a check that everything runs)
      --small          the two small shapes, 2 rounds, a 224 x 224 image (the check run)
  -t, --threads N      threads for both engines (default 2)
  -r, --rounds N       interleaved rounds per shape (default 3): mlxcel, llama.cpp, mlxcel, ...
      --side N         the image's side in pixels (default 896; the small shapes: 224)
      --setup-only     build and write the models, then stop
      --keep-models    keep each shape's models after its runs (default: deleted, for disk)
      --no-check       skip the twin check (below) before the timed runs
  -h, --help           this help

What it does, per shape, one shape at a time (disk: the 7B shape peaks near 22 GB while its
bf16 folder and its Q4_0 twin exist together, Gemma-3-4B's near 12 GB; 0 after a shape unless
--keep-models; duration on 2 cores: about 1.5 hours for both shapes at 3 rounds, 70 min at
2, see docs/benchmarks.md):
  1. the checkpoint with `mlxcel synth` of the published config (make_vlm.py says which
     values): the language model and the vision tower and projector, in transformers 5's
     layout; bf16 for the twin, then with -q (the language model 4-bit g64, the bytes
     `mlxcel convert -q` makes of the bf16 one; the tower stays bf16, as mlx-vlm converts it,
     the same values in both); the image processor's configs and the tokenizer beside them
     (make_vlm.py extras: tests/fixtures/tokenizers/qwen3, Gemma 3's image tokens added at its
     ids);
  2. the llama.cpp twin of the bf16 folder with scripts/hf2gguf.py: the language model as
     Q4_0 (--outtype q4_0: the bytes `llama-quantize --pure Q4_0` makes of its F16 GGUF) and
     the tower as an F16 mmproj (clip GGUF; F32 where llama.cpp's converter keeps F32);
     then the bf16 folder is deleted;
  3. the image (make_vlm.py image: a deterministic picture of the tower's size, so neither
     engine resizes it) and 32 text tokens (a sentence cut to 32 ids of the tokenizer, checked
     to tokenize the same in llama-tokenize);
  4. the twin check: both engines' image embeddings (the projector's output) for that image,
     mlxcel `generate --image-embd-out` against llama-mtmd-cli's MTMD_DEBUG_EMBEDDINGS dump
     (flash attention off there: its F16 K/V in the tower costs a few % on a wide image), must
     agree (least row cosine >= 0.999, max |diff| <= 1% of the largest value: make_vlm.py
     compare) with the same number of image tokens, else the run stops; the result goes to
     check.txt;
  5. rounds of mlxcel / llama.cpp / mlxcel, the same prompt (the image first, then the text;
     no chat template, no BOS), greedy, one token generated, the load average read before and
     after each run.

What is timed:
  mlxcel     `generate --stats`: "image: ... preprocess P ms, encode E ms" (decode + processor;
             vision tower + projector) and "time to first token: T ms" (P + E + the prompt's
             prefill + the first token); TTFT in the table is T - P.
  llama.cpp  llama-mtmd-cli -v: "mtmd batch encoding done in E ms" (clip: tower + projector),
             "image decoded ... in D ms" (the image rows' prefill) and llama_perf's "prompt eval
             time" (from the prompt's first decode to its logits: encode, the image's and the
             text's prefill; its timer runs across the encode), which is the table's TTFT; its
             preprocessing from the log's timestamps: the chat prompt formatted to the image's
             "add_media" line (tokenizing, resize + normalize inside mtmd_tokenize; the file's
             decoding, before it, is not seen).
Noise: on 2 cores, another busy process makes ggml's spinning thread pool wait a time slice at
each barrier (the small Gemma shape's llama-mtmd-cli prompt eval took 1105 ms, then 10 ms a
second later, at a load average of 4): run in a quiet window, and read load1_before /
load1_after in runs.jsonl.
  Both: the time to first token without preprocessing, so the two measure the same work.

Environment:
  BENCH_CACHE  cache folder (default ~/.cache/mlxcel-bench): npm package, llama.cpp source
  LLAMA_BUILD  llama.cpp CMake build folder (default $BENCH_CACHE/llama.cpp-build); built or
               completed with llama-mtmd-cli, llama-tokenize when they are missing
  MODELS       model folder (default $BENCH_CACHE/models)
  MLXCEL       an mlxcel binary to use instead of building build/mlxcel
  PYTHON       a Python 3 with numpy (default /usr/bin/python3)
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
out=/tmp/bench-vision
shapes=gemma3-4b,qwen2.5-vl-7b
threads=2
rounds=3
side=""
setup_only=0
keep=0
check=1
die() { echo "bench-vision: $*" >&2; exit 1; }
log() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

while [ $# -gt 0 ]; do
    case $1 in
    -o|--out) out=${2:?}; shift ;;
    --shapes) shapes=${2:?}; shift ;;
    --small) shapes=gemma3-small,qwen2.5-vl-small rounds=2 ;;
    -t|--threads) threads=${2:?}; shift ;;
    -r|--rounds) rounds=${2:?}; shift ;;
    --side) side=${2:?}; shift ;;
    --setup-only) setup_only=1 ;;
    --keep-models) keep=1 ;;
    --no-check) check=0 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
    esac
    shift
done
for s in ${shapes//,/ }; do
    case $s in gemma3-4b|qwen2.5-vl-7b|gemma3-small|qwen2.5-vl-small) ;; *) die "unknown shape '$s'" ;; esac
done
for v in "$threads" "$rounds" ${side:+"$side"}; do
    case $v in ''|*[!0-9]*|0) die "not a positive number: '$v'" ;; esac
done
if [ -n "$side" ] && [ $((side % 28)) -ne 0 ]; then die "--side must be a multiple of 28 (patch 14 x merge 2)"; fi

cache=${BENCH_CACHE:-$HOME/.cache/mlxcel-bench}
M=${MODELS:-$cache/models}
py=${PYTHON:-/usr/bin/python3}
build=${LLAMA_BUILD:-$cache/llama.cpp-build}
NLC_VERSION=3.22.1
case "$M$root$build$out" in *[[:space:]]*) die "the model, repository, build and output paths must not hold spaces" ;; esac
mkdir -p "$cache" "$M" "$out/logs"
out=$(cd "$out" && pwd)
"$py" -c 'import numpy' 2>/dev/null || die "$py cannot import numpy (PYTHON=a python3 with numpy)"
mk() { "$py" "$here/make_vlm.py" "$@"; }

# ---- llama.cpp (as scripts/bench-embed-spec-vs-llamacpp.sh builds it) ----

targets=(llama-mtmd-cli llama-tokenize)
prepare_llamacpp() {
    local src=$cache/llama.cpp-src pkg=$cache/node-llama-cpp-$NLC_VERSION t missing=0
    llama_bin=$build/bin
    for t in "${targets[@]}"; do [ -x "$llama_bin/$t" ] || missing=1; done
    if [ -f "$build/CMakeCache.txt" ]; then
        src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
    fi
    if [ ! -f "$src/CMakeLists.txt" ]; then
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
    if [ $missing = 1 ]; then
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
    [ -f "$llama_src/gguf-py/gguf/__init__.py" ] || die "no gguf-py in $llama_src"
}

prepare_mlxcel() {
    if [ -n "${MLXCEL:-}" ]; then mlxcel=$MLXCEL; return; fi
    log "building mlxcel (build/, Release)"
    nice -n 10 cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null || die "mlxcel cmake failed"
    nice -n 10 cmake --build "$root/build" --target mlxcel -j "$(nproc)" >/dev/null || die "mlxcel build failed"
    mlxcel=$root/build/mlxcel
}

# ---- models ----

tok=$M/tok-qwen3
prepare_tokenizer() {
    [ -f "$tok/tokenizer.json" ] && return 0
    mkdir -p "$tok"
    xz -dc "$root/tests/fixtures/tokenizers/qwen3/tokenizer.json.xz" >"$tok/tokenizer.json" &&
        cp "$root/tests/fixtures/tokenizers/qwen3/tokenizer_config.json" "$tok/" || die "cannot unpack the qwen3 tokenizer"
}

# make_shape SHAPE: $M/vlm-SHAPE/{q (mlxcel 4-bit), q4_0.gguf, mmproj.gguf}
make_shape() {
    local s=$1 d=$M/vlm-$1 seed=43
    [ -f "$d/done" ] && return 0
    rm -rf "$d"
    mkdir -p "$d"
    mk configs "$s" "$d/cfg" || die "make_vlm.py configs $s"
    log "$s: mlxcel synth (bf16)"
    nice -n 10 "$mlxcel" synth -c "$d/cfg/config.json" -o "$d/f" --seed $seed -t "$threads" >/dev/null ||
        die "synth $s (bf16) failed"
    mk extras "$d/cfg/config.json" "$d/f" "$tok" || die "make_vlm.py extras $s"
    log "$s: hf2gguf -> Q4_0 GGUF + F16 mmproj"
    PYTHONPATH=$llama_src/gguf-py nice -n 10 "$py" "$root/scripts/hf2gguf.py" "$d/f" "$d/q4_0.gguf.tmp" \
        --mmproj "$d/mmproj.gguf" --outtype q4_0 && mv "$d/q4_0.gguf.tmp" "$d/q4_0.gguf" || die "hf2gguf $s failed"
    rm -rf "$d/f"
    log "$s: mlxcel synth -q (the language model 4-bit g64 of the same values, the same tower)"
    nice -n 10 "$mlxcel" synth -c "$d/cfg/config.json" -o "$d/q" --seed $seed -t "$threads" -q >/dev/null ||
        die "synth $s (4-bit) failed"
    mk extras "$d/cfg/config.json" "$d/q" "$tok" || die "make_vlm.py extras $s"
    touch "$d/done"
}

# ---- runs ----

load1() { cut -d' ' -f1 /proc/loadavg; }

# run_mlxcel SHAPE ROUND: one record into runs.jsonl
run_mlxcel() {
    local s=$1 r=$2 d=$M/vlm-$1 lg=$out/logs/$1-mlxcel-$2.log l0 l1 t0 t1 rc=0
    l0=$(load1); t0=$(date +%s.%N)
    "$mlxcel" generate -m "$d/q" --no-chat --prompt-ids "$prompt_ids" --image "$img" -n 1 --temp 0 \
        --ignore-eos -t "$threads" --stats --output-ids >"$lg" 2>&1 || rc=$?
    t1=$(date +%s.%N); l1=$(load1)
    "$py" - "$lg" "$s" "$r" "$rc" "$l0" "$l1" "$t0" "$t1" >>"$out/runs.jsonl" <<'PY'
import json, re, sys
lg, s, r, rc, l0, l1, t0, t1 = sys.argv[1:]
t = open(lg, errors="replace").read()
rec = {"shape": s, "engine": "mlxcel", "round": int(r), "rc": int(rc), "load1_before": float(l0),
       "load1_after": float(l1), "wall_s": round(float(t1) - float(t0), 3), "log": lg}
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

run_llama() {
    local s=$1 r=$2 d=$M/vlm-$1 lg=$out/logs/$1-llama.cpp-$2.log l0 l1 t0 t1 rc=0
    l0=$(load1); t0=$(date +%s.%N)
    "$llama_bin/llama-mtmd-cli" -m "$d/q4_0.gguf" --mmproj "$d/mmproj.gguf" --image "$img" -p "$prompt_text" \
        --jinja --chat-template "$template" -n 1 --temp 0 -t "$threads" -c "$ctx" -v >"$lg" 2>&1 || rc=$?
    t1=$(date +%s.%N); l1=$(load1)
    "$py" - "$lg" "$s" "$r" "$rc" "$l0" "$l1" "$t0" "$t1" >>"$out/runs.jsonl" <<'PY'
import json, re, sys
lg, s, r, rc, l0, l1, t0, t1 = sys.argv[1:]
t = open(lg, errors="replace").read()
rec = {"shape": s, "engine": "llama.cpp", "round": int(r), "rc": int(rc), "load1_before": float(l0),
       "load1_after": float(l1), "wall_s": round(float(t1) - float(t0), 3), "log": lg}
ts = lambda line: (lambda p: 60 * int(p[0]) + int(p[1]) + int(p[2]) / 1e3)(line.split()[0].split(".")[:3])
enc = re.search(r"mtmd batch encoding done in (\d+) ms", t)
dec = re.search(r"image decoded \(batch 1/1\) in (\d+) ms", t)
pe = re.search(r"prompt eval time =\s*([0-9.]+) ms /\s*(\d+) tokens", t)
ntok = re.search(r"mtmd_batch_encode_impl: encoding batch with 1 entries and total (\d+) tokens", t)
a = re.search(r"^.*formatted_chat\.prompt:.*$", t, re.M)
b = re.search(r"^.*add_media: preproc_out.*$", t, re.M)  # logged once the image is preprocessed
# TTFT from the log's timestamps: the encode's start to llama_perf's report after the one token
# (llama_perf's "prompt eval time" ended before the image rows' decode in a 2026-12-06 run)
e0 = re.search(r"^.*encoding mtmd batch, n_chunks.*$", t, re.M)
e1 = re.search(r"^.*llama_perf_context_print:\s+load time.*$", t, re.M)
if int(rc) == 0 and enc and dec and pe and e0 and e1:
    rec.update(ok=True, encode_ms=float(enc[1]), image_decode_ms=float(dec[1]),
               ttft_ms=round(1e3 * (ts(e1[0]) - ts(e0[0])), 1), prompt_eval_ms=float(pe[1]),
               prompt_tokens=int(pe[2]), image_tokens=int(ntok[1]) if ntok else None,
               preprocess_ms=round(1e3 * (ts(b[0]) - ts(a[0])), 1) if a and b else None)
else:
    rec["ok"] = False
print(json.dumps(rec))
PY
}

# ---- main ----

prepare_llamacpp
prepare_mlxcel
prepare_tokenizer
template="{%- for m in messages -%}{{ m['content'] }}{%- endfor -%}"  # the content as it is
sentence=" Describe this picture in detail: the colours, the shapes, the lines and circles, where each of them lies, what it might show, and whether anything in it looks out of place or unusual to you."
[ -f "$out/runs.jsonl" ] && mv "$out/runs.jsonl" "$out/runs.jsonl.old"
: >"$out/runs.jsonl"
: >"$out/check.txt"
for s in ${shapes//,/ }; do
    make_shape "$s"
    [ $setup_only = 1 ] && continue
    d=$M/vlm-$s
    sd=$side
    [ -z "$sd" ] && case $s in *-small) sd=224 ;; *) sd=896 ;; esac
    img=$out/image-$sd.png
    [ -f "$img" ] || mk image "$sd" "$sd" "$img"
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
    if [ $check = 1 ]; then
        log "$s: twin check (image embeddings of both engines)"
        "$mlxcel" generate -m "$d/q" --no-chat --prompt-ids "$prompt_ids" --image "$img" -n 1 --temp 0 \
            -t "$threads" --image-embd-out "$out/emb-$s-mlxcel.safetensors" >"$out/logs/$s-check-mlxcel.log" 2>&1 ||
            die "$s: mlxcel failed (logs/$s-check-mlxcel.log)"
        MTMD_DEBUG_EMBEDDINGS=$out/emb-$s-llama.cpp.bin "$llama_bin/llama-mtmd-cli" -m "$d/q4_0.gguf" \
            --mmproj "$d/mmproj.gguf" --image "$img" -p "$prompt_text" --jinja --chat-template "$template" -n 1 \
            --temp 0 -t "$threads" -c "$ctx" -fa off >"$out/logs/$s-check-llama.cpp.log" 2>&1 ||
            die "$s: llama-mtmd-cli failed (logs/$s-check-llama.cpp.log)"
        res=$(mk compare "$out/emb-$s-mlxcel.safetensors" "$out/emb-$s-llama.cpp.bin") && ok=1 || ok=0
        echo "$s: $res" | tee -a "$out/check.txt" >&2
        rm -f "$out/emb-$s-mlxcel.safetensors" "$out/emb-$s-llama.cpp.bin"
        [ $ok = 1 ] || die "$s: the twins' image embeddings disagree"
    fi
    log "$s: $rounds rounds (mlxcel, llama.cpp, mlxcel), $sd x $sd image, $threads threads"
    for r in $(seq 1 "$rounds"); do
        run_mlxcel "$s" "$r"
        run_llama "$s" "$r"
    done
    run_mlxcel "$s" $((rounds + 1))
    [ $keep = 1 ] || rm -rf "$d"
done
[ $setup_only = 1 ] && { log "models in $M"; exit 0; }
{ mk summary "$out/runs.jsonl"; [ -s "$out/check.txt" ] && { echo; echo "Twin check:"; sed 's/^/- /' "$out/check.txt"; }; } >"$out/summary.md"
cat "$out/summary.md"
grep -q '"ok": false' "$out/runs.jsonl" && die "some runs failed (runs.jsonl, logs/)"
log "done: $out/runs.jsonl, $out/summary.md"
