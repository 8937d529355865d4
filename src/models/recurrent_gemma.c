/*
 * recurrent_gemma: RecurrentGemmaForCausalLM (Griffin; transformers
 * modeling_recurrent_gemma.py, mlx-lm models/recurrent_gemma.py), on the shared decoder
 * (ADR 0073):
 *
 *   x     = bf16(sqrt(hidden_size)) * embed(ids)       (transformers' normalizer is a bf16 buffer)
 *   layer = x += temporal(rms(x));  x += mlp(rms(x))   every norm Gemma's, weight used as 1 + w
 *   temporal, by block_types[il % len(block_types)]:
 *     "recurrent": linear_out(rglru(conv1d(linear_x(h))) * act(linear_y(h)))  (blk_rglru;
 *                  MIXER_RGLRU, the conv and RG-LRU states per sequence)
 *     "attention": local attention over the last attention_window_size positions, MQA / GQA
 *                  of num_key_value_heads, rotary on the first half of each head (rotate-half),
 *                  scale head_dim^-0.5, o_proj with a bias
 *   mlp   = down(act(gate(h)) * up(h)) of intermediate_size / 2, biases on all three
 *   head  = 30 tanh(lm_head(rms(x)) / 30) (logits_soft_cap), lm_head tied to the embeddings
 *
 * Config (RecurrentGemmaConfig, transformers 5 defaults): vocab_size 256000, hidden_size
 * 2560, num_hidden_layers 26, num_attention_heads 10, num_key_value_heads = heads, head_dim
 * = hidden / heads, intermediate_size 3 x hidden, lru_width = hidden, attention_window_size
 * 2048, conv1d_width 4, logits_soft_cap 30, rms_norm_eps 1e-6, rope_theta 10000,
 * partial_rotary_factor 0.5 (transformers splits each head into int(1 / factor) chunks and
 * rotates the first of two: any other split is refused), hidden_activation gelu_pytorch_tanh,
 * block_types [recurrent, recurrent, attention], attention_bias false, tie_word_embeddings
 * true. w_init_variance_scale, final_w_init_variance_scale and attention_dropout only
 * initialize or train. There is no position limit (a window and fixed states): the context
 * defaults to 2^20 positions, as for Mamba.
 *
 * Weights: model.embed_tokens, model.final_norm, model.layers.N.{temporal_pre_norm,
 * channel_pre_norm, mlp_block.{gate,up,down}_proj, temporal_block.*}; a recurrent block's
 * conv_1d.weight is [lru, 1, K] (transformers) or [lru, K, 1] (mlx-lm's sanitize), widened
 * to F32 [lru, K] as the RG-LRU's gates, biases and recurrent_param are.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../core/dtype.h"
#include "../loading/config.h"
#include "../loading/convert.h"
#include "blocks.h"
#include "hf_common.h"

static const struct hf_defaults rg_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f, .rope_theta = 10000.0f, .partial_rotary = 0.5f,
    .act = "gelu_pytorch_tanh", .head_dim = 0, .sliding = false, .tie_embd = true,
};

/* A copy of cfg with RecurrentGemmaConfig's defaults and names written in where absent, so
 * that hf_parse_decoder reads them: the required decoder fields, hidden_activation as
 * hidden_act, partial_rotary_factor from rope_parameters, and a position limit. */
/* key = v in c unless cfg states key (v is then dropped); -1: out of memory */
static int put(cJSON *c, const cJSON *cfg, const char *key, cJSON *v)
{
    if (cfg_has(cfg, key)) {
        cJSON_Delete(v);
        return 0;
    }
    if (!v || !cJSON_AddItemToObject(c, key, v)) {
        cJSON_Delete(v);
        return -1;
    }
    return 0;
}

