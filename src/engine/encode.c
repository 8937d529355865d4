/*
 * encode: packed, padding-free encoder batches (ADR 0083).
 *
 * A chunk holds whole sequences: at most n_batch rows, 2 n_batch slots of the pool and
 * n_out sequences (the context's logit rows). Sequence s of a chunk starts at a slot aligned to
 * ENC_BLOCK in the K/V scratch pool (its own block table: consecutive blocks), so every
 * row of s reads exactly the keys of s. Per row the metadata rows of the context are:
 *   0 ids   1 type ids   2 position ids (pos_offset + i; RoBERTa: a pad token takes
 *   padding_idx)   3 attention position (the row's own, i)   4 slot   5 table offset
 *   6 seq_end   7 out_rows (the first row of each sequence)   8-9 [B][2] the row's
 *   bidirectional span, (0, n - 1): the whole sequence (kv_rows.span)
 * and the block tables follow in a buffer of their own. A model with local layers
 * (ModernBERT: KV_SLIDING with window 2h + 1) gets a second span per row in a buffer of the
 * encoder's, the band (max(0, i - h), min(n - 1, i + h)), which those layers read through
 * ch->rows_swa (ADR 0093). With their own positions a
 * sequence's rows are consecutive, so the attention op takes them in tiles (its prefill
 * path) rather than one row at a time, as it did when every row sat at the sequence's last
 * position (ADR 0092).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/log.h"
#include "encode.h"

#define ENC_BLOCK 16   /* slots per block of the scratch pool: a sequence wastes < 16 slots */
/* The longest sequence one chunk takes (a context of that many rows is allocated): a
 * decoder's context is far longer than its embedding use (ADR 0097). It is the most a
 * context holds: a model whose own maximum is longer (Qwen3-Embedding's 32768,
 * ModernBERT's 8192) loads and takes inputs up to this, cut or refused past it as the
 * caller asks. */
#define ENC_MAX_TOKENS CTX_MAX_ROWS

struct encoder {
    const struct model *m;
    struct backend *be;
    struct model_ctx *c;         /* owned */
    void *kv_mem;                /* K | V scratch, n_slots rows each, owned (backend memory) */
    struct kv_layer *kv;         /* [n_layer] all the same pool, owned */
    int n_slots;
    int32_t *tables_dev;         /* [n_slots / ENC_BLOCK], owned (backend memory) */
    int32_t *tables_host;        /* owned */
    int band;                    /* > 0: local layers attend i - band .. i + band */
    int32_t *band_dev;           /* [n_batch][2] their spans (backend memory), owned */
    int32_t *band_host;          /* owned */
};

/* The half-width of the local layers' band (0: none, or a causal model's: its sliding rows
 * keep their causal window); -ERR_UNSUPPORTED when they differ. */
static int enc_band(const struct hparams *hp, int *band, struct err *e)
{
    *band = 0;
    if (hp->causal)
        return 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        if (ls->kv != KV_SLIDING)
            continue;
        int h = ls->window > 1 ? (ls->window - 1) / 2 : 0;
        if (*band > 0 && h != *band)
            return err_setf(e, ERR_UNSUPPORTED, "encoder: local layers with different windows");
        if (h == 0)
            return err_setf(e, ERR_UNSUPPORTED, "encoder: a local layer of window %d", ls->window);
        *band = h;
    }
    return 0;
}

int enc_max_tokens(const struct model *m)
{
    int n = m->hp.n_ctx - m->hp.pos_offset;
    return n < ENC_MAX_TOKENS ? n : ENC_MAX_TOKENS;
}

/* Logits per output row: a classification head's labels, or an LM reranker's vocabulary
 * (a converted one's score head: its labels). */
static int enc_logit_width(const struct hparams *hp)
{
    return hp->lm_rerank && hp->n_cls == 0 ? hp->n_vocab : hp->n_cls;
}

