/*
 * mtp: the checkpoints' own multi-token-prediction layers as drafters (--spec mtp, ADR 0108).
 *
 * The golden checkpoints come from transformers, which has no MTP layer, so each case here
 * builds one: a copy of the golden folder (config.json with num_nextn_predict_layers = 1, the
 * weights copied) and mtp.safetensors holding layer N = num_hidden_layers: the last layer's
 * tensors under N's names with seeded random values, enorm, hnorm, eh_proj, shared_head.norm
 * and (variant) shared_head.head. Greedy output with --spec mtp must be plain decoding's
 * whatever those weights are.
 *
 * Qwen3-Next and Qwen3.5 (ADR 0135) keep the module apart: mtp.layers.0.* (the golden's full
 * attention layer's tensors, seeded random values), mtp.fc, mtp.pre_fc_norm_embedding,
 * mtp.pre_fc_norm_hidden, mtp.norm, and mtp_num_hidden_layers = 1 in config.json; the model's
 * lm_head is the head, so "a head of zeros" is mtp.norm's zero-centred weight at -1 (the
 * layer's output, hence its logits, all zero: every draft token 0).
 *
 * mtp_<family> (deepseek_v3, glm4_moe, glm4_moe_lite, qwen3_next, qwen3_5_text): identity with a random layer, its
 * drafts checked against a fresh recomputation of the layer over the history (so its cache
 * follows every rollback), a head that always drafts token 0 (all rejected), a layer without
 * its own head (the model's lm_head), a context that ends mid-draft, a callback stop; the
 * scheduler with requests drafting by the layer and plain ones in one batch.
 * mtp_errors: a checkpoint without an MTP layer is refused naming the reason.
 * mtp_reference: the layer's forward against transformers' float64 (gen_mtp.py).
 * mtp_reference_qwen3_next / _qwen3_5: the same for the mtp.* module (gen_mtp_qwen3_next.py).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "engine/generate.h"
#include "engine/scheduler.h"
#include "engine/spec.h"
#include "st_build.h"
#include "test.h"

#define N_GEN 24

struct collect {
    int32_t ids[N_GEN + 1];
    int n, stop_after;
};

/* The layer's shared_head.head: random; zeros (every draft is token 0, the first of equal
 * logits); absent (the model's lm_head); zeros with the model's lm_head zeroed too (the model
 * then says token 0 at every step, and every draft is right). */
enum head_kind { HEAD_RANDOM = 0, HEAD_ZERO = 1, HEAD_NONE = 2, HEAD_ZERO_BOTH = 3 };

/* Zero tensor `name` in the safetensors image buf[0..len). */
static void zero_tensor(char *buf, size_t len, const char *name)
{
    uint64_t hl;
    memcpy(&hl, buf, 8);
    assert_true(hl + 8 <= len);
    cJSON *h = cJSON_ParseWithLength(buf + 8, (size_t)hl);
    assert_non_null(h);
    const cJSON *offs = cJSON_GetObjectItem(cJSON_GetObjectItem(h, name), "data_offsets");
    assert_non_null(offs);
    size_t a = (size_t)cJSON_GetArrayItem(offs, 0)->valuedouble, b = (size_t)cJSON_GetArrayItem(offs, 1)->valuedouble;
    assert_true(8 + hl + b <= len && a <= b);
    memset(buf + 8 + hl + a, 0, b - a);
    cJSON_Delete(h);
}

static uint64_t rng_state;
static float urand(void)  /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

/* n elements of dtype (F32, BF16 or F16) at out: norm-like (1 + small) or scaled noise. */
static void fill(void *out, const char *dtype, size_t n, bool norm, float scale)
{
    for (size_t i = 0; i < n; i++) {
        float v = norm ? 1.0f + 0.2f * urand() : scale * urand();
        if (strcmp(dtype, "F32") == 0)
            ((float *)out)[i] = v;
        else if (strcmp(dtype, "BF16") == 0)
            ((uint16_t *)out)[i] = f32_to_bf16(v);
        else
            ((uint16_t *)out)[i] = f32_to_f16(v);
    }
}

static const char *st_dtype_name(enum dtype t)
{
    return t == DTYPE_F32 ? "F32" : t == DTYPE_BF16 ? "BF16" : "F16";
}

/* Whether golden case name is a family with Qwen3-Next's mtp.* module. */
static bool qwen_layout(const char *name)
{
    return strcmp(name, "qwen3_next") == 0 || strcmp(name, "qwen3_5_text") == 0;
}

/* A folder with golden case `name`'s checkpoint and an MTP layer (the file's comment); the
 * caller stb_rmtree's it. */
