/*
 * ernie4_5_moe: Ernie4_5_MoeForCausalLM (Baidu ERNIE 4.5 MoE: ERNIE-4.5-21B-A3B,
 * ERNIE-4.5-300B-A47B). Llama's block with softmax-routed experts:
 *
 *   block(x) = x + attn(rms(x)); x + ffn(rms(x))      pre-norm, RMSNorm (rms_norm_eps 1e-5)
 *   attn     q/k/v/o, GQA, scale head_dim^-0.5 (head_dim: hidden / heads when absent); rope
 *            (rope_theta 500000) on interleaved pairs (2j, 2j + 1): transformers' Ernie 4.5
 *            repeat_interleaves the first half of cos / sin and rotates (-x[1::2], x[0::2])
 *   ffn      layer il has experts when (il + 1) % moe_layer_interval (1) == 0 and
 *            moe_layer_start_index (1) <= il <= moe_layer_end_index (-1: the last layer);
 *            the others a SwiGLU of intermediate_size
 *   moe      p = softmax(mlp.gate x) over moe_num_experts (64), F32; the moe_k (6) experts
 *            with the highest p + moe_statics.e_score_correction_bias (the bias chooses only);
 *            weights their p / max(sum of the k, moe_norm_min (1e-12)); SwiGLU experts of
 *            moe_intermediate_size (1536) + moe_num_shared_experts (2) shared ones (one SwiGLU
 *            of n_shared * moe_intermediate_size) added plain. That is ROUTER_GROUP_SOFTMAX
 *            with one group, the correction bias, renormalization and scale 1.
 *   head     lm_head, tied to the embedding by default (tie_word_embeddings true)
 *
 * partial_rotary_factor other than 1 is refused: transformers' interleaving of cos / sin then
 * misses half the head's dims and fails.
 * use_bias (false) puts biases on every projection in transformers, but not on its experts
 * (transformers 5's MixtralExperts have none, mlx-lm's SwitchGLU has): no published ERNIE
 * 4.5 MoE sets it, and it is refused rather than half-read.
 *
 * Checkpoint names (model.layers.N.): self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj
 * (dense), mlp.gate, mlp.moe_statics.e_score_correction_bias [1, E] (F32),
 * mlp.experts.E.{gate,up,down}_proj, mlp.shared_experts.{gate,up,down}_proj; mlx-lm stacks the
 * experts as mlp.switch_mlp.* and drops the correction bias (it routes on p alone; we do the
 * same for such a checkpoint). The multi-token-prediction tensors (mtp_*) are not part of the
 * causal LM and stay unbound.
 */
#include <stdio.h>

#include "blocks.h"
#include "hf_common.h"
#include "../loading/config.h"

/* transformers Ernie4_5_MoeConfig defaults of the Llama-style fields */
static const struct hf_defaults ernie_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 500000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = true,
};

/* The MoE fields of Ernie4_5_MoeConfig and their defaults. */
struct ernie_moe {
    int n_expert, k, moe_ff, n_shared, start, end, interval;
    float norm_min;
};

static int parse_moe_fields(struct hparams *hp, const cJSON *cfg, struct ernie_moe *o,
                            struct err *e)
{
    int rc;
    if ((rc = cfg_opt_int(cfg, "moe_num_experts", 64, &o->n_expert, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "moe_k", 6, &o->k, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "moe_intermediate_size", 1536, &o->moe_ff, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "moe_num_shared_experts", 2, &o->n_shared, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "moe_layer_start_index", 1, &o->start, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "moe_layer_end_index", -1, &o->end, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "moe_layer_interval", 1, &o->interval, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "moe_norm_min", 1e-12f, &o->norm_min, e)) < 0)
        return rc;
    /* Ernie4_5_MoeConfig: -1 is the last layer */
    if (o->end == -1)
        o->end = hp->n_layer - 1;
    if ((rc = hparams_check_dim(o->n_expert, "moe_num_experts", 1, HP_MAX_EXPERTS, e)) < 0 ||
        (rc = hparams_check_dim(o->k, "moe_k", 1, o->n_expert, e)) < 0 ||
        (rc = hparams_check_dim(o->moe_ff, "moe_intermediate_size", 1, HP_MAX_DIM, e)) < 0 ||
        (rc = hparams_check_dim(o->n_shared, "moe_num_shared_experts", 0, 1024, e)) < 0 ||
        (rc = hparams_check_dim((int64_t)o->moe_ff * o->n_shared,
                                "moe_num_shared_experts * moe_intermediate_size", 0, HP_MAX_DIM, e)) < 0 ||
        (rc = hparams_check_dim(o->start, "moe_layer_start_index", 0, HP_MAX_LAYERS, e)) < 0 ||
        (rc = hparams_check_dim(o->end, "moe_layer_end_index", 0, HP_MAX_LAYERS, e)) < 0 ||
        (rc = hparams_check_dim(o->interval, "moe_layer_interval", 1, HP_MAX_LAYERS, e)) < 0)
        return rc;
    /* the clamp of a sum of probabilities; NaN, infinite or negative would break it */
    if (!(o->norm_min >= 0.0f && o->norm_min <= 1e30f))
        return err_setf(e, ERR_CONFIG, "config field 'moe_norm_min' = %g must be a non-negative "
                        "number", (double)o->norm_min);
    return 0;
}

