#!/bin/bash
# gpu-loop.sh: the GPU loop of issue 42 in one script. GPU time is scarce, so the
# binaries are built on the development machine and one call on the GPU machine runs
# the gate, the sanitizer and the benchmarks together.
#
#   scripts/gpu-loop.sh pack [DIR]    on the development machine: build Release with the
#                                     CUDA plugin and copy mlxcel, run_tests, the plugin,
#                                     dev/kernels/bench_cuda_linear and
#                                     every shared library they need that is not glibc's
#                                     or the driver's into DIR (default .gpu, ignored by git);
#                                     with BASE_PLUGIN=FILE, a baseline plugin (an older
#                                     build) that bench runs around the new one, A/B/A;
#                                     all of it as DIR/pack.tar.xz (carry DIR)
#   scripts/gpu-loop.sh gate [DIR]    on the GPU machine: the `cuda` CTest gate
#                                     (MLXCEL_DEVICE=cuda run_tests golden batch models quant cuda embed vision qwen_vl llava idefics3 mistral3 lora
#                                     embed_dec mtp tp: the suites of CTest's cuda_golden)
#   scripts/gpu-loop.sh sanitize [DIR] compute-sanitizer memcheck on a dense, a MoE and an
#                                     MLA golden
#   scripts/gpu-loop.sh bench [DIR]   random-weight models (mlxcel synth, Llama-3.2-1B and
#                                     Llama-3.1-8B proportions, the hybrids Nemotron-H-8B and
#                                     Qwen3-Next (32 experts), 4-bit g64) and mlxcel bench
#                                     on them (BENCH_MODELS, BENCH_ARGS to choose; -p/-n take
#                                     one value each)
#   scripts/gpu-loop.sh all [DIR]     gate, sanitize and bench, stopping at the first failure
#
# Output: gpu.txt, gate.log, sanitize-*.log and bench.log under $OUT when set (the device
# tool's folder), else DIR/out. Everything else the script writes lives under DIR or /tmp.
set -euo pipefail

cmd=${1:-}
dir=${2:-.gpu}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$dir/out}

usage() {
    awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"
    exit 2
}

pack() {
    cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DMLXCEL_CUDA=ON >/dev/null
    cmake --build "$root/build" -j "$(nproc)" --target mlxcel run_tests mlxcel-cuda >/dev/null
    rm -rf "$dir"
    mkdir -p "$dir/bin" "$dir/lib"
    cp "$root/build/mlxcel" "$root/build/run_tests" "$root/build/libmlxcel-cuda.so" "$dir/bin/"
    # the GEMV microbenchmark (dev/kernels/bench_cuda_linear.c) for the lease's `lin` step
    gcc -std=c11 -O2 -D_GNU_SOURCE -I"$root/src" "$root/dev/kernels/bench_cuda_linear.c" \
        "$root/build/libmlxcel_lib.a" -o "$dir/bin/bench_cuda_linear" -lm -lpthread -ldl
    if [ -n "${BASE_PLUGIN:-}" ]; then
        mkdir -p "$dir/bin/base"
        cp "$BASE_PLUGIN" "$dir/bin/base/libmlxcel-cuda.so"
    fi
    # the libraries the GPU machine's image may lack: all but glibc's, the C++ runtime's,
    # the driver's and CUDA's own (the image has CUDA 13)
    ldd "$dir"/bin/mlxcel "$dir"/bin/run_tests "$dir"/bin/libmlxcel-cuda.so | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
        case $(basename "$lib") in
        libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | \
            libstdc++* | libgcc_s* | libcuda.so* | libcublas* | libcudart*) ;;
        *) cp -L "$lib" "$dir/lib/" ;;
        esac
    done
    # the tree and what is carried travel together within 64 MiB: send one xz archive
    tar -C "$dir" -cJf "$root/$dir.tar.xz" .
    rm -rf "$dir"
    mkdir -p "$dir"
    mv "$root/$dir.tar.xz" "$dir/pack.tar.xz"
    du -sh "$dir/pack.tar.xz"
}

env_there() {
    [ -x "$dir/bin/mlxcel" ] || tar -C "$dir" -xJf "$dir/pack.tar.xz"
    export LD_LIBRARY_PATH="$root/$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export MLXCEL_CUDA_PLUGIN="${GATE_PLUGIN:-$root/$dir/bin/libmlxcel-cuda.so}"  # GATE_PLUGIN: another build's
    export MLXCEL_BIN="$root/$dir/bin/mlxcel"   # the suites that run the CLI (models)
    # the golden folders travel as .tar.xz; a warm machine may keep folders of an earlier call
    # with files missing (the copy of the tree replaces what it carries), so unpack afresh, unless
    # the caller just did (FIXTURES_FRESH=1: dev/gpu/lease.sh, whose other steps may be reading them)
    if [ "${FIXTURES_FRESH:-0}" != 1 ]; then
        rm -rf "$root"/tests/fixtures/golden/*/ "$root"/tests/fixtures/models/*/ "$root"/tests/fixtures/tokenizers/*/ \
            "$root"/tests/fixtures/quant/*/
        sh "$root/scripts/fixtures.sh" unpack
    fi
    sh "$root/scripts/fixtures.sh" derive "$dir/bin/mlxcel"
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader \
        | tee "$out/gpu.txt"
}

gate() {
    env_there
    cd "$root"
    MLXCEL_DEVICE=cuda "$dir/bin/run_tests" golden batch models quant cuda embed vision qwen_vl llava idefics3 mistral3 lora embed_dec mtp tp 2>&1 | tee "$out/gate.log" |
        grep -E "PASSED|FAILED|ERROR|golden kv|max rel|worst|skipped" || true
    grep -q "FAILED" "$out/gate.log" && { echo "gate: FAILED" >&2; return 1; }
    grep -q "PASSED" "$out/gate.log" || { echo "gate: no PASSED line" >&2; return 1; }
    echo "gate: ok"
}

