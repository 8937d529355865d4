/*
 * context: per-request state (model.h). One allocation holds every
 * activation buffer, sized for n_batch tokens at creation; the KV cache is
 * sized for n_ctx tokens. forward() allocates nothing.
 */
#include "model.h"

#include <stdlib.h>
#include <string.h>

#include "blocks.h"

/* Prefill chunk: 512 tokens amortize each weight read over many rows, but the
 * activations of a chunk must stay small next to the weights (peak RSS is
 * budgeted at weights + KV cache + 64 MiB), so wide models get smaller chunks. */
#define CTX_MAX_BATCH    512
#define CTX_MIN_BATCH    32
#define CTX_ARENA_BUDGET (40u << 20)

/* Carve n floats (rounded up to 16 for 64-byte alignment) at byte offset *off of base;
 * with base == NULL only advances the offset. */
static float *carve(char *base, size_t *off, size_t n)
{
    float *p = base ? (float *)(base + *off) : NULL;
    *off += ((n + 15) & ~(size_t)15) * sizeof(float);
    return p;
}

/* Lay out the buffers; with base == NULL only returns the bytes needed. */
static size_t layout(struct ctx_bufs *b, const struct hparams *hp, int B, char *base)
{
    size_t off = 0;
    size_t hd = (size_t)hp->head_dim, E = (size_t)hp->n_expert, k = (size_t)hp->n_expert_used;
    size_t q_dim = hp->n_head * hd, kv_dim = hp->n_kv_head * hd;
    size_t ff = (size_t)hp->n_ff;
    size_t rows = (size_t)B > k ? (size_t)B : k;   /* fused MoE uses k rows */
    struct ctx_bufs t;
    t.x = carve(base, &off, (size_t)B * hp->n_embd);
    t.xn = carve(base, &off, (size_t)B * hp->n_embd);
    t.q = carve(base, &off, (size_t)B * q_dim);
    t.qkv = carve(base, &off, (size_t)B * (q_dim + 2 * kv_dim));
    t.att = carve(base, &off, (size_t)B * q_dim);
    t.o = carve(base, &off, (size_t)B * hp->n_embd);
    t.f = carve(base, &off, (size_t)B * hp->n_embd);
    t.h1 = carve(base, &off, rows * ff);
    t.h2 = carve(base, &off, rows * 2 * ff);  /* also holds a fused gate_up projection */
    t.router = carve(base, &off, (size_t)B * (E ? E : 1));
    t.sel = (int *)carve(base, &off, (size_t)B * (k ? k : 1));
    t.sel_w = carve(base, &off, (size_t)B * (k ? k : 1));
    t.order = (int *)carve(base, &off, (size_t)B * (k ? k : 1));
    t.xg = carve(base, &off, (size_t)B * hp->n_embd);
    t.yg = carve(base, &off, rows * hp->n_embd);
    t.inv_freq = carve(base, &off, (size_t)HP_MAX_ROT_HALF);
    t.inv_freq_long = carve(base, &off, (size_t)HP_MAX_ROT_HALF);
    if (base)
        *b = t;
    return off;
}

static bool env_flag(const char *name, bool def)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    return !(strcmp(v, "0") == 0 || strcmp(v, "off") == 0 || strcmp(v, "false") == 0);
}

int model_ctx_new(struct model_ctx **out, const struct model *m, struct backend *be, int n_ctx,
                  struct err *e)
{
    const struct hparams *hp = &m->hp;
    *out = NULL;
    if (n_ctx <= 0 || n_ctx > hp->n_ctx)
        n_ctx = hp->n_ctx;
    struct model_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return err_setf(e, ERR_NOMEM, "context: out of memory");
    c->m = m;
    c->be = be;
    c->n_ctx = n_ctx;
    c->n_batch = n_ctx < CTX_MAX_BATCH ? n_ctx : CTX_MAX_BATCH;
    while (c->n_batch > CTX_MIN_BATCH && layout(NULL, hp, c->n_batch, NULL) > CTX_ARENA_BUDGET)
        c->n_batch /= 2;
    c->fused_moe = env_flag("MLXCEL_FUSED_MOE", true);

    size_t kv = (size_t)hp->n_layer * n_ctx * hp->n_kv_head * hp->head_dim;
    size_t bytes = layout(NULL, hp, c->n_batch, NULL);
    c->k_cache = malloc(kv * sizeof(float));
    c->v_cache = malloc(kv * sizeof(float));
    c->arena = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!c->k_cache || !c->v_cache || !c->arena) {
        model_ctx_free(c);
        return err_setf(e, ERR_NOMEM, "context: cannot allocate %zu MiB of KV cache and activations",
                        (2 * kv * sizeof(float) + bytes) >> 20);
    }
    layout(&c->bufs, hp, c->n_batch, c->arena);
    if (hp->n_rot > 0)
        blk_rope_freqs(hp, c->bufs.inv_freq, c->bufs.inv_freq_long);
    *out = c;
    return 0;
}

void model_ctx_free(struct model_ctx *c)
{
    if (!c)
        return;
    free(c->k_cache);
    free(c->v_cache);
    free(c->arena);
    free(c);
}

void model_ctx_reset(struct model_ctx *c)
{
    c->pos = 0;
}

int model_forward(struct model_ctx *c, const int32_t *ids, int n_tok, float *logits,
                  bool all_logits, struct err *e)
{
    return c->m->ops->forward(c, ids, n_tok, logits, all_logits, e);
}