static int with_defaults(const cJSON *cfg, cJSON **out, struct err *e)
{
    cJSON *c = *out = cJSON_Duplicate(cfg, 1);
    if (!c)
        return err_setf(e, ERR_NOMEM, "recurrent_gemma config: out of memory");
    const cJSON *hs = cJSON_GetObjectItemCaseSensitive(cfg, "hidden_size");
    double hidden = cJSON_IsNumber(hs) ? hs->valuedouble : 2560.0;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    const cJSON *prf = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, "partial_rotary_factor")
                                          : NULL;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(cfg, "hidden_activation");
    /* the activations the common parser takes under hidden_act, refused here by their own name */
    static const char *const acts[] = {"silu", "swish", "gelu_new", "gelu_pytorch_tanh",
                                       "gelu_fast", "gelu", "relu", "relu2", NULL};
    if (act && !cJSON_IsNull(act)) {
        int k = 0;
        while (cJSON_IsString(act) && acts[k] && strcmp(acts[k], act->valuestring) != 0)
            k++;
        if (!cJSON_IsString(act) || !acts[k]) {
            cJSON_Delete(c);
            *out = NULL;
            return err_setf(e, ERR_UNSUPPORTED, "config field 'hidden_activation': the "
                            "activation is not supported");
        }
    }
    int rc = put(c, cfg, "vocab_size", cJSON_CreateNumber(256000)) |
             put(c, cfg, "hidden_size", cJSON_CreateNumber(2560)) |
             put(c, cfg, "num_hidden_layers", cJSON_CreateNumber(26)) |
             put(c, cfg, "num_attention_heads", cJSON_CreateNumber(10)) |
             put(c, cfg, "intermediate_size", cJSON_CreateNumber(3.0 * hidden)) |
             put(c, cfg, "max_position_embeddings", cJSON_CreateNumber(1 << 20));
    if (act && !cJSON_IsNull(act))
        rc |= put(c, cfg, "hidden_act", cJSON_Duplicate(act, 1));
    if (prf && !cJSON_IsNull(prf))
        rc |= put(c, cfg, "partial_rotary_factor", cJSON_Duplicate(prf, 1));
    if (rc) {
        cJSON_Delete(c);
        *out = NULL;
        return err_setf(e, ERR_NOMEM, "recurrent_gemma config: out of memory");
    }
    return 0;
}

/* block_types repeated over the layers (transformers' layers_block_type). */
static int layer_kinds(struct hparams *hp, const cJSON *cfg, int window, struct err *e)
{
    const cJSON *bt = cJSON_GetObjectItemCaseSensitive(cfg, "block_types");
    static const char *const def[] = {"recurrent", "recurrent", "attention"};
    int n = 3;
    if (bt && !cJSON_IsNull(bt)) {
        if (!cJSON_IsArray(bt) || (n = cJSON_GetArraySize(bt)) < 1)
            return err_setf(e, ERR_CONFIG, "config field 'block_types' must be a non-empty list");
    } else {
        bt = NULL;
    }
    int K = hp->ssm.d_conv, w = hp->ssm.d_inner;
    for (int il = 0; il < hp->n_layer; il++) {
        const char *s = def[il % 3];
        if (bt) {
            const cJSON *t = cJSON_GetArrayItem(bt, il % n);
            s = cJSON_IsString(t) ? t->valuestring : "(not a string)";
        }
        struct layer_spec *ls = &hp->layer[il];
        if (strcmp(s, "recurrent") == 0) {
            ls->mixer = MIXER_RGLRU;
            ls->kv = KV_RECURRENT;
            ls->n_rot = 0;
            ls->state_conv = (K - 1) * w;
            ls->state_rec = w;
        } else if (strcmp(s, "attention") == 0) {
            ls->kv = KV_SLIDING;
            ls->window = window;
        } else {
            return err_setf(e, ERR_UNSUPPORTED, "config field 'block_types'[%d] = '%s' is not "
                            "supported (recurrent, attention)", il % n, s);
        }
    }
    return 0;
}

