#!/bin/bash
# Hybrid models of real proportions against llama.cpp on the CPU (issue 41): decode at depth 0
# and at depth 8192, prefill pp512 and memory per sequence, for Granite-4.0-H-Tiny's shape
# (Mamba-2 + attention, MoE), Qwen3-Next-80B-A3B's shape scaled to fit (gated DeltaNet +
# gated attention, MoE) and an attention-only Llama of about the same active size. The
# random-weight models are made from nothing: `mlxcel synth` bf16 -> `scripts/hf2gguf.py
# --outtype q4_0` (byte for byte what llama-quantize --pure Q4_0 makes of the F16 twin, without
# the F16 file) -> the bf16 folder deleted -> `mlxcel synth -q` 4-bit g64 of the same seed (the
# same values, quantized). Then, per shape, the engines interleaved (mlxcel, llama.cpp,
# mlxcel) for each test; every process's command, wall time, parsed results and the load
# average around it go to runs.jsonl, the medians to summary.md. See --help.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: dev/bench/hybrid-llamacpp/run.sh [OPTIONS]

  -o, --out DIR        output folder (default /tmp/bench-hybrid-llamacpp): runs.jsonl,
                       summary.md, raw/ (each process's stdout and stderr)
      --shapes LIST    comma-separated, from granite-h-tiny,qwen3-next,llama-1b,llama-8b,
                       qwen3-30b-a3b (default: the first three)
      --layers N       cut every shape to its first N layers (widths and layer pattern kept;
                       0 = all, the default): the smoke test's small models
  -t, --threads N      threads for both engines (default 2)
  -r, --reps N         timed repetitions inside each bench process (default 1)
      --rounds N       rounds of mlxcel / llama.cpp / mlxcel per test (default 1)
  -p, --n-prompt N     prefill test size (default 512)
  -n, --n-gen N        decode test size (default 32)
  -d, --depth N        the deep decode test's depth (default 8192)
      --kv-type T      KV cache type of both engines: f16 (default: llama.cpp's default),
                       bf16 or f32 (mlxcel --kv-type, llama-bench -ctk/-ctv)
      --fa on|off      llama.cpp flash attention (default off: on this 2-core AVX-512 host its
                       CPU flash attention decodes slower at depth, see docs/benchmarks.md
                       "Speculative decoding", and llama-bench's auto turns it on)
      --gpu            both engines on the GPU: mlxcel --device cuda, llama-bench -ngl 99
                       (LLAMA_BUILD must be a CUDA build; nothing is built here); -t still
                       sets the CPU threads of both
      --quant LIST     comma-separated weight formats, from q4 (MLX 4-bit g64 against Q4_0, the
                       default), q8 (MLX 8-bit g64 against Q8_0, made by llama-quantize from
                       an F16 GGUF: needs LLAMA_BUILD at setup) and bf16 (the bf16 folder
                       against an F16 GGUF); the summary names the non-q4 ones "SHAPE@FORMAT"
      --batched LIST   also aggregate decode of S sequences together, for each S of the
                       comma-separated LIST (e.g. 16,64): mlxcel `bench -p 0 -n N -d P -s S`
                       against llama.cpp's `llama-batched-bench -npp P -ntg N -npl S` (every
                       sequence its own P-token prompt, then N tokens each; S_TG, the
                       decode's tokens/s of all sequences); needs bin/llama-batched-bench
      --batched-prompt P  the prompt of each batched sequence (default 128)
      --keep           keep the bf16 folders (the full shapes' are 14 + 13 + 2.5 GB)
      --setup-only     make the models, then stop
  -h, --help           this help

Tests, per shape (mlxcel `bench --json`, llama.cpp `llama-bench -o jsonl -v`):
  d0     -p P -n N       prefill of P tokens and decode of N tokens from an empty cache
  dD     -p 0 -n N -d D  decode of N tokens after D tokens (prefilled untimed: mlxcel before
                         every repetition, llama-bench once, its state restored for the later
                         ones; both warm up from an empty cache)
Memory per sequence at depth D: mlxcel's kv_bytes (attention rows for D + N positions and the
recurrent states), llama.cpp's "KV buffer size" + "RS buffer size" of the same context.
Peak RSS of every process (/usr/bin/time, where the machine has it).

Models (MODELS, default $BENCH_CACHE/hybrid-models; NAME-q4 = mlxcel, NAME-q4_0.gguf =
llama.cpp): dev/bench/hybrid-llamacpp/shapes.py writes the configs and says where their values
come from. Tokenizers (only their size matters: both benches feed token ids): GPT-2's padded
to 100352 for Granite, Qwen3's for Qwen3-Next, Llama 3.1's for the Llama. The full shapes
(6.94B, 6.30B and 1.24B parameters; 1.31B, 1.60B and 0.97B active outside the embedding) take
~16.3 GB at the end (~3.9 / ~3.5 / ~0.7 GB each, twice: 4.5 bits per weight both); the GGUFs
are made first, one bf16 folder at a time, so the peak is ~20.0 GB (18.6 GiB: Qwen3-Next's
bf16 folder, 12.6 GB, beside its GGUF and Granite's).

Environment:
  BENCH_CACHE  cache folder (default ~/.cache/mlxcel-bench), holding llama.cpp-src
  LLAMA_BUILD  llama.cpp CMake build folder with bin/llama-bench (default
               $BENCH_CACHE/llama.cpp-build; scripts/bench-embed-spec-vs-llamacpp.sh builds one;
               --setup-only needs only the source)
  LLAMA_SRC    the llama.cpp source (its gguf-py) where LLAMA_BUILD has no CMakeCache.txt yet
               (default $BENCH_CACHE/llama.cpp-src)
  MODELS       model folder (default $BENCH_CACHE/hybrid-models)
  MLXCEL       the mlxcel binary (default build/mlxcel)
  PYTHON       a Python 3 with numpy (default /usr/bin/python3)
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
# the tokenizer fixtures are archives the build unpacks (scripts/fixtures.sh): unpacked here too
sh "$root/scripts/fixtures.sh" unpack >/dev/null || { echo "$0: scripts/fixtures.sh unpack failed" >&2; exit 1; }
out=/tmp/bench-hybrid-llamacpp
shapes_sel=granite-h-tiny,qwen3-next,llama-1b
batched='' b_pp=128 quants=q4 layers=0 threads=2 reps=1 rounds=1 n_pp=512 n_tg=32 depth=8192 kv=f16 fa=off keep=0 setup_only=0 gpu=0
die() { echo "hybrid-llamacpp: $*" >&2; exit 1; }
log() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

while [ $# -gt 0 ]; do
    case $1 in
    -o|--out) out=${2:?}; shift ;;
    --shapes) shapes_sel=${2:?}; shift ;;
    --quant) quants=${2:?}; shift ;;
    --layers) layers=${2:?}; shift ;;
    -t|--threads) threads=${2:?}; shift ;;
    -r|--reps) reps=${2:?}; shift ;;
    --rounds) rounds=${2:?}; shift ;;
    -p|--n-prompt) n_pp=${2:?}; shift ;;
    -n|--n-gen) n_tg=${2:?}; shift ;;
    -d|--depth) depth=${2:?}; shift ;;
    --kv-type) kv=${2:?}; shift ;;
    --fa) fa=${2:?}; shift ;;
    --batched) batched=${2:?}; shift ;;
    --batched-prompt) b_pp=${2:?}; shift ;;
    --keep) keep=1 ;;
    --gpu) gpu=1 ;;
    --setup-only) setup_only=1 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
    esac
    shift
