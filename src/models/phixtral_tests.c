/*
 * phixtral self-test: config normalization (n_inner null, layer_norm_epsilon,
 * every rejection rule naming its field), partial-rotary dims, top-k routing
 * with softmax over only the chosen logits, the parallel-residual contract
 * (attention and MoE read the same normalized input, checked by spying on
 * the backend during a real forward), and the two weight layouts binding to
 * identical expert tensors. Uses tests/fixtures/golden/phixtral{,_mlx}.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "selftest.h"

extern const struct model_ops phixtral_ops;
int phixtral_ops_self_test(struct err *e);

#define FIXTURE "tests/fixtures/golden/"

#define CFG(extra) "{\"model_type\": \"phi-msft\", \"vocab_size\": 384, \"n_embd\": 64, \"n_head\": 4, " \
                   "\"n_layer\": 2, \"n_positions\": 256, \"num_local_experts\": 4" extra "}"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&phixtral_ops, CFG(", \"rotary_dim\": 8, \"num_experts_per_tok\": 2, \"n_inner\": null, "
                                             "\"layer_norm_epsilon\": 1e-6"), &hp, e)) < 0)
        return rc;
    if ((rc = stest_check(hp.n_ff == 256 && hp.head_dim == 16 && hp.n_rot == 8 && hp.n_kv_head == 4,
                          "n_inner null -> 4 n_embd, head_dim, rotary_dim", e)) < 0 ||
        (rc = stest_check(hp.norm_eps == 1e-6f && hp.norm == NORM_LAYER && hp.parallel_residual,
                          "layer_norm_epsilon honoured, LayerNorm, parallel residual", e)) < 0 ||
        (rc = stest_check(hp.n_expert == 4 && hp.n_expert_used == 2 && hp.router == ROUTER_TOPK_SOFTMAX &&
                              hp.ffn == FFN_MLP && hp.act == ACT_GELU_TANH && hp.head_bias,
                          "moe fields", e)) < 0)
        return rc;
    if ((rc = stest_parse(&phixtral_ops, CFG(", \"rotary_dim\": 16, \"num_experts_per_tok\": 1, \"n_inner\": 100"), &hp, e)) < 0 ||
        (rc = stest_check(hp.n_ff == 100 && hp.n_rot == 16 && hp.norm_eps == 1e-5f, "explicit n_inner", e)) < 0)
        return rc;
    if ((rc = stest_parse_fails(&phixtral_ops, CFG(", \"rotary_dim\": 8, \"num_experts_per_tok\": 0"), "num_experts_per_tok", e)) < 0 ||
        (rc = stest_parse_fails(&phixtral_ops, CFG(", \"rotary_dim\": 8, \"num_experts_per_tok\": 5"), "num_experts_per_tok", e)) < 0 ||
        (rc = stest_parse_fails(&phixtral_ops, CFG(", \"rotary_dim\": 7, \"num_experts_per_tok\": 2"), "rotary_dim", e)) < 0 ||
        (rc = stest_parse_fails(&phixtral_ops, CFG(", \"rotary_dim\": 18, \"num_experts_per_tok\": 2"), "rotary_dim", e)) < 0 ||
        (rc = stest_parse_fails(&phixtral_ops, CFG(", \"num_experts_per_tok\": 2"), "rotary_dim", e)) < 0 ||
        (rc = stest_parse_fails(&phixtral_ops,
                                "{\"vocab_size\": 384, \"n_embd\": 66, \"n_head\": 4, \"n_layer\": 2, \"n_positions\": 256, "
                                "\"num_local_experts\": 4, \"rotary_dim\": 8, \"num_experts_per_tok\": 2}", "n_embd", e)) < 0 ||
        (rc = stest_parse_fails(&phixtral_ops,
                                "{\"vocab_size\": 384, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 256, "
                                "\"num_local_experts\": 4, \"rotary_dim\": 8, \"num_experts_per_tok\": 2}", "n_layer", e)) < 0)
        return rc;
    return 0;
}

static int routing(struct err *e)
{
    struct hparams hp;
    hparams_init(&hp);
    hp.n_expert = 4;
    hp.n_expert_used = 2;
    hp.router = ROUTER_TOPK_SOFTMAX;
    int32_t sel[2], rc;
    float w[2];
    /* ties break toward the lower index */
    float tie[4] = {1.0f, 3.0f, 2.0f, 3.0f};
    if ((rc = stest_route(&hp, tie, sel, w, e)) < 0)
        return rc;
    if ((rc = stest_check(sel[0] == 1 && sel[1] == 3 && w[0] == 0.5f && w[1] == 0.5f, "top-2 tie order", e)) < 0)
        return rc;
    /* softmax over the two chosen logits only: the others do not change the weights */
    float a[4] = {0.5f, -1.0f, 2.0f, 1.0f}, b[4] = {0.9f, -100.0f, 2.0f, 1.0f};
    float wa[2], wb[2];
    int32_t sa[2], sb[2];
    if ((rc = stest_route(&hp, a, sa, wa, e)) < 0)
        return rc;
    if ((rc = stest_route(&hp, b, sb, wb, e)) < 0)
        return rc;
    double want = 1.0 / (1.0 + exp(-1.0));
    return stest_check(sa[0] == 2 && sa[1] == 3 && sb[0] == 2 && sb[1] == 3 &&
                           stest_near(wa[0], want, 1e-6) && stest_near(wa[1], 1.0 - want, 1e-6) &&
                           wa[0] == wb[0] && wa[1] == wb[1],
                       "softmax over the top-k logits only", e);
}

