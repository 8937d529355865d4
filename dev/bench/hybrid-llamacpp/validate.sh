#!/bin/bash
# validate.sh: hf2gguf's hybrid twins checked against mlxcel on small random shapes (issue 41).
# For each small config below: `mlxcel synth` bf16, every matrix x8 (scale.py: random layers
# that move the logits), then hf2gguf F32 (no rounding) and F16 GGUFs; greedy ids of the same
# 16-token prompt from `mlxcel generate --temp 0 --ignore-eos` and from llgreedy (libllama,
# argmax) must agree for 24 tokens on the F32 twin, and the prompt's mean NLL (mlxcel
# perplexity against llgreedy's) is printed beside; then hf2gguf --outtype q4_0 must equal
# llama-quantize --pure Q4_0 of the F16 file, tensor for tensor (cmpgguf.py).
# Usage: LLAMA_BUILD=... dev/bench/hybrid-llamacpp/validate.sh [WORKDIR]   (MLXCEL, PYTHON,
# BENCH_CACHE as run.sh). Exit status 0 when every check passed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
cache=${BENCH_CACHE:-$HOME/.cache/mlxcel-bench}
build=${LLAMA_BUILD:-$cache/llama.cpp-build}
mlxcel=${MLXCEL:-$root/build/mlxcel}
py=${PYTHON:-/usr/bin/python3}
w=${1:-/tmp/hybrid-validate}
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
[ -n "$src" ] || src=$cache/llama.cpp-src
export PYTHONPATH=$src/gguf-py
mkdir -p "$w"
cc -O2 -o "$w/llgreedy" "$here/llgreedy.c" -I"$src/include" -I"$src/ggml/include" -L"$build/bin" \
    -lllama -lggml -lggml-base -lm -Wl,-rpath,"$build/bin"

# the small configs: granitemoehybrid MoE (NoPE; rope with attention first), dense, and qwen3_next
"$py" - "$w" <<'PY'
import json, sys
w = sys.argv[1]
g = {"architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "vocab_size": 2048,
     "hidden_size": 64, "intermediate_size": 32, "shared_intermediate_size": 64, "num_local_experts": 4,
     "num_experts_per_tok": 2, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
     "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_n_groups": 1, "mamba_d_conv": 4,
     "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False,
     "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "position_embedding_type": "nope",
     "rope_theta": 10000.0, "embedding_multiplier": 1.0, "attention_multiplier": 0.0078125,
     "residual_multiplier": 1.0, "logits_scaling": 1.0, "hidden_act": "silu",
     "layer_types": ["mamba", "attention", "mamba", "mamba"], "tie_word_embeddings": False,
     "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
cfgs = {"gmh-moe": g,
        "gmh-rope": dict(g, position_embedding_type="rope", layer_types=["attention", "mamba", "mamba", "attention"]),
        "gmh-dense": dict(g, num_local_experts=0, num_experts_per_tok=0, intermediate_size=64, tie_word_embeddings=True,
                          embedding_multiplier=12.0, residual_multiplier=0.22, logits_scaling=6.0),
        "q3n": {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "vocab_size": 2048,
                "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
                "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1, "mlp_only_layers": [],
                "norm_topk_prob": True, "full_attention_interval": 4,
                "layer_types": ["linear_attention"] * 3 + ["full_attention"], "partial_rotary_factor": 0.25,
                "rope_theta": 10000000.0, "max_position_embeddings": 4096, "rms_norm_eps": 1e-06,
                "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                "bos_token_id": 1, "eos_token_id": 2}}
for k, c in cfgs.items():
    json.dump(c, open(f"{w}/{k}.json", "w"))
PY
ids="1 400 52 910 33 1200 7 88 640 1500 23 301 977 14 5 1800"
csv=${ids// /,}
echo "[$csv]" >"$w/ids.json"
fail=0
for m in gmh-moe gmh-rope gmh-dense q3n; do
    rm -rf "${w:?}/$m"
    "$mlxcel" synth -c "$w/$m.json" -o "$w/$m" --seed 3 --tokenizer "$root/models/llama-tiny" -t 1 >/dev/null
    "$py" "$here/scale.py" "$w/$m" 8
    for t in f32 f16 q4_0; do "$py" "$root/scripts/hf2gguf.py" --outtype $t "$w/$m" "$w/$m-$t.gguf" 2>/dev/null; done
    "$build/bin/llama-quantize" --pure "$w/$m-f16.gguf" "$w/$m-q4q.gguf" Q4_0 1 >/dev/null 2>&1
    a=$("$mlxcel" generate -m "$w/$m" --prompt-ids "$csv" -n 24 --temp 0 --ignore-eos --output-ids -t 1 2>/dev/null | tail -1)
    nll_a=$("$mlxcel" perplexity -m "$w/$m" --ids-file "$w/ids.json" --json -t 1 2>/dev/null |
        "$py" -c 'import json,sys; print("%.6f" % json.load(sys.stdin)["nll"])')
    b=$("$w/llgreedy" "$w/$m-f32.gguf" 24 $ids)
    b16=$("$w/llgreedy" "$w/$m-f16.gguf" 24 $ids)
    same=$("$py" -c 'import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); n=next((i for i,(x,y) in enumerate(zip(a,b)) if x!=y), len(a)); print(n)' "$a" "$(head -1 <<<"$b")")
    same16=$("$py" -c 'import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); n=next((i for i,(x,y) in enumerate(zip(a,b)) if x!=y), len(a)); print(n)' "$a" "$(head -1 <<<"$b16")")
    q=$("$py" "$here/cmpgguf.py" "$w/$m-q4_0.gguf" "$w/$m-q4q.gguf" | tail -1) || true
    echo "$m: greedy ids equal for $same/24 (F32 twin), $same16/24 (F16 twin); prompt NLL mlxcel $nll_a," \
         "llama.cpp F32 $(tail -1 <<<"$b" | cut -d' ' -f2), F16 $(tail -1 <<<"$b16" | cut -d' ' -f2);" \
         "q4_0 against llama-quantize: $q"
    [ "$same" = 24 ] && [[ $q == *", 0 differ" ]] || fail=1
done
exit $fail