int enc_new(struct encoder **out, const struct model *m, struct backend *be, struct err *e)
{
    const struct hparams *hp = &m->hp;
    const struct backend_ops *op = be->ops;
    int rc, max_len = enc_max_tokens(m);
    *out = NULL;
    if (!hp->encoder)
        return err_setf(e, ERR_ARG, "model '%s' is not an encoder (no embeddings from it)",
                        hp->model_type);
    struct encoder *en = calloc(1, sizeof *en);
    if (!en)
        return err_setf(e, ERR_NOMEM, "encoder: out of memory");
    en->m = m;
    en->be = be;
    if ((rc = enc_band(hp, &en->band, e)) < 0)
        goto fail;
    /* one chunk holds the longest sequence; 512 rows or more to batch short ones */
    if ((rc = model_ctx_new(&en->c, m, be, max_len > 512 ? max_len : 512, e)) < 0)
        goto fail;
    if (en->c->n_batch < max_len) {
        rc = err_setf(e, ERR_CONFIG, "encoder: a chunk of %d rows cannot hold a sequence of %d",
                      en->c->n_batch, max_len);
        goto fail;
    }
    en->n_slots = (2 * en->c->n_batch + ENC_BLOCK - 1) / ENC_BLOCK * ENC_BLOCK;
    int kv_dim = hp->n_kv_head * hp->head_dim;   /* n_embd for the BERT-style families */
    size_t row = (size_t)kv_dim * sizeof(float);
    en->kv = calloc((size_t)hp->n_layer, sizeof *en->kv);
    en->tables_host = calloc((size_t)en->n_slots / ENC_BLOCK, sizeof *en->tables_host);
    if (!en->kv || !en->tables_host) {
        rc = err_setf(e, ERR_NOMEM, "encoder: out of memory");
        goto fail;
    }
    if (en->band > 0) {
        en->band_host = calloc(2 * (size_t)en->c->n_batch, sizeof *en->band_host);
        if (!en->band_host) {
            rc = err_setf(e, ERR_NOMEM, "encoder: out of memory");
            goto fail;
        }
        if ((rc = op->buf_alloc(be, 2 * sizeof(int32_t) * (size_t)en->c->n_batch,
                                (void **)&en->band_dev, e)) < 0)
            goto fail;
    }
    if ((rc = op->buf_alloc(be, 2 * row * en->n_slots, &en->kv_mem, e)) < 0 ||
        (rc = op->buf_alloc(be, sizeof(int32_t) * (en->n_slots / ENC_BLOCK), (void **)&en->tables_dev,
                            e)) < 0)
        goto fail;
    for (int il = 0; il < hp->n_layer; il++)
        en->kv[il] = (struct kv_layer){
            .k = en->kv_mem,
            .v = (char *)en->kv_mem + row * en->n_slots,
            .k_dim = kv_dim,
            .v_dim = kv_dim,
            .dtype = DTYPE_F32,
        };
    for (int j = 0; j < en->n_slots / ENC_BLOCK; j++)
        en->tables_host[j] = j;   /* the pool's blocks in order: a sequence's are consecutive */
    op->upload(be, en->tables_dev, en->tables_host, sizeof(int32_t) * (en->n_slots / ENC_BLOCK));
    if ((rc = backend_sync(be, e)) < 0)
        goto fail;
    *out = en;
    return 0;
fail:
    enc_free(en);
    return rc;
}

void enc_free(struct encoder *en)
{
    if (!en)
        return;
    if (en->kv_mem)
        en->be->ops->buf_free(en->be, en->kv_mem);
    if (en->tables_dev)
        en->be->ops->buf_free(en->be, en->tables_dev);
    if (en->band_dev)
        en->be->ops->buf_free(en->be, en->band_dev);
    free(en->band_host);
    model_ctx_free(en->c);
    free(en->kv);
    free(en->tables_host);
    free(en);
}

/* Every sequence non-empty, within the position table, ids and types in range. */
static int enc_check(const struct encoder *en, const struct enc_seq *seqs, int n_seq, struct err *e)
{
    const struct hparams *hp = &en->m->hp;
    int max_len = enc_max_tokens(en->m);
    for (int s = 0; s < n_seq; s++) {
        const struct enc_seq *q = &seqs[s];
        if (q->n < 1 || q->n > max_len)
            return err_setf(e, ERR_RANGE, "sequence %d has %d tokens: it must have 1 to %d", s, q->n,
                            max_len);
        for (int i = 0; i < q->n; i++) {
            if (q->ids[i] < 0 || q->ids[i] >= hp->n_vocab)
                return err_setf(e, ERR_RANGE, "sequence %d: token id %d at %d is outside the "
                                "vocabulary of %d", s, q->ids[i], i, hp->n_vocab);
            int t = q->type_ids ? q->type_ids[i] : 0;
            if (t < 0 || t >= (hp->n_type_vocab > 0 ? hp->n_type_vocab : 1))
                return err_setf(e, ERR_RANGE, "sequence %d: token type %d at %d is outside [0, %d)", s,
                                t, i, hp->n_type_vocab > 0 ? hp->n_type_vocab : 1);
        }
    }
    return 0;
}

/* Slots a sequence of n rows takes in the pool. */
static int enc_span(int n)
{
    return (n + ENC_BLOCK - 1) / ENC_BLOCK * ENC_BLOCK;
}

