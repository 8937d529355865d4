/*
 * batch: building batches and running them through a model (batch.h).
 *
 * model_forward: check the rows, reserve every sequence's new positions in
 * the paged cache (all or nothing), then per chunk of at most n_batch rows
 * (and n_out logit rows) reserve the chunk in the sliding-window pool (which
 * releases the blocks that fell out of every later query's window, so a
 * long prompt never holds more than its window and one chunk there), upload
 * changed block tables, stage the chunk's metadata (ids, positions, cache
 * slots of both pools, table offsets, sequence ends, logit rows) on the
 * host, upload it in one copy, run the family forward and download the
 * chunk's logits. One backend_sync at the end reports any op failure; then
 * the reservation is rolled back.
 *
 * Decode steps run as graphs where the backend has them (be->graphs, ADR
 * 0024): a chunk of at most GRAPH_MAX_ROWS rows, all wanting logits, is a
 * pure function of its row count, the context's buffers and the cache's
 * buffers, since everything that changes per step (ids, positions, slots,
 * table offsets, block tables) is read from backend memory uploaded before
 * it. The first such chunk of a shape is recorded instead of run, then
 * replayed each step; a shape whose recording fails runs op by op from then
 * on. Other chunks (prefill, mixed batches) always run op by op.
 *
 * Non-finite logits (NaN weights, an overflowing activation) are counted per
 * call on the host copy (one pass over the downloaded rows, negligible next
 * to the forward) into ctx->n_nonfinite, and logged once per context. The
 * forward still succeeds, because one bad sequence must not fail a batch;
 * callers decide: generate() stops with an error, perplexity fails.
 */
#include "batch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/fscan.h"
#include "../core/log.h"
#include "../models/lora.h"
#include "../models/tp.h"
#include "../models/vision.h"

int batch_init(struct batch *b, int cap, struct err *e)
{
    memset(b, 0, sizeof *b);
    if (cap < 1 || cap > (1 << 24))
        return err_setf(e, ERR_ARG, "batch capacity %d must be in [1, 2^24]", cap);
    b->ids = malloc((size_t)cap * sizeof *b->ids);
    b->pos = malloc((size_t)cap * sizeof *b->pos);
    b->seq = malloc((size_t)cap * sizeof *b->seq);
    b->logits = malloc((size_t)cap * sizeof *b->logits);
    b->rope = malloc((size_t)cap * 3 * sizeof *b->rope);
    if (!b->ids || !b->pos || !b->seq || !b->logits || !b->rope) {
        batch_free(b);
        return err_setf(e, ERR_NOMEM, "batch: out of memory");
    }
    b->cap = cap;
    return 0;
}

void batch_free(struct batch *b)
{
    free(b->ids);
    free(b->pos);
    free(b->seq);
    free(b->logits);
    free(b->rope);
    memset(b, 0, sizeof *b);
}

void batch_clear(struct batch *b)
{
    b->n_tok = 0;
    b->img = NULL;
    b->n_img = 0;
    b->hidden = NULL;
    b->hidden_out = NULL;
}

int batch_add(struct batch *b, int32_t id, int32_t pos, int32_t seq, bool logits, struct err *e)
{
    if (b->n_tok >= b->cap)
        return err_setf(e, ERR_RANGE, "batch full (%d rows)", b->cap);
    int i = b->n_tok++;
    b->ids[i] = id;
    b->pos[i] = pos;
    b->seq[i] = seq;
    b->logits[i] = logits;
    b->rope[3 * i] = b->rope[3 * i + 1] = b->rope[3 * i + 2] = pos;
    return 0;
}

int batch_rope_set(struct batch *b, int row, int n, const int32_t *p3, int32_t delta, struct err *e)
{
    if (row < 0 || n < 0 || n > b->n_tok - row)
        return err_setf(e, ERR_RANGE, "rope positions for rows [%d, %d) of a batch of %d", row, row + n,
                        b->n_tok);
    for (int i = 0; i < n; i++)
        for (int s = 0; s < 3; s++)
            b->rope[3 * (row + i) + s] = p3 ? p3[3 * i + s] : b->pos[row + i] + delta;
    return 0;
}