static char *make_mtp_ckpt(const char *name, enum head_kind head, uint64_t seed)
{
    const char *src = golden_case_dir(name);
    char *dir = stb_tmpdir(), *text = NULL;
    size_t len;
    struct err e = {0};
    bool qwen = qwen_layout(name);
    assert_non_null(dir);
    assert_int_equal(file_read_all(stb_path(src, "config.json"), 1 << 20, &text, &len, &e), 0);
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    assert_non_null(cfg);
    int N = cJSON_GetObjectItem(cfg, "num_hidden_layers")->valueint;
    int d = cJSON_GetObjectItem(cfg, "hidden_size")->valueint;
    int V = cJSON_GetObjectItem(cfg, "vocab_size")->valueint;
    int src_layer = N - 1;
    if (qwen) {
        /* the golden's last full-attention layer is the module's model */
        const cJSON *lt = cJSON_GetObjectItem(cfg, "layer_types");
        for (int il = 0; il < N; il++)
            if (strcmp(cJSON_GetArrayItem(lt, il)->valuestring, "full_attention") == 0)
                src_layer = il;
        cJSON_AddNumberToObject(cfg, "mtp_num_hidden_layers", 1);
        cJSON_AddFalseToObject(cfg, "mtp_use_dedicated_embeddings");
    } else {
        cJSON_DeleteItemFromObject(cfg, "num_nextn_predict_layers");  /* glm4_moe's golden states 1 */
        cJSON_AddNumberToObject(cfg, "num_nextn_predict_layers", 1);
    }
    char *out = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    assert_int_equal(stb_write_text(stb_path(dir, "config.json"), out), 0);
    free(out);
    assert_int_equal(file_read_all(stb_path(src, "model.safetensors"), 64 << 20, &text, &len, &e), 0);
    if (head == HEAD_ZERO_BOTH)
        zero_tensor(text, len, "lm_head.weight");
    assert_int_equal(stb_write_raw(stb_path(dir, "model.safetensors"), text, len), 0);
    free(text);

    /* layer N: layer N - 1's tensors (the same kind of layer past first_k_dense_replace);
     * Qwen3-Next: mtp.layers.0, a full-attention layer's */
    struct st_set *st = NULL;
    assert_int_equal(st_set_open(&st, src, &e), 0);
    char from[64], to[64];
    snprintf(from, sizeof from, "model.layers.%d.", src_layer);
    if (qwen)
        snprintf(to, sizeof to, "mtp.layers.0.");
    else
        snprintf(to, sizeof to, "model.layers.%d.", N);
    size_t n = 0, cap = st_set_count(st) + 8;
    struct stb_tensor *t = calloc(cap, sizeof *t);
    char (*names)[160] = calloc(cap, sizeof *names);
    void **data = calloc(cap, sizeof *data);
    assert_true(t && names && data);
    rng_state = seed;
    for (size_t i = 0; i < st_set_count(st); i++) {
        const struct st_tensor *s = st_set_at(st, i);
        if (strncmp(s->name, from, strlen(from)) != 0)
            continue;
        snprintf(names[n], sizeof names[n], "%s%s", to, s->name + strlen(from));
        size_t cnt = 1;
        t[n] = (struct stb_tensor){names[n], st_dtype_name(s->dtype), s->ndim, {0}, NULL, 0};
        for (int k = 0; k < s->ndim; k++) {
            t[n].shape[k] = s->shape[k];
            cnt *= (size_t)s->shape[k];
        }
        t[n].nbytes = cnt * dtype_size(s->dtype);
        data[n] = malloc(t[n].nbytes);
        /* zero-centred norms (Qwen3-Next: 1 + w) get w near 0 */
        bool norm = s->ndim == 1 && strstr(s->name, "norm");
        float scale = strstr(s->name, "e_score_correction_bias") ? 0.1f
                    : qwen && norm                               ? 0.2f
                                                                 : 2.0f / sqrtf((float)s->shape[s->ndim - 1]);
        fill(data[n], t[n].dtype, cnt, norm && !qwen, scale);
        t[n].data = data[n];
        n++;
    }
    st_set_free(st);
    assert_true(n > 0);
    struct { const char *suffix; int rows, cols; bool norm; } extra[] = {
        {"enorm.weight", d, 0, true}, {"hnorm.weight", d, 0, true}, {"eh_proj.weight", d, 2 * d, false},
        {"shared_head.norm.weight", d, 0, true}, {"shared_head.head.weight", V, d, false},
    };
    static const char *const qwen_names[] = {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                                             "mtp.fc.weight", "mtp.norm.weight", NULL};
    for (size_t x = 0; x < sizeof extra / sizeof extra[0]; x++) {
        bool is_head = x == 4;
        if (is_head && (head == HEAD_NONE || qwen))
            continue;
        if (qwen)
            snprintf(names[n], sizeof names[n], "%s", qwen_names[x]);
        else
            snprintf(names[n], sizeof names[n], "model.layers.%d.%s", N, extra[x].suffix);
        size_t cnt = (size_t)extra[x].rows * (extra[x].cols ? (size_t)extra[x].cols : 1);
        t[n] = (struct stb_tensor){names[n], "F32", extra[x].cols ? 2 : 1, {extra[x].rows, extra[x].cols}, NULL,
                                   cnt * sizeof(float)};
        data[n] = calloc(cnt, sizeof(float));
        bool zero_head = head == HEAD_ZERO || head == HEAD_ZERO_BOTH;
        if (qwen && x == 3 && zero_head) {
            for (size_t i = 0; i < cnt; i++)  /* 1 + w = 0: the layer's output is zeros */
                ((float *)data[n])[i] = -1.0f;
        } else if (qwen) {
            fill(data[n], "F32", cnt, false, extra[x].norm ? 0.2f : 2.0f / sqrtf((float)(extra[x].cols ? extra[x].cols : 1)));
        } else if (!(is_head && zero_head)) {
            fill(data[n], "F32", cnt, extra[x].norm, 2.0f / sqrtf((float)(extra[x].cols ? extra[x].cols : 1)));
        }
        t[n].data = data[n];
        n++;
    }
    assert_int_equal(stb_write(stb_path(dir, "mtp.safetensors"), t, n), 0);
    for (size_t i = 0; i < n; i++)
        free(data[i]);
    free(data);
    free(names);
    free(t);
    return dir;
}

// ---- a model with its MTP drafter ----

struct mtp_eng {
    struct test_eng g;      /* the model */
    struct model *mm;       /* its MTP layer */
    struct model_ctx *mc;
    struct kv_cache *mkv;
    struct spec_mtp *sm;
};

static void mtp_open(struct mtp_eng *x, const char *dir, int ctx, int max_seqs)
{
    struct err e = {0};
    memset(x, 0, sizeof *x);
    test_eng_open(&x->g, dir, NULL, 0, 512, max_seqs, 4);
    struct kv_params kp = {.n_tokens = 512, .max_seqs = max_seqs, .max_seq_len = ctx, .block_size = 4,
                           .dtype = test_kv_dtype, .n_batch = x->g.c->n_batch, .swa_slack = 16};
    kv_cache_free(x->g.kv);
    if (kv_cache_new(&x->g.kv, x->g.m, x->g.be, &kp, &e) < 0 || model_load_mtp(&x->mm, dir, &e) < 0 ||
        spec_mtp_check(x->g.m, x->mm, &e) < 0 || model_prepare(x->mm, x->g.be, &e) < 0 ||
        model_ctx_new(&x->mc, x->mm, x->g.be, 0, &e) < 0)
        fail_msg("%s: %s", dir, e.msg);
    kp.n_tokens = 512 + max_seqs * SPEC_DRAFT_MAX_LIMIT;
    kp.n_batch = x->mc->n_batch;
    if (kv_cache_new(&x->mkv, x->mm, x->g.be, &kp, &e) < 0 || spec_mtp_new(&x->sm, x->mc, x->mkv, &e) < 0)
        fail_msg("%s: %s", dir, e.msg);
}

