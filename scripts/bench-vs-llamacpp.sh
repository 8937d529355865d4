#!/bin/bash
# bench-vs-llamacpp.sh: mlxcel against llama.cpp on the CPU, side by side, from nothing
# (issue 13). One command on a fresh Debian 12 machine:
#   1. fetches node-llama-cpp@3.22.1 with `npm pack` into a cache folder outside the repository
#      and builds llama-bench and llama-quantize from the llama.cpp source bundled in it (CMake
#      Release, CPU only, GGML_NATIVE=ON), unless that cache (or LLAMA_BUILD) has them already;
#   2. writes the models: MLX checkpoints with `mlxcel synth` (bf16) and `mlxcel convert -q`
#      (8-bit g64, 4-bit g64) and their GGUF twins for llama.cpp (scripts/hf2gguf.py: the same bf16 values as F16, then
#      `llama-quantize --pure` to Q8_0 / Q4_0; Phixtral's twin is the phi2 proxy of
#      scripts/make-proxy-gguf.py, which reads the same bytes per token);
#   3. runs the matrix interleaved A/B/A per model and width (mlxcel, llama.cpp, mlxcel): pp512,
#      tg128, tg128 at depth 4096, and mlxcel's batched decode (8 sequences against 1), on
#      2 threads, each weight file dropped from the page cache and read back before its run,
#      `membw` before and after (docs/benchmarks.md, "Method"); the MoE shapes gpt-oss and
#      qwen3-moe (issue 12; only on request) run pp512 and tg128 alone;
#   4. writes results.json (one object per measurement, ratios and bandwidth fractions
#      computed), ratios.png (gnuplot) and table.md to the output folder, and prints the table.
# Everything it builds or writes lives in the cache folder or the output folder; nothing in the
# repository changes except build/ (mlxcel itself, `cmake --build build`). Not run by CI.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/bench-vs-llamacpp.sh [OPTIONS]

mlxcel against llama.cpp (built from the node-llama-cpp 3.22.1 bundle) on the CPU, interleaved
A/B/A per model and width; writes results.json, ratios.png and table.md to the output folder.

  -o, --out DIR        output folder (default /tmp/bench-out)
      --quick          a check that everything works, not a measurement: -p 64 -n 16,
                       depth 256, 1 repetition, no waiting for a quiet machine
      --models LIST    comma-separated, from llama-1b,phi-2,phixtral (the default: these
                       three) and the MoE shapes gpt-oss,qwen3-moe (only when named)
      --widths LIST    comma-separated, from bf16,q8,q4 (default: all; Phixtral only q8,q4);
                       the MoE shapes have one width each and ignore it (see below)
      --layers N       cut every shape to N layers (a faster check; model names get -lN)
  -t, --threads N      threads for both engines and membw (default 2)
  -r, --reps N         timed repetitions per test (default 3)
      --depth N        KV-cache depth of the long-context decode test (default 4096)
      --tests LIST     comma-separated, from pp_tg,batched,depth (default: all three; a
                       shorter matrix leaves the others out)
      --quiet-wait S   before each run, wait up to S seconds for 20 s in which the machine
                       used < 0.15 cores (default 600, then 60 once one wait was in
                       vain; 0 = do not wait)
      --setup-only     fetch, build and write the models, then stop
      --isa avx2       both engines on AVX2 only, as on hosts that expose no AVX-512 (the
                       Zen 4 VMs of this machine kind): mlxcel with MLXCEL_ISA=avx2 and a
                       second llama.cpp build (llama.cpp-build-avx2: GGML_NATIVE=OFF, AVX, AVX2,
                       FMA, F16C, BMI2 on, AVX-512 and AVX-VNNI off); default native
      --fast           run mlxcel with --fast (4-bit products on x rounded to 8 bits per
                       group, as llama.cpp's Q8 activations; not exact, opt-in); meta.json
                       and the table say so
  -h, --help           this help

MoE shapes (issue 12): random weights of the published shapes with fewer layers (every other
dimension kept), so that the largest file of each (its bf16 synth, its F16 GGUF twin) stays
under ~12 GB and the models fit a 2-core, 23 GB machine with ~35 GB of free disk:
  gpt-oss    gpt-oss-20b-l4: openai/gpt-oss-20b (hidden 2880, 64 q / 8 kv heads of 64, 32
             experts top-4 of width 2880, vocab 201088, sliding 128 / full alternating, yarn
             x32 on 4096, theta 150000, swiglu limit 7) with 4 of its 24 layers (bf16 8.9 GB).
             mlxcel: the mlx-community layout (experts mxfp4, everything else 8-bit g64
             affine, scripts/mlx-mixq.py) against GGUF MXFP4_MOE (experts MXFP4, rest Q8_0).
  qwen3-moe  qwen3-30b-a3b-l6: Qwen/Qwen3-30B-A3B (hidden 2048, 32 q / 4 kv heads of 128, 128
             experts top-8 of width 768, vocab 151936, theta 1e6, norm_topk_prob) with 6 of
             its 48 layers (bf16 8.7 GB). mlxcel: MLX 4-bit g64 (router 8-bit) against Q4_0.
  Their width is named mxfp4 (gpt-oss) and q4 (qwen3-moe). Only pp and tg are run (no depth
  test, no batched decode: the time goes to the dense shapes' matrix). Their bf16 folder and
  F16 GGUF are deleted once the quantized GGUF is written (KEEP_FLOAT=1 keeps them) and the
  MLX folder is written after that with `mlxcel synth -q` (the same bytes as `convert -q` of
  the bf16 folder), so the disk holds at most bf16 + F16 of one shape at a time; the
  bytes read per decoded token count every dense tensor, the LM head, and k/n of each expert
  stack (only the selected experts are read), and are printed after the setup and recorded
  with GB/s (bytes per token x tokens per second) in results.json and table.md.

Environment:
  BENCH_CACHE    cache folder for npm package, llama.cpp build, models (default ~/.cache/mlxcel-bench)
  LLAMA_BUILD    an existing llama.cpp CMake build folder to use instead of building one
                 (needs bin/llama-bench and bin/llama-quantize; its CMakeCache.txt names the
                 source, whose gguf-py writes the GGUFs)
  MODELS         model folder (default $BENCH_CACHE/models)
  MLXCEL         an mlxcel binary to use instead of building build/mlxcel
  PHIXTRAL_LAYERS  layers of the Phixtral-4x2_8 shape (default 8 of its 32, as make-bench-models.sh)
  GPT_OSS_LAYERS, QWEN3_MOE_LAYERS  layers of the MoE shapes (default 4 of 24, 6 of 48)
  KEEP_FLOAT     1 keeps the MoE shapes' bf16 folder and F16 GGUF (default: deleted when done)
  PYTHON         a Python 3 with numpy (default /usr/bin/python3, Debian's python3-numpy)

Missing Debian packages (npm, git, cmake, build-essential, python3-numpy, gnuplot-nox) are
installed with apt-get (as root, or through sudo).
EOF
}

root=$(cd "$(dirname "$0")/.." && pwd)
out=/tmp/bench-out
quick=0
models_sel=llama-1b,phi-2,phixtral
widths_sel=bf16,q8,q4
layers=
threads=2
reps=3
depth=4096
tests_sel=pp_tg,batched,depth
quiet_wait=600
setup_only=0
quiet_wait_set=0
mlx_flags=()
isa=native

die() { echo "bench-vs-llamacpp: $*" >&2; exit 1; }
log() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

while [ $# -gt 0 ]; do
    case $1 in
    -o|--out) out=${2:?}; shift ;;
    --quick) quick=1 ;;
    --models) models_sel=${2:?}; shift ;;
    --widths) widths_sel=${2:?}; shift ;;
    --layers) layers=${2:?}; shift ;;
    -t|--threads) threads=${2:?}; shift ;;
    -r|--reps) reps=${2:?}; shift ;;
    --depth) depth=${2:?}; shift ;;
    --tests) tests_sel=${2:?}; shift ;;
    --quiet-wait) quiet_wait=${2:?}; quiet_wait_set=1; shift ;;
    --setup-only) setup_only=1 ;;
    --fast) mlx_flags=(--fast) ;;
    --isa) isa=${2:?}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
    esac
    shift
