#!/bin/bash
# dev/gpu/lease.sh: one GPU lease's work as named steps (issues 41-45: the `cuda` gate, the float64
# generators that need torch, and the GPU halves of the side-by-side benchmarks), written so that
# few calls of the device tool do it all. Not run by CI.
#
# On the development machine, once (`.gpu/` is ignored by git; carry it, ~17 MB):
#   scripts/gpu-loop.sh pack .gpu/p        mlxcel + run_tests + the CUDA plugin (BASE_PLUGIN=F
#                                          adds a baseline plugin for `ab`)
#   dev/gpu/lease.sh prep                  .gpu/llsrc.tar.xz (llama.cpp's source from the npm
#                                          node-llama-cpp 3.22.1 bundle in BENCH_CACHE, without
#                                          the backends CUDA does not need: ~4.5 MB), the text
#                                          the generators read, the code-editing prompt's source
# On the GPU machine, from the repository root (each step logs to steps.log; what comes back:
# $OUT/steps.log, steps-live.log, gate.log, gen.tar.xz and logs.tar.xz):
#   dev/gpu/lease.sh STEP...
# Steps, run in order (`bg:STEP` in the background, `wait` for those, `lim:S` skips every later
# step once S seconds have passed since the start):
#   llb        build llama.cpp with CUDA (sm_90a) into /tmp/llb, in the background (~5 min on
#              16 cores, not measured yet); llwait waits for it
#   gate       the `cuda` CTest gate (MLXCEL_DEVICE=cuda run_tests, CTest's cuda_golden suites)
#   gatebase   the same gate with the baseline plugin (pack's BASE_PLUGIN), log gate-base.log
#   tpgpu      run_tests tp on CUDA: tensor-parallel ranks on one GPU (ADR 0139), log tp.log
#   gen        tests/fixtures/gen/gen_qwen3_vl.py qwen3_vl_moe and gen_mtp_qwen3_next.py (GENT s each, float64
#              references; CPU torch) into $OUT/gen.tar.xz
#   absetup    Llama-3.2-1B / 3.1-8B shapes, 4-bit (ABM names which; ABQ=q8|bf16 for other
#              weights; ABLAYERS=N: the first N layers only, for A/B runs), for ab, in /tmp/ab
#   cudat      run_tests cuda alone (log cudat.log)
#   ab         mlxcel bench with the baseline plugin and the new one, A/B/A (ABVAR=NAME: one
#              plugin, the variable NAME 0 and 1)
#   abv:VAR:MODELS[:EXTRA]  ab with ABVAR=VAR on MODELS (comma-separated absetup names), EXTRA
#              (NAME=VALUE,...) set in all three runs: several A/B switches in one call, e.g.
#              abv:MLXCEL_CUDA_MMQ:llama-8b abv:MLXCEL_CUDA_ATTN_FA2:llama-8b:MLXCEL_KV_TYPE=f16
#              (ABARGS: mlxcel bench's arguments, default -p 512 -n 128 -r 3)
#   lin        dev/kernels/bench_cuda_linear (LINBITS), once per LINENV setting
#   ncuprof    Nsight Compute (--clock-control none) on absetup's first model: a few prefill
#              and depth-4096 decode kernels (NCUKP / NCUKT: kernel regexes), ncu-pp/tg.txt
#   hybgpu     dev/bench/hybrid-gpu/run.sh (chunked recurrent prefill against the recurrence)
#   llsetup:SHAPES[:QUANTS], llbench[:SHAPES[:QUANTS]]   dev/bench/hybrid-llamacpp/run.sh --gpu
#              (--quant QUANTS, default q4; llbench's SHAPES default LLSHAPES; LLARGS)
#   embspec    scripts/bench-embed-spec-vs-llamacpp.sh --gpu (ESTESTS, ESR; ESARGS: more of its flags)
#   vision     dev/bench/vision-llamacpp/run.sh --gpu (VISR)
#   sanit      compute-sanitizer memcheck on three goldens (gate and sanit: scripts/gpu-loop.sh)
# Example (one call, ~10 min): dev/gpu/lease.sh lim:540 llb bg:gen bg:absetup gate lim:430 ab \
#   llwait lim:330 embspec lim:540 wait
set -u
case ${1:-} in
'' | -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
esac
if [ "$1" = prep ]; then
    cache=${BENCH_CACHE:-$HOME/.cache/mlxcel-bench}
    src=$cache/llama.cpp-src
    [ -f "$src/CMakeLists.txt" ] || { echo "lease.sh prep: no llama.cpp source in $src (scripts/bench-embed-spec-vs-llamacpp.sh --setup-only makes it)" >&2; exit 1; }
    mkdir -p .gpu
    tar -C "$src" --exclude=.git --exclude='ggml/src/ggml-sycl' --exclude='ggml/src/ggml-vulkan' \
        --exclude='ggml/src/ggml-opencl' --exclude='ggml/src/ggml-hexagon' --exclude='ggml/src/ggml-metal' \
        --exclude='ggml/src/ggml-et' --exclude='tools/server/public*' --exclude='tools/ui' \
        --exclude='examples/llama.android' --exclude='examples/llama.swiftui' -cJf .gpu/llsrc.tar.xz \
        CMakeLists.txt cmake common ggml include src tools examples vendor licenses LICENSE gguf-py pocs app || exit 1
    xz -9c "${SHAKESPEARE:-../shared/fixtures/text/tinyshakespeare.txt}" >.gpu/tinyshakespeare.txt.xz || exit 1
    git show 46dfd2c:src/engine/sampler.c >.gpu/sampler-46dfd2c.c || exit 1
    du -sh .gpu
    exit 0
