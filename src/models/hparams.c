/*
 * hparams: shared defaults and the validation every family's config passes
 * through before any buffer is sized from it.
 */
#include "hparams.h"

#include <math.h>
#include <string.h>

void hparams_init(struct hparams *hp)
{
    memset(hp, 0, sizeof *hp);
    hp->norm = NORM_RMS;
    hp->norm_bias = true;
    hp->rope = ROPE_DEFAULT;
    hp->rope_attn_factor = 1.0f;
    hp->rope_factor = 1.0f;
    hp->ffn = FFN_GLU;
    hp->act = ACT_SILU;
    hp->router = ROUTER_NONE;
    hp->moe_n_group = hp->moe_topk_group = 1;
    hp->moe_scale = 1.0f;
    hp->bos_id = -1;
    hp->embd_scale = hp->residual_scale = hp->logit_scale = 1.0f;
}

void hparams_fill_layers(struct hparams *hp)
{
    struct layer_spec ls = {
        .kv = KV_FULL,
        .n_rot = hp->n_rot,
        .rope_theta = hp->rope_theta,
        .rope = hp->rope,
        .attn_scale = hp->attn_scale,
        .softcap = hp->attn_softcap,
        .qk_norm = hp->qk_norm,
        .qk_norm_full = hp->qk_norm && hp->qk_norm_full,
        .residual = hp->sandwich_norm ? RESID_SANDWICH
                    : hp->post_norm ? RESID_POST
                    : hp->parallel_residual ? RESID_PARALLEL : RESID_SEQUENTIAL,
        .rope_style = hp->rope_style,
        .moe = hp->n_expert > 0,
        .ffn = hp->ffn,
        .act = hp->act,
        .n_ff = hp->n_ff,
        .glu_alpha = hp->glu_alpha,
        .glu_limit = hp->glu_limit,
        .sinks = hp->attn_sinks,
        .router = hp->router,
        .n_expert_used = hp->n_expert_used,
        .router_jitter = hp->router_jitter,
    };
    for (int il = 0; il < hp->n_layer && il < HP_MAX_LAYERS; il++)
        hp->layer[il] = ls;
}