int batch_add_seq(struct batch *b, const int32_t *ids, int n, int32_t pos0, int32_t seq, bool last,
                  struct err *e)
{
    int rc;
    for (int i = 0; i < n; i++)
        if ((rc = batch_add(b, ids[i], pos0 + i, seq, last && i == n - 1, e)) < 0)
            return rc;
    return 0;
}

// ---- forward ----

/* The batch rules of batch.h; kv->want[seq] becomes each sequence's new length. */
static int check_rows(const struct model_ctx *c, const struct batch *b, struct kv_cache *kv,
                      struct err *e)
{
    int V = c->m->hp.n_vocab;
    if (b->n_tok <= 0)
        return err_setf(e, ERR_ARG, "forward: empty batch");
    for (int q = 0; q < kv->max_seqs; q++)
        kv->want[q] = -1;
    for (int i = 0; i < b->n_tok; i++) {
        int s = b->seq[i];
        if (kv_seq_len(kv, s) < 0)
            return err_setf(e, ERR_ARG, "batch row %d: sequence %d does not exist", i, s);
        if (b->ids[i] < 0 || b->ids[i] >= V)
            return err_setf(e, ERR_RANGE, "token id %d at row %d is outside the vocabulary [0, %d)",
                            b->ids[i], i, V);
        if (kv->want[s] < 0)
            kv->want[s] = kv_seq_len(kv, s);
        if (b->pos[i] != kv->want[s])
            return err_setf(e, ERR_ARG, "batch row %d: sequence %d expects position %d, got %d", i, s,
                            kv->want[s], b->pos[i]);
        kv->want[s]++;
    }
    return 0;
}

// ---- images (ADR 0087) ----

/* The batch's images against its rows (batch.h, struct batch_image): the model takes
 * images; each image's rows are consecutive rows of its sequence at its positions, holding
 * the image token, shared with no other image, few enough for one chunk. first[k]: the
 * batch row of image k's first position. */
static int check_images(const struct model_ctx *c, const struct batch *b, int32_t *first, struct err *e)
{
    const struct vision *v = c->m->vision;
    if (!v)
        return err_setf(e, ERR_ARG, "model %s does not take images", c->m->hp.model_type);
    for (int k = 0; k < b->n_img; k++) {
        const struct batch_image *im = &b->img[k];
        int r = 0;
        /* an image attended both ways must sit in one chunk; a causal one (Qwen) may be cut */
        if (im->n_tok < 1 || (v->info.bidirectional && im->n_tok > c->n_batch) || !im->embd)
            return err_setf(e, ERR_ARG, "image %d: %d rows (1 to the %d rows of a forward chunk, with "
                            "embeddings)", k + 1, im->n_tok, c->n_batch);
        if (v->info.n_deepstack > 0 && im->deep_ld < (size_t)im->n_tok * c->m->hp.n_embd)
            return err_setf(e, ERR_ARG, "image %d: %s adds deepstack features to its rows, but the image "
                            "comes without them (deep_ld %zu)", k + 1, v->ops->model_type, im->deep_ld);
        while (r < b->n_tok && !(b->seq[r] == im->seq && b->pos[r] == im->pos))
            r++;
        if (r + im->n_tok > b->n_tok)
            return err_setf(e, ERR_ARG, "image %d: the batch lacks rows for positions %d..%d of "
                            "sequence %d", k + 1, im->pos, im->pos + im->n_tok - 1, im->seq);
        for (int i = 0; i < im->n_tok; i++)
            if (b->seq[r + i] != im->seq || b->pos[r + i] != im->pos + i ||
                !vision_is_image_row(&v->info, b->ids[r + i]))
                return err_setf(e, ERR_ARG, "image %d: batch row %d is not position %d of sequence %d "
                                "holding the image token %d", k + 1, r + i, im->pos + i, im->seq,
                                v->info.image_token_id);
        for (int j = 0; j < k; j++)
            if (r < first[j] + b->img[j].n_tok && first[j] < r + im->n_tok)
                return err_setf(e, ERR_ARG, "images %d and %d share batch rows", j + 1, k + 1);
        first[k] = r;
    }
    return 0;
}