done
case $isa in
native) ;;
avx2) export MLXCEL_ISA=avx2 ;;
*) die "unknown --isa '$isa' (native, avx2)" ;;
esac
for t in ${tests_sel//,/ }; do
    case $t in pp_tg|batched|depth) ;; *) die "unknown test '$t' (pp_tg, batched, depth)" ;; esac
done
want() { case ",$tests_sel," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
for v in "$threads" "$reps" "$depth" "$quiet_wait" ${layers:+"$layers"}; do
    case $v in ''|*[!0-9]*) die "not a number: '$v'" ;; esac
done

# test sizes
if [ "$quick" = 1 ]; then
    n_pp=64 n_tg=16 n_seq=8
    [ "$depth" = 4096 ] && depth=256
    [ "$reps" = 3 ] && reps=1
    [ "$quiet_wait_set" = 1 ] || quiet_wait=0
    membw_args="-s 512 -r 2"
else
    n_pp=512 n_tg=128 n_seq=8
    membw_args="-s 2048 -r 5"
fi

cache=${BENCH_CACHE:-$HOME/.cache/mlxcel-bench}
models_dir=${MODELS:-$cache/models}
py=${PYTHON:-/usr/bin/python3}
phixtral_layers=${PHIXTRAL_LAYERS:-8}
gpt_oss_layers=${GPT_OSS_LAYERS:-4}
qwen3_moe_layers=${QWEN3_MOE_LAYERS:-6}
keep_float=${KEEP_FLOAT:-0}
NLC_VERSION=3.22.1