static int ernie4_5_moe_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    struct ernie_moe o;
    bool bias;
    int rc;
    if ((rc = hf_parse_decoder(hp, cfg, &ernie_defaults, e)) < 0 ||
        (rc = hf_check_full_rotary(cfg, "Ernie 4.5's rope covers the whole head", e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "use_bias", false, &bias, e)) < 0)
        return rc;
    if (bias)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'use_bias' = true is not supported");
    /* Ernie4_5_MoeAttention reads use_bias only: attention_bias means nothing here */
    hp->qkv_bias = hp->out_bias = false;
    hp->rope_style = ROPE_STYLE_PAIRS;
    if ((rc = hf_finish_layers(hp, cfg, &ernie_defaults, 0, e)) < 0 ||
        (rc = parse_moe_fields(hp, cfg, &o, e)) < 0)
        return rc;
    hp->n_expert = o.n_expert;
    hp->n_expert_used = o.k;
    hp->router = ROUTER_GROUP_SOFTMAX;
    hp->router_bias = true;
    hp->moe_n_group = hp->moe_topk_group = 1;
    hp->moe_norm = true;
    hp->moe_scale = 1.0f;
    /* 0 would select the DeepSeek rule (sum + 1e-20): the smallest positive float instead */
    hp->moe_norm_min = o.norm_min > 0.0f ? o.norm_min : 1e-45f;
    int ff = hp->n_ff, widest = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer_spec *ls = &hp->layer[il];
        if (ls->kv != KV_FULL)
            return err_setf(e, ERR_UNSUPPORTED, "layer %d: Ernie 4.5 has no sliding window "
                            "(config field 'sliding_window' / 'layer_types')", il);
        ls->moe = (il + 1) % o.interval == 0 && il >= o.start && il <= o.end;
        ls->n_ff = ls->moe ? o.moe_ff : ff;
        ls->n_ff_shexp = ls->moe ? o.moe_ff * o.n_shared : 0;
        ls->shexp_plain = true;
        ls->router = ls->moe ? hp->router : ROUTER_NONE;
        ls->n_expert_used = o.k;
        widest = ls->n_ff > widest ? ls->n_ff : widest;
        widest = ls->n_ff_shexp > widest ? ls->n_ff_shexp : widest;
    }
    hp->n_ff = widest;
    return 0;
}

static const struct hf_moe_names ernie_names = {
    "model.layers.%d.mlp.gate", hf_mlp_experts_stacking, "model.layers.%d.mlp.shared_experts", NULL,
    NULL, /* the correction bias: below */
};

/* moe_statics.e_score_correction_bias of every MoE layer ([1, E], F32); mlx-lm's sanitize
 * drops it and routes on the probabilities alone, so a checkpoint with stacked experts and
 * no bias runs so */
static int map_correction_bias(struct model *m, struct st_set *st, struct err *e)
{
    struct wmap w = {st, &m->hp.quant};
    char name[256];
    int rc;
    for (int il = 0; il < m->hp.n_layer; il++) {
        if (!m->hp.layer[il].moe)
            continue;
        snprintf(name, sizeof name, "model.layers.%d.mlp.moe_statics.e_score_correction_bias", il);
        bool stacked = wm_has(&w, "model.layers.%d.mlp.switch_mlp.gate_proj.weight", il) ||
                       wm_has(&w, "model.layers.%d.mlp.switch_mlp.gate_proj.scales", il);
        if (stacked && !wm_has(&w, "%s", name))
            continue;
        if ((rc = hf_map_router_bias(m, &w, &m->layers[il], name, true, e)) < 0)
            return rc;
    }
    return 0;
}

static int ernie4_5_moe_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    int rc = hf_map_decoder_moe(m, st, &ernie_names, e);
    return rc < 0 ? rc : map_correction_bias(m, st, e);
}

static const char *const ernie4_5_moe_archs[] = {"Ernie4_5_MoeForCausalLM", NULL};

const struct model_ops ernie4_5_moe_ops = {
    .family = "ernie4_5_moe",
    .description = "ERNIE 4.5 MoE: Llama attention with interleaved-pair rope + softmax experts "
                   "chosen with a correction bias, shared experts",
    .architectures = ernie4_5_moe_archs,
    .parse_config = ernie4_5_moe_parse_config,
    .map_weights = ernie4_5_moe_map_weights,
    .forward = decoder_forward,
    .expert_stacking = hf_mlp_experts_stacking,
};
