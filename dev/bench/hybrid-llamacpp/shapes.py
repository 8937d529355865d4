#!/usr/bin/env python3
"""shapes.py NAME LAYERS OUT.json: the config.json of one benchmark shape of run.sh.

NAME is one of:
  granite-h-tiny  IBM Granite-4.0-H-Tiny (granitemoehybrid, 7B total / ~1B active): hidden 1536,
                  40 layers (36 Mamba-2 of 48 heads x 64, state 128, 1 group, + 4 attention
                  layers of 12 / 4 heads at 5, 15, 25, 35), 64 experts of 512 top-6 + a shared
                  MLP of 1024, vocabulary 100352, tied, NoPE. The values of its published
                  config.json (huggingface.co/ibm-granite/granite-4.0-h-tiny), as quoted in
                  public code that reads it; llama.cpp's granitehybrid names the same widths
                  (hidden 1536 with expert FFN 512) 7B_A1B. The four Granite multipliers do not
                  change the cost.
  qwen3-next      Qwen3-Next-80B-A3B's shape (qwen3_next) scaled to fit: its widths (hidden
                  2048, gated attention of 16 / 2 heads of 256 with a quarter rotary, gated
                  DeltaNet of 16 key / 32 value heads of 128, conv 4, experts of 512 top-10 +
                  a shared expert of 512, vocabulary 151936, untied) and its 3:1 pattern (every
                  4th layer full attention), with 24 of its 48 layers and 64 of its 512 experts:
                  the active size per layer is the published one (10 experts + the shared one),
                  the total ~6.3B fits 4-bit in ~3.6 GB.
  llama-1b        an attention-only model of about the same active size: Llama-3.2-1B's shape
                  (16 x 2048, 32 / 8 heads of 64, FFN 8192, vocabulary 128256, tied).
  llama-8b        Llama-3.1-8B's shape (32 x 4096, 32 / 8 heads of 128, FFN 14336, vocabulary
                  128256, untied): the GPU runs' dense reference (issue 42's table).
  qwen3-30b-a3b   Qwen3-30B-A3B's shape (qwen3_moe: hidden 2048, 32 / 4 heads of 128 with
                  q/k norms, 128 experts of 768 top-8 normalized, vocabulary 151936, untied,
                  rope theta 1e6) with 12 of its 48 layers: every layer whole (all 128 experts,
                  so a prefill's tokens spread over the experts as in the real model), ~7.9B
                  parameters in all (4-bit ~4.4 GB); the time per layer is the real one, so
                  tokens/s are about 4x the full model's for both engines (issue 42's MoE row).
LAYERS cuts the shape to its first LAYERS layers (0: all), the layer pattern kept: the smoke
test's small models (widths unchanged).
"""
import json
import sys


def granite_h_tiny():
    lt = ["mamba"] * 40
    for i in (5, 15, 25, 35):
        lt[i] = "attention"
    return {
        "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
        "vocab_size": 100352, "hidden_size": 1536, "intermediate_size": 512,
        "shared_intermediate_size": 1024, "num_local_experts": 64, "num_experts_per_tok": 6,
        "num_hidden_layers": 40, "num_attention_heads": 12, "num_key_value_heads": 4,
        "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1,
        "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True,
        "mamba_proj_bias": False, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
        "position_embedding_type": "nope", "rope_theta": 10000.0, "embedding_multiplier": 12.0,
        "attention_multiplier": 0.0078125, "residual_multiplier": 0.22, "logits_scaling": 6.0,
        "hidden_act": "silu", "layer_types": lt, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "bos_token_id": 50256, "eos_token_id": 50256,
    }


def qwen3_next():
    L = 24
    return {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5120,
        "num_hidden_layers": L, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 64,
        "num_experts_per_tok": 10, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
        "full_attention_interval": 4,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)],
        "partial_rotary_factor": 0.25, "rope_theta": 10000000.0, "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-06, "hidden_act": "silu", "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645,
    }


def llama_1b():
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "hidden_act": "silu",
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
        "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
    }


def llama_8b():
    cfg = llama_1b()
    cfg.update(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, head_dim=128,
               tie_word_embeddings=False)
    return cfg


def qwen3_30b_a3b():
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_hidden_layers": 12, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "hidden_act": "silu", "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": False,
        "attention_bias": False, "torch_dtype": "bfloat16", "bos_token_id": 151643,
        "eos_token_id": 151645,
    }


SHAPES = {"granite-h-tiny": granite_h_tiny, "qwen3-next": qwen3_next, "llama-1b": llama_1b,
          "llama-8b": llama_8b, "qwen3-30b-a3b": qwen3_30b_a3b}


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in SHAPES:
        sys.exit(f"usage: shapes.py {'|'.join(SHAPES)} LAYERS OUT.json")
    cfg = SHAPES[sys.argv[1]]()
    n = int(sys.argv[2])
    if n < 0:
        sys.exit("shapes.py: LAYERS must be >= 0")
    if 0 < n < cfg["num_hidden_layers"]:
        cfg["num_hidden_layers"] = n
        if "layer_types" in cfg:
            cfg["layer_types"] = cfg["layer_types"][:n]
    with open(sys.argv[3], "w") as f:
        json.dump(cfg, f, indent=1)


if __name__ == "__main__":
    main()