case "$(realpath -m "$cache")/" in
"$root"/*) die "BENCH_CACHE $cache is inside the repository; use a folder outside it" ;;
esac
case "$(realpath -m "$models_dir")/" in
"$root"/*) die "MODELS $models_dir is inside the repository; use a folder outside it" ;;
esac
mkdir -p "$cache" "$models_dir" "$out"
out=$(cd "$out" && pwd)

# ---- dependencies ----

# need CMD PACKAGE: install PACKAGE with apt-get when CMD is missing, or say what to do
apt_missing=""
need() { command -v "$1" >/dev/null 2>&1 || apt_missing="$apt_missing $2"; }
[ -n "${LLAMA_BUILD:-}" ] || need npm npm
need git git
need cmake cmake
need g++ build-essential
need gnuplot gnuplot-nox
need lscpu util-linux
"$py" -c 'import numpy' 2>/dev/null || apt_missing="$apt_missing python3-numpy"
if [ -n "$apt_missing" ]; then
    if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo=sudo; else
        die "missing Debian packages:$apt_missing (apt-get install them as root)"
    fi
    command -v apt-get >/dev/null || die "missing:$apt_missing, and no apt-get to install them"
    log "installing$apt_missing"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    # shellcheck disable=SC2086
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $apt_missing >&2
fi
"$py" -c 'import numpy' 2>/dev/null || die "$py cannot import numpy (PYTHON=a python3 with numpy)"

# ---- llama.cpp from the node-llama-cpp bundle ----

# host_id: CPU family, model and a checksum of the feature flags
host_id() {
    lscpu | awk -F: '/^CPU family/{f=$2} /^Model:/{m=$2} /^Flags/{fl=$2} END{gsub(/ /,"",f); gsub(/ /,"",m); print f, m, fl}' |
        { read -r f m fl; echo "family $f model $m flags $(echo "$fl" | cksum | cut -d' ' -f1)"; }
}

# Sets llama_src, llama_bin, llama_pkg (the npm package folder, may be empty).
prepare_llamacpp() {
    llama_pkg=
    if [ -n "${LLAMA_BUILD:-}" ]; then
        llama_bin=$LLAMA_BUILD/bin
        [ -f "$LLAMA_BUILD/CMakeCache.txt" ] || die "LLAMA_BUILD=$LLAMA_BUILD has no CMakeCache.txt"
        llama_src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$LLAMA_BUILD/CMakeCache.txt")
        for d in "$(dirname "$llama_src")/package" "$cache/node-llama-cpp-$NLC_VERSION/package"; do
            [ -f "$d/llama/llama.cpp.info.json" ] && { llama_pkg=$d; break; }
        done
    else
        local tgz=$cache/node-llama-cpp-$NLC_VERSION.tgz
        local pkgdir=$cache/node-llama-cpp-$NLC_VERSION
        llama_src=$cache/llama.cpp-src
        local build=$cache/llama.cpp-build isa_flags=(-DGGML_NATIVE=ON)
        if [ "$isa" = avx2 ]; then
            build=$cache/llama.cpp-build-avx2
            isa_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                       -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF)
        fi
        llama_bin=$build/bin
        if [ ! -f "$tgz" ]; then
            log "npm pack node-llama-cpp@$NLC_VERSION into $cache"
            (cd "$cache" && npm pack "node-llama-cpp@$NLC_VERSION" >"$cache/npm-pack.log" 2>&1) ||
                die "npm pack node-llama-cpp@$NLC_VERSION failed (network? registry?)"
        fi
        if [ ! -f "$pkgdir/package/llama/gitRelease.bundle" ]; then
            rm -rf "$pkgdir" && mkdir -p "$pkgdir"
            tar -xzf "$tgz" -C "$pkgdir" || die "cannot unpack $tgz"
        fi
        llama_pkg=$pkgdir/package
        [ -f "$llama_pkg/llama/gitRelease.bundle" ] || die "$tgz has no llama/gitRelease.bundle"
        if [ ! -f "$llama_src/CMakeLists.txt" ]; then
            rm -rf "$llama_src"
            git -c advice.detachedHead=false clone -q "$llama_pkg/llama/gitRelease.bundle" "$llama_src" ||
                die "cannot clone the llama.cpp source out of $llama_pkg/llama/gitRelease.bundle"
        fi
        # GGML_NATIVE binaries run only on the CPU they were built for: a cache moved to
        # another host kind (Zen 4 / Zen 5, with or without AVX-512) is rebuilt
        local stamp=$build/mlxcel-bench-host.txt host
        host=$(host_id)
        if [ -x "$llama_bin/llama-bench" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" != "$host" ]; then
            log "llama.cpp in $build was built on another CPU ($(cat "$stamp")); rebuilding"
            rm -rf "$build"
        fi
        if [ ! -x "$llama_bin/llama-bench" ] || [ ! -x "$llama_bin/llama-quantize" ]; then
            log "building llama-bench and llama-quantize in $build (nice; this takes a while)"
            nice -n 19 cmake -S "$llama_src" -B "$build" -DCMAKE_BUILD_TYPE=Release \
                "${isa_flags[@]}" -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
                >"$build.cmake.log" 2>&1 ||
                die "llama.cpp cmake failed, see $build.cmake.log"
            nice -n 19 cmake --build "$build" --target llama-bench llama-quantize -j "$(nproc)" \
                >"$build.log" 2>&1 ||
                die "llama.cpp build failed, see $build.log"
        fi
        [ -f "$stamp" ] || echo "$host" >"$stamp"
    fi
    [ -x "$llama_bin/llama-bench" ] || die "no llama-bench in $llama_bin"
    [ -x "$llama_bin/llama-quantize" ] || die "no llama-quantize in $llama_bin"
    [ -f "$llama_src/gguf-py/gguf/__init__.py" ] || die "no gguf-py in the llama.cpp source $llama_src"
}

# ---- mlxcel ----

prepare_mlxcel() {
    if [ -n "${MLXCEL:-}" ]; then
        mlxcel=$MLXCEL
    else
        log "building mlxcel (build/, Release)"
        if ! nice -n 19 cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null 2>&1; then
            "$root/scripts/install-deps.sh" || die "scripts/install-deps.sh failed"
            nice -n 19 cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null ||
                die "mlxcel cmake failed"
        fi
        nice -n 19 cmake --build "$root/build" --target mlxcel -j "$(nproc)" >/dev/null ||
            die "mlxcel build failed"
        mlxcel=$root/build/mlxcel
    fi
    [ -x "$mlxcel" ] || die "no mlxcel binary at $mlxcel"
    membw=$cache/membw  # -march=native: built on every run, for this CPU
    gcc -O2 -march=native -pthread -o "$membw" "$root/dev/membw.c" || die "cannot build dev/membw.c"
}

# ---- models ----

# shape_config SHAPE LAYERS: the config.json of one shape on stdout
shape_config() {
    case $1 in
    llama-1b) cat <<JSON
{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 8192,
  "num_hidden_layers": $2, "num_attention_heads": 32, "num_key_value_heads": 8,
  "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 8192,
  "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": true,
  "attention_bias": false, "mlp_bias": false, "initializer_range": 0.02,
  "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 0
}
JSON
    ;;
    phi-2) cat <<JSON
{
  "architectures": ["PhiForCausalLM"], "model_type": "phi",
  "vocab_size": 51200, "hidden_size": 2560, "intermediate_size": 10240,
  "num_hidden_layers": $2, "num_attention_heads": 32, "num_key_value_heads": 32,
  "partial_rotary_factor": 0.4, "hidden_act": "gelu_new", "max_position_embeddings": 8192,
  "layer_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false,
  "qk_layernorm": false, "initializer_range": 0.02,
  "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 0
}
JSON
    ;;
    phixtral) cat <<JSON
{
  "architectures": ["PhiForCausalLM"], "model_type": "phi-msft",
  "activation_function": "gelu_new", "n_embd": 2560, "n_head": 32, "n_head_kv": null,
  "n_inner": 10240, "n_layer": $2, "n_positions": 8192, "rotary_dim": 32,
  "vocab_size": 51200, "layer_norm_epsilon": 1e-05, "num_local_experts": 4,
  "num_experts_per_tok": 2, "tie_word_embeddings": false, "initializer_range": 0.02,
  "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 0
}
JSON
    ;;
    gpt-oss) cat <<JSON
{
  "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
  "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880,
  "num_hidden_layers": $2, "num_attention_heads": 64, "num_key_value_heads": 8,
  "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4,
  "hidden_act": "silu", "max_position_embeddings": 131072, "initial_context_length": 4096,
  "rms_norm_eps": 1e-05, "rope_theta": 150000.0,
  "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                   "original_max_position_embeddings": 4096, "truncate": false},
  "sliding_window": 128, "layer_types": [$(gpt_oss_layer_types "$2")],
  "attention_bias": true, "attention_dropout": 0.0, "swiglu_limit": 7.0,
  "router_aux_loss_coef": 0.9, "output_router_logits": false, "tie_word_embeddings": false,
  "initializer_range": 0.02, "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 0,
  "pad_token_id": 0
}
JSON
    ;;
    qwen3-moe) cat <<JSON
{
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
  "moe_intermediate_size": 768, "num_hidden_layers": $2, "num_attention_heads": 32,
  "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
  "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
  "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "attention_bias": false, "use_sliding_window": false,
  "sliding_window": null, "max_window_layers": $2, "output_router_logits": false,
  "router_aux_loss_coef": 0.001, "tie_word_embeddings": false, "initializer_range": 0.02,
  "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 0
}
JSON
    ;;
    esac
}

# gpt_oss_layer_types N: sliding, full, sliding, ... as JSON strings
gpt_oss_layer_types() {
    local i sep=""
    for ((i = 0; i < $1; i++)); do
        if [ $((i % 2)) = 0 ]; then printf '%s"sliding_attention"' "$sep"; else printf '%s"full_attention"' "$sep"; fi
        sep=", "
    done
}

# is_moe SHAPE: the issue-12 MoE shapes (pp and tg only, one width, float files deleted)
is_moe() { case $1 in gpt-oss|qwen3-moe) return 0 ;; esac; return 1; }

shape_layers() {
    if [ -n "$layers" ]; then echo "$layers"; return; fi
    case $1 in
    llama-1b) echo 16 ;; phi-2) echo 32 ;; phixtral) echo "$phixtral_layers" ;;
    gpt-oss) echo "$gpt_oss_layers" ;; qwen3-moe) echo "$qwen3_moe_layers" ;;
    esac
}

# model_name SHAPE: the folder / file stem, with -lN when the layer count is not the shape's own
model_name() {
    local n; n=$(shape_layers "$1")
    case $1:$n in
    llama-1b:16|phi-2:32|phixtral:32) echo "$1" ;;
    gpt-oss:24) echo gpt-oss-20b ;; gpt-oss:*) echo "gpt-oss-20b-l$n" ;;
    qwen3-moe:48) echo qwen3-30b-a3b ;; qwen3-moe:*) echo "qwen3-30b-a3b-l$n" ;;
    *) echo "$1-l$n" ;;
    esac
}

# synth NAME CONFIG [FLAGS]: one MLX folder, skipped when complete (config.json is written last)
synth() {
    local dir=$models_dir/$1 cfg=$2
    shift 2
    [ -f "$dir/config.json" ] && return 0
    rm -rf "$dir"
    log "mlxcel synth $dir $*"
    nice -n 19 "$mlxcel" synth --config "$cfg" -o "$dir" --seed 1 --tokenizer "$root/models/llama-tiny" \
        "$@" >/dev/null || die "mlxcel synth $dir failed"
}

# mlx_quantize NAME BITS: NAME-qBITS, from NAME-bf16 with `mlxcel convert` where that exists
# (the same bytes as `synth -q`, faster), else with synth (Phixtral: no bf16 folder needed)
mlx_quantize() {
    local dir=$models_dir/$1-q$2 src=$models_dir/$1-bf16
    [ -f "$dir/config.json" ] && return 0
    if [ -f "$src/config.json" ]; then
        rm -rf "$dir"
        log "mlxcel convert $src -> $dir"
        nice -n 19 "$mlxcel" convert -m "$src" -o "$dir" -q --q-bits "$2" --q-group-size 64 >/dev/null ||
            die "mlxcel convert $dir failed"
    else
        synth "$1-q$2" "$models_dir/configs/$1.json" -q --q-bits "$2" --q-group-size 64
    fi
}

# quantize GGUF_IN GGUF_OUT TYPE: --pure (every matrix at TYPE), except MXFP4_MOE, whose own
# rule is the point (experts MXFP4, every other matrix Q8_0; --pure would make them MXFP4 too)
quantize() {
    [ -f "$2" ] && return 0
    local pure=--pure
    [ "$3" = MXFP4_MOE ] && pure=
    log "llama-quantize $pure $1 $3"
    # shellcheck disable=SC2086
    nice -n 19 "$llama_bin/llama-quantize" $pure "$1" "$2.tmp" "$3" "$threads" \
        >"$2.log" 2>&1 || die "llama-quantize failed, see $2.log"
    mv "$2.tmp" "$2"
}

# prepare_moe SHAPE NAME CFG: the one width of a MoE shape. Disk: the bf16 folder and the F16
# GGUF are ~9 GB each at the default layer counts, so the GGUF comes first (bf16, F16, then the
# quantized GGUF; the float files deleted) and the MLX folder after it with `synth -q`, which
# writes the bytes `mlxcel convert -q` makes of the same bf16 folder (no bf16 on disk by then)
prepare_moe() {
    local shape=$1 name=$2 cfg=$3 bf16=$models_dir/$2-bf16 f16=$models_dir/gguf/$2-f16.gguf mdir ggq w
    w=$(widths_of "$shape")
    mdir=$models_dir/$name-$w
    ggq=$(gguf_of "$name" "$w")
    if [ ! -f "$ggq" ]; then
        if [ ! -f "$f16" ]; then
            synth "$name-bf16" "$cfg"
            log "hf2gguf.py $bf16 -> $f16"
            PYTHONPATH=$llama_src/gguf-py nice -n 19 "$py" "$root/scripts/hf2gguf.py" "$bf16" "$f16.tmp" ||
                die "hf2gguf.py failed"
            mv "$f16.tmp" "$f16"
        fi
        [ "$keep_float" = 1 ] || rm -rf "$bf16"
        if [ "$shape" = gpt-oss ]; then quantize "$f16" "$ggq" MXFP4_MOE; else quantize "$f16" "$ggq" Q4_0; fi
    fi
    if [ "$keep_float" != 1 ]; then rm -rf "$bf16"; rm -f "$f16"; fi
    if [ ! -f "$mdir/config.json" ]; then
        rm -rf "$mdir" "$mdir.tmp"
        if [ "$shape" = gpt-oss ]; then
            # the mlx-community layout: experts mxfp4, the rest 8-bit g64 (one synth -q each)
            local r=$models_dir/.$name-rest-q8 x=$models_dir/.$name-experts-mxfp4
            rm -rf "$r" "$x"
            synth ".$name-rest-q8" "$cfg" -q --q-bits 8 --q-group-size 64
            synth ".$name-experts-mxfp4" "$cfg" -q --q-mode mxfp4
            log "mlx-mixq.py -> $mdir"
            nice -n 19 "$py" "$root/scripts/mlx-mixq.py" "$r" "$x" "$mdir.tmp" || die "mlx-mixq.py failed"
            rm -rf "$r" "$x"
            mv "$mdir.tmp" "$mdir"
        else
            synth "$name-$w" "$cfg" -q --q-bits 4 --q-group-size 64
        fi
    fi
    log "$name bytes read per decoded token (dense tensors + LM head + k/n of the experts):"
    PYTHONPATH=$llama_src/gguf-py "$py" "$root/scripts/bench-report.py" --bpt "$mdir" "$ggq" >&2 ||
        die "bench-report.py --bpt failed"
}

# prepare_models SHAPE: the MLX folders and GGUF files of every selected width
prepare_models() {
    local shape=$1 name cfg width bf16 f16
    name=$(model_name "$shape")
    cfg=$models_dir/configs/$name.json
    mkdir -p "$models_dir/configs" "$models_dir/gguf"
    shape_config "$shape" "$(shape_layers "$shape")" >"$cfg.tmp" && mv "$cfg.tmp" "$cfg"
    if is_moe "$shape"; then prepare_moe "$shape" "$name" "$cfg"; return; fi
    f16=$models_dir/gguf/$name-f16.gguf
    if [ "$shape" = phixtral ]; then
        # llama.cpp has no phixtral: the phi2 proxy with both active experts as one dense MLP
        if [ ! -f "$f16" ]; then
            log "make-proxy-gguf.py phi2dense $f16"
            PYTHONPATH=$llama_src/gguf-py nice -n 19 "$py" "$root/scripts/make-proxy-gguf.py" \
                --variant phi2dense --n-layer "$(shape_layers "$shape")" --ctx 8192 --seed 1 -o "$f16.tmp" ||
                die "make-proxy-gguf.py failed"
            mv "$f16.tmp" "$f16"
        fi
    else
        bf16=$models_dir/$name-bf16
        synth "$name-bf16" "$cfg"
        if [ ! -f "$f16" ]; then
            log "hf2gguf.py $bf16 -> $f16"
            PYTHONPATH=$llama_src/gguf-py nice -n 19 "$py" "$root/scripts/hf2gguf.py" "$bf16" "$f16.tmp" ||
                die "hf2gguf.py failed"
            mv "$f16.tmp" "$f16"
        fi
    fi
    for width in $(widths_of "$shape"); do
        case $width in
        bf16) if [ "$shape" = phixtral ]; then synth "$name-bf16" "$cfg"; fi ;;
        q8) mlx_quantize "$name" 8
            quantize "$f16" "$models_dir/gguf/$name-q8_0.gguf" Q8_0 ;;
        q4) mlx_quantize "$name" 4
            quantize "$f16" "$models_dir/gguf/$name-q4_0.gguf" Q4_0 ;;
        esac
    done
}

# widths_of SHAPE: the selected widths this shape runs at
widths_of() {
    local w
    case $1 in gpt-oss) echo mxfp4; return ;; qwen3-moe) echo q4; return ;; esac
    for w in bf16 q8 q4; do
        case ",$widths_sel," in *",$w,"*) ;; *) continue ;; esac
        # Phixtral's targets are at 4 and 8 bits; its bf16 only when asked for alone
        [ "$1" = phixtral ] && [ "$w" = bf16 ] && [ "$widths_sel" != bf16 ] && continue
        echo "$w"
    done
}

gguf_of() {
    case $2 in bf16) echo "$models_dir/gguf/$1-f16.gguf" ;; q8) echo "$models_dir/gguf/$1-q8_0.gguf" ;;
    q4) echo "$models_dir/gguf/$1-q4_0.gguf" ;; mxfp4) echo "$models_dir/gguf/$1-mxfp4_moe.gguf" ;; esac
}

# ---- measuring ----

# drop FILE... from the page cache and read it back (docs/benchmarks.md, "Method")
refresh() {
    local f
    for f in "$@"; do
        "$py" -c 'import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)' "$f"
        cat "$f" >/dev/null
    done
}

# busy: "busy_jiffies steal_jiffies" of all CPUs so far
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8, $9; exit}' /proc/stat; }

# wait_quiet: up to $quiet_wait s for 20 s in a row of < 0.15 cores busy; sets quiet=1|0.
# After one wait in vain the machine is busy for good: later waits give up after 60 s.
busy_seen=0
wait_quiet() {
    local t0 ok=0 a b hz limit=$quiet_wait; hz=$(getconf CLK_TCK)
    quiet=0
    [ "$quiet_wait" -gt 0 ] || return 0
    [ "$busy_seen" = 1 ] && [ "$limit" -gt 60 ] && limit=60
    t0=$(date +%s)
    while [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
        a=$(busy); sleep 5; b=$(busy)
        if awk -v a="${a% *}" -v b="${b% *}" -v hz=$hz 'BEGIN{exit !((b-a)/hz/5 < 0.15)}'; then
            ok=$((ok + 1)); [ $ok -ge 4 ] && { quiet=1; return 0; }
        else
            ok=0
        fi
    done
    busy_seen=1
    log "machine not quiet after ${limit}s; running anyway (recorded as quiet=false)"
}

json_str() { printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g')"; }

# run ENGINE MODEL WIDTH PHASE KIND FILE... -- CMD...: one benchmark process, recorded in
# runs.jsonl with its raw JSON output in raw/ID.json; FILE... are refreshed in the page cache first.
# KIND: pp_tg, batched or depth.
run_id=0
run() {
    local engine=$1 model=$2 width=$3 phase=$4 kind=$5 files=() id t0 t1 l0 l1 b0 b1 rc
    shift 5
    while [ "$1" != -- ]; do files+=("$1"); shift; done
    shift
    run_id=$((run_id + 1)); id=$(printf 'r%03d' $run_id)
    wait_quiet
    refresh "${files[@]}"
    log "$id $engine $model $width $phase: $*"
    l0=$(cut -d' ' -f1-3 /proc/loadavg); b0=$(busy); t0=$(date -u +%FT%TZ)
    local s0 s1; s0=$(date +%s.%N)
    rc=0
    { TIMEFORMAT='%3U %3S'; time timeout 3600 "$@" >"$out/raw/$id.json" 2>"$out/raw/$id.err"; } \
        2>"$out/raw/$id.time" || rc=$?
    s1=$(date +%s.%N); b1=$(busy); t1=$(date -u +%FT%TZ); l1=$(cut -d' ' -f1-3 /proc/loadavg)
    [ $rc -eq 0 ] || log "$id failed (exit $rc): $(tail -3 "$out/raw/$id.err")"
    {
        printf '{"id":"%s","engine":"%s","model":"%s","width":"%s","phase":"%s","kind":"%s",' "$id" "$engine" "$model" "$width" "$phase" "$kind"
        printf '"files":['; local f sep=""
        for f in "${files[@]}"; do printf '%s%s' "$sep" "$(json_str "$f")"; sep=,; done
        printf '],"command":%s,"rc":%d,"start":"%s","end":"%s",' "$(json_str "$*")" $rc "$t0" "$t1"
        printf '"loadavg_before":"%s","loadavg_after":"%s","quiet_before":%s,' "$l0" "$l1" \
            "$([ "$quiet" = 1 ] && echo true || ([ "$quiet_wait" -gt 0 ] && echo false || echo null))"
        printf '"wall_s":%s,"busy_jiffies":%s,"steal_jiffies":%s,"cpu_s":"%s"}\n' \
            "$(awk -v a="$s0" -v b="$s1" 'BEGIN{printf "%.3f", b-a}')" \
            "$(( ${b1% *} - ${b0% *} ))" "$(( ${b1#* } - ${b0#* } ))" "$(tr -d '\n' <"$out/raw/$id.time")"
    } >>"$out/runs.jsonl"
}

membw_run() {
    local tag=$1
    log "membw $tag"
    "$membw" $membw_args >"$out/raw/membw-$tag.txt" 2>&1 || die "membw failed"
}

# mlxcel bench gained a depth option? (the name is looked up in its --help)
mlxcel_depth_flag() {
    local h; h=$("$mlxcel" bench --help 2>&1)
    case $h in
    *--n-depth*) echo --n-depth ;;
    *--depth*) echo --depth ;;
    esac
}

# ---- the matrix ----

shapes=()
IFS=, read -r -a want <<<"$models_sel"
for s in "${want[@]}"; do
    case $s in
    llama-1b|phi-2|phixtral|gpt-oss|qwen3-moe) shapes+=("$s") ;;
    *) die "unknown model '$s' (llama-1b, phi-2, phixtral, gpt-oss, qwen3-moe)" ;;
    esac
done
IFS=, read -r -a want <<<"$widths_sel"
for w in "${want[@]}"; do case $w in bf16|q8|q4) ;; *) die "unknown width '$w' (bf16, q8, q4)" ;; esac; done

log "cache $cache, models $models_dir, output $out"
prepare_llamacpp
prepare_mlxcel
for s in "${shapes[@]}"; do prepare_models "$s"; done
[ "$setup_only" = 1 ] && { log "setup done"; exit 0; }

rm -rf "$out/raw" "$out/runs.jsonl"
mkdir -p "$out/raw"
depth_flag=$(mlxcel_depth_flag)
[ -n "$depth_flag" ] || log "mlxcel bench has no depth option: its tg at depth $depth is not measured"

# meta.json: machine, builds, settings
{
    lscpu >"$out/raw/lscpu.txt"
    "$mlxcel" --version >"$out/raw/mlxcel-version.txt" 2>&1 || true
    "$llama_bin/llama-bench" --version >"$out/raw/llama-version.txt" 2>&1 || true
    lsc() { sed -n "s/^$1: *//p" "$out/raw/lscpu.txt" | head -1; }
    printf '{\n'
    printf '  "date_start": "%s",\n' "$(date -u +%FT%TZ)"
    printf '  "clk_tck": %d,\n' "$(getconf CLK_TCK)"
    printf '  "node_llama_cpp_tgz_sha256": %s,\n' "$(json_str "$(sha256sum "$cache/node-llama-cpp-$NLC_VERSION.tgz" 2>/dev/null | cut -d' ' -f1)")"
    printf '  "host": {"model_name": %s, "vendor": %s, "family": %s, "model": %s, "cpus": %s, "flags_simd": %s, "hypervisor": %s, "kernel": %s, "mem_total_kb": %s},\n' \
        "$(json_str "$(lsc 'Model name')")" "$(json_str "$(lsc 'Vendor ID')")" "$(json_str "$(lsc 'CPU family')")" \
        "$(json_str "$(lsc 'Model')")" "$(json_str "$(lsc 'CPU(s)')")" \
        "$(json_str "$(lsc Flags | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_bf16|avx_vnni|amx_[a-z0-9]*)$' | tr '\n' ' ' | sed 's/ $//')")" \
        "$(json_str "$(lsc 'Hypervisor vendor')")" "$(json_str "$(uname -r)")" \
        "$(awk '/MemTotal/{print $2}' /proc/meminfo)"
    printf '  "mlxcel": {"binary": %s, "commit": %s, "dirty": %s, "version": %s},\n' \
        "$(json_str "$mlxcel")" "$(json_str "$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)")" \
        "$( [ -n "$(git -C "$root" status --porcelain -- src CMakeLists.txt 2>/dev/null)" ] && echo true || echo false)" \
        "$(json_str "$(tr '\n' ' ' <"$out/raw/mlxcel-version.txt")")"
    tag=; [ -n "$llama_pkg" ] && tag=$(sed -n 's/.*"tag": *"\([^"]*\)".*/\1/p' "$llama_pkg/llama/llama.cpp.info.json")
    nlc=; [ -n "$llama_pkg" ] && nlc=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$llama_pkg/package.json" | head -1)
    repo=; [ -n "$llama_pkg" ] && repo=$(sed -n 's/.*"llamaCppGithubRepo": *"\([^"]*\)".*/\1/p' "$llama_pkg/llama/llama.cpp.info.json")
    printf '  "llamacpp": {"bin": %s, "source": %s, "repo": %s, "tag": %s, "commit": %s, "version": %s, "node_llama_cpp": %s, "patches_applied": false},\n' \
        "$(json_str "$llama_bin")" "$(json_str "$llama_src")" "$(json_str "$repo")" "$(json_str "$tag")" \
        "$(json_str "$(git -C "$llama_src" rev-parse HEAD 2>/dev/null || echo unknown)")" \
        "$(json_str "$(tr '\n' ' ' <"$out/raw/llama-version.txt")")" "$(json_str "$nlc")"
    printf '  "settings": {"threads": %d, "reps": %d, "n_prompt": %d, "n_gen": %d, "n_seq": %d, "depth": %d, "quick": %s, "mlxcel_depth_flag": %s, "quiet_wait_s": %d, "tests": %s, "mlxcel_fast": %s, "isa": %s}\n' \
        "$threads" "$reps" "$n_pp" "$n_tg" "$n_seq" "$depth" "$([ $quick = 1 ] && echo true || echo false)" \
        "$(json_str "$depth_flag")" "$quiet_wait" "$(json_str "$tests_sel")" \
        "$([ ${#mlx_flags[@]} -gt 0 ] && echo true || echo false)" "$(json_str "$isa")"
    printf '}\n'
} >"$out/meta.json"