static void mtp_close(struct mtp_eng *x)
{
    spec_mtp_free(x->sm);
    kv_cache_free(x->mkv);
    model_ctx_free(x->mc);
    model_free(x->mm);
    test_eng_close(&x->g);
}

/* Every draft the layer made: the history's length and the tokens. */
#define MAX_CALLS 64
struct collect;
struct recorder {
    struct spec_mtp *sm;
    const struct collect *truth;  /* set: the layer drafts (and is recorded), then its draft is
                                   * replaced by plain decoding's continuation (all accepted) */
    int n_prompt;
    int n_empty;                  /* calls that could draft (max > 0) and drafted nothing */
    int n_calls;
    int32_t hist[MAX_CALLS][160];
    int n_hist[MAX_CALLS], k[MAX_CALLS];
    int32_t out[MAX_CALLS][2];
};

static int record_draft(void *ud, int seq, const int32_t *hist, int n, int32_t *out, int max)
{
    struct recorder *r = ud;
    int k = spec_mtp_draft(r->sm, seq, hist, n, out, max);
    r->n_empty += max > 0 && k == 0;
    if (k > 0 && r->n_calls < MAX_CALLS && n <= 160) {
        int c = r->n_calls++;
        memcpy(r->hist[c], hist, (size_t)n * sizeof *hist);
        r->n_hist[c] = n;
        r->k[c] = k;
        r->out[c][0] = out[0];
        r->out[c][1] = k > 1 ? out[1] : -1;
    }
    if (r->truth) {
        int at = n - r->n_prompt, j = 0;
        for (; j < k && at + j < r->truth->n && at + j <= N_GEN; j++)
            out[j] = r->truth->ids[at + j];
        k = j;
    }
    return k;
}

static void record_observe(void *ud, int seq, int pos0, const float *hidden, int n, const int32_t *hist, int n_hist)
{
    struct recorder *r = ud;
    spec_mtp_observe(r->sm, seq, pos0, hidden, n, hist, n_hist);
}

static int on_id(void *ud, int32_t id)
{
    struct collect *c = ud;
    if (c->n < N_GEN + 1)
        c->ids[c->n] = id;
    c->n++;
    return c->stop_after > 0 && c->n >= c->stop_after;
}

struct run {
    struct collect got;
    struct gen_stats st;
    int kv_len;
};

static void run_gen(struct mtp_eng *x, const int32_t *prompt, int n_prompt, const struct spec_params *sp,
                    int stop_after, struct run *r)
{
    struct gen_params gp = {.n_predict = N_GEN, .ignore_eos = true};
    sampler_params_default(&gp.sampling);
    if (sp)
        gp.spec = *sp;
    memset(r, 0, sizeof *r);
    r->got.stop_after = stop_after;
    struct err e = {0};
    if (generate(x->g.c, x->g.kv, 0, prompt, n_prompt, &gp, on_id, &r->got, &r->st, &e) < 0)
        fail_msg("generate: %s", e.msg);
    r->kv_len = kv_seq_len(x->g.kv, 0);
}

static void same(const char *name, const char *what, const struct run *plain, const struct run *r)
{
    if (r->got.n != plain->got.n)
        fail_msg("%s, %s: %d ids, plain decoding %d", name, what, r->got.n, plain->got.n);
    for (int i = 0; i < r->got.n && i <= N_GEN; i++)
        if (r->got.ids[i] != plain->got.ids[i])
            fail_msg("%s, %s: id %d is %d, plain decoding %d", name, what, i, r->got.ids[i], plain->got.ids[i]);
    if (r->kv_len != plain->kv_len || r->st.stop != plain->st.stop)
        fail_msg("%s, %s: cache %d / stop %d, plain decoding %d / %d", name, what, r->kv_len, (int)r->st.stop,
                 plain->kv_len, (int)plain->st.stop);
}

static int32_t argmax(const float *l, int V, float *margin)
{
    int32_t b = 0, s = -1;
    for (int i = 1; i < V; i++)
        if (l[i] > l[b])
            b = i;
    for (int i = 0; i < V; i++)
        if (i != b && (s < 0 || l[i] > l[s]))
            s = i;
    *margin = l[b] - l[s];
    return b;
}

/* Draft c of r recomputed from scratch: the model over hist[0..n-1) for its hidden states, a
 * fresh MTP cache fed rows 0..n-2, then one chained row; the tokens must be the layer's (where
 * the recomputed top-2 margin leaves no doubt). Returns the comparisons made. */