fi
R=$(pwd)
T0=$(date +%s)
FINAL=${OUT:-/tmp/final}
export OUT=/tmp/o
mkdir -p "$OUT" "$FINAL"
el() { echo $(( $(date +%s) - T0 )); }
say() { echo "## $(date -u +%H:%M:%S) +$(el)s $*" | tee -a "$OUT/steps.log" >>"$FINAL/steps-live.log"; tail -1 "$OUT/steps.log"; }
export PYTHONUNBUFFERED=1
P=$R/.gpu/p
[ -x "$P/bin/mlxcel" ] || tar -C "$P" -xJf "$P/pack.tar.xz"
export LD_LIBRARY_PATH="$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MLXCEL_CUDA_PLUGIN="$P/bin/libmlxcel-cuda.so"
export MLXCEL_BIN="$P/bin/mlxcel" MLXCEL="$P/bin/mlxcel"
export LLAMA_BUILD=/tmp/llb LLAMA_SRC=/tmp/llsrc PYTHON=python3
# the fixture archives unpacked afresh once, before any step: steps in the background then
# never race the gate's unpacking (gpu-loop.sh skips its own with FIXTURES_FRESH=1)
rm -rf "$R"/tests/fixtures/golden/*/ "$R"/tests/fixtures/models/*/ "$R"/tests/fixtures/tokenizers/*/ \
    "$R"/tests/fixtures/quant/*/
sh "$R/scripts/fixtures.sh" unpack || exit 1
export FIXTURES_FRESH=1
LLT=${LLT:-"llama-bench llama-mtmd-cli llama-embedding llama-lookup llama-speculative-simple llama-completion llama-tokenize llama-quantize llama-batched-bench"}

llb() {
    local t miss=
    for t in $LLT; do [ -x /tmp/llb/bin/$t ] || miss="$miss $t"; done
    if [ -z "$miss" ]; then say "llb: already built"; return 0; fi  # else (again) the LLT targets
    rm -f /tmp/llb.done  # a warm machine's marker of an earlier build: llwait must wait for this one
    [ -f /tmp/llsrc/CMakeLists.txt ] || { mkdir -p /tmp/llsrc && tar -C /tmp/llsrc -xJf "$R/.gpu/llsrc.tar.xz"; }
    (
        s=$(date +%s)
        cmake -S /tmp/llsrc -B /tmp/llb -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
            -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_SERVER=OFF >/tmp/llb.cmake.log 2>&1 &&
            nice -n 5 cmake --build /tmp/llb -j "${LLJ:-12}" --target $LLT >/tmp/llb.log 2>&1
        rc=$?
        echo "llb rc=$rc in $(( $(date +%s) - s )) s" >>/tmp/llb.log
        cp /tmp/llb.log /tmp/llb.cmake.log "$OUT/" 2>/dev/null
        touch /tmp/llb.done
    ) &
    say "llb: started"
}
llwait() {
    local n=0
    while [ ! -f /tmp/llb.done ] && [ $n -lt 600 ]; do sleep 2; n=$((n + 2)); done
    say "llwait: $(tail -1 /tmp/llb.log 2>/dev/null)"
    [ -x /tmp/llb/bin/llama-bench ]
}

