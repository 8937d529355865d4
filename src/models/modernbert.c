/*
 * modernbert: ModernBertModel and ModernBertForSequenceClassification (transformers
 * modeling_modernbert.py), an encoder (hp.encoder) run by the packed encoder path (ADR 0083,
 * 0092, 0093):
 *
 *   x     = LN_e(tok[id])                                   no position table: rope
 *   block : x += Wo(attend(rope(q), rope(k), v)),  q|k|v = Wqkv(LN_a(x))   LN_a: none in layer 0
 *           x += mlp.Wo(act(a) * g),  a|g = Wi(LN_m(x))                     GeGLU (act: gelu)
 *   out   : x = LN_f(x)                                     the last hidden state
 *   head  : logits = classifier(LN_h(gelu(head.dense(x[first token]))))   (classification)
 *           classifier_pooling "mean": of the mean of the sequence's rows instead (hp.cls_mean)
 *
 * Layers are global (full attention over the sequence, rope theta global_rope_theta /
 * rope_parameters.full_attention, 160000) or local (`layer_types` "sliding_attention", else
 * every layer but each global_attn_every_n_layers-th): a band of local_attention / 2 positions
 * each side, |i - j| <= local_attention / 2 as transformers' sliding_window_mask (rope theta
 * local_rope_theta / rope_parameters.sliding_attention, 10000). A local layer is KV_SLIDING
 * with window = 2 (local_attention / 2) + 1 (the positions a row attends, its own included);
 * the encoder gives its rows that band as their span (encode.c, ADR 0093). No biases
 * (attention_bias / mlp_bias true are refused), LayerNorms without bias unless norm_bias.
 *
 * Checkpoint names: the base model's ("embeddings.tok_embeddings", "layers.N.attn.Wqkv",
 * "final_norm", ...) with the "model." prefix in task-head checkpoints, head.dense, head.norm
 * and classifier there.
 */
#include <stdio.h>
#include <string.h>

#include "../loading/config.h"
#include "../loading/wmap.h"
#include "blocks.h"
#include "hf_common.h"

static const struct hf_defaults modernbert_defaults = {
    .eps_key = "norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 160000.0f, .partial_rotary = 1.0f, .act = "gelu",
    .head_dim = 0, .sliding = false, .tie_embd = true,
};

/* transformers' ACT2FN names the family accepts for hidden_activation */
static int act_of(const cJSON *cfg, const char *key, enum act_kind *out, struct err *e)
{
    char a[64];
    int rc = cfg_opt_str(cfg, key, "gelu", a, sizeof a, e);
    if (rc < 0)
        return rc;
    if (strcmp(a, "gelu") == 0)
        *out = ACT_GELU_ERF;
    else if (strcmp(a, "gelu_pytorch_tanh") == 0 || strcmp(a, "gelu_new") == 0)
        *out = ACT_GELU_TANH;
    else if (strcmp(a, "silu") == 0)
        *out = ACT_SILU;
    else if (strcmp(a, "relu") == 0)
        *out = ACT_RELU;
    else
        return err_setf(e, ERR_UNSUPPORTED, "config field '%s': activation '%s' is not supported",
                        key, a);
    return 0;
}

/* The rope thetas: rope_parameters {"full_attention": {rope_theta}, "sliding_attention":
 * {rope_theta}} (transformers 5), else global_rope_theta / local_rope_theta. */
static int rope_thetas(const cJSON *cfg, float *global, float *local, struct err *e)
{
    int rc;
    if ((rc = cfg_opt_float(cfg, "global_rope_theta", 160000.0f, global, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "local_rope_theta", 10000.0f, local, e)) < 0)
        return rc;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    if (!cJSON_IsObject(rp))
        return 0;
    const cJSON *full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
    const cJSON *slide = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
    char type[32];
    for (int i = 0; i < 2; i++) {
        const cJSON *p = i ? slide : full;
        if (!cJSON_IsObject(p))
            continue;
        if ((rc = cfg_opt_str(p, "rope_type", "default", type, sizeof type, e)) < 0 ||
            (rc = cfg_opt_float(p, "rope_theta", i ? *local : *global, i ? local : global, e)) < 0)
            return rc;
        if (strcmp(type, "default") != 0)
            return err_setf(e, ERR_UNSUPPORTED, "config field 'rope_parameters.%s.rope_type' = "
                            "'%s' is not supported (only \"default\")",
                            i ? "sliding_attention" : "full_attention", type);
    }
    return 0;
}