static int recheck(struct mtp_eng *x, const struct recorder *r, int c)
{
    struct err e = {0};
    int n = r->n_hist[c], d = x->g.m->hp.n_embd, V = x->g.m->hp.n_vocab, checked = 0;
    const int32_t *h = r->hist[c];
    struct kv_params kp = {.n_tokens = 256, .max_seqs = 1, .max_seq_len = x->g.kv->max_seq_len, .block_size = 4,
                           .dtype = test_kv_dtype, .n_batch = x->g.c->n_batch};
    struct kv_cache *kv = NULL, *mkv = NULL;
    struct batch b;
    float *hid = malloc((size_t)n * d * sizeof *hid), *g = malloc((size_t)n * d * sizeof *g);
    float *lg = malloc((size_t)V * sizeof *lg);
    assert_true(hid && g && lg);
    kp.n_batch = x->mc->n_batch;
    assert_int_equal(kv_cache_new(&kv, x->g.m, x->g.be, &kp, &e), 0);
    assert_int_equal(kv_cache_new(&mkv, x->mm, x->g.be, &kp, &e), 0);
    assert_int_equal(batch_init(&b, 256, &e), 0);
    assert_int_equal(kv_seq_add(kv, 0, &e), 0);
    assert_int_equal(kv_seq_add(mkv, 0, &e), 0);
    /* the model over positions 0 .. n-2 */
    assert_int_equal(batch_add_seq(&b, h, n - 1, 0, 0, true, &e), 0);
    b.hidden_out = hid;
    if (model_forward(x->g.c, &b, kv, lg, &e) < 0)
        fail_msg("%s", e.msg);
    /* the layer: rows p = 0 .. n-2, token h[p + 1], hidden hid[p] */
    batch_clear(&b);
    assert_int_equal(batch_add_seq(&b, h + 1, n - 1, 0, 0, true, &e), 0);
    b.hidden = hid;
    b.hidden_out = g;
    if (model_forward(x->mc, &b, mkv, lg, &e) < 0)
        fail_msg("%s", e.msg);
    float margin;
    int32_t t0 = argmax(lg, V, &margin);
    if (margin > 1e-3f) {
        if (t0 != r->out[c][0])
            fail_msg("draft %d (history of %d): the layer drafted %d, recomputed %d", c, n, r->out[c][0], t0);
        checked++;
    }
    if (r->k[c] > 1 && t0 == r->out[c][0]) {
        batch_clear(&b);
        assert_int_equal(batch_add(&b, t0, n - 1, 0, true, &e), 0);
        b.hidden = g + (size_t)(n - 2) * d;
        memcpy(hid, b.hidden, (size_t)d * sizeof *hid);
        b.hidden = hid;
        b.hidden_out = g;
        if (model_forward(x->mc, &b, mkv, lg, &e) < 0)
            fail_msg("%s", e.msg);
        int32_t t1 = argmax(lg, V, &margin);
        if (margin > 1e-3f) {
            if (t1 != r->out[c][1])
                fail_msg("draft %d (history of %d): the chained draft is %d, recomputed %d", c, n, r->out[c][1], t1);
            checked++;
        }
    }
    batch_free(&b);
    kv_cache_free(kv);
    kv_cache_free(mkv);
    free(hid);
    free(g);
    free(lg);
    return checked;
}

static void mtp_params(struct spec_params *sp, struct recorder *r)
{
    spec_params_default(sp);
    sp->mode = SPEC_MTP;
    sp->draft = record_draft;
    sp->observe = record_observe;
    sp->draft_ud = r;
}

static void check_family(const char *name, const int32_t *prompt, int L, int ctx, const char *family)
{
    char *dir = make_mtp_ckpt(name, HEAD_RANDOM, 45);
    struct mtp_eng x;
    struct recorder *rec = calloc(1, sizeof *rec);
    struct run plain, r;
    struct spec_params sp;
    assert_non_null(rec);
    mtp_open(&x, dir, ctx, 1);
    assert_string_equal(x.mm->ops->family, family);
    assert_int_equal(x.mm->hp.n_layer, 1);
    run_gen(&x, prompt, L, NULL, 0, &plain);

    rec->sm = x.sm;
    mtp_params(&sp, rec);
    run_gen(&x, prompt, L, &sp, 0, &r);
    same(name, "a random MTP layer", &plain, &r);
    assert_null(spec_mtp_error(x.sm));
    if (r.st.n_drafted == 0)
        fail_msg("%s: the MTP layer drafted nothing", name);
    /* every step that asked for a draft got one: the hidden state before it was there, after
     * a rejection too (recurrent models: the kept rows' states before they are fed again) */
    if (rec->n_empty > 0)
        fail_msg("%s: %d steps asked for a draft and the layer had none", name, rec->n_empty);
    int checked = 0;
    for (int c = 0; c < rec->n_calls; c++)
        checked += recheck(&x, rec, c);
    if (checked < 4)
        fail_msg("%s: only %d of the layer's drafts could be checked against a recomputation", name, checked);
    /* the layer's drafts replaced by the truth: every draft accepted, so the layer is handed
     * several rows per step; its own drafts still match a recomputation */
    rec->n_calls = 0;
    rec->truth = &plain.got;
    rec->n_prompt = L;
    run_gen(&x, prompt, L, &sp, 0, &r);
    same(name, "drafts replaced by the truth", &plain, &r);
    if (r.st.n_accepted != r.st.n_drafted || r.st.n_drafted < 4)
        fail_msg("%s, the truth: %d of %d accepted", name, r.st.n_accepted, r.st.n_drafted);
    int checked_all = 0;
    for (int c = 0; c < rec->n_calls; c++)
        checked_all += recheck(&x, rec, c);
    if (checked_all < 2)
        fail_msg("%s: only %d drafts checked with every draft accepted", name, checked_all);
    rec->truth = NULL;
    /* the same drafter on a second prompt (its sequence starts over), then short drafts */
    struct run plain_b;
    run_gen(&x, prompt + 1, L - 1, NULL, 0, &plain_b);
    run_gen(&x, prompt + 1, L - 1, &sp, 0, &r);
    same(name, "a second prompt", &plain_b, &r);
    sp.draft_max = 2;
    run_gen(&x, prompt + 1, L - 1, &sp, 0, &r);
    same(name, "drafts of 2", &plain_b, &r);
    /* a callback (a stop string) stopping after 7 tokens */
    struct run plain7;
    run_gen(&x, prompt, L, NULL, 7, &plain7);
    sp.draft_max = 16;
    run_gen(&x, prompt, L, &sp, 7, &r);
    same(name, "stopped by the callback after 7", &plain7, &r);
    printf("mtp %-16s random layer: %d of %d drafted accepted, %d drafts rechecked\n", name, r.st.n_accepted,
           r.st.n_drafted, checked);
    mtp_close(&x);
    stb_rmtree(dir);

    /* a head of zeros: every draft is token 0 */
    dir = make_mtp_ckpt(name, HEAD_ZERO, 7);
    mtp_open(&x, dir, ctx, 1);
    rec->sm = x.sm;
    run_gen(&x, prompt, L, &sp, 0, &r);
    same(name, "a head drafting token 0", &plain, &r);
    bool zero_out = false;
    for (int i = 0; i < plain.got.n; i++)
        zero_out |= plain.got.ids[i] == 0;
    if (!zero_out && r.st.n_accepted != 0)
        fail_msg("%s: token 0 accepted %d times, never in the output", name, r.st.n_accepted);
    assert_true(r.st.n_drafted > 0);
    mtp_close(&x);
    stb_rmtree(dir);

    /* the model's head zeroed too: it says token 0 at every step, as does every draft */
    dir = make_mtp_ckpt(name, HEAD_ZERO_BOTH, 8);
    mtp_open(&x, dir, ctx, 1);
    rec->sm = x.sm;
    struct run plain0;
    run_gen(&x, prompt, L, NULL, 0, &plain0);
    for (int i = 0; i < plain0.got.n && i <= N_GEN; i++)
        assert_int_equal(plain0.got.ids[i], 0);
    run_gen(&x, prompt, L, &sp, 0, &r);
    same(name, "model and layer saying token 0", &plain0, &r);
    if (r.st.n_drafted == 0 || r.st.n_accepted != r.st.n_drafted)
        fail_msg("%s: the layer's drafts of token 0: %d of %d accepted", name, r.st.n_accepted, r.st.n_drafted);
    mtp_close(&x);
    stb_rmtree(dir);

    if (qwen_layout(name)) {   /* its head is always the model's */
        free(rec);
        return;
    }
    /* no head of its own: the model's lm_head */
    dir = make_mtp_ckpt(name, HEAD_NONE, 9);
    mtp_open(&x, dir, ctx, 1);
    rec->sm = x.sm;
    assert_ptr_equal(x.mm->lm_head.ndim, 2);
    run_gen(&x, prompt, L, &sp, 0, &r);
    same(name, "no shared_head.head", &plain, &r);
    mtp_close(&x);
    stb_rmtree(dir);
    free(rec);
}

