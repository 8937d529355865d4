/*
 * post: the post-processor of tokenizer.json (special tokens and token type
 * ids around one text or a pair) and truncation, as tokenizers' Tokenizer::
 * post_process does them.
 *
 * Loaded shapes (anything else is -ERR_UNSUPPORTED):
 *   TemplateProcessing  "single" must hold one $A with special tokens around
 *                       it (kept as prefix/suffix ids, which tokenizer_config
 *                       add_bos/eos_token may edit); "pair" any order of
 *                       specials, $A and $B, each with its type id
 *   BertProcessing      [CLS] A [SEP] / [CLS] A [SEP] B:1 [SEP]:1
 *   RobertaProcessing   <s> A </s> / <s> A </s> </s> B </s>, every type id 0
 *   ByteLevel           offsets only: nothing to do
 *   Sequence            each in turn (a later template replaces an earlier one)
 * With no post-processor a pair is A then B, type ids 0 and 1.
 *
 * Truncation (tokenizers' truncate_encodings, direction right, no stride):
 * encode.c has already stopped each text after the word that reached
 * max_length (tokenizers 0.23's early exit), then the budget is max_length
 * minus the special tokens the post-processor will add (no cut at all when
 * they are more than max_length: tokenizers' usize subtraction wraps); longest_first cuts a pair as tokenizers does (the shorter sequence is
 * kept whole when the longer one can take the whole cut, else both get half
 * the budget, the odd token to the second), only_first / only_second cut
 * one sequence and fail when it is not longer than the cut.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

/* ---- load ---- */

int tok_post_push(struct tokenizer *t, bool prefix, int32_t id, struct err *e)
{
    int *n = prefix ? &t->post.n_prefix : &t->post.n_suffix;
    if (id < 0 || id >= t->n_ids)
        return err_setf(e, ERR_FORMAT, "post_processor: id %d out of range [0, %d)", id, t->n_ids);
    if (*n >= TOK_POST_MAX)
        return err_setf(e, ERR_UNSUPPORTED, "post_processor: more than %d special tokens",
                        TOK_POST_MAX);
    (prefix ? t->post.prefix_type : t->post.suffix_type)[*n] = 0;
    (prefix ? t->post.prefix : t->post.suffix)[(*n)++] = id;
    return 0;
}

static int pair_push(struct tok_post *p, int32_t id, int32_t type_id, struct err *e)
{
    if (p->n_pair >= TOK_POST_PAIR_MAX)
        return err_setf(e, ERR_UNSUPPORTED, "post_processor: pair template of more than %d items",
                        TOK_POST_PAIR_MAX);
    p->pair[p->n_pair++] = (struct tok_post_item){id, type_id};
    return 0;
}

/* The "type_id" of a template item: an integer in [0, TOK_TYPE_ID_MAX]. */
static int item_type(const cJSON *item, int32_t *out, struct err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(item, "type_id");
    *out = 0;
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > TOK_TYPE_ID_MAX ||
        v->valuedouble != (int32_t)v->valuedouble)
        return err_setf(e, ERR_FORMAT, "post_processor: type_id must be an integer in [0, %d]",
                        TOK_TYPE_ID_MAX);
    *out = (int32_t)v->valuedouble;
    return 0;
}

/* Calls back for each id of the special token named by item. */
static int special_ids(const struct tokenizer *t, const cJSON *specials, const cJSON *st,
                       int32_t *ids, int *n, struct err *e)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(st, "id"), *idv;
    *n = 0;
    if (!cJSON_IsString(name))
        return err_setf(e, ERR_FORMAT, "post_processor TemplateProcessing: bad item");
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(specials, name->valuestring);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(spec, "ids");
    if (!cJSON_IsArray(list))
        return err_setf(e, ERR_FORMAT, "post_processor: special token '%.64s' has no ids",
                        name->valuestring);
    cJSON_ArrayForEach(idv, list) {
        if (!cJSON_IsNumber(idv) || idv->valuedouble < 0 || idv->valuedouble >= t->n_ids ||
            idv->valuedouble != (int32_t)idv->valuedouble)
            return err_setf(e, ERR_FORMAT,
                            "post_processor: special token '%.64s': id %.0f out of range [0, %d)",
                            name->valuestring, cJSON_IsNumber(idv) ? idv->valuedouble : -1.0,
                            t->n_ids);
        if (*n >= TOK_POST_MAX)
            return err_setf(e, ERR_UNSUPPORTED, "post_processor: more than %d special tokens",
                            TOK_POST_MAX);
        ids[(*n)++] = (int32_t)idv->valuedouble;
    }
    return 0;
}