/* Which layers are local: layer_types when listed, else il % global_attn_every_n_layers. */
static int local_layers(const cJSON *cfg, int n_layer, bool *local, struct err *e)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types"), *it;
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != n_layer)
            return err_setf(e, ERR_CONFIG, "config field 'layer_types' must list %d layer types",
                            n_layer);
        int il = 0;
        cJSON_ArrayForEach(it, lt) {
            if (!cJSON_IsString(it) || (strcmp(it->valuestring, "full_attention") != 0 &&
                                        strcmp(it->valuestring, "sliding_attention") != 0))
                return err_setf(e, ERR_CONFIG, "config field 'layer_types'[%d]: expected "
                                "\"full_attention\" or \"sliding_attention\"", il);
            local[il] = it->valuestring[0] == 's';
            il++;
        }
        return 0;
    }
    int every, rc;
    if ((rc = cfg_opt_int(cfg, "global_attn_every_n_layers", 3, &every, e)) < 0 ||
        (rc = hparams_check_dim(every, "global_attn_every_n_layers", 1, 1 << 20, e)) < 0)
        return rc;
    for (int il = 0; il < n_layer; il++)
        local[il] = il % every != 0;
    return 0;
}

/* Whether config "architectures" names ModernBertForSequenceClassification. */
static bool is_classifier(const cJSON *cfg)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cfg, "architectures"), *it;
    cJSON_ArrayForEach(it, a)
        if (cJSON_IsString(it) && strstr(it->valuestring, "ForSequenceClassification"))
            return true;
    return false;
}

static int modernbert_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    bool local[HP_MAX_LAYERS], b;
    float g_theta, l_theta;
    int window, rc;
    enum act_kind act = ACT_GELU_ERF;
    char s[32];
    if ((rc = hf_parse_decoder(hp, cfg, &modernbert_defaults, e)) < 0 ||
        (rc = act_of(cfg, "hidden_activation", &act, e)) < 0 ||
        (rc = rope_thetas(cfg, &g_theta, &l_theta, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "local_attention", 128, &window, e)) < 0 ||
        (rc = hparams_check_dim(window, "local_attention", 0, 1 << 24, e)) < 0 ||
        (rc = local_layers(cfg, hp->n_layer, local, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "norm_bias", false, &hp->norm_bias, e)) < 0)
        return rc;
    static const char *const no_bias[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++) {
        if ((rc = cfg_opt_bool(cfg, no_bias[i], false, &b, e)) < 0)
            return rc;
        if (b)
            return err_setf(e, ERR_UNSUPPORTED, "config field '%s' = true is not supported "
                            "(ModernBERT's checkpoints have no such biases)", no_bias[i]);
    }
    if (hp->n_kv_head != hp->n_head)
        return err_setf(e, ERR_CONFIG, "config field 'num_key_value_heads' = %d: ModernBERT has "
                        "%d key/value heads, one per query head", hp->n_kv_head, hp->n_head);
    if (is_classifier(cfg)) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(cfg, "id2label");
        if (cJSON_IsObject(m))
            hp->n_cls = cJSON_GetArraySize(m);
        else if ((rc = cfg_opt_int(cfg, "num_labels", 2, &hp->n_cls, e)) < 0)
            return rc;
        if ((rc = hparams_check_dim(hp->n_cls, "num_labels", 1, 1 << 16, e)) < 0)
            return rc;
        if (hp->n_cls > hp->n_vocab)
            return err_setf(e, ERR_CONFIG, "num_labels %d exceeds vocab_size %d (the logits buffer)",
                            hp->n_cls, hp->n_vocab);
        if ((rc = cfg_opt_str(cfg, "classifier_pooling", "cls", s, sizeof s, e)) < 0)
            return rc;
        if (strcmp(s, "cls") != 0 && strcmp(s, "mean") != 0)
            return err_setf(e, ERR_UNSUPPORTED, "config field 'classifier_pooling' = '%s' is not "
                            "supported (\"cls\" or \"mean\")", s);
        hp->cls_mean = strcmp(s, "mean") == 0;
        if ((rc = cfg_opt_str(cfg, "classifier_activation", "gelu", s, sizeof s, e)) < 0)
            return rc;
        if (strcmp(s, "gelu") != 0)
            return err_setf(e, ERR_UNSUPPORTED, "config field 'classifier_activation' = '%s' is not "
                            "supported (only \"gelu\")", s);
    }
    hp->encoder = true;
    hp->n_type_vocab = 0;
    hp->pos_offset = 0;
    hp->pad_id = -1;
    hp->bos_id = -1;
    hp->n_eos = 0;
    hp->norm = NORM_LAYER;
    hp->qkv_bias = hp->out_bias = false;
    hp->ffn = FFN_GLU;
    hp->ffn_bias = false;
    hp->act = act;
    hp->rope_theta = g_theta;
    hparams_fill_layers(hp);
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer_spec *ls = &hp->layer[il];
        ls->residual = RESID_SEQUENTIAL;
        if (!local[il])
            continue;
        ls->kv = KV_SLIDING;
        ls->window = 2 * (window / 2) + 1;
        ls->rope_theta = l_theta;
    }
    return 0;
}

