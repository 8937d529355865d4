/*
 * encoder: BERT-style bidirectional encoders (BertModel, XLMRobertaModel and their
 * *ForSequenceClassification heads), shared by bert.c and xlm_roberta.c. ADR 0083.
 *
 *   x      = LN_e(tok[id] + pos[p] + type[t])      p: i (BERT) or padding_idx + 1 + i (RoBERTa)
 *   block  : x = LN_1(x + wo(attend(wq x + bq, wk x + bk, wv x + bv)) + bo)     post-LN
 *            x = LN_2(x + down(gelu(up x + up_b)) + down_b)                    exact erf gelu
 *   head   : logits = cls_out(tanh(cls_dense(x[first token])))     (classification only)
 *
 * Checkpoint names (transformers), with the base prefix ("bert." / "roberta.") in task-head
 * checkpoints and without it in the base model's (sentence-transformers saves BertModel):
 *   embeddings.{word,position,token_type}_embeddings.weight, embeddings.LayerNorm.{weight,bias}
 *   encoder.layer.N.attention.self.{query,key,value}.{weight,bias}
 *   encoder.layer.N.attention.output.dense.{weight,bias}, .attention.output.LayerNorm.*
 *   encoder.layer.N.intermediate.dense.*, encoder.layer.N.output.dense.*, .output.LayerNorm.*
 * The post-LN norms sit in the attn_norm / ffn_norm slots (applied after each residual add).
 * MLX-quantized checkpoints quantize the linears and the embeddings: wm_linear binds both.
 */
#include <stdio.h>
#include <string.h>

#include "../loading/config.h"
#include "../loading/wmap.h"
#include "blocks.h"
#include "encoder.h"
#include "hf_common.h"

/* transformers BertConfig defaults (XLMRobertaConfig's are the same) */
static const struct hf_defaults enc_defaults = {
    .eps_key = "layer_norm_eps", .norm_eps = 1e-12f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "gelu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

/* Whether config "architectures" names a sequence-classification class. */
static bool enc_is_classifier(const cJSON *cfg)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cfg, "architectures"), *it;
    cJSON_ArrayForEach(it, a)
        if (cJSON_IsString(it) && strstr(it->valuestring, "ForSequenceClassification"))
            return true;
    return false;
}

/* len(id2label) when given (transformers derives num_labels from it), else num_labels,
 * else 2 (PretrainedConfig's default). */
static int enc_n_labels(const cJSON *cfg, int *out, struct err *e)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cfg, "id2label");
    if (cJSON_IsObject(m)) {
        *out = cJSON_GetArraySize(m);
        return 0;
    }
    return cfg_opt_int(cfg, "num_labels", 2, out, e);
}

int enc_parse_config(struct hparams *hp, const cJSON *cfg, bool roberta_positions, struct err *e)
{
    char pet[32];
    int rc, pad;
    if ((rc = hf_parse_decoder(hp, cfg, &enc_defaults, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "type_vocab_size", 2, &hp->n_type_vocab, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "pad_token_id", roberta_positions ? 1 : 0, &pad, e)) < 0 ||
        (rc = cfg_opt_str(cfg, "position_embedding_type", "absolute", pet, sizeof pet, e)) < 0)
        return rc;
    if (strcmp(pet, "absolute") != 0)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'position_embedding_type' = '%s' is not "
                        "supported (only \"absolute\")", pet);
    if ((rc = hparams_check_dim(hp->n_type_vocab, "type_vocab_size", 0, 1 << 16, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_vocab, "vocab_size", 1, 1 << 24, e)) < 0 ||
        (rc = hparams_check_dim(pad, "pad_token_id", 0, (int64_t)hp->n_vocab - 1, e)) < 0)
        return rc;
    if (hp->n_kv_head != hp->n_head)
        return err_setf(e, ERR_CONFIG, "config field 'num_key_value_heads' = %d: an encoder has "
                        "%d key/value heads, one per query head", hp->n_kv_head, hp->n_head);
    hp->encoder = true;
    hp->n_rot = 0;                 /* absolute position embeddings, no rope */
    hp->norm = NORM_LAYER;
    hp->norm_bias = true;
    hp->qkv_bias = hp->out_bias = true;
    hp->ffn = FFN_MLP;
    hp->ffn_bias = true;
    hp->post_norm = true;
    hp->bos_id = -1;
    hp->n_eos = 0;
    hp->pad_id = roberta_positions ? pad : -1;
    if (roberta_positions) {
        /* positions padding_idx + 1 .. must fit the table: usable length n_ctx - pad - 1 */
        hp->pos_offset = pad + 1;
        if (hp->pos_offset >= hp->n_ctx)
            return err_setf(e, ERR_CONFIG, "max_position_embeddings %d leaves no position after "
                            "padding_idx %d", hp->n_ctx, pad);
    }
    if (enc_is_classifier(cfg)) {
        if ((rc = enc_n_labels(cfg, &hp->n_cls, e)) < 0 ||
            (rc = hparams_check_dim(hp->n_cls, "num_labels", 1, 1 << 16, e)) < 0)
            return rc;
        if (hp->n_cls > hp->n_vocab)
            return err_setf(e, ERR_CONFIG, "num_labels %d exceeds vocab_size %d (the logits buffer)",
                            hp->n_cls, hp->n_vocab);
    }
    hparams_fill_layers(hp);
    for (int il = 0; il < hp->n_layer; il++)
        hp->layer[il].residual = RESID_POST;
    return 0;
}

