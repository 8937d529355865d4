/*
 * embedder: texts and pairs through the tokenizer, the encoder and sentence-transformers'
 * modules (embedder.h). Texts and pairs go through the tokenizer's own encoding
 * (tok_encode_pair: its post-processor's single or pair template, type ids, tokenizers'
 * truncation), as transformers' tokenizer(text, text_pair, truncation=True) makes them.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../core/fileio.h"
#include "../loading/config.h"
#include "../tokenizer/tokenizer.h"
#include "embedder.h"

#define EMB_GROUP_ROWS 8192   /* rows of hidden states held on the host at once */
#define EMB_RR_GROUP   64     /* an LM reranker's pairs per run: their logits rows (n_vocab each)
                               * held on the host at once */

void emb_item_deinit(struct emb_item *it)
{
    free(it->ids);
    free(it->types);
    memset(it, 0, sizeof *it);
}

/* Whether the tokenizer gives the model token_type_ids (embedder.h, embedder_tokenize_pair). */
static bool tok_returns_types(const char *dir)
{
    char path[4096 + 32];
    cJSON *tc = NULL;
    struct err e = {0};
    bool yes = false;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (cfg_load_file(path, FILE_FOLDER, &tc, &e) < 0)
        return false;
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(tc, "model_input_names"), *it;
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(tc, "tokenizer_class");
    if (cJSON_IsArray(names)) {
        cJSON_ArrayForEach(it, names)
            yes = yes || (cJSON_IsString(it) && strcmp(it->valuestring, "token_type_ids") == 0);
    } else if (cJSON_IsString(cls)) {
        yes = strncmp(cls->valuestring, "BertTokenizer", 13) == 0 ||
              strncmp(cls->valuestring, "ElectraTokenizer", 16) == 0;
    }
    cJSON_Delete(tc);
    return yes;
}

static int item_alloc(struct emb_item *it, int n, struct err *e);

/* ---- LM rerankers (ADR 0098) ---- */

#define EMB_RR_MAX_INSTRUCTION (64u << 10)

/* The ids of "no" / "yes" and of the prompt around each pair, from the tokenizer. */
static int rr_init(struct embedder *em, struct err *e)
{
    size_t np, ns;
    int rc;
    if (!em->tok)
        return err_setf(e, ERR_ARG, "an LM reranker needs its tokenizer (tokenizer.json)");
    em->rr_no = tok_piece_to_id(em->tok, "no");
    em->rr_yes = tok_piece_to_id(em->tok, "yes");
    /* a converted one (a score head, n_cls) reads no token rows */
    if (em->m->hp.n_cls == 0 &&
        (em->rr_no < 0 || em->rr_yes < 0 || em->rr_no >= em->m->hp.n_vocab || em->rr_yes >= em->m->hp.n_vocab))
        return err_setf(e, ERR_FORMAT, "an LM reranker's vocabulary needs the tokens \"no\" and \"yes\" "
                        "(within the model's %d)", em->m->hp.n_vocab);
    if ((rc = tok_encode(em->tok, EMB_RR_PREFIX, strlen(EMB_RR_PREFIX), false, &em->rr_prefix, &np, e)) < 0 ||
        (rc = tok_encode(em->tok, EMB_RR_SUFFIX, strlen(EMB_RR_SUFFIX), false, &em->rr_suffix, &ns, e)) < 0)
        return err_prefix(e, "the reranker's prompt");
    em->n_rr_prefix = (int)np;
    em->n_rr_suffix = (int)ns;
    if ((size_t)em->max_len <= np + ns)
        return err_setf(e, ERR_CONFIG, "the model's %d tokens leave no room for a pair after the "
                        "reranker's prompt (%zu tokens)", em->max_len, np + ns);
    return embedder_set_instruction(em, EMB_RR_INSTRUCTION, e);
}

int embedder_set_instruction(struct embedder *em, const char *text, struct err *e)
{
    if (!em->m->hp.lm_rerank)
        return err_setf(e, ERR_ARG, "only an LM reranker (Qwen3-Reranker) takes an instruction");
    if (strlen(text) > EMB_RR_MAX_INSTRUCTION)
        return err_setf(e, ERR_ARG, "the instruction is over %u bytes", EMB_RR_MAX_INSTRUCTION);
    char *t = strdup(text);
    if (!t)
        return err_setf(e, ERR_NOMEM, "out of memory");
    free(em->rr_instruction);
    em->rr_instruction = t;
    return 0;
}

