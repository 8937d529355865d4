/*
 * deepseek_v3: DeepseekV3ForCausalLM (also the architecture of DeepSeek-R1, Kimi K2 and
 * others). The DeepSeek-V2 block of deepseek_v2.c (multi-head latent attention with the
 * latent KV cache, dense layers before first_k_dense_replace, routed + shared experts) with
 * V3's router (noaux_tc):
 *
 *   scores = sigmoid(mlp.gate x)                              [n_routed_experts], f32
 *   choice = scores + mlp.gate.e_score_correction_bias        (F32; for the choice only)
 *   groups = n_group equal groups ranked by the sum of their top-2 choice scores; only the
 *            topk_group best stay eligible (the others' choice scores become 0)
 *   top-k  = num_experts_per_tok highest choice scores
 *   weight = scores of those (/ their sum + 1e-20 with norm_topk_prob, default true)
 *            x routed_scaling_factor (default 2.5)
 *
 * and rope_interleave (default true, absent from published configs): transformers
 * de-interleaves q_pe / k_pe before a rotate-half rope, which pairs dims (2j, 2j + 1), a
 * permutation of the interleaved-pair rope applied to q and k alike; false: rotate-half.
 */
#include "blocks.h"
#include "deepseek.h"
#include "hf_common.h"

static int deepseek_v3_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    return deepseek_parse_config(hp, cfg, DEEPSEEK_V3, e);
}

/* mlx-lm's deepseek_v2 keeps kv_b_proj; its deepseek_v3 splits it (deepseek.h). */
void deepseek_convert_views(const struct hparams *hp, struct ck_view_rule *out)
{
    out[0] = (struct ck_view_rule){"model.layers.%d.self_attn.kv_b_proj.weight",
                                   "model.layers.%d.self_attn.embed_q.weight", CK_VIEW_HEAD_K_T,
                                   hp->qk_nope_dim, hp->v_head_dim};
    out[1] = (struct ck_view_rule){"model.layers.%d.self_attn.kv_b_proj.weight",
                                   "model.layers.%d.self_attn.unembed_out.weight", CK_VIEW_HEAD_V,
                                   hp->qk_nope_dim, hp->v_head_dim};
    out[2] = (struct ck_view_rule){NULL, NULL, CK_VIEW_NONE, 0, 0};
}

static const char *const deepseek_v3_archs[] = {"DeepseekV3ForCausalLM", NULL};

const struct model_ops deepseek_v3_ops = {
    .family = "deepseek_v3",
    .description = "DeepSeek-V3 / R1: multi-head latent attention (latent KV cache), sigmoid "
                   "group-limited routing with a correction bias + shared experts",
    .architectures = deepseek_v3_archs,
    .parse_config = deepseek_v3_parse_config,
    .map_weights = deepseek_map_weights,
    .forward = decoder_forward,
    .expert_stacking = hf_mlp_experts_stacking,
    .quant_predicate = hf_quant_gate_float,
    .mtp = MTP_DEEPSEEK,  /* model_load_mtp: the layer past num_hidden_layers (ADR 0108) */
    .convert_views = deepseek_convert_views,
};
