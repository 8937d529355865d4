/*
 * granitemoehybrid: GraniteMoeHybridForCausalLM (IBM Granite 4.0-H). Granite's block with
 * its four multipliers (granite.c), whose mixer is Mamba-2 or attention by layer_types and
 * whose FFN is a top-k MoE plus an always-on shared SwiGLU expert (or the shared MLP alone
 * when num_local_experts is 0), on the shared decoder:
 *
 *   x = embedding_multiplier * embed(ids)
 *   x += residual_multiplier * mixer(rmsnorm(x))           input_layernorm; mamba / self_attn
 *   x += residual_multiplier * (moe(h) + shared_mlp(h)),   h = rmsnorm(x) (post_attention_layernorm)
 *   logits = lm_head(rmsnorm(x)) / logits_scaling
 *
 * moe: router.layer logits, top-k, softmax over the k (ROUTER_TOPK_SOFTMAX); experts
 * input_linear [E, 2 ff, d] whose first half rows are the gate and second the up (viewed
 * as two expert_linears, no copy), output_linear [E, d, ff]; mlx-lm's switch_mlp
 * {gate,up,down}_proj also load. shared_mlp: input_linear [2 s, d] (gate | up rows),
 * output_linear [d, s]; mlx-lm's dense models carry it as mlp.{gate,up,down}_proj.
 *
 * Config (transformers GraniteMoeHybridConfig): the Llama fields (rms_norm_eps 1e-6,
 * rope_theta 1e4, tie_word_embeddings false, attention_bias, mlp_bias refused), the Granite
 * multipliers (1), position_embedding_type ("rope": rope; absent, null or "nope": none, as
 * transformers rotates only for "rope"; mlx-lm's default "rope" differs there),
 * layer_types (absent: every layer Mamba-2; "mamba" / "linear_attention",
 * "attention" / "full_attention"; its length must be num_hidden_layers),
 * num_local_experts (0: dense), num_experts_per_tok, shared_intermediate_size (> 0), and
 * the mixer's mamba_* fields as Bamba's (bamba.c; gated norm over the whole inner row with
 * rms_norm_eps). Not read: output_router_logits, router_aux_loss_coef (training).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"
#include "ssm2.h"

static const struct hf_defaults gmh_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

static const struct ssm2_keys gmh_keys = {
    .n_head = "mamba_n_heads", .head_dim = "mamba_d_head", .d_state = "mamba_d_state",
    .n_group = "mamba_n_groups", .d_conv = "mamba_d_conv", .expand = "mamba_expand",
    .inner = NULL, .conv_bias = "mamba_conv_bias", .proj_bias = "mamba_proj_bias",
    .chunk = "mamba_chunk_size", .eps = "rms_norm_eps", .act = "hidden_act",
    .def_n_head = 128, .def_head_dim = 0, .def_d_state = 256, .def_n_group = 1,
    .def_d_conv = 4, .def_chunk = 256, .def_expand = 2.0f, .def_eps = 1e-6f,
    .def_conv_bias = true, .def_proj_bias = false, .norm_per_group = false,
};

static int multiplier(const cJSON *cfg, const char *key, float *out, struct err *e)
{
    int rc = cfg_opt_float(cfg, key, 1.0f, out, e);
    if (rc == 0 && (!isfinite(*out) || *out == 0.0f))
        return err_setf(e, ERR_CONFIG, "config field '%s' = %g must be finite and non-zero", key,
                        (double)*out);
    return rc;
}

/* layer_types into each layer's mixer */
static int gmh_layers(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types");
    if (!lt || cJSON_IsNull(lt)) {
        for (int il = 0; il < hp->n_layer; il++)
            ssm2_layer(hp, il);
        return 0;
    }
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != hp->n_layer)
        return err_setf(e, ERR_CONFIG, "config field 'layer_types' must list num_hidden_layers = "
                        "%d layer types", hp->n_layer);
    int il = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, lt) {
        const char *s = cJSON_IsString(t) ? t->valuestring : "(not a string)";
        if (strcmp(s, "mamba") == 0 || strcmp(s, "linear_attention") == 0)
            ssm2_layer(hp, il);
        else if (strcmp(s, "attention") != 0 && strcmp(s, "full_attention") != 0)
            return err_setf(e, ERR_CONFIG, "config field 'layer_types'[%d] = '%s' is not mamba "
                            "or attention", il, s);
        il++;
    }
    return 0;
}