/* Rows [r0, *r1) of the next chunk: at most n_batch rows and n_out logit rows, ending
 * before a bidirectional image it would cut (first[k]: image k's first row). -ERR_ARG when
 * such an image starting at r0 does not fit. */
static int chunk_end(const struct model_ctx *c, const struct batch *b, const int32_t *first, int r0,
                     int *r1, struct err *e)
{
    int n_out = 0, r = r0;
    while (r < b->n_tok && r - r0 < c->n_batch) {
        if (b->logits[r] && n_out == c->n_out)
            break;
        n_out += b->logits[r];
        r++;
    }
    for (int k = 0; k < b->n_img && c->m->vision->info.bidirectional; k++) {
        if (!(first[k] < r && r < first[k] + b->img[k].n_tok))
            continue;
        if (first[k] <= r0)
            return err_setf(e, ERR_ARG, "image %d's %d rows do not fit one forward chunk (%d rows, "
                            "%d of them with logits)", k + 1, b->img[k].n_tok, c->n_batch, c->n_out);
        r = first[k];
    }
    *r1 = r;
    return 0;
}

/* The images of rows [r0, r1) into fi (chunk rows), their spans into the staged metadata
 * when the model attends bidirectionally within images; returns how many. An image row's
 * span is (its position, the image's last): it sees the rest of its image ahead of it, and
 * behind it what it sees anyway, so a sliding layer's window still bounds its past, as
 * transformers 5.17 computes Gemma 3 (the vision goldens: 3e-7 this way; 5e-2 off at the
 * image's last rows with the window lifted back to the image's first). */
static int stage_images(struct model_ctx *c, const struct batch *b, const int32_t *first, int r0, int r1,
                        struct fwd_image *fi, bool *spans)
{
    int n = 0, B = c->n_batch;
    int32_t *span = c->meta_host + 8 * B;
    *spans = false;
    for (int k = 0; k < b->n_img; k++) {
        /* the image's rows in [r0, r1): all of them, or, for an image a chunk may cut (not
         * bidirectional), the part in this chunk */
        int lo = first[k] > r0 ? first[k] : r0, hi = first[k] + b->img[k].n_tok;
        hi = hi < r1 ? hi : r1;
        if (lo < hi)
            fi[n++] = (struct fwd_image){lo - r0, hi - lo,
                                         b->img[k].embd + (size_t)(lo - first[k]) * c->m->hp.n_embd,
                                         c->m->vision->info.n_deepstack, b->img[k].deep_ld};
    }
    if (n == 0 || !c->m->vision->info.bidirectional)
        return n;
    for (int r = r0; r < r1; r++)
        span[2 * (r - r0)] = span[2 * (r - r0) + 1] = b->pos[r];
    for (int i = 0; i < n; i++)
        for (int j = 0; j < fi[i].n; j++) {
            int r = r0 + fi[i].row + j;
            span[2 * (r - r0)] = b->pos[r];
            span[2 * (r - r0) + 1] = b->pos[r0 + fi[i].row] + fi[i].n - 1;
        }
    *spans = true;
    return n;
}