/* The sequence of a {"Sequence": {"id": "A"|"B"}} item. */
static int seq_of(const cJSON *seq, int32_t *out, struct err *e)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(seq, "id");
    if (cJSON_IsString(id) && strcmp(id->valuestring, "A") == 0)
        *out = TOK_POST_SEQ_A;
    else if (cJSON_IsString(id) && strcmp(id->valuestring, "B") == 0)
        *out = TOK_POST_SEQ_B;
    else
        return err_setf(e, ERR_FORMAT, "post_processor TemplateProcessing: sequence id not A or B");
    return 0;
}

/* Reads one template ("single" or "pair") into items. */
static int read_template(const struct tokenizer *t, const cJSON *tmpl, const cJSON *specials,
                         struct tok_post *items, struct err *e)
{
    const cJSON *it;
    int rc;
    items->n_pair = 0;
    cJSON_ArrayForEach(it, tmpl) {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        int32_t type_id, ids[TOK_POST_MAX], which = TOK_POST_SEQ_A;
        int n;
        if (seq) {
            if ((rc = item_type(seq, &type_id, e)) < 0 || (rc = seq_of(seq, &which, e)) < 0 ||
                (rc = pair_push(items, which, type_id, e)) < 0)
                return rc;
            continue;
        }
        if ((rc = item_type(st, &type_id, e)) < 0 ||
            (rc = special_ids(t, specials, st, ids, &n, e)) < 0)
            return rc;
        for (int k = 0; k < n; k++)
            if ((rc = pair_push(items, ids[k], type_id, e)) < 0)
                return rc;
    }
    return 0;
}

/* TemplateProcessing: "single" into prefix / type_a / suffix, "pair" as it is. */
static int load_template(struct tokenizer *t, const cJSON *j, struct err *e)
{
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single");
    const cJSON *pair = cJSON_GetObjectItemCaseSensitive(j, "pair");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
    struct tok_post *p = &t->post, tmp = {0};
    int n_seq = 0, rc;
    if (!cJSON_IsArray(single))
        return err_setf(e, ERR_FORMAT, "post_processor TemplateProcessing: missing \"single\"");
    if ((rc = read_template(t, single, specials, &tmp, e)) < 0)
        return rc;
    p->n_prefix = p->n_suffix = 0;
    p->type_a = 0;
    for (int i = 0; i < tmp.n_pair; i++) {
        const struct tok_post_item *it = &tmp.pair[i];
        if (it->id == TOK_POST_SEQ_B || (it->id == TOK_POST_SEQ_A && n_seq++ > 0))
            return err_setf(e, ERR_UNSUPPORTED,
                            "post_processor TemplateProcessing: \"single\" must hold $A once");
        if (it->id == TOK_POST_SEQ_A) {
            p->type_a = it->type_id;
            continue;
        }
        int *n = n_seq ? &p->n_suffix : &p->n_prefix;
        if (*n >= TOK_POST_MAX)
            return err_setf(e, ERR_UNSUPPORTED, "post_processor: more than %d special tokens",
                            TOK_POST_MAX);
        (n_seq ? p->suffix : p->prefix)[*n] = it->id;
        (n_seq ? p->suffix_type : p->prefix_type)[(*n)++] = it->type_id;
    }
    if (n_seq == 0)
        return err_setf(e, ERR_FORMAT, "post_processor TemplateProcessing: \"single\" has no $A");
    p->n_pair = -1;  /* no pair template: a pair with special tokens is an error */
    if (!pair || cJSON_IsNull(pair))
        return 0;
    if (!cJSON_IsArray(pair))
        return err_setf(e, ERR_FORMAT, "post_processor TemplateProcessing: bad \"pair\"");
    return read_template(t, pair, specials, p, e);
}