static void prompt_of(const char *name, int32_t *prompt, int *L)
{
    struct st_set *gs = NULL;
    struct tensor ids;
    golden_case_input_ids(name, &gs, &ids);
    *L = (int)ids.shape[0];
    memcpy(prompt, ids.data, (size_t)*L * sizeof *prompt);
    st_set_free(gs);
}

static void mtp_family(void **state)
{
    const char *name = *state;
    int32_t prompt[128];
    int L;
    prompt_of(name, prompt, &L);
    check_family(name, prompt, L, L + N_GEN + 8, name);
    /* a context that ends 9 positions after the prompt: drafts are cut at its end */
    check_family(name, prompt, L, L + 9, name);
}

/* dir (make_mtp_ckpt of qwen3_5_text) rewritten as a published Qwen3.5 checkpoint holds it:
 * config.json of model_type qwen3_5 with the text config (mtp_num_hidden_layers included)
 * under text_config, the text model's tensors under model.language_model.*, the mtp.* module
 * at the top level where it was. */
static void nest_qwen3_5(const char *dir)
{
    char *text = NULL, *buf = NULL;
    size_t len;
    struct err e = {0};
    assert_int_equal(file_read_all(stb_path(dir, "config.json"), 1 << 20, &text, &len, &e), 0);
    cJSON *tc = cJSON_Parse(text), *outer = cJSON_CreateObject();
    free(text);
    assert_true(tc && outer);
    cJSON_AddStringToObject(outer, "model_type", "qwen3_5");
    cJSON_AddItemToObject(outer, "architectures", cJSON_Parse("[\"Qwen3_5ForConditionalGeneration\"]"));
    cJSON_AddItemToObject(outer, "tie_word_embeddings", cJSON_DetachItemFromObject(tc, "tie_word_embeddings"));
    cJSON_AddItemToObject(outer, "text_config", tc);
    char *out = cJSON_Print(outer);
    cJSON_Delete(outer);
    assert_int_equal(stb_write_text(stb_path(dir, "config.json"), out), 0);
    free(out);
    /* the header's names "model.X" become "model.language_model.X"; the data stays */
    assert_int_equal(file_read_all(stb_path(dir, "model.safetensors"), 64 << 20, &buf, &len, &e), 0);
    uint64_t hl;
    memcpy(&hl, buf, 8);
    cJSON *h = cJSON_ParseWithLength(buf + 8, (size_t)hl), *nh = cJSON_CreateObject(), *it;
    assert_true(h && nh);
    cJSON_ArrayForEach(it, h) {
        char name[256];
        bool in_model = strncmp(it->string, "model.", 6) == 0;
        snprintf(name, sizeof name, "%s%s", in_model ? "model.language_model." : "", it->string + (in_model ? 6 : 0));
        cJSON_AddItemToObject(nh, name, cJSON_Duplicate(it, true));
    }
    char *hs = cJSON_PrintUnformatted(nh);
    size_t hn = strlen(hs), pad = (8 - hn % 8) % 8, data = len - 8 - (size_t)hl;
    char *nb = malloc(8 + hn + pad + data);
    assert_non_null(nb);
    uint64_t nhl = hn + pad;
    memcpy(nb, &nhl, 8);
    memcpy(nb + 8, hs, hn);
    memset(nb + 8 + hn, ' ', pad);
    memcpy(nb + 8 + hn + pad, buf + 8 + hl, data);
    assert_int_equal(stb_write_raw(stb_path(dir, "model.safetensors"), nb, 8 + hn + pad + data), 0);
    free(nb);
    free(hs);
    free(buf);
    cJSON_Delete(h);
    cJSON_Delete(nh);
}

/* Qwen3.5 as published (multimodal wrapper, text model nested, mtp.* at the top): its module
 * loads and computes what the text checkpoint's does, and --spec mtp keeps plain decoding's
 * output. */