/* Stage and upload the metadata of rows [r0, r1); returns the logit rows. */
static int stage_chunk(struct model_ctx *c, const struct batch *b, const struct kv_cache *kv, int r0,
                       int r1)
{
    int B = c->n_batch, n_out = 0;
    int32_t *ids = c->meta_host, *pos = ids + B, *slot = pos + B, *tab = slot + B;
    int32_t *end = tab + B, *out = end + B, *slot_swa = out + B, *state = slot_swa + B;
    bool swa = kv->swa.window > 0;
    for (int r = r0; r < r1; r++) {
        int i = r - r0, s = b->seq[r];
        ids[i] = b->ids[r];
        pos[i] = b->pos[r];
        slot[i] = kv_slot(kv, s, b->pos[r]);
        slot_swa[i] = swa ? kv_slot_window(kv, s, b->pos[r]) : 0;
        tab[i] = s * kv->max_blocks;
        end[i] = kv->want[s];
        state[i] = s;
        if (b->logits[r])
            out[n_out++] = i;
    }
    if (hparams_has_mrope(&c->m->hp)) {
        int32_t *mp = c->meta_host + CTX_META_MROPE * B;
        for (int r = r0; r < r1; r++)
            for (int s = 0; s < 3; s++)
                mp[s * B + r - r0] = b->rope[3 * r + s];
    }
    c->be->ops->upload(c->be, c->bufs.meta, c->meta_host, (size_t)CTX_META_ROWS * B * sizeof(int32_t));
    return n_out;
}

// ---- graphs ----

/* Decode chunks up to this many rows are recorded (one graph per row count). */
#define GRAPH_MAX_ROWS 64

/* FNV-1a over the cache's buffers as the forward sees them: a graph names these
 * addresses, so a cache with another pool, layout or table buffers needs its own. */
static uint64_t cache_key(const struct kv_cache *kv)
{
    uint64_t h = 1469598103934665603ull;
    uintptr_t v[4] = {(uintptr_t)kv->blk.tables, (uintptr_t)kv->swa.blk.tables,
                      (uintptr_t)kv->block_size, (uintptr_t)kv->n_layer};
    for (int il = -1; il < kv->n_layer; il++) {
        if (il >= 0) {
            const struct kv_layer *l = &kv->layers[il];
            v[0] = (uintptr_t)l->k;
            v[1] = (uintptr_t)l->v;
            v[2] = (uintptr_t)l->k_dim;
            v[3] = (uintptr_t)l->v_dim;
        }
        const unsigned char *p = (const unsigned char *)v;
        for (size_t i = 0; i < sizeof v; i++)
            h = (h ^ p[i]) * 1099511628211ull;
    }
    return h;
}

/* The graph slot of a decode-shaped chunk, or NULL: run op by op. A slot found holds its
 * graph, or NULL when recording failed; a new one (*fresh) is to be recorded. */
static struct ctx_graph *graph_slot(struct model_ctx *c, const struct kv_cache *kv,
                                    const struct fwd_chunk *ch, bool *fresh)
{
    *fresh = false;
    /* a chunk with adapters issues ops its graph would not have: op by op */
    if (c->bufs.lora || !c->be->graphs || !c->be->ops->graph_begin || ch->n_tok > GRAPH_MAX_ROWS ||
        ch->n_out != ch->n_tok || ch->n_img > 0)
        return NULL;
    uint64_t key = cache_key(kv);
    /* a graph with and one without the hidden states' norm are two shapes */
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].n_tok == ch->n_tok && c->graphs[i].hidden == ch->hidden && c->graphs[i].cache_key == key)
            return &c->graphs[i];
    if (c->n_graphs == CTX_MAX_GRAPHS)
        return NULL;
    struct ctx_graph *g = &c->graphs[c->n_graphs++];
    *g = (struct ctx_graph){ch->n_tok, ch->hidden, key, NULL};
    *fresh = true;
    return g;
}

/* The family forward of one chunk: replayed from its graph, recorded into a new one and
 * replayed, or run op by op. */