/* RoPE touches only the first rotary_dim dims of each head. */
static int partial_rotary(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&phixtral_ops, CFG(", \"rotary_dim\": 8, \"num_experts_per_tok\": 2"), &hp, e)) < 0)
        return rc;
    float inv[4];
    blk_rope_freqs(&hp, &hp.layer[0], inv, NULL);
    for (int j = 0; j < 4; j++)
        if ((rc = stest_check(stest_near(inv[j], pow(10000.0, -2.0 * j / 8), 1e-7), "inverse frequencies", e)) < 0)
            return rc;
    struct backend *be = NULL;
    if ((rc = backend_cpu_new(&be, 1, NULL, e)) < 0)
        return rc;
    float x[16], y[16];
    for (int i = 0; i < 16; i++)
        x[i] = y[i] = 0.1f * (float)(i + 1);
    int pos = 3;
    int32_t pos32 = pos;
    struct kv_rows rows = {.pos = &pos32, .seq_end = &pos32};
    struct rope_params rp = {8, inv, NULL, 0, 1.0f};
    be->ops->rope(be, y, 16, 1, 1, 16, &rp, &rows);
    backend_free(be);
    for (int j = 0; j < 4 && rc == 0; j++) {
        double c = cos(pos * (double)inv[j]), s = sin(pos * (double)inv[j]);
        rc = stest_check(stest_near(y[j], x[j] * c - x[j + 4] * s, 1e-5) &&
                             stest_near(y[j + 4], x[j + 4] * c + x[j] * s, 1e-5),
                         "rotate-half on the rotary dims", e);
    }
    for (int j = 8; j < 16 && rc == 0; j++)
        rc = stest_check(y[j] == x[j], "dims past rotary_dim untouched", e);
    return rc;
}

/* ---- parallel residual: spy on the linear calls of a real forward ---- */

#define SPY_MAX 64

struct spy {
    struct backend be;          /* a copy of the CPU backend with our ops table */
    struct backend_ops ops;
    void (*inner_linear)(struct backend *, float *, int, const float *, const struct tensor *,
                         const struct tensor *, int);
    int n;
    const void *w[SPY_MAX];     /* weight data of each call */
    uint64_t x_hash[SPY_MAX];   /* FNV-1a of its input rows */
};

