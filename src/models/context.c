/*
 * context: the activation context of a model on a backend (model.h). One
 * backend allocation holds every activation buffer, the per-layer rope
 * tables and the per-chunk metadata, sized for n_batch rows at creation;
 * a forward allocates nothing. The KV cache is separate (engine/kvcache.h),
 * so one context serves any number of sequences.
 */
#include "model.h"

#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "lora.h"
#include "tp.h"
#include "vision.h"

/* Prefill chunk: 512 tokens amortize each weight read over many rows, but the
 * activations of a chunk must stay small next to the weights (peak RSS is
 * budgeted at weights + KV cache + 64 MiB), so wide models get smaller chunks.
 * A GPU's arena is device memory, outside that budget: there the chunk stays at 512
 * rows up to Llama-3.1-70B's width (the 8B shape got 128-row chunks under the host
 * budget, and its products of more than 128 rows run 2x faster, ADR 0074). */
#define CTX_MAX_BATCH    512
#define CTX_MIN_BATCH    32
#define CTX_ARENA_BUDGET (40u << 20)
#define CTX_ARENA_BUDGET_DEVICE ((size_t)512 << 20)
/* Logit rows per chunk: a chunk that wants more (perplexity) is split; at most
 * this many bytes of logits, but never fewer than CTX_MIN_OUT rows. */
#define CTX_LOGITS_BUDGET (32u << 20)
#define CTX_MIN_OUT       16


/* Carve n 4-byte elements (rounded up to 16 for 64-byte alignment) at byte offset
 * *off of base; with base == NULL only advances the offset. */
static void *carve(char *base, size_t *off, size_t n)
{
    void *p = base ? base + *off : NULL;
    *off += ((n + 15) & ~(size_t)15) * sizeof(float);
    return p;
}

static int out_rows_for(const struct hparams *hp, int B)
{
    size_t rows = CTX_LOGITS_BUDGET / ((size_t)hp->n_vocab * sizeof(float));
    if (rows < CTX_MIN_OUT)
        rows = CTX_MIN_OUT;
    return rows < (size_t)B ? (int)rows : B;
}

/* Bytes of the logits buffer for B rows (as carve() rounds them). */
static size_t logits_bytes(const struct hparams *hp, int B)
{
    size_t off = 0;
    carve(NULL, &off, (size_t)out_rows_for(hp, B) * hp->n_vocab);
    return off;
}