/* Bind one layer: attention q/k/v/o with biases, its LayerNorm, the MLP and its LayerNorm. */
static int enc_map_layer(struct wmap *w, const struct hparams *hp, struct layer *L, const char *pre,
                         struct err *e)
{
    int64_t d = hp->n_embd, ff = hp->n_ff;
    char ln[192];
    int rc;
    if ((rc = wm_linear(w, &L->wq, WM_REQUIRED, 0, d, d, e, "%s.attention.self.query", pre)) < 0 ||
        (rc = wm_vec(w, &L->bq, WM_REQUIRED, d, e, "%s.attention.self.query.bias", pre)) < 0 ||
        (rc = wm_linear(w, &L->wk, WM_REQUIRED, 0, d, d, e, "%s.attention.self.key", pre)) < 0 ||
        (rc = wm_vec(w, &L->bk, WM_REQUIRED, d, e, "%s.attention.self.key.bias", pre)) < 0 ||
        (rc = wm_linear(w, &L->wv, WM_REQUIRED, 0, d, d, e, "%s.attention.self.value", pre)) < 0 ||
        (rc = wm_vec(w, &L->bv, WM_REQUIRED, d, e, "%s.attention.self.value.bias", pre)) < 0 ||
        (rc = wm_linear(w, &L->wo, WM_REQUIRED, 0, d, d, e, "%s.attention.output.dense", pre)) < 0 ||
        (rc = wm_vec(w, &L->bo, WM_REQUIRED, d, e, "%s.attention.output.dense.bias", pre)) < 0 ||
        (rc = wm_linear(w, &L->up, WM_REQUIRED, 0, ff, d, e, "%s.intermediate.dense", pre)) < 0 ||
        (rc = wm_vec(w, &L->up_b, WM_REQUIRED, ff, e, "%s.intermediate.dense.bias", pre)) < 0 ||
        (rc = wm_linear(w, &L->down, WM_REQUIRED, 0, d, ff, e, "%s.output.dense", pre)) < 0 ||
        (rc = wm_vec(w, &L->down_b, WM_REQUIRED, d, e, "%s.output.dense.bias", pre)) < 0)
        return rc;
    snprintf(ln, sizeof ln, "%s.attention.output.LayerNorm", pre);
    if ((rc = hf_map_norm(w, hp, &L->attn_norm, &L->attn_norm_b, ln, e)) < 0)
        return rc;
    snprintf(ln, sizeof ln, "%s.output.LayerNorm", pre);
    return hf_map_norm(w, hp, &L->ffn_norm, &L->ffn_norm_b, ln, e);
}

