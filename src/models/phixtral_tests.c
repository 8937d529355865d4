/*
 * phixtral self-test: what the Phixtral family makes of its phi-msft config
 * and its checkpoints, and the two contracts it adds to Phi-2.
 *  - Config: defaults when a field is null or absent (n_inner 4 n_embd,
 *    layer_norm_epsilon, n_head_kv = n_head, rope_theta), stated values
 *    reaching every layer's spec (rotary_dim, n_inner, num_experts_per_tok),
 *    and every rejection rule naming its field.
 *  - Routing: top-k with ties to the lower index, softmax over only the
 *    chosen logits; RoPE rotates only the first rotary_dim dims of a head.
 *  - Forward: the parallel-residual contract (attention and MoE read the
 *    same normalized input, checked by spying on the backend's linears).
 *  - Weights: the published and the mlx-lm layout bind byte-identical
 *    expert views and consume every tensor; a missing tensor is named in
 *    either layout. Uses tests/fixtures/golden/phixtral{,_mlx}.
 */
#include <math.h>
#include <stdlib.h>

#include "blocks.h"
#include "selftest.h"

extern const struct model_ops phixtral_ops;
int phixtral_ops_self_test(struct err *e);

#define CFG(extra) "{\"model_type\": \"phi-msft\", \"vocab_size\": 384, \"n_embd\": 64, \"n_head\": 4, " \
                   "\"n_layer\": 2, \"n_positions\": 256, \"num_local_experts\": 4" extra "}"

/* Every layer: rotary dims, expert width, experts per token. */
static bool layers_are(const struct hparams *hp, int n_rot, int n_ff, int k)
{
    for (int il = 0; il < hp->n_layer; il++)
        if (hp->layer[il].n_rot != n_rot || hp->layer[il].n_ff != n_ff || hp->layer[il].n_expert_used != k)
            return false;
    return true;
}

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    /* null / absent: n_inner 4 n_embd, layer_norm_epsilon 1e-5, n_head_kv = n_head, theta 1e4 */
    if ((rc = stest_parse(&phixtral_ops, CFG(", \"rotary_dim\": 8, \"num_experts_per_tok\": 2, \"n_inner\": null, "
                                             "\"n_head_kv\": null, \"layer_norm_epsilon\": null"), &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, 8, 256, 2) && hp.norm_eps == 1e-5f && hp.n_kv_head == 4 &&
                              hp.layer[1].rope_theta == 1e4f, "phi-msft defaults", e)) < 0)
        return rc;
    if ((rc = stest_parse(&phixtral_ops, CFG(", \"rotary_dim\": 16, \"num_experts_per_tok\": 1, \"n_inner\": 100, "
                                             "\"n_head_kv\": 4, \"layer_norm_epsilon\": 1e-6, \"rope_theta\": 500"), &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, 16, 100, 1) && hp.norm_eps == 1e-6f && hp.layer[1].rope_theta == 500.0f,
                          "rotary_dim, n_inner, num_experts_per_tok, epsilon, theta per layer", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"rotary_dim\": 8, \"num_experts_per_tok\": 0"), "num_experts_per_tok"},
        {CFG(", \"rotary_dim\": 8, \"num_experts_per_tok\": 5"), "num_experts_per_tok"},
        {CFG(", \"rotary_dim\": 7, \"num_experts_per_tok\": 2"), "rotary_dim"},
        {CFG(", \"rotary_dim\": 18, \"num_experts_per_tok\": 2"), "rotary_dim"},
        {CFG(", \"num_experts_per_tok\": 2"), "rotary_dim"},
        {CFG(", \"rotary_dim\": 8, \"num_experts_per_tok\": 2, \"n_head_kv\": 2"), "n_head_kv"},
        {CFG(", \"rotary_dim\": 8, \"num_experts_per_tok\": 2, \"n_inner\": -1"), "n_inner"},
        {CFG(", \"rotary_dim\": 8, \"num_experts_per_tok\": 2, \"activation_function\": \"relu\""), "activation_function"},
        {"{\"vocab_size\": 384, \"n_embd\": 66, \"n_head\": 4, \"n_layer\": 2, \"n_positions\": 256, "
         "\"num_local_experts\": 4, \"rotary_dim\": 8, \"num_experts_per_tok\": 2}", "n_embd"},
        {"{\"vocab_size\": 384, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 256, "
         "\"num_local_experts\": 4, \"rotary_dim\": 8, \"num_experts_per_tok\": 2}", "n_layer"},
    };
    return stest_parse_fails_all(&phixtral_ops, bad, sizeof bad / sizeof bad[0], e);
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
    if ((rc = backend_cpu_new(&be, 1, NULL, NULL, e)) < 0)
        return rc;
    float x[16], y[16];
    for (int i = 0; i < 16; i++)
        x[i] = y[i] = 0.1f * (float)(i + 1);
    int pos = 3;
    int32_t pos32 = pos;
    struct kv_rows rows = {.pos = &pos32, .seq_end = &pos32};
    struct rope_params rp = {.n_rot = 8, .inv_freq = inv, .mscale = 1.0f, .style = ROPE_STYLE_HALF};
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
    if ((rc = model_load(&m, STEST_GOLDEN "phixtral", e)) < 0 || (rc = backend_cpu_new(&cpu, 1, NULL, NULL, e)) < 0)
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

/* ---- weights: both layouts bind identical tensors, a missing one is named ---- */

static int weights(struct err *e)
{
    static const char *const pub_required[] = {"transformer.h.1.moe.mlp.2.fc2.bias", "lm_head.ln.bias", NULL};
    static const char *const mlx_required[] = {"transformer.h.0.moe.switch_mlp.fc1.bias", NULL};
    struct model *pub = NULL, *mlx = NULL;
    int rc;
    if ((rc = model_load(&pub, STEST_GOLDEN "phixtral", e)) < 0 || (rc = model_load(&mlx, STEST_GOLDEN "phixtral_mlx", e)) < 0)
        goto out;
    rc = stest_check(stest_same_experts(pub, mlx) && st_set_n_unused(pub->st) == 0 && st_set_n_unused(mlx->st) == 0,
                     "published and mlx-lm layouts bind identical expert views, every tensor", e);
out:
    model_free(pub);
    model_free(mlx);
    if (rc < 0 || (rc = stest_missing_named("phixtral", pub_required, e)) < 0)
        return rc;
    return stest_missing_named("phixtral_mlx", mlx_required, e);
}

int phixtral_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = routing(e)) < 0 || (rc = partial_rotary(e)) < 0 ||
        (rc = parallel_residual(e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    return 0;
}