done
for s in ${shapes_sel//,/ }; do
    case $s in granite-h-tiny|qwen3-next|llama-1b|llama-8b|qwen3-30b-a3b) ;; *) die "unknown shape '$s'" ;; esac
done
for v in "$threads" "$reps" "$rounds" "$n_pp" "$n_tg" "$depth" "$b_pp" ${batched//,/ }; do
    case $v in ''|*[!0-9]*|0) die "not a positive number: '$v'" ;; esac
done
for q in ${quants//,/ }; do
    case $q in q4|q8|bf16) ;; *) die "--quant: q4, q8 or bf16, not '$q'" ;; esac
done
case $layers in ''|*[!0-9]*) die "--layers: not a number: '$layers'" ;; esac
case $kv in f16|bf16|f32) ;; *) die "--kv-type: f16, bf16 or f32" ;; esac
case $fa in on|off) ;; *) die "--fa: on or off" ;; esac

cache=${BENCH_CACHE:-$HOME/.cache/mlxcel-bench}
M=${MODELS:-$cache/hybrid-models}
py=${PYTHON:-/usr/bin/python3}
build=${LLAMA_BUILD:-$cache/llama.cpp-build}
mlxcel=${MLXCEL:-$root/build/mlxcel}
llama_bench=$build/bin/llama-bench
[ "$setup_only" = 1 ] || [ -x "$llama_bench" ] || die "no $llama_bench (LLAMA_BUILD=a llama.cpp build folder)"
llama_batched=$build/bin/llama-batched-bench
[ "$setup_only" = 1 ] || [ -z "$batched" ] || [ -x "$llama_batched" ] || die "--batched: no $llama_batched"
[ -x "$mlxcel" ] || die "no $mlxcel (MLXCEL=an mlxcel binary, or build build/mlxcel)"
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
[ -n "$src" ] || src=${LLAMA_SRC:-$cache/llama.cpp-src}
[ -f "$src/gguf-py/gguf/__init__.py" ] || die "no gguf-py in $src (the llama.cpp source of $build)"
"$py" -c 'import numpy' 2>/dev/null || die "$py cannot import numpy (PYTHON=a python3 with numpy)"
case "$M$root$out" in *[[:space:]]*) die "the model, repository and output paths must not hold spaces" ;; esac
mkdir -p "$M" "$out/raw"
out=$(cd "$out" && pwd)