static void mtp_qwen3_5_nested(void **state)
{
    (void)state;
    char *flat = make_mtp_ckpt("qwen3_5_text", HEAD_RANDOM, 45), *dir = make_mtp_ckpt("qwen3_5_text", HEAD_RANDOM, 45);
    nest_qwen3_5(dir);
    struct err e = {0};
    struct model *a = NULL, *b = NULL;
    if (model_load_mtp(&a, flat, &e) < 0 || model_load_mtp(&b, dir, &e) < 0)
        fail_msg("%s", e.msg);
    assert_string_equal(b->multimodal, "qwen3_5");
    assert_int_equal(b->hp.n_layer, 1);
    /* the same tensors bound: the views' bytes equal */
#define T_BYTES(t) ((size_t)tensor_nelem(t) * dtype_size((t)->dtype))
    assert_int_equal(memcmp(a->mtp.eh_proj.data, b->mtp.eh_proj.data, T_BYTES(&a->mtp.eh_proj)), 0);
    assert_int_equal(memcmp(a->layers[0].wq.data, b->layers[0].wq.data, T_BYTES(&a->layers[0].wq)), 0);
    assert_int_equal(memcmp(a->out_norm.data, b->out_norm.data, T_BYTES(&a->out_norm)), 0);
    assert_int_equal(memcmp(a->lm_head.data, b->lm_head.data, T_BYTES(&a->lm_head)), 0);
#undef T_BYTES
    model_free(a);
    model_free(b);
    int32_t prompt[128];
    int L;
    prompt_of("qwen3_5_text", prompt, &L);
    struct mtp_eng x;
    struct recorder *rec = calloc(1, sizeof *rec);
    struct run plain, r;
    struct spec_params sp;
    assert_non_null(rec);
    mtp_open(&x, dir, L + N_GEN + 8, 1);
    run_gen(&x, prompt, L, NULL, 0, &plain);
    rec->sm = x.sm;
    mtp_params(&sp, rec);
    run_gen(&x, prompt, L, &sp, 0, &r);
    same("qwen3_5 nested", "a random MTP module", &plain, &r);
    assert_true(r.st.n_drafted > 0 && rec->n_empty == 0);
    mtp_close(&x);
    free(rec);
    stb_rmtree(flat);
    stb_rmtree(dir);
}

// ---- the scheduler ----

struct sgot {
    int32_t ids[N_GEN + 1];
    int n, done;
};

static int s_on_token(void *ud, int32_t id, const float *logits)
{
    struct sgot *g = ud;
    (void)logits;
    if (g->n < N_GEN + 1)
        g->ids[g->n] = id;
    g->n++;
    return 0;
}

static void s_on_done(void *ud, const struct gen_stats *st, int rc, const struct err *e)
{
    struct sgot *g = ud;
    (void)st;
    if (rc < 0)
        fail_msg("request failed: %s", e ? e->msg : "?");
    g->done++;
}

static int s_empty;   /* scheduler steps that asked for a draft and got none */
static int counting_draft(void *ud, int seq, const int32_t *hist, int n, int32_t *out, int max)
{
    int k = spec_mtp_draft(ud, seq, hist, n, out, max);
    s_empty += max > 0 && k == 0;
    return k;
}

/* Requests drafting with the MTP layer and plain ones, in one batch each step, each equal to
 * plain decoding alone (two prompts, each drafted and plain); every step that asks for a
 * draft gets one (after a recurrent model's rollback too). */
static void mtp_sched(void **state)
{
    const char *name = *state ? (const char *)*state : "deepseek_v3";
    char *dir = make_mtp_ckpt(name, HEAD_RANDOM, 45);
    int32_t prompt[128];
    int L;
    prompt_of(name, prompt, &L);
    struct mtp_eng x;
    mtp_open(&x, dir, L + N_GEN + 8, 4);
    struct run plain[2];
    run_gen(&x, prompt, L, NULL, 0, &plain[0]);
    run_gen(&x, prompt + 2, L - 2, NULL, 0, &plain[1]);
    kv_seq_remove(x.g.kv, 0);
    struct sched *s = NULL;
    struct err e = {0};
    s_empty = 0;
    assert_int_equal(sched_new(&s, x.g.c, x.g.kv, NULL, &e), 0);
    struct sgot got[4] = {0};
    for (int i = 0; i < 4; i++) {
        struct gen_params gp = {.n_predict = N_GEN, .ignore_eos = true};
        sampler_params_default(&gp.sampling);
        spec_params_default(&gp.spec);
        if (i % 2 == 0) {
            gp.spec.mode = SPEC_MTP;
            gp.spec.draft = counting_draft;
            gp.spec.observe = spec_mtp_observe;
            gp.spec.draft_ud = x.sm;
        }
        struct sched_cb cb = {s_on_token, s_on_done, &got[i]};
        const int32_t *p = i < 2 ? prompt : prompt + 2;
        assert_int_equal(sched_submit(s, p, i < 2 ? L : L - 2, &gp, &cb, NULL, &e), 0);
    }
    for (int steps = 0; steps < 1000 && sched_step(s, &e) > 0; steps++)
        ;
    for (int i = 0; i < 4; i++) {
        const struct run *want = &plain[i / 2];
        assert_int_equal(got[i].done, 1);
        if (got[i].n != want->got.n)
            fail_msg("request %d: %d ids, plain %d", i, got[i].n, want->got.n);
        for (int j = 0; j < got[i].n && j <= N_GEN; j++)
            if (got[i].ids[j] != want->got.ids[j])
                fail_msg("request %d (%s): id %d is %d, plain %d", i, i % 2 ? "plain" : "mtp", j, got[i].ids[j],
                         want->got.ids[j]);
    }
    uint64_t drafted, accepted;
    sched_spec_stats(s, &drafted, &accepted);
    assert_true(drafted > 0);
    if (s_empty > 0)
        fail_msg("%s: %d scheduler steps asked for a draft and the layer had none", name, s_empty);
    assert_null(spec_mtp_error(x.sm));
    printf("mtp scheduler (%s): 2 requests drafting with the layer, 2 plain: all equal plain decoding (%llu of "
           "%llu drafted accepted)\n", name, (unsigned long long)accepted, (unsigned long long)drafted);
    sched_free(s);
    mtp_close(&x);
    stb_rmtree(dir);
}

// ---- refusals ----

static void expect_refused(const char *dir, int code, const char *needle)
{
    struct model *m = NULL;
    struct err e = {0};
    int rc = model_load_mtp(&m, dir, &e);
    if (rc != -code || !strstr(e.msg, needle))
        fail_msg("%s: rc %d (%s), expected -%d naming '%s'", dir, rc, e.msg, code, needle);
    assert_null(m);
}