/* prefix + tokens("<Instruct>: I\n<Query>: q\n<Document>: d") + suffix into *it. */
static int rr_pair(const struct embedder *em, const char *q, size_t ql, const char *d, size_t dl,
                   bool truncate, struct emb_item *it, struct err *e)
{
    static const char f1[] = "<Instruct>: ", f2[] = "\n<Query>: ", f3[] = "\n<Document>: ";
    size_t il = strlen(em->rr_instruction), n = sizeof f1 + sizeof f2 + sizeof f3 + il;
    int np = em->n_rr_prefix, ns = em->n_rr_suffix, room = em->max_len - np - ns, rc;
    struct tok_encode_opts o = {.add_special = true, .strategy = TOK_TRUNC_LONGEST_FIRST,
                                .max_length = truncate ? (size_t)room : 0};
    struct tok_encoding enc;
    memset(it, 0, sizeof *it);
    if (ql > SIZE_MAX / 4 - n || dl > SIZE_MAX / 4 - n - ql)
        return err_setf(e, ERR_RANGE, "the pair is too long");
    char *text = malloc(n + ql + dl), *p = text;
    if (!text)
        return err_setf(e, ERR_NOMEM, "out of memory tokenizing");
    memcpy(p, f1, sizeof f1 - 1), p += sizeof f1 - 1;
    memcpy(p, em->rr_instruction, il), p += il;
    memcpy(p, f2, sizeof f2 - 1), p += sizeof f2 - 1;
    memcpy(p, q, ql), p += ql;
    memcpy(p, f3, sizeof f3 - 1), p += sizeof f3 - 1;
    memcpy(p, d, dl), p += dl;
    rc = tok_encode_pair(em->tok, text, (size_t)(p - text), NULL, 0, &o, &enc, e);
    free(text);
    if (rc < 0)
        return rc;
    if (enc.n > (size_t)room)
        rc = err_setf(e, ERR_RANGE, "the pair has %zu tokens, more than the %d the model's %d leave "
                      "after the reranker's prompt", enc.n, room, em->max_len);
    else if ((rc = item_alloc(it, np + (int)enc.n + ns, e)) == 0) {
        memcpy(it->ids, em->rr_prefix, (size_t)np * sizeof *it->ids);
        memcpy(it->ids + np, enc.ids, enc.n * sizeof *it->ids);
        memcpy(it->ids + np + enc.n, em->rr_suffix, (size_t)ns * sizeof *it->ids);
    }
    tok_encoding_deinit(&enc);
    return rc;
}

int embedder_new(struct embedder **out, const struct model *m, struct backend *be,
                 const struct tokenizer *tok, struct err *e)
{
    int rc;
    *out = NULL;
    struct embedder *em = calloc(1, sizeof *em);
    if (!em)
        return err_setf(e, ERR_NOMEM, "embedder: out of memory");
    em->m = m;
    em->tok = tok;
    if ((rc = emb_config_load(&em->cfg, m->dir, &m->hp, e)) < 0 || (rc = enc_new(&em->enc, m, be, e)) < 0) {
        embedder_free(em);
        return rc;
    }
    em->max_len = enc_max_tokens(m);
    em->pair_types = m->hp.n_type_vocab > 1 && tok_returns_types(m->dir);
    if (em->cfg.max_seq_length > 0 && em->cfg.max_seq_length < em->max_len)
        em->max_len = em->cfg.max_seq_length;
    if (m->hp.lm_rerank && (rc = rr_init(em, e)) < 0) {
        embedder_free(em);
        return rc;
    }
    *out = em;
    return 0;
}

void embedder_free(struct embedder *em)
{
    if (!em)
        return;
    enc_free(em->enc);
    emb_config_deinit(&em->cfg);
    free(em->rr_prefix);
    free(em->rr_suffix);
    free(em->rr_instruction);
    free(em);
}

bool embedder_is_reranker(const struct embedder *em)
{
    return em->m->hp.n_cls > 0 || em->m->hp.lm_rerank;
}

// ---- tokens ----

static int item_alloc(struct emb_item *it, int n, struct err *e)
{
    memset(it, 0, sizeof *it);
    it->ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *it->ids);
    it->types = calloc((size_t)(n > 0 ? n : 1), sizeof *it->types);
    if (!it->ids || !it->types) {
        emb_item_deinit(it);
        return err_setf(e, ERR_NOMEM, "out of memory tokenizing");
    }
    it->n = n;
    return 0;
}

/* a, or the pair (a, b), through the tokenizer's post-processor, truncated to the model's
 * limit (tokenizers' longest_first, as transformers' truncation=True) or refused when it is
 * longer and truncate is false. */
