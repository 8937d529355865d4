/*
 * mamba2: Mamba2ForCausalLM (state-spaces Mamba-2, Dao & Gu 2024). Every block is
 * x += mixer(rmsnorm(x)) with the Mamba-2 mixer (blocks_ssm.c) and no FFN, so the shared
 * decoder runs it (FFN_NONE layers, MIXER_MAMBA2, a recurrent cache per sequence); the
 * head is rmsnorm (norm_f) and lm_head, tied to the embedding by default.
 *
 * Config (transformers Mamba2Config, with its defaults): vocab_size, hidden_size,
 * num_hidden_layers (required here), num_heads 128, head_dim 64, state_size 128,
 * n_groups 8, conv_kernel 4, expand 2, use_conv_bias true, use_bias false (in_proj /
 * out_proj), chunk_size 256, layer_norm_epsilon 1e-5 (the block norms, norm_f and the
 * gated norm), hidden_act silu (the conv's activation; others refused),
 * time_step_limit [0, inf], tie_word_embeddings false. Not read, as in transformers'
 * forward: time_step_rank / _min / _max / _floor (initialization), rms_norm (the mixer
 * always takes the gated RMSNorm), residual_in_fp32 (we keep f32 residuals),
 * rescale_prenorm_residual. transformers' MambaRMSNormGated normalizes the whole
 * d_inner row (not per group as mamba_ssm does): so do we.
 *
 * A recurrent model has no position limit: n_ctx is set to 1 << 20 positions.
 */
#include <stdio.h>

#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"
#include "ssm2.h"

static const struct ssm2_keys mamba2_keys = {
    .n_head = "num_heads", .head_dim = "head_dim", .d_state = "state_size",
    .n_group = "n_groups", .d_conv = "conv_kernel", .expand = "expand", .inner = NULL,
    .conv_bias = "use_conv_bias", .proj_bias = "use_bias", .chunk = "chunk_size",
    .eps = "layer_norm_epsilon", .act = "hidden_act",
    .def_n_head = 128, .def_head_dim = 64, .def_d_state = 128, .def_n_group = 8,
    .def_d_conv = 4, .def_chunk = 256, .def_expand = 2.0f, .def_eps = 1e-5f,
    .def_conv_bias = true, .def_proj_bias = false, .norm_per_group = false,
};

#define MAMBA2_CTX (1 << 20)

static int mamba2_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    if ((rc = cfg_int(cfg, "vocab_size", &hp->n_vocab, e)) < 0 ||
        (rc = cfg_int(cfg, "hidden_size", &hp->n_embd, e)) < 0 ||
        (rc = cfg_int(cfg, "num_hidden_layers", &hp->n_layer, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "layer_norm_epsilon", 1e-5f, &hp->norm_eps, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "tie_word_embeddings", false, &hp->tie_embd, e)) < 0)
        return rc;
    if ((rc = hparams_check_dim(hp->n_embd, "hidden_size", 1, HP_MAX_DIM, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_layer, "num_hidden_layers", 1, HP_MAX_LAYERS, e)) < 0 ||
        (rc = ssm2_parse(hp, cfg, &mamba2_keys, e)) < 0)
        return rc;
    /* no attention: the smallest attention sizes hparams_validate accepts */
    hp->n_head = hp->n_kv_head = hp->head_dim = 1;
    hp->n_ff = 1;
    hp->n_ctx = MAMBA2_CTX;
    hp->attn_scale = 1.0f;
    hparams_fill_layers(hp);
    for (int il = 0; il < hp->n_layer; il++) {
        hp->layer[il].ffn = FFN_NONE;
        ssm2_layer(hp, il);
    }
    return 0;
}

static int mamba2_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    struct wmap w = {st, &m->hp.quant};
    char pre[128];
    int rc;
    if ((rc = hf_map_head(m, &w, "backbone.embeddings", "backbone.norm_f", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < m->hp.n_layer; il++) {
        struct layer *L = &m->layers[il];
        snprintf(pre, sizeof pre, "backbone.layers.%d.mixer", il);
        if ((rc = wm_vec(&w, &L->attn_norm, WM_REQUIRED, m->hp.n_embd, e,
                         "backbone.layers.%d.norm.weight", il)) < 0 ||
            (rc = ssm2_map(m, &w, L, pre, e)) < 0)
            return rc;
    }
    return 0;
}

/* mlx-lm's sanitize moves conv1d's kernel axis last but one: [ch, 1, K] -> [ch, K, 1] */
static void mamba2_convert_views(const struct hparams *hp, struct ck_view_rule *out)
{
    (void)hp;
    out[0] = (struct ck_view_rule){"backbone.layers.%d.mixer.conv1d.weight", "backbone.layers.%d.mixer.conv1d.weight", CK_VIEW_T, 0, 0};
    out[1] = (struct ck_view_rule){NULL, NULL, CK_VIEW_NONE, 0, 0};
}

static const char *const mamba2_archs[] = {"Mamba2ForCausalLM", NULL};

const struct model_ops mamba2_ops = {
    .family = "mamba2",
    .description = "Mamba-2: SSD state-space mixer blocks, no attention, fixed state per sequence",
    .architectures = mamba2_archs,
    .parse_config = mamba2_parse_config,
    .map_weights = mamba2_map_weights,
    .convert_views = mamba2_convert_views,
    .forward = decoder_forward,
};