gate() {  # scripts/gpu-loop.sh's gate: CTest's cuda_golden suites, its log in $OUT/gate.log
          # (test_graph_decode's derived fixture made first, as cudat does)
    say "gate start"
    sh "$R/scripts/fixtures.sh" derive "$MLXCEL_BIN" >/dev/null 2>&1
    (cd "$R" && scripts/gpu-loop.sh gate .gpu/p)
    say "gate rc=$?"
    cp "$OUT/gate.log" "$FINAL/" 2>/dev/null
    tail -3 "$OUT/gate.log"
}

gatebase() {
    say "gatebase start"
    (cd "$R" && OUT=$OUT/gb GATE_PLUGIN=$P/bin/base/libmlxcel-cuda.so scripts/gpu-loop.sh gate .gpu/p)
    say "gatebase rc=$?"
    cp "$OUT/gb/gate.log" "$FINAL/gate-base.log" 2>/dev/null
}

tpgpu() {
    say "tpgpu start"
    (cd "$R" && MLXCEL_DEVICE=cuda timeout 300 "$P/bin/run_tests" tp >"$OUT/tp.log" 2>&1)
    say "tpgpu rc=$? $(grep -cE '^tp .*ranks' "$OUT/tp.log") split runs, $(grep -c FAILED "$OUT/tp.log") FAILED lines"
    cp "$OUT/tp.log" "$FINAL/" 2>/dev/null
}

gen() {
    say "gen start"
    rm -rf /tmp/gen && mkdir -p /tmp/gen && xz -dc .gpu/tinyshakespeare.txt.xz >/tmp/tinyshakespeare.txt
    (timeout "${GENT:-480}" python3 tests/fixtures/gen/gen_qwen3_vl.py /tmp/gen --text /tmp/tinyshakespeare.txt qwen3_vl_moe >/tmp/gen/vl.log 2>&1; echo "vl rc=$?" >>/tmp/gen/vl.log) &
    (timeout "${GENT:-480}" python3 tests/fixtures/gen/gen_mtp_qwen3_next.py /tmp/gen >/tmp/gen/mtp.log 2>&1; echo "mtp rc=$?" >>/tmp/gen/mtp.log) &
    wait
    tar -C /tmp/gen -cJf "$OUT/gen.tar.xz" .
    say "gen: $(tail -1 /tmp/gen/vl.log) $(tail -1 /tmp/gen/mtp.log) $(du -sh "$OUT/gen.tar.xz" | cut -f1)"
}

hybgpu() {
    say "hybgpu start"
    OUT=/tmp/hg sh dev/bench/hybrid-gpu/run.sh "$MLXCEL_BIN" >"$OUT/hybgpu.log" 2>&1
    say "hybgpu done"
}

llsetup() {  # SHAPES [QUANTS]
    say "llsetup $1 ${2:-q4}"
    MODELS=/tmp/hm dev/bench/hybrid-llamacpp/run.sh --gpu --setup-only --shapes "$1" --quant "${2:-q4}" -o /tmp/hl >>"$OUT/llsetup.log" 2>&1
    say "llsetup rc=$?"
}
llbench() {  # [SHAPES [QUANTS]] (default LLSHAPES, q4); env LLARGS
    local sh=${1:-$LLSHAPES} q=${2:-q4}
    say "llbench $sh $q $LLARGS"
    # shellcheck disable=SC2086
    MODELS=/tmp/hm dev/bench/hybrid-llamacpp/run.sh --gpu --shapes "$sh" --quant "$q" -o /tmp/hl $LLARGS >>"$OUT/llbench.log" 2>&1
    say "llbench rc=$?"
    cp /tmp/hl/summary.md "$OUT/llbench-summary.md" 2>/dev/null
    cp /tmp/hl/runs.jsonl "$OUT/llbench-runs.jsonl" 2>/dev/null
    cat /tmp/hl/summary.md 2>/dev/null
}