static int forward_chunk(struct model_ctx *c, const struct kv_cache *kv, const struct fwd_chunk *ch,
                         struct err *e)
{
    const struct backend_ops *op = c->be->ops;
    bool fresh;
    if (c->tp)  /* every rank's forward, on threads of their own: never recorded */
        return model_tp_forward(c, ch, kv->layers, e);
    struct ctx_graph *g = graph_slot(c, kv, ch, &fresh);
    int rc;
    if (g && g->graph) {
        op->graph_launch(c->be, g->graph);
        return 0;
    }
    if (!fresh)
        return c->m->ops->forward(c, ch, e);
    op->graph_begin(c->be);
    rc = c->m->ops->forward(c, ch, e);
    g->graph = op->graph_end(c->be);
    if (rc < 0 || !g->graph) {
        /* a shape whose ops cannot be recorded runs op by op from now on */
        if (g->graph)
            op->graph_free(c->be, g->graph);
        g->graph = NULL;
        return rc < 0 ? rc : c->m->ops->forward(c, ch, e);
    }
    op->graph_launch(c->be, g->graph);
    return 0;
}

/* Logit rows of [rows, V] holding a NaN or an infinity. */
bool logits_row_finite(const float *l, int V)
{
    return fscan_finite(l, V);
}

static int count_nonfinite(const float *logits, int rows, int V)
{
    int bad = 0;
    for (int r = 0; r < rows; r++)
        bad += !logits_row_finite(logits + (size_t)r * V, V);
    return bad;
}

/* Back to each sequence's length before the call (its first row's position). A sequence
 * whose sliding-window blocks for that length were already released (a later chunk of the
 * call failed after an earlier one moved its window on) is emptied instead: its cache can no
 * longer be what the caller had (ADR 0023). */
static void rollback(const struct batch *b, struct kv_cache *kv)
{
    for (int i = 0; i < b->n_tok; i++)
        if (b->pos[i] < kv_seq_len(kv, b->seq[i]) && kv_seq_truncate(kv, b->seq[i], b->pos[i], NULL) < 0)
            kv_seq_truncate(kv, b->seq[i], 0, NULL);
}

/* An MTP model's rows [r0, r1): zeros | h staged (the zero halves are never written) and
 * uploaded into bufs.mtp_in. */
static void stage_mtp(struct model_ctx *c, const struct batch *b, int r0, int r1)
{
    size_t d = (size_t)c->m->hp.n_embd;
    for (int r = r0; r < r1; r++)
        memcpy(c->mtp_host + (size_t)(r - r0) * 2 * d + d, b->hidden + (size_t)r * d, d * sizeof(float));
    c->be->ops->upload(c->be, c->bufs.mtp_in, c->mtp_host, (size_t)(r1 - r0) * 2 * d * sizeof(float));
}