/* Lay out the buffers for B rows; with base == NULL only returns the bytes needed. */
static size_t layout(struct ctx_bufs *b, const struct model *m, int B, char *base)
{
    const struct hparams *hp = &m->hp;
    size_t off = 0;
    size_t hd = (size_t)hp->head_dim, E = (size_t)hp->n_expert;
    size_t k = 1, d = (size_t)hp->n_embd, ff = (size_t)hp->n_ff;
    for (int il = 0; il < hp->n_layer; il++)
        if (hp->layer[il].moe && (size_t)hp->layer[il].n_expert_used > k)
            k = (size_t)hp->layer[il].n_expert_used;
    size_t q_dim = hp->n_head * hd, kv_dim = hp->n_kv_head * hd;
    size_t K = (size_t)B * k, rows = E ? K : (size_t)B;
    size_t qkv_w = q_dim + 2 * kv_dim, att_w = q_dim;
    for (int il = 0; il < hp->n_layer; il++) {
        if (hp->layer[il].kv != KV_LATENT)
            continue;
        /* MLA (blk_mla_attention): qkv holds q_a | q_nope per head | q_full | latent row,
         * att the per-head attention outputs | the heads' values */
        size_t H = (size_t)hp->n_head, lr = (size_t)hp->kv_lora_rank + hp->qk_rope_dim;
        size_t qw = (size_t)hp->q_lora_rank + H * hp->qk_nope_dim + H * lr + lr;
        size_t aw = H * lr + H * hp->v_head_dim;
        qkv_w = qw > qkv_w ? qw : qkv_w;
        att_w = aw > att_w ? aw : att_w;
        break;
    }
    struct ctx_bufs t;
    t.x = carve(base, &off, (size_t)B * d);
    t.xn = carve(base, &off, (size_t)B * d);
    t.qkv = carve(base, &off, (size_t)B * qkv_w);
    t.att = carve(base, &off, (size_t)B * att_w);
    t.o = carve(base, &off, (size_t)B * d);
    t.f = carve(base, &off, (size_t)B * d);
    t.h = carve(base, &off, rows * 2 * ff);
    t.h1 = carve(base, &off, rows * ff);
    t.router = carve(base, &off, (size_t)B * (E ? E : 1));
    t.sel = carve(base, &off, E ? K : 1);
    t.sel_w = carve(base, &off, E ? K : 1);
    t.order = carve(base, &off, E ? K : 1);
    t.offsets = carve(base, &off, E + 1);
    t.xg = carve(base, &off, E ? K * d : 1);
    t.yg = carve(base, &off, E ? K * d : 1);
    t.logits = carve(base, &off, (size_t)out_rows_for(hp, B) * hp->n_vocab);
    t.rope = carve(base, &off, (size_t)hp->n_layer * 2 * HP_MAX_ROT_HALF);
    t.mrope = carve(base, &off, hparams_has_mrope(hp) ? 3 * HP_MAX_ROT_HALF : 1);
    t.sinks = carve(base, &off, (size_t)hp->n_layer * hp->n_head);
    t.rec = carve(base, &off, (size_t)B * (hp->rec_scratch > 0 ? hp->rec_scratch : 1));
    t.mtp_in = tensor_is_present(&m->mtp.eh_proj) ? carve(base, &off, (size_t)B * 2 * d) : NULL;
    t.meta = carve(base, &off, (size_t)CTX_META_ROWS * B);
    if (base)
        *b = t;
    return off;
}

/* Per-layer inverse frequencies, computed on the host and uploaded once. */
static int upload_rope(struct model_ctx *c, struct err *e)
{
    const struct hparams *hp = &c->m->hp;
    size_t n = (size_t)hp->n_layer * 2 * HP_MAX_ROT_HALF;
    float *tab = calloc(n, sizeof *tab);
    if (!tab)
        return err_setf(e, ERR_NOMEM, "context: out of memory");
    for (int il = 0; il < hp->n_layer; il++) {
        float *t = tab + (size_t)il * 2 * HP_MAX_ROT_HALF;
        if (hp->layer[il].n_rot > 0)
            blk_rope_freqs(hp, &hp->layer[il], t, t + HP_MAX_ROT_HALF);
    }
    c->be->ops->upload(c->be, c->bufs.rope, tab, n * sizeof *tab);
    /* M-RoPE: stream s keeps the frequencies of its section, the others turn by 0 (an exact
     * identity), so three plain rope passes make it (blk_attention; ADR 0094) */
    float m[3 * HP_MAX_ROT_HALF] = {0};
    if (hparams_has_mrope(hp)) {
        for (int j = 0; j < hp->n_rot / 2; j++)
            m[hparams_mrope_stream(hp, j) * HP_MAX_ROT_HALF + j] = tab[j];
        c->be->ops->upload(c->be, c->bufs.mrope, m, 3 * HP_MAX_ROT_HALF * sizeof *m);
    }
    int rc = backend_sync(c->be, e);
    free(tab);
    return rc;
}

/* Per-layer attention sink logits, widened to f32 on the host and uploaded once (the
 * attention op reads f32 in backend memory; checkpoints store them as BF16). */