static int encode_item(const struct embedder *em, const char *a, size_t al, const char *b, size_t bl,
                       bool truncate, struct emb_item *it, struct err *e)
{
    struct tok_encode_opts o = {.add_special = true, .strategy = TOK_TRUNC_LONGEST_FIRST};
    struct tok_encoding enc;
    int rc;
    memset(it, 0, sizeof *it);
    if (!em->tok)
        return err_setf(e, ERR_ARG, "this model has no tokenizer: give token ids");
    o.max_length = truncate ? (size_t)em->max_len : 0;
    if ((rc = tok_encode_pair(em->tok, a, al, b, bl, &o, &enc, e)) < 0)
        return rc;
    if (enc.n > (size_t)em->max_len) {   /* not asked to cut, or the specials alone exceed it */
        rc = err_setf(e, ERR_RANGE, "the %s has %zu tokens, more than the model's %d",
                      b ? "pair" : "input", enc.n, em->max_len);
    } else if (enc.n == 0) {   /* an empty text with a tokenizer that adds no special token */
        rc = err_setf(e, ERR_RANGE, "the text gives no tokens (the model needs at least one)");
    } else if ((rc = item_alloc(it, (int)enc.n, e)) == 0) {
        memcpy(it->ids, enc.ids, enc.n * sizeof *it->ids);
        for (size_t i = 0; em->pair_types && i < enc.n; i++)
            it->types[i] = enc.type_ids[i];
    }
    tok_encoding_deinit(&enc);
    return rc;
}

int embedder_tokenize(const struct embedder *em, const char *prompt, const char *text, size_t len,
                      bool truncate, struct emb_item *it, struct err *e)
{
    size_t pl = prompt ? strlen(prompt) : 0;
    int rc;
    if (pl == 0)
        return encode_item(em, text, len, NULL, 0, truncate, it, e);
    if (len > SIZE_MAX - pl - 1)
        return err_setf(e, ERR_RANGE, "the input is too long");
    char *joined = malloc(pl + len + 1);
    if (!joined)
        return err_setf(e, ERR_NOMEM, "out of memory tokenizing");
    memcpy(joined, prompt, pl);
    memcpy(joined + pl, text, len);
    joined[pl + len] = 0;
    rc = encode_item(em, joined, pl + len, NULL, 0, truncate, it, e);
    free(joined);
    if (rc < 0)
        return rc;
    /* sentence-transformers' prompt_length: the prompt's ids with the special tokens, less
     * one (the closing special it assumes) */
    struct emb_item p;
    if (encode_item(em, prompt, pl, NULL, 0, true, &p, e) == 0)
        it->skip = p.n - 1 < it->n ? (p.n - 1 > 0 ? p.n - 1 : 0) : it->n;
    emb_item_deinit(&p);
    err_clear(e);
    return 0;
}

int embedder_tokenize_pair(const struct embedder *em, const char *q, size_t ql, const char *d,
                           size_t dl, bool truncate, struct emb_item *it, struct err *e)
{
    if (em->m->hp.lm_rerank)
        return em->tok ? rr_pair(em, q, ql, d, dl, truncate, it, e)
                       : err_setf(e, ERR_ARG, "this model has no tokenizer: give token ids");
    return encode_item(em, q, ql, d, dl, truncate, it, e);
}

int embedder_ids(const struct embedder *em, const int32_t *ids, int n, bool truncate,
                 struct emb_item *it, struct err *e)
{
    int rc;
    if (n > em->max_len && !truncate)
        return err_setf(e, ERR_RANGE, "the input has %d tokens, more than the model's %d", n, em->max_len);
    int k = n < em->max_len ? n : em->max_len;
    if ((rc = item_alloc(it, k, e)) < 0)
        return rc;
    memcpy(it->ids, ids, (size_t)k * sizeof *ids);
    return 0;
}

// ---- running ----

/* Items [i0, i1) of at most EMB_GROUP_ROWS rows (at least one item). */
static int group_end(const struct emb_item *items, int n, int i0, size_t *rows)
{
    int i1 = i0;
    *rows = 0;
    while (i1 < n && (i1 == i0 || *rows + (size_t)items[i1].n <= EMB_GROUP_ROWS))
        *rows += (size_t)items[i1++].n;
    return i1;
}