# ---- runs ----

run_id=$(ls "$out/raw" | grep -c '\.err$' || true)
# run ENGINE SHAPE TEST -- CMD...: one process, timed, its stdout and stderr kept in raw/;
# one line of runs.jsonl with what its output says (bench results, cache sizes, peak RSS)
run() {
    local engine=$1 shape=$2 test=$3 id l0 l1 s0 s1 rc=0
    shift 4
    run_id=$((run_id + 1)); id=$(printf 'r%03d' $run_id)
    log "$id $engine $shape $test"
    l0=$(cut -d' ' -f1-3 /proc/loadavg); s0=$(date +%s.%N)
    if [ -x /usr/bin/time ]; then
        /usr/bin/time -f "maxrss_kb %M" -o "$out/raw/$id.time" "$@" </dev/null >"$out/raw/$id.out" 2>"$out/raw/$id.err" || rc=$?
    else  # no GNU time (the GPU machine's image): no peak RSS
        "$@" </dev/null >"$out/raw/$id.out" 2>"$out/raw/$id.err" || rc=$?
    fi
    s1=$(date +%s.%N); l1=$(cut -d' ' -f1-3 /proc/loadavg)
    [ $rc = 0 ] || log "$id failed (exit $rc): $(tail -2 "$out/raw/$id.err")"
    "$py" - "$id" "$engine" "$shape" "$test" "$rc" "$s0" "$s1" "$l0" "$l1" "$out/raw/$id" "$M" "$*" <<'PY' >>"$out/runs.jsonl"
import json, os, re, shutil, sys
id_, engine, shape, test, rc, s0, s1, l0, l1, base, models, cmd = sys.argv[1:]
r = {"id": id_, "engine": engine, "shape": shape, "test": test, "rc": int(rc),
     "wall_s": round(float(s1) - float(s0), 3), "loadavg_before": l0, "loadavg_after": l1,
     "disk_free_gb": round(shutil.disk_usage(models).free / 2**30, 1), "command": cmd}
stdout = open(base + ".out", errors="replace").read()
err = open(base + ".err", errors="replace").read()
try:
    m = re.search(r"maxrss_kb (\d+)", open(base + ".time").read())
    if m:
        r["peak_rss_mib"] = round(int(m[1]) / 1024, 1)
except OSError:
    pass
tests = []
if engine == "mlxcel" and stdout.strip().startswith("["):
    for t in json.loads(stdout):
        tests.append({"test": t["test"], "ts": t["ts_mean"], "sd": t["ts_sd"], "samples": t["samples_ts"]})
        r.update(n_ctx=t["n_ctx"], kv_bytes=t["kv_bytes"], kv_type=t["kv_type"], weight_bytes=t["weight_bytes"])
elif engine == "llama.cpp":
    for line in stdout.splitlines():
        if line.startswith("{") and "speed_tg" in line:  # llama-batched-bench: mlxcel's names
            t = json.loads(line)
            name = f"tg{t['tg']}x{t['pl']}" + (f" @ d{t['pp']}" if t["pp"] else "")
            tests.append({"test": name, "ts": t["speed_tg"], "sd": 0.0, "samples": [t["speed_tg"]]})
            r.update(flash_attn=t["flash_attn"], n_kv_max=t["n_kv_max"])
        elif line.startswith("{"):
            t = json.loads(line)
            name = f"pp{t['n_prompt']}" if t["n_prompt"] else f"tg{t['n_gen']}"
            if t["n_depth"]:
                name += f" @ d{t['n_depth']}"
            tests.append({"test": name, "ts": t["avg_ts"], "sd": t["stddev_ts"], "samples": t["samples_ts"]})
            r.update(model_bytes=t["model_size"], kv_type=t["type_k"], flash_attn=t["flash_attn"])
    # the largest context's caches (llama-bench makes one per test): attention rows and states
    kv = [float(x) for x in re.findall(r"KV buffer size =\s+([\d.]+) MiB", err)]
    rs = [float(x) for x in re.findall(r"RS buffer size =\s+([\d.]+) MiB", err)]
    cells = [int(x) for x in re.findall(r"llama_kv_cache: size = .*?\(\s*(\d+) cells", err)]
    r.update(kv_mib=max(kv, default=0.0), rs_mib=max(rs, default=0.0), kv_cells=max(cells, default=0))
if tests:
    r["tests"] = tests
print(json.dumps(r))
PY
    return $rc
}