/* RobertaProcessing / BertProcessing: "cls": [piece, id], "sep": [piece, id]. */
static int load_cls_sep(struct tokenizer *t, const cJSON *j, bool roberta, struct err *e)
{
    const cJSON *cls = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "cls"), 1);
    const cJSON *sep = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "sep"), 1);
    struct tok_post *p = &t->post;
    int rc;
    if (!cJSON_IsNumber(cls) || !cJSON_IsNumber(sep))
        return err_setf(e, ERR_FORMAT, "post_processor: bad \"cls\"/\"sep\"");
    p->n_prefix = p->n_suffix = 0;
    p->type_a = 0;
    if ((rc = tok_post_push(t, true, (int32_t)cls->valuedouble, e)) < 0 ||
        (rc = tok_post_push(t, false, (int32_t)sep->valuedouble, e)) < 0)
        return rc;
    int32_t c = p->prefix[0], s = p->suffix[0], tb = roberta ? 0 : 1;
    p->n_pair = 0;
    pair_push(p, c, 0, e);
    pair_push(p, TOK_POST_SEQ_A, 0, e);
    pair_push(p, s, 0, e);
    if (roberta)
        pair_push(p, s, 0, e);
    pair_push(p, TOK_POST_SEQ_B, tb, e);
    return pair_push(p, s, tb, e);
}

static int load_post(struct tokenizer *t, const cJSON *j, int depth, struct err *e)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type"), *it;
    if (!j || cJSON_IsNull(j))
        return 0;
    if (!cJSON_IsString(type))
        return err_setf(e, ERR_FORMAT, "post_processor: missing \"type\"");
    const char *ty = type->valuestring;
    if (strcmp(ty, "ByteLevel") == 0)
        return 0;  /* only adjusts offsets */
    if (strcmp(ty, "TemplateProcessing") == 0)
        return load_template(t, j, e);
    if (strcmp(ty, "RobertaProcessing") == 0 || strcmp(ty, "BertProcessing") == 0)
        return load_cls_sep(t, j, ty[0] == 'R', e);
    if (strcmp(ty, "Sequence") == 0 && depth < 4) {
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(j, "processors")) {
            int rc = load_post(t, it, depth + 1, e);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    return err_setf(e, ERR_UNSUPPORTED, "post_processor type '%.64s' is not supported", ty);
}

int tok_post_load(struct tokenizer *t, const cJSON *j, struct err *e)
{
    return load_post(t, j, 0, e);
}

/* ---- apply ---- */

/* Special tokens the post-processor adds to a single text or a pair. */
static size_t n_added(const struct tok_post *p, bool pair)
{
    size_t n = 0;
    if (!pair)
        return (size_t)(p->n_prefix + p->n_suffix);
    for (int i = 0; i < p->n_pair; i++)
        n += p->pair[i].id >= 0;
    return n;
}

/* tokenizers' truncate_encodings (direction right, stride 0) on the lengths
 * *na and *nb (nb NULL: a single text). Errors: ERR_RANGE as tokenizers'
 * TruncationError. */