int enc_map_weights(struct model *m, struct st_set *st, const struct enc_names *nm, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &hp->quant};
    int64_t d = hp->n_embd;
    char pre[160], ln[192];
    int rc;
    /* the base prefix of task-head checkpoints, or none (the base model as saved alone) */
    const char *p = wm_has(&w, "%sembeddings.word_embeddings.weight", nm->prefix) ? nm->prefix : "";
    if ((rc = wm_linear(&w, &m->tok_embd, WM_REQUIRED, 0, hp->n_vocab, d, e,
                        "%sembeddings.word_embeddings", p)) < 0 ||
        (rc = wm_linear(&w, &m->pos_embd, WM_REQUIRED, 0, hp->n_ctx, d, e,
                        "%sembeddings.position_embeddings", p)) < 0)
        return rc;
    if (hp->n_type_vocab > 0 &&
        (rc = wm_linear(&w, &m->type_embd, WM_REQUIRED, 0, hp->n_type_vocab, d, e,
                        "%sembeddings.token_type_embeddings", p)) < 0)
        return rc;
    snprintf(ln, sizeof ln, "%sembeddings.LayerNorm", p);
    if ((rc = hf_map_norm(&w, hp, &m->embd_norm, &m->embd_norm_b, ln, e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        snprintf(pre, sizeof pre, "%sencoder.layer.%d", p, il);
        if ((rc = enc_map_layer(&w, hp, &m->layers[il], pre, e)) < 0)
            return rc;
    }
    if (hp->n_cls == 0) {
        /* BertModel's pooler: sentence-transformers does not use it (the Pooling module does) */
        snprintf(pre, sizeof pre, "%spooler.", p);
        st_set_mark_prefix(st, pre);
        return 0;
    }
    if ((rc = wm_linear(&w, &m->cls_dense, WM_REQUIRED, 0, d, d, e, "%s", nm->cls_dense)) < 0 ||
        (rc = wm_vec(&w, &m->cls_dense_b, WM_REQUIRED, d, e, "%s.bias", nm->cls_dense)) < 0 ||
        (rc = wm_linear(&w, &m->cls_out, WM_REQUIRED, 0, hp->n_cls, d, e, "%s", nm->cls_out)) < 0 ||
        (rc = wm_vec(&w, &m->cls_out_b, WM_REQUIRED, hp->n_cls, e, "%s.bias", nm->cls_out)) < 0)
        return rc;
    return 0;
}

/* b->x = LN_e(tok[ids] + pos[emb_pos] + type[type_ids]) */
static void enc_embed(struct model_ctx *c, const struct fwd_chunk *ch, int n)
{
    const struct model *m = c->m;
    const struct hparams *hp = &m->hp;
    const struct backend_ops *op = c->be->ops;
    const struct ctx_bufs *b = &c->bufs;
    int d = hp->n_embd;
    op->embed(c->be, b->x, &m->tok_embd, ch->ids, n);
    op->embed(c->be, b->xn, &m->pos_embd, ch->emb_pos, n);
    op->axpy(c->be, b->x, d, 1.0f, b->xn, d, n, d);
    if (hp->n_type_vocab > 0) {
        op->embed(c->be, b->xn, &m->type_embd, ch->type_ids, n);
        op->axpy(c->be, b->x, d, 1.0f, b->xn, d, n, d);
    }
    struct blk_norm_w ne = {.kind = NORM_LAYER, .eps = hp->norm_eps, .w = &m->embd_norm,
                            .b = &m->embd_norm_b};
    blk_norm(c->be, b->x, b->x, &ne, n, d);
}

/* logits[n_out, n_cls] = cls_out(tanh(cls_dense(x[out_rows]))) */
static void enc_head(struct model_ctx *c, const struct fwd_chunk *ch)
{
    const struct model *m = c->m;
    const struct hparams *hp = &m->hp;
    const struct backend_ops *op = c->be->ops;
    const struct ctx_bufs *b = &c->bufs;
    int d = hp->n_embd, k = ch->n_out;
    op->gather(c->be, b->xn, b->x, d, ch->out_rows, 1, k, d);
    op->linear(c->be, b->o, d, b->xn, &m->cls_dense, &m->cls_dense_b, k);
    op->softcap(c->be, b->o, d, 1.0f, k, d);   /* cap * tanh(x / cap) with cap 1: tanh */
    op->linear(c->be, b->logits, hp->n_cls, b->o, &m->cls_out, &m->cls_out_b, k);
}

int encoder_forward(struct model_ctx *c, const struct fwd_chunk *ch, struct err *e)
{
    const struct model *m = c->m;
    const struct hparams *hp = &m->hp;
    const struct backend_ops *op = c->be->ops;
    const struct ctx_bufs *b = &c->bufs;
    int n = ch->n_tok, d = hp->n_embd;
    if (!ch->emb_pos || (hp->n_type_vocab > 0 && !ch->type_ids))
        return err_setf(e, ERR_INTERNAL, "encoder forward without position / type ids");
    enc_embed(c, ch, n);
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer *L = &m->layers[il];
        const struct layer_spec *ls = &hp->layer[il];
        struct blk_norm_w n1 = {.kind = NORM_LAYER, .eps = hp->norm_eps, .w = &L->attn_norm,
                                .b = &L->attn_norm_b};
        struct blk_norm_w n2 = {.kind = NORM_LAYER, .eps = hp->norm_eps, .w = &L->ffn_norm,
                                .b = &L->ffn_norm_b};
        struct blk_attn_cfg ac = {
            .ap = {.n_head = hp->n_head, .n_kv_head = hp->n_kv_head, .head_dim = hp->head_dim,
                   .scale = ls->attn_scale},
            .rp = NULL,
            .norm = NORM_LAYER,
            .norm_eps = hp->norm_eps,
            .n_embd = d,
        };
        /* x = LN_1(x + attention(x)) */
        blk_attention(c->be, b->o, b->x, L, &ac, &ch->kv[il], ch->rows, b, n);
        op->axpy(c->be, b->x, d, 1.0f, b->o, d, n, d);
        blk_norm(c->be, b->x, b->x, &n1, n, d);
        /* x = LN_2(x + mlp(x)) */
        blk_mlp(c->be, b->f, b->x, L, ls->act, ls->n_ff, b, n);
        op->axpy(c->be, b->x, d, 1.0f, b->f, d, n, d);
        blk_norm(c->be, b->x, b->x, &n2, n, d);
    }
    if (hp->n_cls > 0 && ch->n_out > 0)
        enc_head(c, ch);
    return 0;
}