# ---- models ----

tokenizer() {  # FIXTURE_NAME -> $M/tok-NAME/tokenizer.json
    local d=$M/tok-$1 f=$root/tests/fixtures/tokenizers/$1
    [ -f "$d/tokenizer.json" ] && return 0
    mkdir -p "$d"
    xz -dc "$f/tokenizer.json.xz" >"$d/tokenizer.json" && cp "$f/tokenizer_config.json" "$d/" || die "cannot unpack $f"
}

model_name() {  # SHAPE -> NAME: SHAPE, or SHAPE-lN with --layers N
    if [ "$layers" = 0 ]; then echo "$1"; else echo "$1-l$layers"; fi
}

has_quant() { case ",$quants," in *",$1,"*) return 0 ;; esac; return 1; }

# the GGUF of NAME in format Q (q4 -> q4_0, q8 -> q8_0, bf16 -> f16), and mlxcel's folder
gguf_of() { case $2 in q4) echo "$M/$1-q4_0.gguf" ;; q8) echo "$M/$1-q8_0.gguf" ;; bf16) echo "$M/$1-f16.gguf" ;; esac; }
mlx_of() { echo "$M/$1-$2"; }

# make_gguf SHAPE: $M/NAME.json and the GGUF of every --quant format (through NAME-bf16,
# deleted after unless bf16 is benchmarked or --keep)
make_gguf() {
    local shape=$1 name tok q need=0
    name=$(model_name "$shape")
    case $shape in granite-h-tiny) tok=gpt2 ;; qwen3-*) tok=qwen3 ;; llama-*) tok=llama3_1 ;; esac
    tokenizer $tok
    "$py" "$here/shapes.py" "$shape" "$layers" "$M/$name.json" || die "shapes.py $shape failed"
    for q in ${quants//,/ }; do [ -f "$(gguf_of "$name" $q)" ] || need=1; done
    [ $need = 1 ] || return 0
    if [ ! -f "$M/$name-bf16/config.json" ]; then
        rm -rf "$M/$name-bf16"
        run setup "$name" synth-bf16 -- nice -n 10 "$mlxcel" synth -c "$M/$name.json" -o "$M/$name-bf16" --seed 41 \
            -t "$(nproc)" --tokenizer "$M/tok-$tok" --dtype bf16 || die "synth $name-bf16 failed"
    fi
    if has_quant q4 && [ ! -f "$M/$name-q4_0.gguf" ]; then
        run setup "$name" hf2gguf-q4_0 -- env PYTHONPATH="$src/gguf-py" nice -n 10 "$py" "$root/scripts/hf2gguf.py" \
            --outtype q4_0 "$M/$name-bf16" "$M/$name-q4_0.gguf.tmp" || die "hf2gguf $name failed"
        mv "$M/$name-q4_0.gguf.tmp" "$M/$name-q4_0.gguf"
    fi
    if { has_quant q8 && [ ! -f "$M/$name-q8_0.gguf" ]; } || { has_quant bf16 && [ ! -f "$M/$name-f16.gguf" ]; }; then
        if [ ! -f "$M/$name-f16.gguf" ]; then
            run setup "$name" hf2gguf-f16 -- env PYTHONPATH="$src/gguf-py" nice -n 10 "$py" "$root/scripts/hf2gguf.py" \
                --outtype f16 "$M/$name-bf16" "$M/$name-f16.gguf.tmp" || die "hf2gguf $name f16 failed"
            mv "$M/$name-f16.gguf.tmp" "$M/$name-f16.gguf"
        fi
        if has_quant q8 && [ ! -f "$M/$name-q8_0.gguf" ]; then
            [ -x "$build/bin/llama-quantize" ] || die "--quant q8: no $build/bin/llama-quantize"
            run setup "$name" quantize-q8_0 -- nice -n 10 "$build/bin/llama-quantize" --pure "$M/$name-f16.gguf" \
                "$M/$name-q8_0.gguf.tmp" Q8_0 "$(nproc)" || die "llama-quantize $name failed"
            mv "$M/$name-q8_0.gguf.tmp" "$M/$name-q8_0.gguf"
        fi
        has_quant bf16 || rm -f "$M/$name-f16.gguf"
    fi
    [ "$keep" = 1 ] || has_quant bf16 || rm -rf "$M/$name-bf16"
}