ab() {  # the packed plugin (new) against BASE_PLUGIN's (base), A/B/A, on absetup's models;
        # ABVAR=NAME: one plugin, the variable NAME 0 (base) and 1 (new) instead
    say "ab start ${ABVAR:-} ${ABEXTRA:-}"
    echo "## ab ${ABVAR:-base/new} ${ABEXTRA:-}" >>"$OUT/ab.log"
    local n=0
    while [ ! -f /tmp/ab/.done ] && [ $n -lt 300 ]; do sleep 2; n=$((n + 2)); done
    for m in ${ABM:-llama-1b llama-8b}; do
        [ -f /tmp/ab/$m-${ABQ:-q4}/config.json ] || continue
        for pl in base new base; do
            f=$P/bin/libmlxcel-cuda.so
            [ $pl = base ] && [ -z "${ABVAR:-}" ] && f=$P/bin/base/libmlxcel-cuda.so
            v=1
            [ $pl = base ] && v=0
            echo "== $m $pl" >>"$OUT/ab.log"
            # shellcheck disable=SC2086
            env ${ABEXTRA:+${ABEXTRA//,/ }} ${ABVAR:+$ABVAR=$v} MLXCEL_CUDA_PLUGIN=$f "$MLXCEL_BIN" bench --device cuda \
                -m /tmp/ab/$m-${ABQ:-q4} ${ABARGS:--p 512 -n 128 -r 3} 2>&1 | grep -E "^\|" >>"$OUT/ab.log"
        done
    done
    cat "$OUT/ab.log"
    say "ab done"
}

abv() {  # VAR MODELS [EXTRA]: see the header
    local m=$2
    ABVAR=$1 ABM=${m//,/ } ABEXTRA=${3:-} ab
}

lin() {  # the GEMV microbenchmark (LINBITS: widths, default 4), once per LINENV entry
         # (NAME=VALUE, e.g. "MLXCEL_CUDA_QI=0 MLXCEL_CUDA_QI=1"; default one run)
    say "lin start"
    for v in ${LINENV:-MLXCEL_CUDA_QI=0}; do
        echo "== $v" >>"$OUT/lin.log"
        env "$v" timeout 120 "$P/bin/bench_cuda_linear" ${LINBITS:-4} >>"$OUT/lin.log" 2>&1
    done
    cat "$OUT/lin.log"
    say "lin done"
}

vision() {
    say "vision start (disk: $(df -h /tmp | tail -1))"
    rm -rf /tmp/hm /tmp/hg
    PYTHON=python3 GGUF_PY=/tmp/llsrc/gguf-py MODELS=/tmp/vis-models \
        dev/bench/vision-llamacpp/run.sh --gpu -r "${VISR:-3}" -o /tmp/o/vis >"$OUT/vision.log" 2>&1
    say "vision rc=$?"
    cat /tmp/o/vis/summary.md 2>/dev/null
    rm -rf /tmp/vis-models
}

embspec() {
    say "embspec start ${ESTESTS:-embed,lookup,draft} (disk: $(df -h /tmp | tail -1))"
    # shellcheck disable=SC2086
    PYTHON=python3 GGUF_PY=/tmp/llsrc/gguf-py EDIT_SRC=$R/.gpu/sampler-46dfd2c.c MODELS=/tmp/esm \
        scripts/bench-embed-spec-vs-llamacpp.sh --gpu -r "${ESR:-2}" --tests "${ESTESTS:-embed,lookup,draft}" -o /tmp/o/es ${ESARGS:-} >"$OUT/embspec.log" 2>&1
    say "embspec rc=$?"
    cat /tmp/o/es/summary.md 2>/dev/null
}

absetup() {  # into /tmp/ab (llsetup's models are /tmp/hm's); /tmp/ab/.done at the end;
             # ABQ: q4 (4-bit g64, the default), q8 or bf16 (float weights)
    mkdir -p /tmp/ab
    local q=${ABQ:-q4}
    local qa="-q --q-bits ${q#q} --q-group-size 64"
    [ "$q" = bf16 ] && qa="--dtype bf16"
    for m in ${ABM:-llama-1b llama-8b}; do
        # shellcheck disable=SC2086
        python3 dev/bench/hybrid-llamacpp/shapes.py $m "${ABLAYERS:-0}" /tmp/ab/$m.json &&
            "$MLXCEL_BIN" synth -c /tmp/ab/$m.json -o /tmp/ab/$m-$q --seed 41 -t 12 $qa >/dev/null 2>&1
        say "absetup $m rc=$?"
    done
    touch /tmp/ab/.done
}

ncuprof() {  # Nsight Compute on absetup's first model (ABM, ABQ): the prefill's and the decode's
            # products and attention, a few launches each, into ncu-pp.txt / ncu-tg.txt
    say "ncu start"
    local n=0 m
    while [ ! -f /tmp/ab/.done ] && [ $n -lt 300 ]; do sleep 2; n=$((n + 2)); done
    m=/tmp/ab/$(echo ${ABM:-llama-8b} | cut -d' ' -f1)-${ABQ:-q4}
    local sec="--section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats"
    # shellcheck disable=SC2086
    timeout 240 ncu --clock-control none $sec -k "regex:${NCUKP:-mma_affine|attn_fa|attn_kernel}" --launch-skip 8 --launch-count 6 \
        "$MLXCEL_BIN" bench --device cuda -m "$m" -p 512 -n 0 -r 1 >"$OUT/ncu-pp.txt" 2>&1
    say "ncu pp rc=$?"
    # shellcheck disable=SC2086
    timeout 240 ncu --clock-control none $sec -k "regex:${NCUKT:-gemv|attn_fd|attn_split|rope|norm}" --launch-skip 300 --launch-count 12 \
        "$MLXCEL_BIN" bench --device cuda -m "$m" -p 0 -n 16 -d 4096 -r 1 >"$OUT/ncu-tg.txt" 2>&1
    say "ncu tg rc=$?"
    cp "$OUT"/ncu-*.txt "$FINAL/" 2>/dev/null
}

cudat() {  # run_tests cuda alone: the kernels against the CPU (test_graph_decode reads a
           # derived fixture, made first)
    say "cudat start"
    sh "$R/scripts/fixtures.sh" derive "$MLXCEL_BIN" >/dev/null 2>&1
    (cd "$R" && MLXCEL_DEVICE=cuda timeout 300 "$P/bin/run_tests" cuda >"$OUT/cudat.log" 2>&1)
    say "cudat rc=$? $(grep -E 'worst rel err' "$OUT/cudat.log" | grep -v shapes | awk '{print $NF}' | tr '\n' ' ')"
    grep -E "FAILED|linear.*: [0-9]+ formats" "$OUT/cudat.log"
}

sanit() {  # scripts/gpu-loop.sh's sanitize: memcheck on a dense, a MoE and an MLA golden
    say "sanitize"
    (cd "$R" && scripts/gpu-loop.sh sanitize .gpu/p)
    say "sanitize rc=$?"
}

LIM=100000
run_step() {
    if [ "$(el)" -gt "$LIM" ]; then say "skip $1 (past ${LIM}s)"; return 0; fi
    case $1 in
    lim:*) LIM=${1#lim:} ;;
    llb | llwait | gate | gatebase | tpgpu | gen | hybgpu | sanit | llbench | ab | lin | cudat | ncuprof | vision | embspec | absetup) $1 ;;
    llsetup:*) a=${1#llsetup:}; llsetup "${a%%:*}" "$(echo "$a" | sed -n 's/^[^:]*://p')" ;;
    llbench:*) a=${1#llbench:}; llbench "${a%%:*}" "$(echo "$a" | sed -n 's/^[^:]*://p')" ;;
    abv:*) IFS=: read -r v m x <<<"${1#abv:}"; abv "$v" "$m" "$x" ;;
    bg:*) run_step "${1#bg:}" & ;;
    wait) wait ;;
    *) say "unknown step $1" ;;
    esac
}
for step in "$@"; do run_step "$step"; done
say "end"
[ -f "$OUT/gen.tar.xz" ] && mv "$OUT/gen.tar.xz" "$FINAL/"
cp "$OUT/steps.log" "$FINAL/"
tar -C "$OUT" -cJf "$FINAL/logs.tar.xz" .
