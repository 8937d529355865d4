/*
 * phi3: Phi3ForCausalLM (Phi-3, Phi-3.5-mini, Phi-4-mini). The Llama block
 * with fused projections: self_attn.qkv_proj [(H + 2 KV) * hd, d] and
 * mlp.gate_up_proj [2 n_ff, d] (gate rows first). rope_scaling "longrope"
 * switches from short to long factors once the sequence passes
 * original_max_position_embeddings and scales cos/sin by the attention factor,
 * as transformers does (blocks.c / hf_common.c).
 */
#include "blocks.h"
#include "hf_common.h"


/* transformers Phi3Config defaults */
static const struct hf_defaults phi3_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = true, .tie_embd = false,
};

static int phi3_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc = hf_parse_decoder(hp, cfg, &phi3_defaults, e);
    hp->qkv_bias = hp->out_bias = false;  /* Phi-3 projections carry no biases */
    return rc < 0 ? rc : hf_finish_layers(hp, cfg, &phi3_defaults, 0, e);
}

/* Published Phi-3 checkpoints fuse q/k/v and gate/up (synth writes that layout). */
static const char *const phi3_fused[] = {".self_attn.qkv_proj.weight", ".mlp.gate_up_proj.weight", NULL};

static const char *const phi3_archs[] = {"Phi3ForCausalLM", NULL};

const struct model_ops phi3_ops = {
    .family = "phi3",
    .description = "Phi-3 / Phi-3.5 / Phi-4-mini: fused qkv and gate_up, longrope scaling",
    .architectures = phi3_archs,
    .parse_config = phi3_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
    .synth_prefer = phi3_fused,
};