# make_mlx SHAPE: the MLX folders of the quantized --quant formats, the same seed's values
make_mlx() {
    local name q bits
    name=$(model_name "$1")
    for q in ${quants//,/ }; do
        case $q in q4) bits=4 ;; q8) bits=8 ;; *) continue ;; esac
        if [ ! -f "$M/$name-$q/config.json" ]; then
            rm -rf "$M/$name-$q"
            run setup "$name" "synth-$q" -- nice -n 10 "$mlxcel" synth -c "$M/$name.json" -o "$M/$name-$q" --seed 41 \
                -t "$(nproc)" -q --q-bits $bits --q-group-size 64 || die "synth $name-$q failed"
        fi
    done
}

# ---- tests ----

bench_pair() {  # LABEL NAME QUANT TEST MLXCEL_ARGS... -- LLAMA_ARGS...
    local shape=$1 name=$2 q=$3 test=$4 ma=() la=() seen=0
    shift 4
    for a in "$@"; do
        if [ "$a" = -- ]; then seen=1; elif [ $seen = 0 ]; then ma+=("$a"); else la+=("$a"); fi
    done
    local ll=(-m "$(gguf_of "$name" "$q")" "${la[@]}" -r "$reps" -t "$threads" -ctk "$kv" -ctv "$kv" -fa "$fa" -o jsonl -v)
    local ml=(bench -m "$(mlx_of "$name" "$q")" "${ma[@]}" -r "$reps" -t "$threads" --kv-type "$kv" --json)
    aba "$shape" "$test" "$llama_bench"
}