static void mtp_errors(void **state)
{
    (void)state;
    /* no num_nextn_predict_layers; a family without a layout; the field but no tensors */
    expect_refused(golden_case_dir("deepseek_v3"), ERR_CONFIG, "'num_nextn_predict_layers' is absent");
    /* golden glm4_moe states 1 (GLM-4.5's config) but transformers saved no such layer */
    expect_refused(golden_case_dir("glm4_moe"), ERR_FORMAT, "tensor 'model.layers.3.eh_proj.weight' is missing");
    expect_refused(golden_case_dir("llama"), ERR_UNSUPPORTED, "no multi-token-prediction");
    char *dir = make_mtp_ckpt("glm4_moe", HEAD_RANDOM, 1);
    assert_int_equal(unlink(stb_path(dir, "mtp.safetensors")), 0);
    expect_refused(dir, ERR_FORMAT, "eh_proj.weight' is missing: the checkpoint does not hold its "
                   "multi-token-prediction layer");
    /* num_nextn_predict_layers 0 */
    char *text = NULL;
    size_t len;
    struct err e = {0};
    assert_int_equal(file_read_all(stb_path(dir, "config.json"), 1 << 20, &text, &len, &e), 0);
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    assert_true(cJSON_ReplaceItemInObject(cfg, "num_nextn_predict_layers", cJSON_CreateNumber(0)));
    char *out = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    assert_int_equal(stb_write_text(stb_path(dir, "config.json"), out), 0);
    free(out);
    expect_refused(dir, ERR_CONFIG, "'num_nextn_predict_layers' is 0");
    stb_rmtree(dir);
    /* the model itself loads as before: the MTP layer's tensors are not read */
    dir = make_mtp_ckpt("deepseek_v3", HEAD_RANDOM, 1);
    struct model *m = NULL;
    assert_int_equal(model_load(&m, dir, &e), 0);
    assert_int_equal(m->hp.n_layer, 2);
    assert_false(tensor_is_present(&m->mtp.eh_proj));
    model_free(m);
    stb_rmtree(dir);
}

/* config.json of dir with key set to v (a number, or a bool when is_bool). */
static void set_config(const char *dir, const char *key, double v, bool is_bool)
{
    char *text = NULL;
    size_t len;
    struct err e = {0};
    assert_int_equal(file_read_all(stb_path(dir, "config.json"), 1 << 20, &text, &len, &e), 0);
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    assert_non_null(cfg);
    cJSON_DeleteItemFromObject(cfg, key);
    cJSON_AddItemToObject(cfg, key, is_bool ? cJSON_CreateBool(v != 0) : cJSON_CreateNumber(v));
    char *out = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    assert_int_equal(stb_write_text(stb_path(dir, "config.json"), out), 0);
    free(out);
}

/* Qwen3-Next's mtp.* module: what is missing or not supported is named. */
static void mtp_errors_qwen3_next(void **state)
{
    (void)state;
    struct err e = {0};
    /* transformers saves no mtp.* (the count defaults to 1, as vLLM's) */
    expect_refused(golden_case_dir("qwen3_next"), ERR_FORMAT, "tensor 'mtp.fc.weight' is missing");
    expect_refused(golden_case_dir("qwen3_5_text"), ERR_FORMAT, "tensor 'mtp.fc.weight' is missing");
    char *dir = make_mtp_ckpt("qwen3_next", HEAD_RANDOM, 1);
    set_config(dir, "mtp_num_hidden_layers", 0, false);
    expect_refused(dir, ERR_CONFIG, "'mtp_num_hidden_layers' is 0");
    set_config(dir, "mtp_num_hidden_layers", 1, false);
    set_config(dir, "mtp_use_dedicated_embeddings", 1, true);
    expect_refused(dir, ERR_UNSUPPORTED, "mtp_use_dedicated_embeddings");
    set_config(dir, "mtp_use_dedicated_embeddings", 0, true);
    /* the model loads as before, its layers and no MTP stage */
    struct model *m = NULL;
    assert_int_equal(model_load(&m, dir, &e), 0);
    assert_int_equal(m->hp.n_layer, 4);
    assert_false(tensor_is_present(&m->mtp.eh_proj));
    model_free(m);
    /* the layer: full attention with the gate, experts (layer 0's kind) */
    assert_int_equal(model_load_mtp(&m, dir, &e), 0);
    assert_int_equal(m->hp.n_layer, 1);
    assert_int_equal(m->hp.layer[0].mixer, MIXER_ATTENTION);
    assert_true(m->hp.layer[0].attn_gate);
    assert_true(m->hp.layer[0].moe);
    model_free(m);
    stb_rmtree(dir);
}

// ---- the float64 reference ----


/* The largest |a - b| over n values against the largest |b| (a: ours, b: float64 JSON). */
static double rel_err(const float *a, const cJSON *b, int n)
{
    double worst = 0.0, scale = 1e-30;
    for (int i = 0; i < n; i++)
        scale = fmax(scale, fabs(cJSON_GetArrayItem(b, i)->valuedouble));
    for (int i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)a[i] - cJSON_GetArrayItem(b, i)->valuedouble));
    return worst / scale;
}

static void rows_of(const cJSON *arr, float *out, int cols)
{
    for (int r = 0; r < cJSON_GetArraySize(arr); r++)
        for (int c = 0; c < cols; c++)
            out[(size_t)r * cols + c] = (float)cJSON_GetArrayItem(cJSON_GetArrayItem(arr, r), c)->valuedouble;
}

/* gen_mtp.py's case (gen_mtp_qwen3_next.py's with state naming the folder): the model's final
 * hidden states, the layer's logits and normalized outputs over T - 1 rows, and two chained
 * rows, against transformers in float64. */