int model_forward(struct model_ctx *c, const struct batch *b, struct kv_cache *kv, float *logits,
                  struct err *e)
{
    const struct model *m = c->m;
    int B = c->n_batch, V = m->hp.n_vocab, rc, done_out = 0;
    size_t d = (size_t)m->hp.n_embd;
    bool mtp = tensor_is_present(&m->mtp.eh_proj);
    c->n_nonfinite = 0;
    if (kv->n_layer != m->hp.n_layer || kv->n_rank != (m->tp ? m->tp->n_rank : 1) ||
        (m->tp && !c->tp))
        return err_setf(e, ERR_ARG, "forward: the kv cache was made for another model");
    if (b->lora && b->n_lora != model_ctx_n_lora(c))
        return err_setf(e, ERR_ARG, "forward: the batch names %d adapters, the context holds %d",
                        b->n_lora, model_ctx_n_lora(c));
    if (mtp && !b->hidden)
        return err_setf(e, ERR_ARG, "forward: a multi-token-prediction layer needs each row's hidden state");
    if (b->hidden_out && m->ops->mtp == MTP_NONE && !mtp)
        return err_setf(e, ERR_UNSUPPORTED, "forward: the %s family does not hand out hidden states",
                        m->ops->family);
    if (b->n_img < 0 || (b->n_img > 0 && !b->img))
        return err_setf(e, ERR_ARG, "forward: %d images without their list", b->n_img);
    /* per call, not per token: a batch with images is a prompt's prefill */
    int32_t *first = NULL;
    struct fwd_image *fi = NULL;
    if (b->n_img > 0) {
        first = malloc((size_t)b->n_img * sizeof *first);
        fi = malloc((size_t)b->n_img * sizeof *fi);
        if (!first || !fi) {
            free(first);
            free(fi);
            return err_setf(e, ERR_NOMEM, "forward: out of memory");
        }
    }
    if ((rc = check_rows(c, b, kv, e)) < 0 || (b->n_img > 0 && (rc = check_images(c, b, first, e)) < 0) ||
        (rc = kv_reserve(kv, kv->want, e)) < 0) {
        free(first);
        free(fi);
        return rc;
    }
    const int32_t *meta = c->bufs.meta;
    struct kv_rows rows = {.pos = meta + B, .slot = meta + 2 * B, .table = meta + 3 * B,
                           .tables = kv->blk.tables, .seq_end = meta + 4 * B,
                           .block_size = kv->block_size, .state = meta + 7 * B};
    struct kv_rows rows_swa = rows;
    rows_swa.slot = meta + 6 * B;
    rows_swa.tables = kv->swa.blk.tables;
    for (int r0 = 0; r0 < b->n_tok;) {
        int r1 = r0;
        if ((rc = chunk_end(c, b, first, r0, &r1, e)) < 0 ||
            (rc = kv_reserve_window(kv, b->seq + r0, b->pos + r0, r1 - r0, e)) < 0)
            break;
        kv_sync_tables(kv);
        bool spans = false;
        int n_img = b->n_img > 0 ? stage_images(c, b, first, r0, r1, fi, &spans) : 0;
        int n_out = stage_chunk(c, b, kv, r0, r1);
        c->bufs.lora = lora_stage(c->lora, c->be, b->seq + r0, r1 - r0, b->lora, b->n_lora)
                           ? c->lora : NULL;
        if (mtp)
            stage_mtp(c, b, r0, r1);
        rows.span = rows_swa.span = spans ? meta + 8 * B : NULL;
        struct fwd_chunk ch = {.n_tok = r1 - r0, .n_out = n_out, .ids = meta,
                               .out_rows = meta + 5 * B, .rows = &rows, .rows_swa = &rows_swa,
                               .kv = kv->layers, .img = n_img ? fi : NULL, .n_img = n_img,
                               .mpos = hparams_has_mrope(&m->hp) ? meta + CTX_META_MROPE * B : NULL,
                               .mpos_ld = B, .hidden = b->hidden_out != NULL};
        if ((rc = forward_chunk(c, kv, &ch, e)) < 0)
            break;
        if (n_out > 0)
            c->be->ops->download(c->be, logits + (size_t)done_out * V, c->bufs.logits,
                                 (size_t)n_out * V * sizeof(float));
        if (b->hidden_out)
            c->be->ops->download(c->be, b->hidden_out + (size_t)r0 * d, c->bufs.o,
                                 (size_t)(r1 - r0) * d * sizeof(float));
        done_out += n_out;
        r0 = r1;
    }
    free(first);
    free(fi);
    c->bufs.lora = NULL;
    /* always sync: it also clears an error recorded after a failing forward */
    int rs = backend_sync(c->be, rc < 0 ? NULL : e);
    rc = rc < 0 ? rc : rs;
    if (rc < 0) {
        rollback(b, kv);
        return rc;
    }
    c->n_nonfinite = count_nonfinite(logits, done_out, V);
    if (c->n_nonfinite > 0 && !c->warned_nonfinite) {
        c->warned_nonfinite = true;
        LOG_WARN("the forward produced non-finite logits (NaN or inf) in %d of %d rows: "
                 "the weights or the config are broken", c->n_nonfinite, done_out);
    }
    return rc;
}