static int run_group(struct embedder *em, const struct emb_item *items, int i0, int i1, float *hidden,
                     float *logits, struct err *e)
{
    struct enc_seq *seqs = calloc((size_t)(i1 - i0), sizeof *seqs);
    if (!seqs)
        return err_setf(e, ERR_NOMEM, "out of memory");
    for (int i = i0; i < i1; i++)
        seqs[i - i0] = (struct enc_seq){items[i].ids, items[i].types, items[i].n};
    int rc = enc_run(em->enc, seqs, i1 - i0, hidden, logits, e);
    free(seqs);
    return rc;
}

int embedder_embed(struct embedder *em, const struct emb_item *items, int n, float *out, struct err *e)
{
    int d = em->m->hp.n_embd, rc = 0;
    if (embedder_is_reranker(em))
        return err_setf(e, ERR_ARG, "this model is a reranker (cross-encoder): it scores pairs");
    for (int i0 = 0; i0 < n && rc == 0;) {
        size_t rows;
        int i1 = group_end(items, n, i0, &rows);
        float *hidden = malloc(rows * (size_t)d * sizeof *hidden);
        if (!hidden)
            return err_setf(e, ERR_NOMEM, "out of memory for %zu hidden rows", rows);
        if ((rc = run_group(em, items, i0, i1, hidden, NULL, e)) == 0) {
            size_t r = 0;
            for (int i = i0; i < i1; i++) {
                emb_finish(&em->cfg, out + (size_t)i * em->cfg.dim, hidden + r * d, items[i].n, d,
                           items[i].skip);
                r += (size_t)items[i].n;
            }
        }
        free(hidden);
        i0 = i1;
    }
    return rc;
}

/* An LM reranker's scores: P(yes) = softmax(no, yes)[1] of each item's last-token logits,
 * computed in double as the model card's log_softmax(...).exp(); a converted one's (score
 * head of one label, ADR 0136): its logit through the cross-encoder activation (sigmoid unless
 * config.json names another, as sentence-transformers' CrossEncoder). */
static int rr_score(struct embedder *em, const struct emb_item *items, int n, float *scores, struct err *e)
{
    int nc = em->m->hp.n_cls, nv = nc > 0 ? nc : em->m->hp.n_vocab, rc = 0;
    if (nc > 1)
        return err_setf(e, ERR_UNSUPPORTED, "reranking needs a sequence-classification head of one label "
                        "(num_labels 1); this one has %d", nc);
    for (int i0 = 0; i0 < n && rc == 0;) {
        size_t rows;
        int i1 = group_end(items, n, i0, &rows);
        if (i1 - i0 > EMB_RR_GROUP)
            i1 = i0 + EMB_RR_GROUP;
        float *logits = malloc((size_t)(i1 - i0) * nv * sizeof *logits);
        if (!logits)
            return err_setf(e, ERR_NOMEM, "out of memory for %d rows of logits", i1 - i0);
        if ((rc = run_group(em, items, i0, i1, NULL, logits, e)) == 0)
            for (int i = i0; i < i1; i++) {
                const float *l = logits + (size_t)(i - i0) * nv;
                scores[i] = nc > 0 ? emb_score(&em->cfg, l[0])
                                   : (float)(1.0 / (1.0 + exp((double)l[em->rr_no] - (double)l[em->rr_yes])));
            }
        free(logits);
        i0 = i1;
    }
    return rc;
}

int embedder_score(struct embedder *em, const struct emb_item *items, int n, float *scores, struct err *e)
{
    int nc = em->m->hp.n_cls, rc = 0;
    if (em->m->hp.lm_rerank)
        return rr_score(em, items, n, scores, e);
    if (!embedder_is_reranker(em))
        return err_setf(e, ERR_ARG, "this model embeds texts: it has no classification head to rerank with");
    if (nc != 1)   /* CrossEncoder.predict gives such a model's label logits, not one relevance */
        return err_setf(e, ERR_UNSUPPORTED, "reranking needs a cross-encoder of one label (num_labels 1); "
                        "this one has %d", nc);
    float *logits = malloc((size_t)(n > 0 ? n : 1) * nc * sizeof *logits);
    if (!logits)
        return err_setf(e, ERR_NOMEM, "out of memory");
    for (int i0 = 0; i0 < n && rc == 0;) {
        size_t rows;
        int i1 = group_end(items, n, i0, &rows);
        rc = run_group(em, items, i0, i1, NULL, logits + (size_t)i0 * nc, e);
        i0 = i1;
    }
    for (int i = 0; rc == 0 && i < n; i++)
        scores[i] = emb_score(&em->cfg, logits[(size_t)i * nc]);
    free(logits);
    return rc;
}
