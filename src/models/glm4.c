/*
 * glm4: Glm4ForCausalLM (GLM-4-0414). A sandwich-norm block (RESID_SANDWICH)
 * with GLM's names and partial, interleaved rotary embeddings:
 *
 *   h   = x + post_self_attn_layernorm(attn(input_layernorm(x)))
 *   out = h + post_mlp_layernorm(mlp(post_attention_layernorm(h)))
 *   attn: q/k/v biases (attention_bias, default true), no o bias; RoPE on the
 *         first head_dim * partial_rotary_factor dims of each head, pairing
 *         dims (2j, 2j + 1) (ROPE_STYLE_PAIRS, transformers' GLM rotate_half)
 *   mlp:  down(silu(gate) * up) from the fused gate_up_proj (gate rows first)
 *
 * Config (transformers Glm4Config): rms_norm_eps 1.5625e-7, head_dim 128 and
 * num_key_value_heads 2 when absent, partial_rotary_factor 0.5 (rope_parameters'
 * own value wins over the top-level one, as transformers 5 merges them),
 * rope_theta 1e4, untied head. Tensors: the checkpoint's names above.
 */
#include <stdio.h>

#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"


/* transformers Glm4Config defaults */
static const struct hf_defaults glm4_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1.5625e-7f,
    .rope_theta = 10000.0f, .partial_rotary = 0.5f, .act = "silu",
    .head_dim = 128, .sliding = false, .tie_embd = false,
};

static int glm4_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    struct hf_defaults d = glm4_defaults;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    int rc;
    /* rope_parameters.partial_rotary_factor, else the top-level field, else 0.5 */
    float top;
    if ((rc = cfg_opt_float(cfg, "partial_rotary_factor", d.partial_rotary, &top, e)) < 0)
        return rc;
    d.partial_rotary = top;
    if (cJSON_IsObject(rp) &&
        (rc = cfg_opt_float(rp, "partial_rotary_factor", top, &d.partial_rotary, e)) < 0)
        return err_prefix(e, "rope_parameters");
    cJSON *c = cJSON_Duplicate(cfg, true);
    if (!c)
        return err_setf(e, ERR_NOMEM, "out of memory copying config.json");
    /* hf_parse_decoder reads the top-level factor: hand it the merged one */
    cJSON_DeleteItemFromObjectCaseSensitive(c, "partial_rotary_factor");
    rc = hf_parse_decoder(hp, c, &d, e);
    cJSON_Delete(c);
    if (rc < 0)
        return rc;
    /* absent: Glm4Config's 2; null: num_attention_heads (hf_parse_decoder) */
    if (!cJSON_GetObjectItemCaseSensitive(cfg, "num_key_value_heads"))
        hp->n_kv_head = 2;
    if ((rc = cfg_opt_bool(cfg, "attention_bias", true, &hp->qkv_bias, e)) < 0)
        return rc;
    hp->out_bias = false;
    hp->rope_style = ROPE_STYLE_PAIRS;
    hp->sandwich_norm = true;
    return hf_finish_layers(hp, cfg, &d, 0, e);
}

static int glm4_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &hp->quant};
    int64_t d = hp->n_embd;
    int rc;
    if ((rc = hf_map_head(m, &w, "model.embed_tokens", "model.norm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *L = &m->layers[il];
        int64_t ff = hp->layer[il].n_ff;
        char p[64];
        snprintf(p, sizeof p, "model.layers.%d", il);
        if ((rc = wm_vec(&w, &L->attn_norm, WM_REQUIRED, d, e, "%s.input_layernorm.weight", p)) < 0 ||
            (rc = wm_vec(&w, &L->attn_post_norm, WM_REQUIRED, d, e, "%s.post_self_attn_layernorm.weight", p)) < 0 ||
            (rc = wm_vec(&w, &L->ffn_norm, WM_REQUIRED, d, e, "%s.post_attention_layernorm.weight", p)) < 0 ||
            (rc = wm_vec(&w, &L->ffn_post_norm, WM_REQUIRED, d, e, "%s.post_mlp_layernorm.weight", p)) < 0 ||
            (rc = hf_map_attention(&w, hp, L, il, e)) < 0 ||
            (rc = wm_linear(&w, &L->gate_up, WM_REQUIRED, 0, 2 * ff, d, e, "%s.mlp.gate_up_proj", p)) < 0 ||
            (rc = wm_linear(&w, &L->down, WM_REQUIRED, 0, d, ff, e, "%s.mlp.down_proj", p)) < 0)
            return rc;
    }
    return 0;
}

static const char *const glm4_archs[] = {"Glm4ForCausalLM", NULL};

const struct model_ops glm4_ops = {
    .family = "glm4",
    .description = "GLM-4-0414: sandwich RMSNorms, partial interleaved RoPE, q/k/v biases, fused gate_up",
    .architectures = glm4_archs,
    .parse_config = glm4_parse_config,
    .map_weights = glm4_map_weights,
    .forward = decoder_forward,
};
