#!/bin/sh
# make-bench-models.sh OUTDIR: build mlxcel and write the random-weight
# benchmark models of docs/benchmarks.md into OUTDIR with `mlxcel synth`
# (keep OUTDIR outside the repository; /work/bench-models is the usual place):
#
#   OUTDIR/llama-1b          Llama-3.2-1B proportions (hidden 2048, 16 layers,
#                            32 heads / 8 kv heads, ff 8192, tied head) with a
#                            32000 vocab: 1.1B params, 2.1 GB bf16
#   OUTDIR/phixtral-4x2_8-l8 mlabonne/phixtral-4x2_8 widths (n_embd 2560,
#                            32 heads, rotary_dim 32, n_inner 10240, 4 experts,
#                            top-2, vocab 51200) with 8 layers instead of 32:
#                            2.1B params, 4.3 GB bf16
#   OUTDIR/<name>-q4         the same, MLX 4-bit (group 64, experts stacked)
#
# A folder that already has config.json (written last) is complete and is
# skipped; FORCE=1 regenerates. BUILD_DIR (default build) is the CMake tree.
# The tokenizer of models/llama-tiny is copied in so `generate` runs too
# (its 2048 ids fit both vocabularies; the text is noise, the weights random).
# Any other shape: write its config.json and run
#   mlxcel synth --config CONFIG.json -o DIR [-q] [--seed N] [--tokenizer DIR]
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
cmake --build "$build" --target mlxcel -j2 >/dev/null
mkdir -p "$out/configs"

cat >"$out/configs/llama-1b.json" <<'JSON'
{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 8192,
  "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
  "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 2048,
  "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": true,
  "attention_bias": false, "mlp_bias": false, "initializer_range": 0.02,
  "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 0
}
JSON
cat >"$out/configs/phixtral-4x2_8-l8.json" <<'JSON'
{
  "architectures": ["PhiForCausalLM"], "model_type": "phi-msft",
  "activation_function": "gelu_new", "n_embd": 2560, "n_head": 32, "n_head_kv": null,
  "n_inner": 10240, "n_layer": 8, "n_positions": 2048, "rotary_dim": 32,
  "vocab_size": 51200, "layer_norm_epsilon": 1e-05, "num_local_experts": 4,
  "num_experts_per_tok": 2, "tie_word_embeddings": false, "initializer_range": 0.02,
  "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 0
}
JSON

# gen NAME CONFIG [SYNTH FLAGS...]: one model folder, skipped when complete
gen() {
    name=$1
    cfg=$2
    shift 2
    dir=$out/$name
    if [ -f "$dir/config.json" ] && [ "$force" != 1 ]; then
        echo "$dir: present (FORCE=1 regenerates)"
        return
    fi
    rm -rf "$dir"
    echo "$dir: generating"
    "$build/mlxcel" synth --config "$cfg" -o "$dir" --seed 1 --tokenizer "$root/models/llama-tiny" "$@"
    printf '{\n  "bos_token_id": 0,\n  "eos_token_id": 0,\n  "do_sample": false\n}\n' \
        >"$dir/generation_config.json"
}

gen llama-1b "$out/configs/llama-1b.json"
gen phixtral-4x2_8-l8 "$out/configs/phixtral-4x2_8-l8.json"
gen llama-1b-q4 "$out/configs/llama-1b.json" -q
gen phixtral-4x2_8-l8-q4 "$out/configs/phixtral-4x2_8-l8.json" -q

du -sh "$out"/*