/* The per-layer rules; il names the layer in messages. */
static int validate_layer(const struct hparams *hp, const struct layer_spec *ls, int il,
                          struct err *e)
{
    bool rec_mixer = ls->mixer != MIXER_ATTENTION && ls->mixer != MIXER_NONE;
    if ((ls->kv == KV_RECURRENT) != rec_mixer)
        return err_setf(e, ERR_INTERNAL, "layer %d: a recurrent mixer needs a recurrent cache and "
                        "only it", il);
    if (ls->kv == KV_RECURRENT &&
        (ls->state_conv < 0 || ls->state_conv > HP_MAX_STATE || ls->state_rec < 0 ||
         ls->state_rec > HP_MAX_STATE || ls->state_conv + ls->state_rec == 0))
        return err_setf(e, ERR_CONFIG, "layer %d: recurrent state sizes %d + %d floats must be in "
                        "[0, %d], not both 0", il, ls->state_conv, ls->state_rec, HP_MAX_STATE);
    if (ls->kv == KV_RECURRENT && (hp->rec_scratch < 1 || hp->rec_scratch > HP_MAX_DIM * 8))
        return err_setf(e, ERR_INTERNAL, "layer %d: recurrent scratch %d floats per row", il,
                        hp->rec_scratch);
    if (ls->attn_gate && (int64_t)hp->rec_scratch < (int64_t)hp->n_head * hp->head_dim)
        return err_setf(e, ERR_INTERNAL, "layer %d: an attention output gate needs %d floats of "
                        "recurrent scratch per row", il, hp->n_head * hp->head_dim);
    if (ls->mixer == MIXER_NONE && ls->ffn == FFN_NONE)
        return err_setf(e, ERR_CONFIG, "layer %d has neither a mixer nor an FFN", il);
    if (ls->kv == KV_LATENT &&
        (hp->kv_lora_rank < 1 || hp->kv_lora_rank > HP_MAX_HEAD_DIM || hp->qk_rope_dim < 2 ||
         hp->qk_rope_dim > HP_MAX_HEAD_DIM || hp->qk_nope_dim < 1 ||
         hp->qk_nope_dim > HP_MAX_HEAD_DIM || hp->v_head_dim < 1 ||
         hp->v_head_dim > HP_MAX_HEAD_DIM || hp->q_lora_rank < 0 || hp->q_lora_rank > HP_MAX_DIM ||
         ls->n_rot != hp->qk_rope_dim))
        return err_setf(e, ERR_CONFIG, "layer %d: latent attention needs kv_lora_rank, "
                        "qk_nope_head_dim, qk_rope_head_dim (= its rotary dims) and v_head_dim in "
                        "[1, %d]", il, HP_MAX_HEAD_DIM);
    if (ls->kv == KV_SLIDING && ls->window <= 0)
        return err_setf(e, ERR_CONFIG, "layer %d: sliding window %d must be positive", il, ls->window);
    /* a chunked layer's cache is its sliding pool: the window must cover the chunk */
    if (ls->chunk < 0 || (ls->chunk > 0 && (ls->kv != KV_SLIDING || ls->window < ls->chunk)))
        return err_setf(e, ERR_CONFIG, "layer %d: attention chunk %d needs a sliding window of at "
                        "least it", il, ls->chunk);
    if (ls->attn_temp_floor < 0 || !isfinite(ls->attn_temp_scale))
        return err_setf(e, ERR_CONFIG, "layer %d: attention temperature floor %d / scale %g", il,
                        ls->attn_temp_floor, (double)ls->attn_temp_scale);
    if (ls->n_rot < 0 || ls->n_rot > hp->head_dim || ls->n_rot % 2 != 0 ||
        ls->n_rot / 2 > HP_MAX_ROT_HALF)
        return err_setf(e, ERR_CONFIG, "layer %d: rotary dims %d must be even and within head_dim %d",
                        il, ls->n_rot, hp->head_dim);
    if (ls->n_rot > 0 && !(ls->rope_theta > 0.0f))
        return err_setf(e, ERR_CONFIG, "layer %d: rope_theta %g must be positive", il,
                        (double)ls->rope_theta);
    if (!(ls->softcap >= 0.0f) || !isfinite(ls->softcap) || !isfinite(ls->attn_scale))
        return err_setf(e, ERR_CONFIG, "layer %d: attention scale / softcap must be finite", il);
    if (ls->ffn == FFN_NONE && !ls->moe)
        return 0;
    if (ls->n_ff < 1 || ls->n_ff > hp->n_ff)
        return err_setf(e, ERR_CONFIG, "layer %d: FFN width %d must be in [1, %d]", il, ls->n_ff,
                        hp->n_ff);
    if (ls->n_ff_shexp < 0 || ls->n_ff_shexp > hp->n_ff || (ls->n_ff_shexp > 0 && !ls->moe))
        return err_setf(e, ERR_CONFIG, "layer %d: shared expert width %d must be in [0, %d], on a "
                        "MoE layer", il, ls->n_ff_shexp, hp->n_ff);
    if (ls->ffn == FFN_GLU_CLAMPED && (!(ls->glu_limit > 0.0f) || !isfinite(ls->glu_alpha)))
        return err_setf(e, ERR_CONFIG, "layer %d: swiglu_limit %g must be positive and swiglu_alpha "
                        "finite", il, (double)ls->glu_limit);
    if (ls->ffn == FFN_GLU_CLAMPED && !ls->moe)
        return err_setf(e, ERR_UNSUPPORTED, "layer %d: a dense clamped SwiGLU is not supported", il);
    if (ls->act == ACT_XIELU && (ls->ffn != FFN_MLP || ls->moe))
        return err_setf(e, ERR_UNSUPPORTED, "layer %d: xIELU is supported in a dense non-gated MLP only",
                        il);
    if (ls->ffn == FFN_MLP && ls->act == ACT_SILU)
        return err_setf(e, ERR_UNSUPPORTED, "a non-gated MLP with silu is not supported");
    if (!ls->moe)
        return 0;
    if (hp->n_expert < 1)
        return err_setf(e, ERR_CONFIG, "layer %d is a MoE layer but the model has no experts", il);
    if (ls->n_expert_used < 1 || ls->n_expert_used > hp->n_expert)
        return err_setf(e, ERR_CONFIG,
                        "num_experts_per_tok = %d must be between 1 and num_local_experts = %d",
                        ls->n_expert_used, hp->n_expert);
    if (ls->router == ROUTER_SPARSEMIXER && ls->n_expert_used != 2)
        return err_setf(e, ERR_CONFIG, "sparsemixer routing needs num_experts_per_tok = 2, got %d",
                        ls->n_expert_used);
    if (ls->router == ROUTER_NONE)
        return err_setf(e, ERR_INTERNAL, "MoE family without a router kind");
    if (ls->router == ROUTER_GROUP_SOFTMAX || ls->router == ROUTER_GROUP_SIGMOID) {
        int ng = hp->moe_n_group, tg = hp->moe_topk_group;
        if (ng < 1 || hp->n_expert % ng != 0)
            return err_setf(e, ERR_CONFIG, "config field 'n_group' = %d must divide the %d "
                            "routed experts", ng, hp->n_expert);
        if (tg < 1 || tg > ng)
            return err_setf(e, ERR_CONFIG, "config field 'topk_group' = %d must be in [1, "
                            "n_group = %d]", tg, ng);
        if (ls->router == ROUTER_GROUP_SIGMOID && ng > 1 && hp->n_expert / ng < 2)
            return err_setf(e, ERR_CONFIG, "config field 'n_group' = %d leaves fewer than 2 "
                            "experts per group (the group score sums its top 2)", ng);
        if (ls->n_expert_used > tg * (hp->n_expert / ng))
            return err_setf(e, ERR_CONFIG, "num_experts_per_tok = %d exceeds the %d experts of "
                            "topk_group groups", ls->n_expert_used, tg * (hp->n_expert / ng));
        if (!isfinite(hp->moe_scale))
            return err_setf(e, ERR_CONFIG, "config field 'routed_scaling_factor' must be finite");
    }
    return 0;
}