/* The metadata of sequences [s0, s1) into the context's staging rows; returns the rows. */
static int enc_stage(struct encoder *en, const struct enc_seq *seqs, int s0, int s1)
{
    const struct hparams *hp = &en->m->hp;
    int B = en->c->n_batch, r = 0, slot0 = 0;
    int32_t *mh = en->c->meta_host;
    for (int s = s0; s < s1; s++) {
        const struct enc_seq *q = &seqs[s];
        int emb = hp->pos_offset;
        /* the output row: the first (a classification head's CLS), a causal model's last */
        mh[7 * B + (s - s0)] = hp->causal ? r + q->n - 1 : r;
        for (int i = 0; i < q->n; i++, r++) {
            mh[r] = q->ids[i];
            mh[B + r] = q->type_ids ? q->type_ids[i] : 0;
            /* RoBERTa: cumsum of non-pad tokens + padding_idx, a pad token padding_idx */
            bool pad = hp->pad_id >= 0 && q->ids[i] == hp->pad_id;
            mh[2 * B + r] = pad ? hp->pad_id : emb++;
            mh[3 * B + r] = i;
            mh[8 * B + 2 * r] = 0;
            mh[8 * B + 2 * r + 1] = q->n - 1;
            if (en->band > 0) {
                en->band_host[2 * r] = i - en->band > 0 ? i - en->band : 0;
                en->band_host[2 * r + 1] = i + en->band < q->n - 1 ? i + en->band : q->n - 1;
            }
            mh[4 * B + r] = slot0 + i;
            mh[5 * B + r] = slot0 / ENC_BLOCK;
            mh[6 * B + r] = q->n;
        }
        slot0 += enc_span(q->n);
    }
    return r;
}

/* Whether the rows hold a NaN or an infinity. */
static bool enc_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return false;
    return true;
}

int enc_run(struct encoder *en, const struct enc_seq *seqs, int n_seq, float *hidden, float *logits,
            struct err *e)
{
    const struct hparams *hp = &en->m->hp;
    const struct backend_ops *op = en->be->ops;
    struct model_ctx *c = en->c;
    int B = c->n_batch, rc, d = hp->n_embd;
    int nl = enc_logit_width(hp);
    if (logits && nl <= 0)
        return err_setf(e, ERR_ARG, "model '%s' has no classification head", hp->model_type);
    if ((rc = enc_check(en, seqs, n_seq, e)) < 0)
        return rc;
    const int32_t *meta = c->bufs.meta;
    struct kv_rows rows = {.pos = meta + 3 * B, .slot = meta + 4 * B, .table = meta + 5 * B,
                           .tables = en->tables_dev, .seq_end = meta + 6 * B,
                           .block_size = ENC_BLOCK, .state = NULL,
                           .span = hp->causal ? NULL : meta + 8 * B};
    struct kv_rows band = rows;
    band.span = en->band_dev;
    size_t row0 = 0;
    for (int s0 = 0; s0 < n_seq;) {
        /* whole sequences while the rows, the slots and the logit rows last */
        int s1 = s0, n_rows = 0, n_sl = 0;
        while (s1 < n_seq && n_rows + seqs[s1].n <= B && n_sl + enc_span(seqs[s1].n) <= en->n_slots &&
               s1 - s0 < c->n_out) {
            n_rows += seqs[s1].n;
            n_sl += enc_span(seqs[s1].n);
            s1++;
        }
        int n = enc_stage(en, seqs, s0, s1), k = s1 - s0;
        op->upload(en->be, c->bufs.meta, c->meta_host, sizeof(int32_t) * CTX_META_ROWS * (size_t)B);
        if (en->band > 0)
            op->upload(en->be, en->band_dev, en->band_host, 2 * sizeof(int32_t) * (size_t)n);
        struct fwd_chunk ch = {.n_tok = n, .n_out = logits ? k : 0, .ids = meta,
                               .out_rows = meta + 7 * B, .rows = &rows,
                               .rows_swa = en->band > 0 ? &band : &rows,
                               .kv = en->kv, .type_ids = meta + B, .emb_pos = meta + 2 * B};
        if ((rc = en->m->ops->forward(c, &ch, e)) < 0)
            break;
        if (hidden)
            op->download(en->be, hidden + row0 * d, c->bufs.x, (size_t)n * d * sizeof(float));
        if (logits)
            op->download(en->be, logits + (size_t)s0 * nl, c->bufs.logits, (size_t)k * nl * sizeof(float));
        /* the staging rows are read by the upload: wait before the next chunk rewrites them */
        if ((rc = backend_sync(en->be, e)) < 0)
            return rc;
        if ((hidden && !enc_finite(hidden + row0 * d, (size_t)n * d)) ||
            (logits && !enc_finite(logits + (size_t)s0 * nl, (size_t)k * nl)))
            return err_setf(e, ERR_FORMAT, "the encoder produced non-finite values (NaN or inf) for "
                            "sequences %d to %d: the weights or the config are broken", s0, s1 - 1);
        row0 += n;
        s0 = s1;
    }
    int rs = backend_sync(en->be, rc < 0 ? NULL : e);
    return rc < 0 ? rc : rs;
}