static int upload_sinks(struct model_ctx *c, struct err *e)
{
    const struct model *m = c->m;
    const struct hparams *hp = &m->hp;
    size_t n = (size_t)hp->n_layer * hp->n_head;
    float *tab = calloc(n, sizeof *tab);
    if (!tab)
        return err_setf(e, ERR_NOMEM, "context: out of memory");
    for (int il = 0; il < hp->n_layer; il++) {
        const struct tensor *t = &m->layers[il].sinks;
        if (!hp->layer[il].sinks || !tensor_is_present(t))
            continue;
        dtype_to_f32_ref(tab + (size_t)il * hp->n_head, t->data, t->dtype, (size_t)hp->n_head);
    }
    c->be->ops->upload(c->be, c->bufs.sinks, tab, n * sizeof *tab);
    free(tab);
    return backend_sync(c->be, e);
}

int model_ctx_auto_batch(const struct model *m, size_t budget)
{
    /* an image the text model attends to bidirectionally (Gemma 3's) is one forward chunk
     * (batch.c): its tokens_per_image rows are the floor, whatever the budget (Gemma-3-4B's
     * 256 rows of 2560 would otherwise be cut to 128 on the CPU, and refused) */
    const struct vision *v = m->vision;
    int floor = v && v->info.bidirectional && v->info.tokens_per_image > CTX_MIN_BATCH ? v->info.tokens_per_image
                                                                                        : CTX_MIN_BATCH;
    int n = CTX_MAX_BATCH;
    while (n < floor && n < CTX_MAX_ROWS)
        n *= 2;
    /* the activations within their budget; logits have their own (CTX_LOGITS_BUDGET) */
    while (n / 2 >= floor && layout(NULL, m, n, NULL) - logits_bytes(&m->hp, n) > budget)
        n /= 2;
    return n;
}

int model_ctx_new(struct model_ctx **out, const struct model *m, struct backend *be, int n_batch,
                  struct err *e)
{
    const struct hparams *hp = &m->hp;
    int rc;
    *out = NULL;
    struct model_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return err_setf(e, ERR_NOMEM, "context: out of memory");
    c->m = m;
    c->be = be;
    if (n_batch > 0)
        c->n_batch = n_batch < CTX_MAX_ROWS ? n_batch : CTX_MAX_ROWS;
    else
        c->n_batch = model_ctx_auto_batch(m, backend_is_cpu(be) ? CTX_ARENA_BUDGET : CTX_ARENA_BUDGET_DEVICE);
    c->n_out = out_rows_for(hp, c->n_batch);
    size_t bytes = layout(NULL, m, c->n_batch, NULL);
    c->meta_host = calloc((size_t)CTX_META_ROWS * c->n_batch, sizeof *c->meta_host);
    /* an MTP model's staged input rows: zeros (the embedding's half, never written) | h */
    if (tensor_is_present(&m->mtp.eh_proj))
        c->mtp_host = calloc((size_t)c->n_batch * 2 * hp->n_embd, sizeof *c->mtp_host);
    if (!c->meta_host || (tensor_is_present(&m->mtp.eh_proj) && !c->mtp_host)) {
        model_ctx_free(c);
        return err_setf(e, ERR_NOMEM, "context: out of memory");
    }
    if ((rc = be->ops->buf_alloc(be, bytes, &c->arena, e)) < 0) {
        model_ctx_free(c);
        return err_prefix(e, "context activations (%zu MiB)", bytes >> 20);
    }
    layout(&c->bufs, m, c->n_batch, c->arena);
    if ((rc = upload_rope(c, e)) < 0 || (rc = upload_sinks(c, e)) < 0 ||
        (m->tp && (rc = model_tp_ctx_new(c, e)) < 0)) {
        model_ctx_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void model_ctx_free(struct model_ctx *c)
{
    if (!c)
        return;
    model_tp_ctx_free(c);
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].graph)
            c->be->ops->graph_free(c->be, c->graphs[i].graph);
    if (c->arena)
        c->be->ops->buf_free(c->be, c->arena);
    lora_run_free(c->lora, c->be);
    free(c->meta_host);
    free(c->mtp_host);
    free(c);
}