int hparams_check_dim(int64_t v, const char *field, int64_t lo, int64_t hi, struct err *e)
{
    if (v < lo || v > hi)
        return err_setf(e, ERR_CONFIG, "config field '%s' = %lld is out of range [%lld, %lld]", field,
                        (long long)v, (long long)lo, (long long)hi);
    return 0;
}

int hparams_validate(const struct hparams *hp, struct err *e)
{
    int rc;
    if ((rc = hparams_check_dim(hp->n_vocab, "vocab_size", 1, 1 << 24, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_embd, "hidden_size", 1, HP_MAX_DIM, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_layer, "num_hidden_layers", 1, HP_MAX_LAYERS, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_head, "num_attention_heads", 1, HP_MAX_HEADS, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_kv_head, "num_key_value_heads", 1, hp->n_head, e)) < 0 ||
        (rc = hparams_check_dim(hp->head_dim, "head_dim", 1, HP_MAX_HEAD_DIM, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_ff, "intermediate_size", 1, HP_MAX_DIM, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_ctx, "max_position_embeddings", 1, HP_MAX_CTX, e)) < 0)
        return rc;
    if (hp->n_head % hp->n_kv_head != 0)
        return err_setf(e, ERR_CONFIG,
                        "num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
                        hp->n_head, hp->n_kv_head);
    if (hp->n_rot < 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return err_setf(e, ERR_CONFIG, "rotary dims %d must be even and within head_dim %d",
                        hp->n_rot, hp->head_dim);
    if (hp->n_rot / 2 > HP_MAX_ROT_HALF)
        return err_setf(e, ERR_CONFIG, "rotary dims %d exceed the supported %d", hp->n_rot,
                        2 * HP_MAX_ROT_HALF);
    if (hparams_has_mrope(hp)) {
        const int *ms = hp->mrope_section;
        if (ms[0] < 0 || ms[1] < 0 || ms[2] < 0 || ms[0] + ms[1] + ms[2] != hp->n_rot / 2 ||
            hp->rope != ROPE_DEFAULT || hp->rope_style != ROPE_STYLE_HALF)
            return err_setf(e, ERR_CONFIG, "mrope_section [%d, %d, %d] must be three non-negative counts "
                            "summing to half the rotary dims (%d), over default rotate-half rope", ms[0],
                            ms[1], ms[2], hp->n_rot / 2);
    }
    if (!isfinite(hp->embd_scale) || !isfinite(hp->residual_scale) || !isfinite(hp->logit_scale) ||
        hp->embd_scale == 0.0f || hp->logit_scale == 0.0f)
        return err_setf(e, ERR_CONFIG, "embedding, residual and logit scales must be finite and non-zero");
    if (!(hp->logit_softcap >= 0.0f) || !isfinite(hp->logit_softcap))
        return err_setf(e, ERR_CONFIG, "final_logit_softcapping %g must be a non-negative number",
                        (double)hp->logit_softcap);
    if (!(hp->norm_eps > 0.0f) || !isfinite(hp->norm_eps))
        return err_setf(e, ERR_CONFIG, "norm epsilon %g must be a positive number",
                        (double)hp->norm_eps);
    if (!(hp->rope_theta > 0.0f) && hp->n_rot > 0)
        return err_setf(e, ERR_CONFIG, "rope_theta %g must be positive", (double)hp->rope_theta);
    if (!(hp->rope_attn_factor > 0.0f) || !isfinite(hp->rope_attn_factor) || !isfinite(hp->rope_factor))
        return err_setf(e, ERR_CONFIG, "rope scaling factors must be finite (factor %g, attention_factor %g)",
                        (double)hp->rope_factor, (double)hp->rope_attn_factor);
    if ((hp->rope == ROPE_LINEAR || hp->rope == ROPE_LLAMA3) && !(hp->rope_factor > 0.0f))
        return err_setf(e, ERR_CONFIG, "rope_scaling.factor %g must be positive",
                        (double)hp->rope_factor);
    if (hp->rope == ROPE_LLAMA3 &&
        (hp->rope_orig_ctx <= 0 || !(hp->rope_high_freq_factor > hp->rope_low_freq_factor)))
        return err_setf(e, ERR_CONFIG,
                        "rope_scaling (llama3): need original_max_position_embeddings > 0 and "
                        "high_freq_factor > low_freq_factor");
    if ((hp->rope == ROPE_YARN || hp->rope == ROPE_DYNAMIC) &&
        (!(hp->rope_factor > 0.0f) || hp->rope_orig_ctx <= 0))
        return err_setf(e, ERR_CONFIG, "rope_scaling (yarn / dynamic): need factor > 0 and "
                        "original_max_position_embeddings > 0");
    if (hp->rope == ROPE_DYNAMIC && hp->n_rot > 0 && hp->n_rot <= 2)
        return err_setf(e, ERR_CONFIG, "rope_scaling (dynamic) needs more than 2 rotary dims");
    if (hp->rope == ROPE_YARN && (!isfinite(hp->rope_beta_fast) || !isfinite(hp->rope_beta_slow)))
        return err_setf(e, ERR_CONFIG, "rope_scaling (yarn): beta_fast / beta_slow must be finite");
    if (hp->rope == ROPE_LONGROPE && hp->rope_orig_ctx <= 0)
        return err_setf(e, ERR_CONFIG, "longrope needs original_max_position_embeddings > 0");
    if (hp->n_expert > 0 && (rc = hparams_check_dim(hp->n_expert, "num_local_experts", 1, HP_MAX_EXPERTS, e)) < 0)
        return rc;
    /* checked model-wide too: a config whose MoE layers all fall away (decoder_sparse_step,
     * mlp_only_layers) still states a top-k the engine sizes buffers from */
    if (hp->n_expert > 0 &&
        (rc = hparams_check_dim(hp->n_expert_used, "num_experts_per_tok", 1, hp->n_expert, e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++)
        if ((rc = validate_layer(hp, &hp->layer[il], il, e)) < 0)
            return rc;
    return 0;
}

int hparams_ctx_limit(const struct hparams *hp)
{
    return hp->n_ctx_max > hp->n_ctx ? hp->n_ctx_max : hp->n_ctx;
}

int hparams_ctx_default(const struct hparams *hp)
{
    if (hp->rope != ROPE_DYNAMIC || !(hp->rope_factor > 1.0f))
        return hp->n_ctx;
    double want = ceil((double)hp->n_ctx * (double)hp->rope_factor);
    int limit = hparams_ctx_limit(hp);
    return want < (double)limit ? (int)want : limit;
}