static int rg_parse_config(struct hparams *hp, const cJSON *cfg0, struct err *e)
{
    cJSON *cfg;
    int rc = with_defaults(cfg0, &cfg, e), window, K, w, inter;
    float cap;
    if (rc < 0)
        return rc;
    if ((rc = hf_parse_decoder(hp, cfg, &rg_defaults, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "lru_width", hp->n_embd, &w, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "conv1d_width", 4, &K, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "attention_window_size", 2048, &window, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "logits_soft_cap", 30.0f, &cap, e)) < 0 ||
        (rc = cfg_int(cfg, "intermediate_size", &inter, e)) < 0)
        goto out;
    if (cfg_has(cfg0, "lru_width") && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cfg0, "lru_width")))
        w = hp->n_embd;
    if ((rc = hparams_check_dim(hp->n_layer, "num_hidden_layers", 1, HP_MAX_LAYERS, e)) < 0 ||
        (rc = hparams_check_dim(w, "lru_width", 1, HP_MAX_DIM, e)) < 0 ||
        (rc = hparams_check_dim(K, "conv1d_width", 1, 64, e)) < 0 ||
        (rc = hparams_check_dim(window, "attention_window_size", 1, 1 << 20, e)) < 0 ||
        (rc = hparams_check_dim(inter, "intermediate_size", 2, HP_MAX_DIM, e)) < 0)
        goto out;
    if (w % hp->n_head != 0) {
        rc = err_setf(e, ERR_CONFIG, "config field 'lru_width' = %d is not a multiple of "
                      "num_attention_heads %d (the RG-LRU's gate blocks)", w, hp->n_head);
        goto out;
    }
    if (hp->n_rot * 2 != hp->head_dim) {
        rc = err_setf(e, ERR_UNSUPPORTED, "config field 'partial_rotary_factor': transformers "
                      "rotates the first of two halves of a head; %d of %d rotary dims is not "
                      "that", hp->n_rot, hp->head_dim);
        goto out;
    }
    if (hp->rope != ROPE_DEFAULT) {
        rc = err_setf(e, ERR_UNSUPPORTED, "config field 'rope_parameters': RecurrentGemma takes "
                      "the default rope type only");
        goto out;
    }
    if (!(cap > 0.0f)) {
        rc = err_setf(e, ERR_CONFIG, "config field 'logits_soft_cap' = %g must be positive",
                      (double)cap);
        goto out;
    }
    hp->n_ff = inter / 2;
    hp->ffn = FFN_GLU;
    hp->norm = NORM_RMS;
    hp->norm_w_offset = 1.0f;
    hp->out_bias = true;
    hp->logit_softcap = cap;
    hp->embd_scale = bf16_to_f32(f32_to_bf16(sqrtf((float)hp->n_embd)));
    hp->ssm.d_inner = w;
    hp->ssm.d_conv = K;
    hp->ssm.n_head = hp->n_head;
    hp->ssm.head_dim = w / hp->n_head;
    hp->ssm.conv_bias = hp->ssm.proj_bias = true;
    if ((int64_t)(K - 1) * w > HP_MAX_STATE) {
        rc = err_setf(e, ERR_CONFIG, "config fields 'conv1d_width' / 'lru_width': a state of "
                      "%lld floats exceeds %d", (long long)(K - 1) * w, HP_MAX_STATE);
        goto out;
    }
    hp->rec_scratch = blk_rglru_scratch(w);
    hparams_fill_layers(hp);
    rc = layer_kinds(hp, cfg, window, e);
out:
    cJSON_Delete(cfg);
    return rc;
}