static void mtp_reference(void **state)
{
    char ref_dir[256];
    snprintf(ref_dir, sizeof ref_dir, "tests/fixtures/models/%s", *state ? (const char *)*state : "deepseek_v3_mtp");
    char *text = NULL;
    size_t len;
    struct err e = {0};
    assert_int_equal(file_read_all(test_path(stb_path(ref_dir, "mtp_ref.json")), 8 << 20, &text, &len, &e), 0);
    cJSON *ref = cJSON_Parse(text);
    free(text);
    assert_non_null(ref);
    const cJSON *ids_j = cJSON_GetObjectItem(ref, "input_ids");
    int T = cJSON_GetArraySize(ids_j);
    struct mtp_eng x;
    mtp_open(&x, test_path(ref_dir), 64, 1);
    int d = x.g.m->hp.n_embd, V = x.g.m->hp.n_vocab;
    int32_t ids[64];
    for (int i = 0; i < T; i++)
        ids[i] = cJSON_GetArrayItem(ids_j, i)->valueint;
    float *hid = malloc((size_t)(T + 2) * d * sizeof *hid), *g = malloc((size_t)(T + 2) * d * sizeof *g);
    float *lg = malloc((size_t)T * V * sizeof *lg), *href = malloc((size_t)T * d * sizeof *href);
    assert_true(hid && g && lg && href);
    struct batch *b = x.g.b;
    double tol = 1e-4, err;

    /* the model: its final hidden states (what lm_head reads) and last logits */
    assert_int_equal(kv_seq_add(x.g.kv, 0, &e), 0);
    batch_clear(b);
    assert_int_equal(batch_add_seq(b, ids, T, 0, 0, true, &e), 0);
    b->hidden_out = hid;
    if (model_forward(x.g.c, b, x.g.kv, lg, &e) < 0)
        fail_msg("%s", e.msg);
    const cJSON *H = cJSON_GetObjectItem(ref, "hidden");
    for (int r = 0; r < T; r++)
        if ((err = rel_err(hid + (size_t)r * d, cJSON_GetArrayItem(H, r), d)) > tol)
            fail_msg("the model's hidden state at %d: rel err %.2e", r, err);
    if ((err = rel_err(lg, cJSON_GetObjectItem(ref, "target_logits_last"), V)) > tol)
        fail_msg("the model's last logits: rel err %.2e", err);

    /* the layer over rows 0 .. T-2, fed the reference's hidden states */
    rows_of(H, href, d);
    assert_int_equal(kv_seq_add(x.mkv, 0, &e), 0);
    batch_clear(b);
    assert_int_equal(batch_add_seq(b, ids + 1, T - 1, 0, 0, false, &e), 0);
    for (int i = 0; i < T - 1; i++)
        b->logits[i] = true;
    b->hidden = href;
    b->hidden_out = g;
    if (model_forward(x.mc, b, x.mkv, lg, &e) < 0)
        fail_msg("%s", e.msg);
    const cJSON *rows = cJSON_GetObjectItem(ref, "rows");
    double worst = 0.0;
    for (int r = 0; r < T - 1; r++) {
        worst = fmax(worst, rel_err(lg + (size_t)r * V, cJSON_GetArrayItem(cJSON_GetObjectItem(rows, "logits"), r), V));
        worst = fmax(worst, rel_err(g + (size_t)r * d, cJSON_GetArrayItem(cJSON_GetObjectItem(rows, "g"), r), d));
    }
    if (worst > tol)
        fail_msg("the MTP rows: rel err %.2e", worst);

    /* the chain: position T-1 (the model's next token, h_{T-1}), then T (the draft, its g) */
    const cJSON *chain = cJSON_GetObjectItem(ref, "chain");
    const cJSON *ct = cJSON_GetObjectItem(chain, "tokens");
    int32_t t0 = cJSON_GetArrayItem(ct, 0)->valueint, t1 = cJSON_GetArrayItem(ct, 1)->valueint;
    float margin;
    for (int step = 0; step < 2; step++) {
        batch_clear(b);
        assert_int_equal(batch_add(b, step ? t1 : t0, T - 1 + step, 0, true, &e), 0);
        float *hin = hid + (size_t)T * d;
        memcpy(hin, step ? g : href + (size_t)(T - 1) * d, (size_t)d * sizeof *hin);
        b->hidden = hin;
        b->hidden_out = g;
        if (model_forward(x.mc, b, x.mkv, lg, &e) < 0)
            fail_msg("%s", e.msg);
        err = fmax(rel_err(lg, cJSON_GetArrayItem(cJSON_GetObjectItem(chain, "logits"), step), V),
                   rel_err(g, cJSON_GetArrayItem(cJSON_GetObjectItem(chain, "g"), step), d));
        worst = fmax(worst, err);
        if (err > tol)
            fail_msg("chained row %d: rel err %.2e", step, err);
        if (step == 0 && argmax(lg, V, &margin) != t1)
            fail_msg("the chained draft is %d, the reference's %d", argmax(lg, V, &margin), t1);
    }
    printf("mtp reference %s (transformers float64): hidden, %d MTP rows and 2 chained rows within rel %.1e "
           "(worst %.2e)\n", ref_dir, T - 1, tol, worst);
    free(hid);
    free(g);
    free(lg);
    free(href);
    mtp_close(&x);
    cJSON_Delete(ref);
}

static void build_tests(const struct CMUnitTest **tests, size_t *n_tests)
{
    static const char *const fams[] = {"deepseek_v3", "glm4_moe", "glm4_moe_lite", "qwen3_next", "qwen3_5_text"};
    enum { N_FAMS = sizeof fams / sizeof fams[0] };
    static struct CMUnitTest t[N_FAMS + 10];
    static char names[N_FAMS][48];
    size_t n = 0;
    for (int i = 0; i < N_FAMS; i++) {
        snprintf(names[i], sizeof names[i], "mtp_%s", fams[i]);
        t[n++] = (struct CMUnitTest){names[i], mtp_family, NULL, NULL, (void *)fams[i]};
    }
    t[n++] = (struct CMUnitTest)cmocka_unit_test(mtp_qwen3_5_nested);
    t[n++] = (struct CMUnitTest)cmocka_unit_test(mtp_sched);
    t[n++] = (struct CMUnitTest){"mtp_sched_qwen3_next", mtp_sched, NULL, NULL, (void *)"qwen3_next"};
    t[n++] = (struct CMUnitTest)cmocka_unit_test(mtp_errors);
    t[n++] = (struct CMUnitTest)cmocka_unit_test(mtp_errors_qwen3_next);
    t[n++] = (struct CMUnitTest)cmocka_unit_test(mtp_reference);
    t[n++] = (struct CMUnitTest){"mtp_reference_qwen3_next", mtp_reference, NULL, NULL, (void *)"qwen3_next_mtp"};
    t[n++] = (struct CMUnitTest){"mtp_reference_qwen3_5", mtp_reference, NULL, NULL, (void *)"qwen3_5_text_mtp"};
    *tests = t;
    *n_tests = n;
}

TEST_SUITE_BUILT(mtp, build_tests);
