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
    hp->rope = ROPE_DEFAULT;
    hp->rope_attn_factor = 1.0f;
    hp->rope_factor = 1.0f;
    hp->ffn = FFN_GLU;
    hp->act = ACT_SILU;
    hp->router = ROUTER_NONE;
    hp->bos_id = -1;
}

static int check_dim(int v, const char *field, int lo, int hi, struct err *e)
{
    if (v < lo || v > hi)
        return err_setf(e, ERR_CONFIG, "config field '%s' = %d is out of range [%d, %d]", field, v,
                        lo, hi);
    return 0;
}

int hparams_validate(const struct hparams *hp, struct err *e)
{
    int rc;
    if ((rc = check_dim(hp->n_vocab, "vocab_size", 1, 1 << 24, e)) < 0 ||
        (rc = check_dim(hp->n_embd, "hidden_size", 1, HP_MAX_DIM, e)) < 0 ||
        (rc = check_dim(hp->n_layer, "num_hidden_layers", 1, HP_MAX_LAYERS, e)) < 0 ||
        (rc = check_dim(hp->n_head, "num_attention_heads", 1, 4096, e)) < 0 ||
        (rc = check_dim(hp->n_kv_head, "num_key_value_heads", 1, hp->n_head, e)) < 0 ||
        (rc = check_dim(hp->head_dim, "head_dim", 1, 4096, e)) < 0 ||
        (rc = check_dim(hp->n_ff, "intermediate_size", 1, HP_MAX_DIM, e)) < 0 ||
        (rc = check_dim(hp->n_ctx, "max_position_embeddings", 1, 1 << 24, e)) < 0)
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
    if (!(hp->norm_eps > 0.0f) || !isfinite(hp->norm_eps))
        return err_setf(e, ERR_CONFIG, "norm epsilon %g must be a positive number",
                        (double)hp->norm_eps);
    if (!(hp->rope_theta > 0.0f) && hp->n_rot > 0)
        return err_setf(e, ERR_CONFIG, "rope_theta %g must be positive", (double)hp->rope_theta);
    if ((hp->rope == ROPE_LINEAR || hp->rope == ROPE_LLAMA3) && !(hp->rope_factor > 0.0f))
        return err_setf(e, ERR_CONFIG, "rope_scaling.factor %g must be positive",
                        (double)hp->rope_factor);
    if (hp->rope == ROPE_LLAMA3 &&
        (hp->rope_orig_ctx <= 0 || !(hp->rope_high_freq_factor > hp->rope_low_freq_factor)))
        return err_setf(e, ERR_CONFIG,
                        "rope_scaling (llama3): need original_max_position_embeddings > 0 and "
                        "high_freq_factor > low_freq_factor");
    if (hp->rope == ROPE_LONGROPE && hp->rope_orig_ctx <= 0)
        return err_setf(e, ERR_CONFIG, "longrope needs original_max_position_embeddings > 0");
    if (hp->ffn == FFN_MLP && hp->act == ACT_SILU)
        return err_setf(e, ERR_UNSUPPORTED, "a non-gated MLP with silu is not supported");
    if (hp->n_expert > 0) {
        if ((rc = check_dim(hp->n_expert, "num_local_experts", 1, HP_MAX_EXPERTS, e)) < 0)
            return rc;
        if (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert)
            return err_setf(e, ERR_CONFIG,
                            "num_experts_per_tok = %d must be between 1 and num_local_experts = %d",
                            hp->n_expert_used, hp->n_expert);
        if (hp->router == ROUTER_SPARSEMIXER && hp->n_expert_used != 2)
            return err_setf(e, ERR_CONFIG, "sparsemixer routing needs num_experts_per_tok = 2, got %d",
                            hp->n_expert_used);
        if (hp->router == ROUTER_NONE)
            return err_setf(e, ERR_INTERNAL, "MoE family without a router kind");
    }
    return 0;
}
