/*
 * embedder: texts and pairs through the tokenizer, the encoder and sentence-transformers'
 * modules (embedder.h). The special tokens of a single text come from the tokenizer's own
 * post-processor (the ids with and without it: a prefix P and a suffix S around the text's
 * ids), so truncation cuts the text and keeps P and S as tokenizers' truncation does before
 * post-processing; pairs are assembled from P and S in the BERT or RoBERTa template.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../core/fileio.h"
#include "../loading/config.h"
#include "../tokenizer/tokenizer.h"
#include "embedder.h"

#define EMB_GROUP_ROWS 8192   /* rows of hidden states held on the host at once */

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
    *out = em;
    return 0;
}

void embedder_free(struct embedder *em)
{
    if (!em)
        return;
    enc_free(em->enc);
    emb_config_deinit(&em->cfg);
    free(em);
}

bool embedder_is_reranker(const struct embedder *em)
{
    return em->m->hp.n_cls > 0;
}

// ---- tokens ----

/* A text's ids with and without the post-processor: *body (owned) and the specials around
 * it, *np before and *ns after. */
static int text_parts(const struct embedder *em, const char *text, size_t len, int32_t **body,
                      int *nb, int32_t **pre, int *np, int *ns, struct err *e)
{
    int32_t *full = NULL;
    size_t nf, n;
    int rc;
    *body = *pre = NULL;
    if (!em->tok)
        return err_setf(e, ERR_ARG, "this model has no tokenizer: give token ids");
    if ((rc = tok_encode(em->tok, text, len, false, body, &n, e)) < 0 ||
        (rc = tok_encode(em->tok, text, len, true, &full, &nf, e)) < 0)
        goto fail;
    size_t p = 0;
    while (p + n <= nf && memcmp(full + p, *body, n * sizeof(int32_t)) != 0)
        p++;
    if (p + n > nf) {
        rc = err_setf(e, ERR_INTERNAL, "the tokenizer's post-processor does not keep the text's ids");
        goto fail;
    }
    *nb = (int)n;
    *np = (int)p;
    *ns = (int)(nf - n - p);
    *pre = full;   /* full[0, p) are P, full[p + n, nf) are S */
    return 0;
fail:
    free(*body);
    free(full);
    *body = NULL;
    return rc;
}

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

int embedder_tokenize(const struct embedder *em, const char *prompt, const char *text, size_t len,
                      bool truncate, struct emb_item *it, struct err *e)
{
    size_t pl = prompt ? strlen(prompt) : 0;
    char *joined = malloc(pl + len + 1);
    int32_t *body = NULL, *full = NULL;
    int nb, np, ns, rc;
    if (!joined)
        return err_setf(e, ERR_NOMEM, "out of memory tokenizing");
    memcpy(joined, prompt ? prompt : "", pl);
    memcpy(joined + pl, text, len);
    joined[pl + len] = 0;
    rc = text_parts(em, joined, pl + len, &body, &nb, &full, &np, &ns, e);
    free(joined);
    if (rc < 0)
        return rc;
    int room = em->max_len - np - ns;
    if (nb > room && !truncate) {
        rc = err_setf(e, ERR_RANGE, "the input has %d tokens, more than the model's %d", nb + np + ns,
                      em->max_len);
        goto out;
    }
    int keep = nb < room ? nb : room > 0 ? room : 0;
    if (np + keep + ns == 0) {   /* an empty text with a tokenizer that adds no special token */
        rc = err_setf(e, ERR_RANGE, "the text gives no tokens (the model needs at least one)");
        goto out;
    }
    if ((rc = item_alloc(it, np + keep + ns, e)) < 0)
        goto out;
    memcpy(it->ids, full, (size_t)np * sizeof(int32_t));
    memcpy(it->ids + np, body, (size_t)keep * sizeof(int32_t));
    memcpy(it->ids + np + keep, full + np + nb, (size_t)ns * sizeof(int32_t));
    if (pl > 0) {   /* the prompt's own tokens (ST's prompt_length) */
        int32_t *pb = NULL;
        size_t pn = 0;
        if (tok_encode(em->tok, prompt, pl, false, &pb, &pn, e) == 0)
            it->skip = np + (int)pn < it->n ? np + (int)pn : it->n;
        free(pb);
        err_clear(e);
    }
out:
    free(body);
    free(full);
    return rc;
}

/* tokenizers' LongestFirst truncation of a pair to target ids (truncate_encodings). */
static void longest_first(int *n1, int *n2, int target)
{
    if (*n1 + *n2 <= target)
        return;
    bool swap = *n1 > *n2;
    int a = swap ? *n2 : *n1, b = swap ? *n1 : *n2;   /* a <= b */
    b = a > target ? a : (a > target - a ? a : target - a);
    if (a + b > target) {
        a = target / 2;
        b = a + target % 2;
    }
    *n1 = swap ? b : a;
    *n2 = swap ? a : b;
}

int embedder_tokenize_pair(const struct embedder *em, const char *q, size_t ql, const char *d,
                           size_t dl, bool truncate, struct emb_item *it, struct err *e)
{
    int32_t *bq = NULL, *fq = NULL, *bd = NULL, *fd = NULL;
    int nq, nd, np, ns, np2, ns2, rc;
    if ((rc = text_parts(em, q, ql, &bq, &nq, &fq, &np, &ns, e)) < 0 ||
        (rc = text_parts(em, d, dl, &bd, &nd, &fd, &np2, &ns2, e)) < 0)
        goto out;
    /* RoBERTa's template repeats the separator between the texts */
    int mid = em->m->hp.pos_offset > 0 ? 2 * ns : ns;
    int room = em->max_len - np - mid - ns, kq = nq, kd = nd;
    if (nq + nd > room && !truncate) {
        rc = err_setf(e, ERR_RANGE, "the pair has %d tokens, more than the model's %d",
                      nq + nd + np + mid + ns, em->max_len);
        goto out;
    }
    longest_first(&kq, &kd, room > 0 ? room : 0);
    if ((rc = item_alloc(it, np + kq + mid + kd + ns, e)) < 0)
        goto out;
    int r = 0, type_b = em->pair_types ? 1 : 0;
    memcpy(it->ids + r, fq, (size_t)np * sizeof(int32_t)), r += np;
    memcpy(it->ids + r, bq, (size_t)kq * sizeof(int32_t)), r += kq;
    for (int i = 0; i < mid; i++)
        it->ids[r++] = fq[np + nq + i % (ns > 0 ? ns : 1)];
    int b0 = r;   /* the second segment: the document and its closing separator */
    memcpy(it->ids + r, bd, (size_t)kd * sizeof(int32_t)), r += kd;
    memcpy(it->ids + r, fq + np + nq, (size_t)ns * sizeof(int32_t)), r += ns;
    for (int i = b0; i < r; i++)
        it->types[i] = type_b;
out:
    free(bq);
    free(fq);
    free(bd);
    free(fd);
    return rc;
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

int embedder_score(struct embedder *em, const struct emb_item *items, int n, float *scores, struct err *e)
{
    int nc = em->m->hp.n_cls, rc = 0;
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
