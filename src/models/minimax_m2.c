/*
 * minimax_m2: MiniMaxM2ForCausalLM (MiniMax-M2, M2.1). The Mixtral block with
 * OLMo-2-style q/k norms, partial rotary and a sigmoid router with a correction bias:
 *
 *   block(x) = x + attn(rms(x)); x + moe(rms(x))      pre-norm, RMSNorm (rms_norm_eps 1e-6)
 *   attn     q/k/v/o without biases; RMSNorm over the whole q projection (n_head * head_dim)
 *            and the whole k projection (n_kv_head * head_dim) before the head split
 *            (FlexOlmoAttention); rotate-half RoPE on the first head_dim * partial_rotary_factor
 *            (1.0) dims of each head (rope_theta 5e6); scale head_dim^-0.5; head_dim 128;
 *            every layer full attention (no sliding window, whatever the config says)
 *   moe      every layer: num_local_experts (256) SwiGLU experts of intermediate_size (1536),
 *            num_experts_per_tok (8) of them; scores = sigmoid(gate x), the choice on score +
 *            e_score_correction_bias (F32), weights the chosen scores / their sum; no shared
 *            expert. That is DeepSeek-V3's ROUTER_GROUP_SIGMOID with one group and scale 1
 *            (its + 1e-20 on the sum aside).
 *
 * partial_rotary_factor is read from rope_parameters or the top level (transformers 5 moves
 * it there). Published configs also state `rotary_dim`, which transformers does not read: it
 * must agree with head_dim * partial_rotary_factor, else the config is refused (it would
 * mean a rotation transformers does not apply). The other fields of MiniMax's own config
 * (use_qk_norm, qk_norm_type, scoring_func, use_routing_bias) are not read by transformers,
 * whose model always has them as above; router_jitter_noise acts in training only.
 *
 * Checkpoint names (model.layers.N.): self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm
 * ([n_head * head_dim], [n_kv_head * head_dim]), block_sparse_moe.gate,
 * block_sparse_moe.e_score_correction_bias, block_sparse_moe.experts.E.{w1,w2,w3} or mlx-lm's
 * stacked block_sparse_moe.switch_mlp.{gate,down,up}_proj.
 */
#include "blocks.h"
#include "hf_common.h"
#include "../loading/config.h"

/* transformers MiniMaxM2Config defaults of the Llama-style fields */
static const struct hf_defaults minimax_m2_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 5e6f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 128, .sliding = false, .tie_embd = false,
};

/* rope_parameters.partial_rotary_factor over the top-level field (already read), and the
 * published rotary_dim checked against the result */
static int minimax_m2_rotary(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    float partial;
    int rc, rotary_dim;
    if (rp && cJSON_IsObject(rp) && cfg_has(rp, "partial_rotary_factor")) {
        if ((rc = cfg_opt_float(rp, "partial_rotary_factor", 1.0f, &partial, e)) < 0)
            return err_prefix(e, "rope_parameters");
        if (!(partial > 0.0f && partial <= 1.0f))
            return err_setf(e, ERR_CONFIG, "config field 'rope_parameters.partial_rotary_factor' = "
                            "%g must be in (0, 1]", (double)partial);
        hp->n_rot = (int)((double)hp->head_dim * partial);
    }
    if (!cfg_has(cfg, "rotary_dim"))
        return 0;
    if ((rc = cfg_int(cfg, "rotary_dim", &rotary_dim, e)) < 0)
        return rc;
    if (rotary_dim != hp->n_rot)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'rotary_dim' = %d disagrees with head_dim "
                        "%d x partial_rotary_factor (%d rotated dims, what transformers applies)",
                        rotary_dim, hp->head_dim, hp->n_rot);
    return 0;
}

static int minimax_m2_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    if ((rc = hf_parse_decoder(hp, cfg, &minimax_m2_defaults, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_key_value_heads", 8, &hp->n_kv_head, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_local_experts", 256, &hp->n_expert, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_experts_per_tok", 8, &hp->n_expert_used, e)) < 0 ||
        (rc = minimax_m2_rotary(hp, cfg, e)) < 0)
        return rc;
    if ((rc = hparams_check_dim(hp->n_expert, "num_local_experts", 1, HP_MAX_EXPERTS, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_expert_used, "num_experts_per_tok", 1, hp->n_expert, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_layer, "num_hidden_layers", 1, HP_MAX_LAYERS, e)) < 0)
        return rc;
    /* MiniMaxM2Attention builds its projections without biases whatever attention_bias says */
    hp->qkv_bias = hp->out_bias = false;
    hp->qk_norm = hp->qk_norm_full = true;
    hp->router = ROUTER_GROUP_SIGMOID;
    hp->router_bias = true;
    hp->moe_n_group = hp->moe_topk_group = 1;
    hp->moe_norm = true;
    hp->moe_scale = 1.0f;
    hparams_fill_layers(hp);
    return 0;
}

static const struct hf_moe_names minimax_m2_names = {
    "model.layers.%d.block_sparse_moe.gate", hf_moe_stacking, NULL, NULL,
    "model.layers.%d.block_sparse_moe.e_score_correction_bias",
};

static int minimax_m2_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    return hf_map_decoder_moe(m, st, &minimax_m2_names, e);
}

static const char *const minimax_m2_archs[] = {"MiniMaxM2ForCausalLM", NULL};

const struct model_ops minimax_m2_ops = {
    .family = "minimax_m2",
    .description = "MiniMax-M2: full-width q/k RMSNorm, partial rotary + sigmoid-routed experts "
                   "with a correction bias",
    .architectures = minimax_m2_archs,
    .parse_config = minimax_m2_parse_config,
    .map_weights = minimax_m2_map_weights,
    .forward = decoder_forward,
    .expert_stacking = hf_moe_stacking,
};