membw_run before
for s in "${shapes[@]}"; do
    name=$(model_name "$s")
    for w in $(widths_of "$s"); do
        dir=$models_dir/$name-$w
        gguf=$(gguf_of "$name" "$w")
        for phase in A1 B A2; do
            if [ $phase = B ]; then
                want pp_tg && run llamacpp "$s" "$w" $phase pp_tg "$gguf" -- "$llama_bin/llama-bench" \
                    -m "$gguf" -p "$n_pp" -n "$n_tg" -r "$reps" -t "$threads" -o json
                is_moe "$s" && continue  # pp and tg only
                want depth && run llamacpp "$s" "$w" $phase depth "$gguf" -- "$llama_bin/llama-bench" \
                    -m "$gguf" -p 0 -n "$n_tg" -d "$depth" -r "$reps" -t "$threads" -o json
                continue
            fi
            want pp_tg && run mlxcel "$s" "$w" $phase pp_tg "$dir"/*.safetensors -- "$mlxcel" bench \
                -m "$dir" -p "$n_pp" -n "$n_tg" -r "$reps" -t "$threads" --json "${mlx_flags[@]}"
            is_moe "$s" && continue  # pp and tg only
            # -p 16: the warm-up then maps every expert's pages (docs/benchmarks.md, Results)
            want batched && run mlxcel "$s" "$w" $phase batched "$dir"/*.safetensors -- "$mlxcel" \
                bench -m "$dir" -p 16 -n "$n_tg" -s "$n_seq" -r "$reps" -t "$threads" --json "${mlx_flags[@]}"
            if want depth && [ -n "$depth_flag" ]; then
                run mlxcel "$s" "$w" $phase depth "$dir"/*.safetensors -- "$mlxcel" bench -m "$dir" \
                    -p 0 -n "$n_tg" "$depth_flag" "$depth" -r "$reps" -t "$threads" --json "${mlx_flags[@]}"
            fi
        done
    done
done
membw_run after
date -u +%FT%TZ >"$out/raw/date_end.txt"

PYTHONPATH=$llama_src/gguf-py "$py" "$root/scripts/bench-report.py" "$out" || die "bench-report.py failed"
log "wrote $out/results.json, $out/ratios.png, $out/table.md"
cat "$out/table.md"