static int gmh_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    float attn_mult, logits_scaling;
    int rc, shared, ff;
    char pos[16];
    if ((rc = hf_parse_decoder(hp, cfg, &gmh_defaults, e)) < 0 ||
        (rc = multiplier(cfg, "embedding_multiplier", &hp->embd_scale, e)) < 0 ||
        (rc = multiplier(cfg, "residual_multiplier", &hp->residual_scale, e)) < 0 ||
        (rc = multiplier(cfg, "attention_multiplier", &attn_mult, e)) < 0 ||
        (rc = multiplier(cfg, "logits_scaling", &logits_scaling, e)) < 0 ||
        (rc = cfg_opt_str(cfg, "position_embedding_type", "", pos, sizeof pos, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_local_experts", 8, &hp->n_expert, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_experts_per_tok", 2, &hp->n_expert_used, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "shared_intermediate_size", 1024, &shared, e)) < 0 ||
        (rc = ssm2_parse(hp, cfg, &gmh_keys, e)) < 0)
        return rc;
    hp->logit_scale = 1.0f / logits_scaling;
    hp->attn_scale = attn_mult;
    /* transformers rotates only for "rope": absent, null and "nope" (the published Granite
     * 4.0-H configs) mean no position embedding; other values are refused */
    if (!pos[0] || strcmp(pos, "nope") == 0)
        hp->n_rot = 0;
    else if (strcmp(pos, "rope") != 0)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'position_embedding_type' = '%s' is not "
                        "supported", pos);
    if ((rc = hparams_check_dim(shared, "shared_intermediate_size", 1, HP_MAX_DIM, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_expert, "num_local_experts", 0, HP_MAX_EXPERTS, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_layer, "num_hidden_layers", 1, HP_MAX_LAYERS, e)) < 0)
        return rc;
    ff = hp->n_ff;
    if (hp->n_expert > 0) {
        hp->router = ROUTER_TOPK_SOFTMAX;
        hp->n_ff = ff > shared ? ff : shared;  /* the widest FFN of the block */
    } else {
        hp->n_ff = shared;                      /* dense: the shared MLP alone */
    }
    hparams_fill_layers(hp);
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer_spec *ls = &hp->layer[il];
        ls->n_ff = hp->n_expert > 0 ? ff : shared;
        if (hp->n_expert > 0) {
            ls->n_ff_shexp = shared;
            ls->shexp_plain = true;
        }
    }
    return gmh_layers(hp, cfg, e);
}

/* [2 n, d] rows gate | up of one linear (or a stacked expert's slice) into two views */
static void split_gate_up(const struct tensor *t, int64_t n, struct tensor *gate, struct tensor *up)
{
    *gate = tensor_rows(t, 0, n);
    *up = tensor_rows(t, n, n);
}

static int map_moe(struct model *m, struct wmap *w, struct layer *L, int il, struct err *e)
{
    const struct hparams *hp = &m->hp;
    int64_t d = hp->n_embd, ff = hp->layer[il].n_ff, E = hp->n_expert;
    char pre[128];
    int rc;
    snprintf(pre, sizeof pre, "model.layers.%d.block_sparse_moe", il);
    if ((rc = wm_linear(w, &L->router, WM_REQUIRED, 0, E, d, e, "%s.router.layer", pre)) < 0)
        return rc;
    if (wm_has(w, "%s.switch_mlp.gate_proj.weight", pre) ||
        wm_has(w, "%s.switch_mlp.gate_proj.scales", pre)) {
        /* mlx-lm's sanitize: switch_mlp.{gate,up,down}_proj, stacked */
        char g[160], u[160], dn[160];
        snprintf(g, sizeof g, "model.layers.%%d.block_sparse_moe.switch_mlp.gate_proj");
        snprintf(u, sizeof u, "model.layers.%%d.block_sparse_moe.switch_mlp.up_proj");
        snprintf(dn, sizeof dn, "model.layers.%%d.block_sparse_moe.switch_mlp.down_proj");
        if ((rc = hf_map_expert_linear(m, w, &L->ex.gate, il, ff, d, false, g, g, e)) < 0 ||
            (rc = hf_map_expert_linear(m, w, &L->ex.up, il, ff, d, false, u, u, e)) < 0 ||
            (rc = hf_map_expert_linear(m, w, &L->ex.down, il, d, ff, false, dn, dn, e)) < 0)
            return rc;
        return 0;
    }
    struct tensor in, out;
    if ((rc = wm_linear(w, &in, WM_REQUIRED, E, 2 * ff, d, e, "%s.input_linear", pre)) < 0 ||
        (rc = wm_linear(w, &out, WM_REQUIRED, E, d, ff, e, "%s.output_linear", pre)) < 0 ||
        (rc = hf_expert_views(m, &L->ex.gate, false, e)) < 0 ||
        (rc = hf_expert_views(m, &L->ex.up, false, e)) < 0 ||
        (rc = hf_expert_views(m, &L->ex.down, false, e)) < 0)
        return rc;
    for (int x = 0; x < E; x++) {
        struct tensor s = tensor_slice0(&in, x);
        split_gate_up(&s, ff, &L->ex.gate.w[x], &L->ex.up.w[x]);
        L->ex.down.w[x] = tensor_slice0(&out, x);
    }
    return 0;
}

