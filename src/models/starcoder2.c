/*
 * starcoder2: Starcoder2ForCausalLM (StarCoder2). A sequential pre-norm block
 * with LayerNorm (weight and bias, eps norm_epsilon), GQA with full RoPE and
 * a plain MLP:
 *
 *   x += o_proj(attend(rope(q_proj(ln1(x)), k_proj(ln1(x))), v_proj(ln1(x))))
 *   x += c_proj(gelu_pytorch_tanh(c_fc(ln2(x))))
 *   logits = lm_head(norm(x))           lm_head tied to the embedding by default
 *
 * use_bias (default true) puts biases on q/k/v/o and on c_fc/c_proj;
 * sliding_window (null: none) applies to every layer. Config names and
 * defaults are Starcoder2Config's.
 */
#include <stdio.h>

#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"


/* transformers Starcoder2Config defaults (sliding_window, when set, covers every layer) */
static const struct hf_defaults starcoder2_defaults = {
    .eps_key = "norm_epsilon", .norm_eps = 1e-5f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "gelu_pytorch_tanh",
    .head_dim = 0, .sliding = true, .tie_embd = true,
};

static int starcoder2_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    bool bias;
    if ((rc = hf_parse_decoder(hp, cfg, &starcoder2_defaults, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "use_bias", true, &bias, e)) < 0)
        return rc;
    hp->norm = NORM_LAYER;
    hp->qkv_bias = hp->out_bias = hp->ffn_bias = bias;
    hp->ffn = FFN_MLP;
    return hf_finish_layers(hp, cfg, &starcoder2_defaults, 0, e);
}

static int starcoder2_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &hp->quant};
    int64_t d = hp->n_embd;
    char pre[128], ln1[160], ln2[160];
    int rc;
    if ((rc = hf_map_head(m, &w, "model.embed_tokens", "model.norm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *L = &m->layers[il];
        int64_t ff = hp->layer[il].n_ff;
        snprintf(pre, sizeof pre, "model.layers.%d", il);
        snprintf(ln1, sizeof ln1, "%s.input_layernorm", pre);
        snprintf(ln2, sizeof ln2, "%s.post_attention_layernorm", pre);
        if ((rc = hf_map_norm(&w, hp, &L->attn_norm, &L->attn_norm_b, ln1, e)) < 0 ||
            (rc = hf_map_norm(&w, hp, &L->ffn_norm, &L->ffn_norm_b, ln2, e)) < 0 ||
            (rc = hf_map_attention(&w, hp, L, il, e)) < 0 ||
            (rc = wm_linear(&w, &L->up, WM_REQUIRED, 0, ff, d, e, "%s.mlp.c_fc", pre)) < 0 ||
            (rc = wm_linear(&w, &L->down, WM_REQUIRED, 0, d, ff, e, "%s.mlp.c_proj", pre)) < 0)
            return rc;
        if (hp->ffn_bias &&
            ((rc = wm_vec(&w, &L->up_b, WM_REQUIRED, ff, e, "%s.mlp.c_fc.bias", pre)) < 0 ||
             (rc = wm_vec(&w, &L->down_b, WM_REQUIRED, d, e, "%s.mlp.c_proj.bias", pre)) < 0))
            return rc;
    }
    return 0;
}

static const char *const starcoder2_archs[] = {"Starcoder2ForCausalLM", NULL};

const struct model_ops starcoder2_ops = {
    .family = "starcoder2",
    .description = "StarCoder2: LayerNorm+bias, GQA with biases, gelu_pytorch_tanh MLP, tied head",
    .architectures = starcoder2_archs,
    .parse_config = starcoder2_parse_config,
    .map_weights = starcoder2_map_weights,
    .forward = decoder_forward,
};