static int truncate_lengths(size_t max, enum tok_trunc strategy, size_t *na, size_t *nb,
                            struct err *e)
{
    size_t total = *na + (nb ? *nb : 0);
    if (max == 0) {
        *na = 0;
        if (nb)
            *nb = 0;
        return 0;
    }
    if (total <= max)
        return 0;
    size_t to_remove = total - max;
    if (strategy == TOK_TRUNC_LONGEST_FIRST) {
        if (!nb) {
            *na = max;
            return 0;
        }
        size_t n1 = *na, n2 = *nb;
        bool swap = n1 > n2;
        if (swap) {
            n1 = *nb;
            n2 = *na;
        }
        n2 = n1 > max ? n1 : (n1 > max - n1 ? n1 : max - n1);
        if (n1 + n2 > max) {
            n1 = max / 2;
            n2 = n1 + max % 2;
        }
        if (swap) {
            size_t tmp = n1;
            n1 = n2;
            n2 = tmp;
        }
        if (n1 < *na)
            *na = n1;
        if (n2 < *nb)
            *nb = n2;
        return 0;
    }
    if (strategy == TOK_TRUNC_ONLY_SECOND && !nb)
        return err_setf(e, ERR_RANGE, "truncation: only_second needs a second sequence");
    size_t *target = strategy == TOK_TRUNC_ONLY_FIRST ? na : nb;
    if (*target <= to_remove)
        return err_setf(e, ERR_RANGE,
                        "truncation: the sequence to truncate (%zu tokens) is too short for "
                        "max_length %zu", *target, max);
    *target -= to_remove;
    return 0;
}

static void put_ids(struct tok_encoding *o, size_t *k, const int32_t *ids, size_t n,
                    int32_t type_id)
{
    for (size_t i = 0; i < n; i++) {
        o->ids[*k] = ids[i];
        o->type_ids[(*k)++] = type_id;
    }
}

int tok_post_assemble(const struct tokenizer *t, const struct tok_ids *a, const struct tok_ids *b,
                      const struct tok_encode_opts *o, struct tok_encoding *out, struct err *e)
{
    const struct tok_post *p = &t->post;
    size_t na = a->n, nb = b ? b->n : 0, k = 0;
    int rc;
    if (b && p->n_pair < 0 && o->add_special)
        return err_setf(e, ERR_UNSUPPORTED,
                        "encode: the post-processor has no template for a pair of texts");
    size_t added = o->add_special ? n_added(p, b != NULL) : 0;
    /* tokenizers takes the special tokens off max_length in usize: when
     * they alone exceed it the subtraction wraps and nothing is cut here */
    if (o->max_length > 0 && o->max_length >= added &&
        (rc = truncate_lengths(o->max_length - added, o->strategy, &na, b ? &nb : NULL, e)) < 0)
        return rc;
    size_t n = na + nb + added;
    out->ids = malloc((n + 1) * sizeof *out->ids);
    out->type_ids = malloc((n + 1) * sizeof *out->type_ids);
    out->n = 0;
    if (!out->ids || !out->type_ids) {
        tok_encoding_deinit(out);
        return err_setf(e, ERR_NOMEM, "encode: %zu ids", n);
    }
    if (!b) {
        for (int i = 0; o->add_special && i < p->n_prefix; i++)
            put_ids(out, &k, &p->prefix[i], 1, p->prefix_type[i]);
        put_ids(out, &k, a->v, na, p->type_a);
        for (int i = 0; o->add_special && i < p->n_suffix; i++)
            put_ids(out, &k, &p->suffix[i], 1, p->suffix_type[i]);
    } else if (p->n_pair <= 0) {
        put_ids(out, &k, a->v, na, 0);
        put_ids(out, &k, b->v, nb, 1);
    } else {
        for (int i = 0; i < p->n_pair; i++) {
            const struct tok_post_item *it = &p->pair[i];
            if (it->id == TOK_POST_SEQ_A)
                put_ids(out, &k, a->v, na, it->type_id);
            else if (it->id == TOK_POST_SEQ_B)
                put_ids(out, &k, b->v, nb, it->type_id);
            else if (o->add_special)
                put_ids(out, &k, &it->id, 1, it->type_id);
        }
    }
    out->n = k;
    return 0;
}

void tok_encoding_deinit(struct tok_encoding *enc)
{
    if (!enc)
        return;
    free(enc->ids);
    free(enc->type_ids);
    memset(enc, 0, sizeof *enc);
}