/* shared_mlp (input_linear gate | up, output_linear) into g / u / dn, or mlx-lm's mlp.* */
static int map_shared(struct wmap *w, int il, int64_t s, int64_t d, struct tensor *g,
                      struct tensor *u, struct tensor *dn, struct err *e)
{
    char pre[128];
    int rc;
    snprintf(pre, sizeof pre, "model.layers.%d.shared_mlp", il);
    if (!wm_has(w, "%s.input_linear.weight", pre) && !wm_has(w, "%s.input_linear.scales", pre) &&
        (wm_has(w, "model.layers.%d.mlp.gate_proj.weight", il) ||
         wm_has(w, "model.layers.%d.mlp.gate_proj.scales", il))) {
        snprintf(pre, sizeof pre, "model.layers.%d.mlp", il);
        if ((rc = wm_linear(w, g, WM_REQUIRED, 0, s, d, e, "%s.gate_proj", pre)) < 0 ||
            (rc = wm_linear(w, u, WM_REQUIRED, 0, s, d, e, "%s.up_proj", pre)) < 0)
            return rc;
        return wm_linear(w, dn, WM_REQUIRED, 0, d, s, e, "%s.down_proj", pre);
    }
    struct tensor in;
    if ((rc = wm_linear(w, &in, WM_REQUIRED, 0, 2 * s, d, e, "%s.input_linear", pre)) < 0)
        return rc;
    split_gate_up(&in, s, g, u);
    return wm_linear(w, dn, WM_REQUIRED, 0, d, s, e, "%s.output_linear", pre);
}

static int gmh_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &hp->quant};
    char pre[128];
    int rc;
    if (hp->n_expert > 0 && (rc = hf_experts_alloc(m, e)) < 0)
        return rc;
    if ((rc = hf_map_head(m, &w, "model.embed_tokens", "model.norm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        struct layer *L = &m->layers[il];
        int64_t d = hp->n_embd;
        snprintf(pre, sizeof pre, "model.layers.%d", il);
        if ((rc = wm_vec(&w, &L->attn_norm, WM_REQUIRED, d, e, "%s.input_layernorm.weight", pre)) < 0 ||
            (rc = wm_vec(&w, &L->ffn_norm, WM_REQUIRED, d, e, "%s.post_attention_layernorm.weight",
                         pre)) < 0)
            return rc;
        if (ls->mixer == MIXER_MAMBA2) {
            snprintf(pre, sizeof pre, "model.layers.%d.mamba", il);
            rc = ssm2_map(m, &w, L, pre, e);
        } else {
            rc = hf_map_attention(&w, hp, L, il, e);
        }
        if (rc < 0)
            return rc;
        if (ls->moe && ((rc = map_moe(m, &w, L, il, e)) < 0 ||
                        (rc = map_shared(&w, il, ls->n_ff_shexp, d, &L->shexp_gate, &L->shexp_up,
                                         &L->shexp_down, e)) < 0))
            return rc;
        if (!ls->moe && (rc = map_shared(&w, il, ls->n_ff, d, &L->gate, &L->up, &L->down, e)) < 0)
            return rc;
    }
    return 0;
}

/* mlx-lm's sanitize moves conv1d's kernel axis last but one: [ch, 1, K] -> [ch, K, 1] */
static void granitemoehybrid_convert_views(const struct hparams *hp, struct ck_view_rule *out)
{
    (void)hp;
    out[0] = (struct ck_view_rule){"model.layers.%d.mamba.conv1d.weight", "model.layers.%d.mamba.conv1d.weight", CK_VIEW_T, 0, 0};
    out[1] = (struct ck_view_rule){NULL, NULL, CK_VIEW_NONE, 0, 0};
}

/* mlx-lm's quant_predicate: the router at 8 bits, group 64 (affine) */
static int gmh_quant_predicate(const char *module, const struct quant_params *base,
                               struct quant_params *qp)
{
    static const char suffix[] = ".block_sparse_moe.router.layer";
    size_t a = strlen(module), b = sizeof suffix - 1;
    if (a < b || strcmp(module + a - b, suffix) != 0)
        return CK_Q_DEFAULT;
    *qp = (struct quant_params){QMODE_AFFINE, 8, 64, base->variant};
    return CK_Q_OVERRIDE;
}

static const char *const gmh_archs[] = {"GraniteMoeHybridForCausalLM", NULL};

const struct model_ops granitemoehybrid_ops = {
    .family = "granitemoehybrid",
    .description = "Granite 4.0-H: Mamba-2 / attention layers, top-k MoE plus a shared expert, "
                   "Granite multipliers",
    .architectures = gmh_archs,
    .parse_config = gmh_parse_config,
    .map_weights = gmh_map_weights,
    .convert_views = granitemoehybrid_convert_views,
    .quant_predicate = gmh_quant_predicate,
    .forward = decoder_forward,
};