static void spy_linear(struct backend *be, float *y, int ldy, const float *x, const struct tensor *w,
                       const struct tensor *b, int n_tok)
{
    struct spy *s = (struct spy *)be;
    if (s->n < SPY_MAX) {
        uint64_t h = 1469598103934665603ull;
        const unsigned char *p = (const unsigned char *)x;
        size_t bytes = (size_t)n_tok * (size_t)w->shape[w->ndim - 1] * sizeof(float);
        for (size_t i = 0; i < bytes; i++)
            h = (h ^ p[i]) * 1099511628211ull;
        s->w[s->n] = w->data;
        s->x_hash[s->n++] = h;
    }
    s->inner_linear(be, y, ldy, x, w, b, n_tok);
}

static int find_call(const struct spy *s, const void *w)
{
    for (int i = 0; i < s->n; i++)
        if (s->w[i] == w)
            return i;
    return -1;
}

static int parallel_residual(struct err *e)
{
    struct model *m = NULL;
    struct backend *cpu = NULL;
    struct stest_run run = {0};
    struct spy *s = calloc(1, sizeof *s);
    float *logits = NULL;
    int rc;
    if (!s)
        return err_setf(e, ERR_NOMEM, "out of memory");
    if ((rc = model_load(&m, FIXTURE "phixtral", e)) < 0 || (rc = backend_cpu_new(&cpu, 1, NULL, e)) < 0)
        goto out;
    s->be = *cpu;
    s->ops = *cpu->ops;
    s->inner_linear = cpu->ops->linear;
    s->ops.linear = spy_linear;
    s->be.ops = &s->ops;
    logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
    if (!logits || (rc = stest_run_open(&run, NULL, m, &s->be, 16, e)) < 0)
        goto out;
    int32_t ids[3] = {5, 17, 42};
    if ((rc = stest_run_feed(&run, ids, 3, false, logits, e)) < 0)
        goto out;
    for (int il = 0; il < m->hp.n_layer && rc == 0; il++) {
        int qkv = find_call(s, m->layers[il].wqkv.data), gate = find_call(s, m->layers[il].router.data);
        rc = stest_check(qkv >= 0 && gate >= 0 && s->x_hash[qkv] == s->x_hash[gate],
                         "attention and MoE read the same normalized input", e);
    }
out:
    free(logits);
    stest_run_close(&run);
    backend_free(cpu);
    model_free(m);
    free(s);
    return rc;
}

/* ---- both layouts bind identical tensors ---- */

static bool same_tensor(const struct tensor *a, const struct tensor *b)
{
    if (a->ndim != b->ndim || a->dtype != b->dtype)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return false;
    return memcmp(a->data, b->data, tensor_storage_bytes(a)) == 0;
}

static int layouts_agree(struct err *e)
{
    struct model *pub = NULL, *mlx = NULL;
    int rc;
    if ((rc = model_load(&pub, FIXTURE "phixtral", e)) < 0 || (rc = model_load(&mlx, FIXTURE "phixtral_mlx", e)) < 0)
        goto out;
    for (int il = 0; il < pub->hp.n_layer && rc == 0; il++) {
        const struct experts *a = &pub->layers[il].ex, *b = &mlx->layers[il].ex;
        for (int x = 0; x < pub->hp.n_expert && rc == 0; x++)
            rc = stest_check(same_tensor(&a->up.w[x], &b->up.w[x]) && same_tensor(&a->up.b[x], &b->up.b[x]) &&
                                 same_tensor(&a->down.w[x], &b->down.w[x]) &&
                                 same_tensor(&a->down.b[x], &b->down.b[x]) && a->up.w[x].data != b->up.w[x].data,
                             "published and mlx-lm expert tensors are identical views", e);
    }
    if (rc == 0)
        rc = stest_check(st_set_n_unused(pub->st) == 0 && st_set_n_unused(mlx->st) == 0,
                         "every checkpoint tensor consumed", e);
out:
    model_free(pub);
    model_free(mlx);
    return rc;
}

int phixtral_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = routing(e)) < 0 || (rc = partial_rotary(e)) < 0 ||
        (rc = parallel_residual(e)) < 0 || (rc = layouts_agree(e)) < 0)
        return rc;
    return 0;
}