sanitize() {
    env_there
    cd "$root"
    local rc=0
    for c in golden_llama golden_qwen3_moe_mlx_q4 golden_deepseek_v2; do
        if MLXCEL_DEVICE=cuda compute-sanitizer --tool memcheck --error-exitcode 9 \
            "$dir/bin/run_tests" "$c" >"$out/sanitize-$c.log" 2>&1; then
            echo "sanitize $c: $(grep -h 'ERROR SUMMARY' "$out/sanitize-$c.log" | tail -1)"
        else
            echo "sanitize $c: FAILED (tail of the log follows)"
            tail -20 "$out/sanitize-$c.log"
            rc=1
        fi
    done
    return $rc
}

# A config of Llama proportions: name layers hidden ff heads kv_heads vocab
llama_config() {
    cat <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": $7,
 "hidden_size": $3, "intermediate_size": $4, "num_hidden_layers": $2,
 "num_attention_heads": $5, "num_key_value_heads": $6, "head_dim": $(($3 / $5)),
 "hidden_act": "silu", "max_position_embeddings": 16384, "rms_norm_eps": 1e-05,
 "rope_theta": 500000.0, "tie_word_embeddings": $([ "$3" -lt 4096 ] && echo true || echo false),
 "attention_bias": false, "mlp_bias": false, "initializer_range": 0.02,
 "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 0}
JSON
}

# Nemotron-H-8B proportions (nvidia/Nemotron-H-8B-Base-8K): 52 layers in 26 (mixer, relu² MLP)
# pairs, the mixer Mamba-2 (128 heads of 64, state 128, 8 groups) except 4 attention layers
nemotron_h_8b_config() {
    local types="" i
    for i in $(seq 0 25); do
        case $i in 4 | 10 | 16 | 22) types="$types\"full_attention\", " ;; *) types="$types\"linear_attention\", " ;; esac
        types="$types\"mlp\""
        [ "$i" -lt 25 ] && types="$types, "
    done
    cat <<JSON
{"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": 131072,
 "hidden_size": 4096, "intermediate_size": 21504, "num_hidden_layers": 52,
 "layers_block_type": [$types], "num_attention_heads": 32, "num_key_value_heads": 8,
 "head_dim": 128, "mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128,
 "n_groups": 8, "conv_kernel": 4, "expand": 2, "chunk_size": 128, "mlp_hidden_act": "relu2",
 "max_position_embeddings": 16384, "layer_norm_epsilon": 1e-05, "tie_word_embeddings": false,
 "use_conv_bias": true, "use_bias": false, "mamba_proj_bias": false,
 "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
JSON
}

# Qwen3-Next-80B-A3B proportions with 32 of its 512 experts (the active path is the published
# one: 10 routed + 1 shared of 512, 36 gated-DeltaNet and 12 attention layers of 2048)
qwen3_next_config() {
    cat <<JSON
{"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "vocab_size": 151936,
 "hidden_size": 2048, "intermediate_size": 5120, "num_hidden_layers": 48,
 "full_attention_interval": 4, "num_attention_heads": 16, "num_key_value_heads": 2,
 "head_dim": 256, "partial_rotary_factor": 0.25, "rope_theta": 10000000.0,
 "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
 "linear_num_value_heads": 32, "linear_value_head_dim": 128, "num_experts": 32,
 "num_experts_per_tok": 10, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
 "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
 "max_position_embeddings": 16384, "rms_norm_eps": 1e-06, "tie_word_embeddings": false,
 "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
JSON
}

bench() {
    env_there
    cd "$root"
    local models=${BENCH_MODELS:-llama-1b-q4}
    local args=${BENCH_ARGS:--p 512 -n 128 -r 3}
    local m=/tmp/gpu-models
    mkdir -p "$m"
    for name in ${models//,/ }; do
        local base=${name%-q4} q=
        [ "$base" != "$name" ] && q=-q
        if [ ! -f "$m/$name/config.json" ]; then
            case $base in
            llama-1b) llama_config llama-1b 16 2048 8192 32 8 128256 >"$m/$base.json" ;;
            llama-8b) llama_config llama-8b 32 4096 14336 32 8 128256 >"$m/$base.json" ;;
            nemotron-h-8b) nemotron_h_8b_config >"$m/$base.json" ;;
            qwen3-next) qwen3_next_config >"$m/$base.json" ;;
            *) echo "bench: unknown model $name" >&2; return 2 ;;
            esac
            local t0=$SECONDS
            "$dir/bin/mlxcel" synth --config "$m/$base.json" -o "$m/$name" $q >/dev/null
            echo "synth $name: $((SECONDS - t0)) s"
        fi
        local plugins="$dir/bin/libmlxcel-cuda.so"
        [ -f "$dir/bin/base/libmlxcel-cuda.so" ] &&
            plugins="$dir/bin/base/libmlxcel-cuda.so $plugins $dir/bin/base/libmlxcel-cuda.so"
        for p in $plugins; do
            echo "== $name, plugin $p" | tee -a "$out/bench.log"
            # shellcheck disable=SC2086
            MLXCEL_CUDA_PLUGIN="$root/$p" "$dir/bin/mlxcel" bench -m "$m/$name" --device cuda $args \
                2>&1 | grep -v '^peak RSS' | tee -a "$out/bench.log"
        done
    done
}

case $cmd in
pack) pack ;;
gate) gate ;;
sanitize) sanitize ;;
bench) bench ;;
all) gate && sanitize && bench ;;
*) usage ;;
esac