static int map_attention(struct wmap *w, const struct hparams *hp, struct layer *L, const char *pre,
                         struct err *e)
{
    int64_t d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim,
            kvd = (int64_t)hp->n_kv_head * hp->head_dim;
    bool b = hp->qkv_bias;
    int rc;
    if ((rc = wm_linear(w, &L->wq, WM_REQUIRED, 0, qd, d, e, "%s.q_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wk, WM_REQUIRED, 0, kvd, d, e, "%s.k_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wv, WM_REQUIRED, 0, kvd, d, e, "%s.v_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wo, WM_REQUIRED, 0, d, qd, e, "%s.o_proj", pre)) < 0 ||
        (rc = wm_vec(w, &L->bo, WM_REQUIRED, d, e, "%s.o_proj.bias", pre)) < 0 ||
        (b && (rc = wm_vec(w, &L->bq, WM_REQUIRED, qd, e, "%s.q_proj.bias", pre)) < 0) ||
        (b && (rc = wm_vec(w, &L->bk, WM_REQUIRED, kvd, e, "%s.k_proj.bias", pre)) < 0) ||
        (b && (rc = wm_vec(w, &L->bv, WM_REQUIRED, kvd, e, "%s.v_proj.bias", pre)) < 0))
        return rc;
    return 0;
}

/* an F32 copy of a tensor given its shape */
static int f32_tensor(struct model *m, struct wmap *w, struct tensor *t, int ndim,
                      const int64_t *shape, struct err *e, const char *pre, const char *name)
{
    int rc = wm_tensor(w, t, WM_REQUIRED, ndim, shape, e, "%s.%s", pre, name);
    return rc < 0 ? rc : model_widen_f32(m, t, e);
}

static int map_recurrent(struct model *m, struct wmap *w, struct layer *L, const char *pre,
                         struct err *e)
{
    const struct hparams *hp = &m->hp;
    int64_t d = hp->n_embd, lw = hp->ssm.d_inner, K = hp->ssm.d_conv, H = hp->ssm.n_head,
            bw = lw / H;
    int64_t g3[3] = {H, bw, bw}, g2[2] = {H, bw}, v1[1] = {lw};
    char rg[256], name[300];
    int rc;
    snprintf(rg, sizeof rg, "%s.rg_lru", pre);
    if ((rc = wm_linear(w, &L->rg_y, WM_REQUIRED, 0, lw, d, e, "%s.linear_y", pre)) < 0 ||
        (rc = wm_vec(w, &L->rg_y_b, WM_REQUIRED, lw, e, "%s.linear_y.bias", pre)) < 0 ||
        (rc = wm_linear(w, &L->ssm_in, WM_REQUIRED, 0, lw, d, e, "%s.linear_x", pre)) < 0 ||
        (rc = wm_vec(w, &L->ssm_in_b, WM_REQUIRED, lw, e, "%s.linear_x.bias", pre)) < 0 ||
        (rc = wm_linear(w, &L->ssm_out, WM_REQUIRED, 0, d, lw, e, "%s.linear_out", pre)) < 0 ||
        (rc = wm_vec(w, &L->ssm_out_b, WM_REQUIRED, d, e, "%s.linear_out.bias", pre)) < 0 ||
        (rc = f32_tensor(m, w, &L->rg_wi, 3, g3, e, rg, "input_gate_weight")) < 0 ||
        (rc = f32_tensor(m, w, &L->rg_bi, 2, g2, e, rg, "input_gate_bias")) < 0 ||
        (rc = f32_tensor(m, w, &L->rg_wa, 3, g3, e, rg, "recurrent_gate_weight")) < 0 ||
        (rc = f32_tensor(m, w, &L->rg_ba, 2, g2, e, rg, "recurrent_gate_bias")) < 0 ||
        (rc = f32_tensor(m, w, &L->rg_a, 1, v1, e, rg, "recurrent_param")) < 0 ||
        (rc = f32_tensor(m, w, &L->ssm_conv_b, 1, v1, e, pre, "conv_1d.bias")) < 0)
        return rc;
    /* [lw, 1, K] as transformers stores it, or [lw, K, 1] as mlx-lm does: the same bytes */
    snprintf(name, sizeof name, "%s.conv_1d.weight", pre);
    const struct st_tensor *t = st_set_find(w->st, name);
    bool mlx = t && t->ndim == 3 && t->shape[1] == K && t->shape[2] == 1 && K != 1;
    int64_t shape3[3] = {lw, mlx ? K : 1, mlx ? 1 : K}, flat[2] = {lw, K};
    if ((rc = wm_tensor(w, &L->ssm_conv, WM_REQUIRED, 3, shape3, e, "%s", name)) < 0 ||
        (rc = model_widen_f32(m, &L->ssm_conv, e)) < 0)
        return rc;
    const char *tn = L->ssm_conv.name;
    tensor_init(&L->ssm_conv, DTYPE_F32, L->ssm_conv.data, 2, flat);
    L->ssm_conv.name = tn;
    return 0;
}

static int rg_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &hp->quant};
    int64_t d = hp->n_embd, ff = hp->n_ff;
    int rc;
    if ((rc = hf_map_head(m, &w, "model.embed_tokens", "model.final_norm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *L = &m->layers[il];
        char pre[64], tb[96], mlp[96], n1[96], n2[96];
        snprintf(pre, sizeof pre, "model.layers.%d", il);
        snprintf(tb, sizeof tb, "%s.temporal_block", pre);
        snprintf(mlp, sizeof mlp, "%s.mlp_block", pre);
        snprintf(n1, sizeof n1, "%s.temporal_pre_norm", pre);
        snprintf(n2, sizeof n2, "%s.channel_pre_norm", pre);
        if ((rc = hf_map_norm(&w, hp, &L->attn_norm, &L->attn_norm_b, n1, e)) < 0 ||
            (rc = hf_map_norm(&w, hp, &L->ffn_norm, &L->ffn_norm_b, n2, e)) < 0 ||
            (rc = wm_linear(&w, &L->gate, WM_REQUIRED, 0, ff, d, e, "%s.gate_proj", mlp)) < 0 ||
            (rc = wm_vec(&w, &L->gate_b, WM_REQUIRED, ff, e, "%s.gate_proj.bias", mlp)) < 0 ||
            (rc = wm_linear(&w, &L->up, WM_REQUIRED, 0, ff, d, e, "%s.up_proj", mlp)) < 0 ||
            (rc = wm_vec(&w, &L->up_b, WM_REQUIRED, ff, e, "%s.up_proj.bias", mlp)) < 0 ||
            (rc = wm_linear(&w, &L->down, WM_REQUIRED, 0, d, ff, e, "%s.down_proj", mlp)) < 0 ||
            (rc = wm_vec(&w, &L->down_b, WM_REQUIRED, d, e, "%s.down_proj.bias", mlp)) < 0)
            return rc;
        rc = hp->layer[il].mixer == MIXER_RGLRU ? map_recurrent(m, &w, L, tb, e)
                                                : map_attention(&w, hp, L, tb, e);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* mlx-lm's sanitize: conv_1d.weight [lru, 1, K] moves its axes to [lru, K, 1] */
static const struct ck_view_rule rg_views[] = {
    {"model.layers.%d.temporal_block.conv_1d.weight", "model.layers.%d.temporal_block.conv_1d.weight",
     CK_VIEW_T, 0, 0},
    {NULL, NULL, CK_VIEW_NONE, 0, 0},
};

static void rg_convert_views(const struct hparams *hp, struct ck_view_rule *out)
{
    (void)hp;
    memcpy(out, rg_views, sizeof rg_views);
}

static const char *const rg_archs[] = {"RecurrentGemmaForCausalLM", NULL};

const struct model_ops recurrent_gemma_ops = {
    .family = "recurrent_gemma",
    .description = "RecurrentGemma (Griffin): RG-LRU recurrent blocks and local MQA attention, "
                   "Gemma norms, gelu MLP with biases, logit soft-cap",
    .architectures = rg_archs,
    .parse_config = rg_parse_config,
    .map_weights = rg_map_weights,
    .forward = decoder_forward,
    .convert_views = rg_convert_views,
};
