/*
 * bamba: BambaForCausalLM (IBM Bamba), Mamba-2 layers with a few attention layers, every
 * layer followed by a SwiGLU MLP, on the shared decoder:
 *
 *   x += mixer(rmsnorm(x))      mixer: Mamba-2 (blocks_ssm.c), or Llama attention on the
 *                               layers listed in attn_layer_indices (partial rotary)
 *   x += mlp(rmsnorm(x))        feed_forward.{gate,up,down}_proj
 *
 * Config (transformers BambaConfig): the Llama fields (hf_parse_decoder: rms_norm_eps 1e-5,
 * rope_theta 1e4, partial_rotary_factor 0.5 by default here as BambaConfig sets it,
 * attention_bias, mlp_bias refused), attn_layer_indices ([]: every layer Mamba-2; each index
 * in [0, num_hidden_layers)), and the mixer's mamba_n_heads 128, mamba_d_head "auto" (the
 * inner width / heads), mamba_d_state 256, mamba_n_groups 1, mamba_d_conv 4, mamba_expand 2,
 * mamba_conv_bias true, mamba_proj_bias false, mamba_chunk_size 256, time_step_limit
 * [0, inf]; the gated norm (whole inner row, as transformers) uses rms_norm_eps.
 * Not read: z_loss_coefficient, num_logits_to_keep (training), time_step_min / _max /
 * _floor (initialization).
 */
#include <stdio.h>
#include <string.h>

#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"
#include "ssm2.h"

static const struct hf_defaults bamba_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 10000.0f, .partial_rotary = 0.5f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

static const struct ssm2_keys bamba_keys = {
    .n_head = "mamba_n_heads", .head_dim = "mamba_d_head", .d_state = "mamba_d_state",
    .n_group = "mamba_n_groups", .d_conv = "mamba_d_conv", .expand = "mamba_expand",
    .inner = NULL, .conv_bias = "mamba_conv_bias", .proj_bias = "mamba_proj_bias",
    .chunk = "mamba_chunk_size", .eps = "rms_norm_eps", .act = "hidden_act",
    .def_n_head = 128, .def_head_dim = 0, .def_d_state = 256, .def_n_group = 1,
    .def_d_conv = 4, .def_chunk = 256, .def_expand = 2.0f, .def_eps = 1e-5f,
    .def_conv_bias = true, .def_proj_bias = false, .norm_per_group = false,
};

/* attn_layer_indices: the attention layers; every other layer is Mamba-2 */
static int bamba_layers(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    static bool attn[HP_MAX_LAYERS];
    int32_t ids[HP_MAX_LAYERS];
    int n = 0, rc;
    if ((rc = cfg_opt_ids(cfg, "attn_layer_indices", ids, HP_MAX_LAYERS, &n, e)) < 0)
        return rc;
    memset(attn, 0, sizeof attn);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= hp->n_layer)
            return err_setf(e, ERR_CONFIG, "config field 'attn_layer_indices'[%d] = %d is not a "
                            "layer of num_hidden_layers = %d", i, (int)ids[i], hp->n_layer);
        attn[ids[i]] = true;
    }
    for (int il = 0; il < hp->n_layer; il++)
        if (!attn[il])
            ssm2_layer(hp, il);
    return 0;
}

static int bamba_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    if ((rc = hf_parse_decoder(hp, cfg, &bamba_defaults, e)) < 0 ||
        (rc = ssm2_parse(hp, cfg, &bamba_keys, e)) < 0 ||
        (rc = hf_finish_layers(hp, cfg, &bamba_defaults, 0, e)) < 0)
        return rc;
    return bamba_layers(hp, cfg, e);
}

static int bamba_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &hp->quant};
    char pre[128];
    int rc;
    if ((rc = hf_map_head(m, &w, "model.embed_tokens", "model.final_layernorm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *L = &m->layers[il];
        int64_t d = hp->n_embd, ff = hp->layer[il].n_ff;
        snprintf(pre, sizeof pre, "model.layers.%d", il);
        if ((rc = wm_vec(&w, &L->attn_norm, WM_REQUIRED, d, e, "%s.input_layernorm.weight", pre)) < 0 ||
            (rc = wm_vec(&w, &L->ffn_norm, WM_REQUIRED, d, e, "%s.pre_ff_layernorm.weight", pre)) < 0)
            return rc;
        if (hp->layer[il].mixer == MIXER_MAMBA2) {
            snprintf(pre, sizeof pre, "model.layers.%d.mamba", il);
            rc = ssm2_map(m, &w, L, pre, e);
        } else {
            rc = hf_map_attention(&w, hp, L, il, e);
        }
        if (rc < 0)
            return rc;
        snprintf(pre, sizeof pre, "model.layers.%d.feed_forward", il);
        if ((rc = wm_linear(&w, &L->gate, WM_REQUIRED, 0, ff, d, e, "%s.gate_proj", pre)) < 0 ||
            (rc = wm_linear(&w, &L->up, WM_REQUIRED, 0, ff, d, e, "%s.up_proj", pre)) < 0 ||
            (rc = wm_linear(&w, &L->down, WM_REQUIRED, 0, d, ff, e, "%s.down_proj", pre)) < 0)
            return rc;
    }
    return 0;
}

/* mlx-lm's sanitize moves conv1d's kernel axis last but one: [ch, 1, K] -> [ch, K, 1] */
static void bamba_convert_views(const struct hparams *hp, struct ck_view_rule *out)
{
    (void)hp;
    out[0] = (struct ck_view_rule){"model.layers.%d.mamba.conv1d.weight", "model.layers.%d.mamba.conv1d.weight", CK_VIEW_T, 0, 0};
    out[1] = (struct ck_view_rule){NULL, NULL, CK_VIEW_NONE, 0, 0};
}

static const char *const bamba_archs[] = {"BambaForCausalLM", NULL};

const struct model_ops bamba_ops = {
    .family = "bamba",
    .description = "Bamba: Mamba-2 layers with a few attention layers, a SwiGLU MLP after each",
    .architectures = bamba_archs,
    .parse_config = bamba_parse_config,
    .map_weights = bamba_map_weights,
    .convert_views = bamba_convert_views,
    .forward = decoder_forward,
};