static int map_layer(struct wmap *w, const struct hparams *hp, struct layer *L, const char *pre,
                     int il, struct err *e)
{
    int64_t d = hp->n_embd, ff = hp->n_ff;
    char ln[192];
    int rc;
    if ((rc = wm_linear(w, &L->wqkv, WM_REQUIRED, 0, 3 * d, d, e, "%s.attn.Wqkv", pre)) < 0 ||
        (rc = wm_linear(w, &L->wo, WM_REQUIRED, 0, d, d, e, "%s.attn.Wo", pre)) < 0 ||
        (rc = wm_linear(w, &L->gate_up, WM_REQUIRED, 0, 2 * ff, d, e, "%s.mlp.Wi", pre)) < 0 ||
        (rc = wm_linear(w, &L->down, WM_REQUIRED, 0, d, ff, e, "%s.mlp.Wo", pre)) < 0)
        return rc;
    /* layer 0's attn_norm is nn.Identity: no weight */
    snprintf(ln, sizeof ln, "%s.attn_norm", pre);
    if (il > 0 && (rc = hf_map_norm(w, hp, &L->attn_norm, &L->attn_norm_b, ln, e)) < 0)
        return rc;
    snprintf(ln, sizeof ln, "%s.mlp_norm", pre);
    return hf_map_norm(w, hp, &L->ffn_norm, &L->ffn_norm_b, ln, e);
}