# aba SHAPE TEST TOOL: mlxcel with the caller's ml, TOOL with its ll, mlxcel again (the GPU's
# flags added with --gpu)
aba() {
    if [ "$gpu" = 1 ]; then
        ll+=(-ngl 99)
        ml+=(--device cuda)
    fi
    run mlxcel "$1" "$2" -- "$mlxcel" "${ml[@]}" || true
    run llama.cpp "$1" "$2" -- "$3" "${ll[@]}" || true
    run mlxcel "$1" "$2" -- "$mlxcel" "${ml[@]}" || true
}

batched_pair() {  # LABEL NAME QUANT S: S sequences of b_pp prompt tokens, then n_tg each
    local shape=$1 name=$2 q=$3 S=$4
    local ml=(bench -m "$(mlx_of "$name" "$q")" -p 0 -n "$n_tg" -d "$b_pp" -s "$S" -r "$reps" -t "$threads"
        --kv-type "$kv" --json)
    local ll=(-m "$(gguf_of "$name" "$q")" -c $((S * (b_pp + n_tg))) -b 2048 -ub 512 -npp "$b_pp" -ntg "$n_tg"
        -npl "$S" -t "$threads" -ctk "$kv" -ctv "$kv" -fa "$fa" --output-format jsonl)
    aba "$shape" "b$S" "$llama_batched"
}

if [ "$gpu" = 1 ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$out/device.txt" ||
        die "--gpu: nvidia-smi failed"
    log "GPU: $(cat "$out/device.txt")"
fi
log "models in $M ($(df -BG --output=avail "$M" | tail -1 | tr -d ' ') free), output in $out"
# every GGUF first, then the MLX folders: one bf16 folder at a time beside the files made so
# far keeps the peak under 20 GB for the full shapes
for s in ${shapes_sel//,/ }; do make_gguf "$s"; done
for s in ${shapes_sel//,/ }; do make_mlx "$s"; done
[ "$setup_only" = 1 ] && { log "models ready"; exit 0; }

for s in ${shapes_sel//,/ }; do
    name=$(model_name "$s")
    for q in ${quants//,/ }; do
        label=$s
        [ "$q" = q4 ] || label=$s@$q
        for ((i = 1; i <= rounds; i++)); do
            bench_pair "$label" "$name" "$q" d0 -p "$n_pp" -n "$n_tg" -- -p "$n_pp" -n "$n_tg" -d 0
            bench_pair "$label" "$name" "$q" "d$depth" -p 0 -n "$n_tg" -d "$depth" -- -p 0 -n "$n_tg" -d "$depth"
            for S in ${batched//,/ }; do batched_pair "$label" "$name" "$q" "$S"; done
        done
    done
done

{
    [ "$gpu" = 1 ] && printf 'GPU: %s; mlxcel --device cuda, llama-bench -ngl 99 -fa %s\n\n' "$(cat "$out/device.txt")" "$fa"
    "$py" "$here/summary.py" "$out/runs.jsonl" "$depth"
} >"$out/summary.md" || die "summary.py failed"
cat "$out/summary.md"
log "done: $out/summary.md, $out/runs.jsonl"