static int modernbert_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &hp->quant};
    int64_t d = hp->n_embd;
    char pre[160], ln[192];
    int rc;
    const char *p = wm_has(&w, "model.embeddings.tok_embeddings.weight") ? "model." : "";
    if ((rc = wm_linear(&w, &m->tok_embd, WM_REQUIRED, 0, hp->n_vocab, d, e,
                        "%sembeddings.tok_embeddings", p)) < 0)
        return rc;
    snprintf(ln, sizeof ln, "%sembeddings.norm", p);
    if ((rc = hf_map_norm(&w, hp, &m->embd_norm, &m->embd_norm_b, ln, e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        snprintf(pre, sizeof pre, "%slayers.%d", p, il);
        if ((rc = map_layer(&w, hp, &m->layers[il], pre, il, e)) < 0)
            return rc;
    }
    snprintf(ln, sizeof ln, "%sfinal_norm", p);
    if ((rc = hf_map_norm(&w, hp, &m->out_norm, &m->out_norm_b, ln, e)) < 0)
        return rc;
    if (hp->n_cls == 0) {
        /* ModernBertForMaskedLM's head and decoder: not used for embeddings */
        st_set_mark_prefix(st, "head.");
        st_set_mark_prefix(st, "decoder.");
        return 0;
    }
    if ((rc = wm_linear(&w, &m->cls_dense, WM_REQUIRED, 0, d, d, e, "head.dense")) < 0 ||
        (rc = wm_vec(&w, &m->cls_dense_b, WM_OPTIONAL, d, e, "head.dense.bias")) < 0 ||
        (rc = hf_map_norm(&w, hp, &m->cls_norm, &m->cls_norm_b, "head.norm", e)) < 0 ||
        (rc = wm_linear(&w, &m->cls_out, WM_REQUIRED, 0, hp->n_cls, d, e, "classifier")) < 0 ||
        (rc = wm_vec(&w, &m->cls_out_b, WM_OPTIONAL, hp->n_cls, e, "classifier.bias")) < 0)
        return rc;
    return 0;
}

static const struct tensor *opt_t(const struct tensor *t)
{
    return tensor_is_present(t) ? t : NULL;
}

/* b->xn[s] = the mean of output sequence s's rows of b->x (transformers' masked mean over the
 * sequence), for classifier_pooling "mean". The rows' layout is read from the encoder path's
 * staging (encode.c, on the host): output row s is its sequence's first row, and every row's
 * seq_end its sequence's length. One add per row: the head runs once per sequence. */
static void modernbert_mean_rows(struct model_ctx *c, int k)
{
    const struct backend_ops *op = c->be->ops;
    const struct ctx_bufs *b = &c->bufs;
    const int32_t *mh = c->meta_host;
    int B = c->n_batch, d = c->m->hp.n_embd;
    for (int s = 0; s < k; s++) {
        int r0 = mh[7 * B + s], n = mh[6 * B + r0];
        float *y = b->xn + (size_t)s * d;
        op->copy(c->be, y, b->x + (size_t)r0 * d, (size_t)d * sizeof(float));
        for (int i = 1; i < n; i++)
            op->axpy(c->be, y, d, 1.0f, b->x + (size_t)(r0 + i) * d, d, 1, d);
        op->scale(c->be, y, d, 1.0f / (float)n, 1, d);
    }
}

/* logits[n_out, n_cls] = classifier(LN_h(gelu(head.dense(x[out_rows])))), or of each
 * sequence's mean row (hp.cls_mean) */
static void modernbert_head(struct model_ctx *c, const struct fwd_chunk *ch)
{
    const struct model *m = c->m;
    const struct hparams *hp = &m->hp;
    const struct backend_ops *op = c->be->ops;
    const struct ctx_bufs *b = &c->bufs;
    int d = hp->n_embd, k = ch->n_out;
    struct blk_norm_w nh = {.kind = NORM_LAYER, .eps = hp->norm_eps, .w = &m->cls_norm,
                            .b = &m->cls_norm_b};
    if (hp->cls_mean)
        modernbert_mean_rows(c, k);
    else
        op->gather(c->be, b->xn, b->x, d, ch->out_rows, 1, k, d);
    op->linear(c->be, b->o, d, b->xn, &m->cls_dense, opt_t(&m->cls_dense_b), k);
    op->act(c->be, ACT_GELU_ERF, b->o, d, k, d);
    blk_norm(c->be, b->o, b->o, &nh, k, d);
    op->linear(c->be, b->logits, hp->n_cls, b->o, &m->cls_out, opt_t(&m->cls_out_b), k);
}

static int modernbert_forward(struct model_ctx *c, const struct fwd_chunk *ch, struct err *e)
{
    const struct model *m = c->m;
    const struct hparams *hp = &m->hp;
    const struct backend_ops *op = c->be->ops;
    const struct ctx_bufs *b = &c->bufs;
    int n = ch->n_tok, d = hp->n_embd;
    (void)e;
    struct blk_norm_w ne = {.kind = NORM_LAYER, .eps = hp->norm_eps, .w = &m->embd_norm,
                            .b = &m->embd_norm_b};
    op->embed(c->be, b->x, &m->tok_embd, ch->ids, n);
    blk_norm(c->be, b->x, b->x, &ne, n, d);
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer *L = &m->layers[il];
        const struct layer_spec *ls = &hp->layer[il];
        bool local = ls->kv == KV_SLIDING;
        struct blk_norm_w n1 = {.kind = NORM_LAYER, .eps = hp->norm_eps, .w = &L->attn_norm,
                                .b = &L->attn_norm_b};
        struct blk_norm_w n2 = {.kind = NORM_LAYER, .eps = hp->norm_eps, .w = &L->ffn_norm,
                                .b = &L->ffn_norm_b};
        struct rope_params rp = {
            .n_rot = ls->n_rot,
            .inv_freq = c->bufs.rope + (size_t)il * 2 * HP_MAX_ROT_HALF,
            .mscale = 1.0f,
            .style = ls->rope_style,
        };
        /* a local row's causal part is itself (window 1); its span (ch->rows_swa) is the band */
        struct blk_attn_cfg ac = {
            .ap = {.n_head = hp->n_head, .n_kv_head = hp->n_kv_head, .head_dim = hp->head_dim,
                   .scale = ls->attn_scale, .window = local ? 1 : 0},
            .rp = ls->n_rot > 0 ? &rp : NULL,
            .norm = NORM_LAYER,
            .norm_eps = hp->norm_eps,
            .n_embd = d,
        };
        const float *in = b->x;
        if (tensor_is_present(&L->attn_norm)) {
            blk_norm(c->be, b->xn, b->x, &n1, n, d);
            in = b->xn;
        }
        blk_attention(c->be, b->o, in, L, &ac, &ch->kv[il], local ? ch->rows_swa : ch->rows, b, n);
        op->axpy(c->be, b->x, d, 1.0f, b->o, d, n, d);
        blk_norm(c->be, b->xn, b->x, &n2, n, d);
        blk_glu(c->be, b->f, b->xn, L, ls->act, ls->n_ff, b, n);
        op->axpy(c->be, b->x, d, 1.0f, b->f, d, n, d);
    }
    struct blk_norm_w nf = {.kind = NORM_LAYER, .eps = hp->norm_eps, .w = &m->out_norm,
                            .b = &m->out_norm_b};
    blk_norm(c->be, b->x, b->x, &nf, n, d);
    if (hp->n_cls > 0 && ch->n_out > 0)
        modernbert_head(c, ch);
    return 0;
}

static const char *const modernbert_archs[] = {"ModernBertModel", "ModernBertForSequenceClassification",
                                               NULL};

const struct model_ops modernbert_ops = {
    .family = "modernbert",
    .description = "ModernBERT encoder (embeddings / cross-encoder): pre-LN, rope, GeGLU, no "
                   "biases, global and local (banded) attention layers",
    .architectures = modernbert_archs,
    .parse_config = modernbert_parse_config,
    .map_weights = modernbert_map_weights,
    .forward = modernbert_forward,
};
