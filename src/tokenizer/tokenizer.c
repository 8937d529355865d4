/*
 * tokenizer: loading a Hugging Face tokenizer.json (+ tokenizer_config.json)
 * into an immutable struct tokenizer, and the small accessors.
 *
 * Load order: read the file (size-capped); find model.vocab and
 * model.merges in the raw text and read them with jscan.c (90% of the file,
 * far cheaper than a cJSON tree), parse the rest with cJSON; size the id
 * table from the vocab and added_tokens ids so it is allocated in one
 * piece; then each stage loads its own section (model: bpe.c, normalizer:
 * normalize.c, pre_tokenizer: pretok.c, decoder: decode.c, post_processor:
 * post.c; added tokens here). The model is BPE (bpe.c), WordPiece or
 * WordLevel (wordpiece.c) or Unigram (unigram.c, whose vocab is a list of
 * [piece, score] pairs instead of a {piece: id} object). tokenizer_config.json only contributes
 * bos/eos and add_bos_token/add_eos_token. Every section is validated as
 * hostile input: ids in [0, 2^24), pieces <= TOK_PIECE_MAX bytes, duplicate
 * ids or pieces rejected, unknown component types -> ERR_UNSUPPORTED.
 * All failures funnel through one cleanup path that frees the partial
 * tokenizer, so a bad file never leaks.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/fileio.h"
#include "../core/json.h"
#include "tok_impl.h"

/* ---- file reading ---- */

/* Parses tokenizer.json: model.vocab and model.merges are located in the
 * raw text (spans into *text, which the caller frees) and left out of the
 * compact copy cJSON parses (each replaced by an empty {} or []), so the
 * tree holds only the small sections. */
static int parse_tokenizer_json(const char *path, char **text, cJSON **root,
                                struct tok_span *spans, struct err *e)
{
    size_t len = 0, n = 0;
    int rc = file_read_scoped(path, FILE_FOLDER, TOK_JSON_MAX, text, &len, e);
    if (rc < 0)
        return rc;
    if (tok_json_model_spans(*text, len, &spans[0], &spans[1]) < 0) {
        spans[0] = spans[1] = (struct tok_span){0};
        if ((rc = json_parse_object(*text, len, path, root, e)) < 0)
            return rc;  /* cJSON says where the JSON is broken */
        cJSON_Delete(*root);
        *root = NULL;
        return err_setf(e, ERR_FORMAT, "%s: JSON nested deeper than %d levels", path,
                        TOK_JSON_DEPTH);
    }
    char *compact = malloc(len + 1);
    if (!compact)
        return err_setf(e, ERR_NOMEM, "%s: %zu bytes", path, len);
    /* spans in text order; a value that is not an object/array stays as is */
    int first = spans[1].p && (!spans[0].p || spans[1].p < spans[0].p) ? 1 : 0;
    const char *from = *text;
    for (int k = 0; k < 2; k++) {
        const struct tok_span *sp = &spans[k == 0 ? first : 1 - first];
        char open = sp->p ? sp->p[0] : 0;
        if (open != '{' && open != '[')
            continue;
        memcpy(compact + n, from, (size_t)(sp->p - from));
        n += (size_t)(sp->p - from);
        compact[n++] = open;
        compact[n++] = open == '{' ? '}' : ']';
        from = sp->p + sp->len;
    }
    memcpy(compact + n, from, (size_t)(*text + len - from));
    n += (size_t)(*text + len - from);
    rc = json_parse_object(compact, n, path, root, e);
    free(compact);
    return rc;
}

/* ---- id table ---- */

/* Checks one id field and folds it into *max_id. */
static int check_id(const cJSON *v, const char *what, int32_t *max_id, struct err *e)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= TOK_ID_LIMIT ||
        v->valuedouble != (int32_t)v->valuedouble)
        return err_setf(e, ERR_FORMAT, "%s: id must be an integer in [0, %d)", what, TOK_ID_LIMIT);
    if ((int32_t)v->valuedouble > *max_id)
        *max_id = (int32_t)v->valuedouble;
    return 0;
}

/* Sizes and allocates t->entry from the ids in model.vocab and added_tokens. */
static int alloc_ids(struct tokenizer *t, const struct tok_vlist *vocab, const cJSON *added,
                     struct err *e)
{
    int32_t max_id = vocab->max_id;
    size_t n_entries = vocab->n;
    const cJSON *it;
    int rc;
    cJSON_ArrayForEach(it, added) {
        if ((rc = check_id(cJSON_GetObjectItemCaseSensitive(it, "id"), "added_tokens", &max_id, e)) < 0)
            return rc;
        n_entries++;
    }
    if ((size_t)max_id + 1 > 2 * n_entries + TOK_ID_SLACK)
        return err_setf(e, ERR_FORMAT, "ids too sparse: highest id %d for %zu entries", max_id,
                        n_entries);
    t->n_ids = max_id + 1;
    t->entry = calloc((size_t)t->n_ids, sizeof *t->entry);
    if (!t->entry)
        return err_setf(e, ERR_NOMEM, "id table: %d entries", t->n_ids);
    return 0;
}

/* ---- added tokens ---- */

static bool flag(const cJSON *obj, const char *key, bool dflt)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsBool(j) ? cJSON_IsTrue(j) : dflt;
}

static int load_added_one(struct tokenizer *t, const cJSON *it, size_t i, struct err *e)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
    int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
    struct tok_added *a = &t->added[i];
    int rc;
    if (!cJSON_IsString(c) || c->valuestring[0] == '\0')
        return err_setf(e, ERR_FORMAT, "added_tokens[%zu]: missing or empty \"content\"", i);
    size_t len = strlen(c->valuestring);
    if (len > TOK_PIECE_MAX)
        return err_setf(e, ERR_FORMAT, "added_tokens[%zu]: content of %zu bytes (max %d)", i, len,
                        TOK_PIECE_MAX);
    if (tok_utf8_check(c->valuestring, len) != len)
        return err_setf(e, ERR_FORMAT, "added_tokens[%zu]: content is not valid UTF-8", i);
    if (t->entry[id].flags & TOK_E_ADDED)
        return err_setf(e, ERR_FORMAT, "added_tokens[%zu]: id %d used twice", i, id);
    if ((rc = tok_pool_add(&t->pool, c->valuestring, len, &a->off, e)) < 0)
        return rc;
    a->id = id;
    a->len = (uint32_t)len;
    a->moff = a->off;
    a->mlen = a->len;
    a->special = flag(it, "special", false);
    a->lstrip = flag(it, "lstrip", false);
    a->rstrip = flag(it, "rstrip", false);
    a->single_word = flag(it, "single_word", false);
    a->normalized = flag(it, "normalized", !a->special);  /* HF's default */
    struct tok_entry *en = &t->entry[id];
    en->off = a->off;
    en->len = a->len;
    en->flags |= TOK_E_ADDED | (a->special ? TOK_E_SPECIAL : 0);
    return 0;
}

struct added_key {
    unsigned char first;
    uint32_t len, idx;
};

static int added_key_cmp(const void *x, const void *y)
{
    const struct added_key *a = x, *b = y;
    if (a->first != b->first)
        return a->first < b->first ? -1 : 1;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;  /* longest first */
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* Builds the first-byte index of the added tokens whose normalized flag is norm. */
static int build_set(struct tokenizer *t, struct tok_added_set *set, bool norm, struct err *e)
{
    size_t n = 0;
    struct added_key *k = malloc((t->n_added + 1) * sizeof *k);
    set->idx = malloc((t->n_added + 1) * sizeof *set->idx);
    if (!k || !set->idx) {
        free(k);
        return err_setf(e, ERR_NOMEM, "added tokens index");
    }
    for (size_t i = 0; i < t->n_added; i++) {
        const struct tok_added *a = &t->added[i];
        if (a->normalized == norm && a->mlen > 0)
            k[n++] = (struct added_key){(unsigned char)t->pool.buf[a->moff], a->mlen, (uint32_t)i};
    }
    qsort(k, n, sizeof *k, added_key_cmp);
    memset(set->start, 0, sizeof set->start);
    for (size_t i = 0; i < n; i++) {
        set->idx[i] = k[i].idx;
        set->start[k[i].first + 1]++;
    }
    for (int b = 0; b < 256; b++)
        set->start[b + 1] += set->start[b];
    if (norm)
        t->n_added_norm = n;
    free(k);
    return 0;
}

static int load_added(struct tokenizer *t, const cJSON *added, struct err *e)
{
    int rc;
    size_t i = 0;
    const cJSON *it;
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return err_setf(e, ERR_FORMAT, "added_tokens: expected an array");
    t->n_added = (size_t)cJSON_GetArraySize(added);
    t->added = calloc(t->n_added + 1, sizeof *t->added);
    if (!t->added)
        return err_setf(e, ERR_NOMEM, "added_tokens: %zu entries", t->n_added);
    cJSON_ArrayForEach(it, added) {
        if ((rc = load_added_one(t, it, i++, e)) < 0)
            return rc;
    }
    return 0;
}

/* Normalized added tokens are matched in normalized text, so (as HF does
 * since 0.20) their content is normalized once here; then both match sets
 * are built. Runs after the normalizer is loaded. */
static int index_added(struct tokenizer *t, struct err *e)
{
    int rc = 0;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md)
        return err_setf(e, ERR_NOMEM, "added tokens: PCRE2 match data");
    for (size_t i = 0; i < t->n_added && t->norm.n > 0 && rc == 0; i++) {
        struct tok_added *a = &t->added[i];
        char *ns = NULL;
        size_t nlen = 0;
        if (!a->normalized)
            continue;
        if ((rc = tok_norm_apply(t, md, t->pool.buf + a->off, a->len, &ns, &nlen, e)) < 0)
            break;
        if (nlen > TOK_PIECE_MAX)
            rc = err_setf(e, ERR_FORMAT, "added_tokens[%zu]: normalized content over %d bytes", i,
                          TOK_PIECE_MAX);
        else if ((rc = tok_pool_add(&t->pool, ns, nlen, &a->moff, e)) == 0)
            a->mlen = (uint32_t)nlen;
        free(ns);
    }
    pcre2_match_data_free(md);
    if (rc < 0 || (rc = build_set(t, &t->added_raw, false, e)) < 0)
        return rc;
    return build_set(t, &t->added_norm, true, e);
}

int32_t tok_lookup(const struct tokenizer *t, const char *s, size_t len)
{
    for (size_t i = 0; i < t->n_added; i++) {
        const struct tok_added *a = &t->added[i];
        if (a->len == len && memcmp(t->pool.buf + a->off, s, len) == 0)
            return a->id;
    }
    return tok_strmap_get(&t->bpe.vocab, &t->pool, s, len);
}

/* ---- tokenizer.json ---- */

/* The model section: options from the cJSON tree, vocab and merges from
 * their spans in the raw text (jscan.c). */
static int load_model(struct tokenizer *t, const cJSON *root, const struct tok_span *spans,
                      struct err *e)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    struct tok_vlist vl = {0};
    int rc;
    if (!cJSON_IsObject(model))
        return err_setf(e, ERR_FORMAT, "missing \"model\" object");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    double *scores = NULL;
    /* Old files omit the type; a model with merges is BPE, one with
     * max_input_chars_per_word WordPiece, one with an unk_id Unigram. */
    const char *ty = cJSON_IsString(type) ? type->valuestring
                     : cJSON_GetObjectItemCaseSensitive(model, "merges") ? "BPE"
                     : cJSON_GetObjectItemCaseSensitive(model, "max_input_chars_per_word") ? "WordPiece"
                     : cJSON_GetObjectItemCaseSensitive(model, "unk_id") ? "Unigram" : "(none)";
    if (strcmp(ty, "BPE") == 0)
        t->model = TOK_MODEL_BPE;
    else if (strcmp(ty, "WordPiece") == 0)
        t->model = TOK_MODEL_WORDPIECE;
    else if (strcmp(ty, "WordLevel") == 0)
        t->model = TOK_MODEL_WORDLEVEL;
    else if (strcmp(ty, "Unigram") == 0)
        t->model = TOK_MODEL_UNIGRAM;
    else
        return err_setf(e, ERR_UNSUPPORTED,
                        "model type '%.64s' is not supported (BPE, WordPiece, WordLevel, Unigram)", ty);
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return err_setf(e, ERR_FORMAT, "added_tokens: expected an array");
    if (t->model == TOK_MODEL_UNIGRAM)
        rc = tok_uni_read_vocab(t, spans[0], &vl, &scores, e);
    else
        rc = tok_bpe_read_vocab(t, spans[0], &vl, e);
    if (rc == 0 && (rc = alloc_ids(t, &vl, added, e)) == 0) {
        switch (t->model) {
        case TOK_MODEL_BPE:
            rc = tok_bpe_load(t, model, &vl, spans[1], e);
            break;
        case TOK_MODEL_UNIGRAM:
            rc = tok_uni_load(t, model, &vl, scores, e);
            scores = NULL;
            break;
        default:
            rc = tok_wp_load(t, model, &vl, e);
            break;
        }
    }
    if (rc == 0)
        rc = load_added(t, added, e);
    free(scores);
    tok_vlist_deinit(&vl);
    return rc;
}

/* True when cutting words before a U+2581 that follows another character
 * cannot change BPE's result (see on_word in encode.c): the vocab has
 * U+2581 and no piece holds it right after another character, merges are
 * not skipped (ignore_merges), and words are not byte-level mapped. */
static bool spm_cut_ok(const struct tokenizer *t)
{
    if (t->model != TOK_MODEL_BPE || t->bpe.ignore_merges || t->pretok.byte_level ||
        tok_strmap_get(&t->bpe.vocab, &t->pool, TOK_META, 3) < 0)
        return false;
    for (int i = 0; i < t->pretok.n; i++)
        if (t->pretok.step[i].kind == TOK_PRE_BYTELEVEL)
            return false;
    for (int i = 0; i < t->norm.n; i++)
        if (t->norm.step[i].kind == TOK_NORM_BYTELEVEL)
            return false;
    for (int32_t id = 0; id < t->n_ids; id++) {
        const struct tok_entry *en = &t->entry[id];
        if (!(en->flags & TOK_E_MODEL))
            continue;
        const char *p = t->pool.buf + en->off;
        for (size_t i = 1; i + 3 <= en->len; i++)
            if (memcmp(p + i, TOK_META, 3) == 0 &&
                !(i >= 3 && memcmp(p + i - 3, TOK_META, 3) == 0))
                return false;
    }
    return true;
}

static int load_tokenizer_json(struct tokenizer *t, const cJSON *root, const struct tok_span *spans,
                               struct err *e)
{
    int rc;
    if ((rc = load_model(t, root, spans, e)) < 0)
        return rc;
    if ((rc = tok_norm_load(&t->norm, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), e)) < 0)
        return rc;
    if ((rc = index_added(t, e)) < 0)
        return rc;
    if ((rc = tok_pretok_load(&t->pretok, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"),
                              e)) < 0)
        return rc;
    if ((rc = tok_post_load(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), e)) < 0)
        return rc;
    t->spm_cut = spm_cut_ok(t);
    return tok_decoder_load(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"), e);
}

/* ---- tokenizer_config.json ---- */

/* bos_token / eos_token: a string or an AddedToken object {"content": ...}. */
static int32_t config_token(const struct tokenizer *t, const cJSON *cfg, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v))
        return -1;
    return tok_lookup(t, v->valuestring, strlen(v->valuestring));
}

/* add_bos_token / add_eos_token = true make sure the post-processor adds
 * them; an explicit false takes them out of the template (transformers'
 * Llama-style tokenizers rebuild the template from these flags the same
 * way). Absent flags leave the tokenizer.json post-processor as it is. */
static int apply_config(struct tokenizer *t, const cJSON *cfg, struct err *e)
{
    int rc;
    t->bos_id = config_token(t, cfg, "bos_token");
    t->eos_id = config_token(t, cfg, "eos_token");
    if (t->bos_id >= 0 && flag(cfg, "add_bos_token", false) &&
        !(t->post.n_prefix > 0 && t->post.prefix[0] == t->bos_id)) {
        if (t->post.n_prefix >= TOK_POST_MAX)
            return err_setf(e, ERR_UNSUPPORTED, "add_bos_token: template full");
        memmove(t->post.prefix + 1, t->post.prefix, (size_t)t->post.n_prefix * sizeof(int32_t));
        memmove(t->post.prefix_type + 1, t->post.prefix_type,
                (size_t)t->post.n_prefix * sizeof(int32_t));
        t->post.prefix[0] = t->bos_id;
        t->post.prefix_type[0] = 0;
        t->post.n_prefix++;
    }
    if (t->bos_id >= 0 && !flag(cfg, "add_bos_token", true) && t->post.n_prefix > 0 &&
        t->post.prefix[0] == t->bos_id) {
        memmove(t->post.prefix, t->post.prefix + 1,
                (size_t)(t->post.n_prefix - 1) * sizeof(int32_t));
        memmove(t->post.prefix_type, t->post.prefix_type + 1,
                (size_t)(t->post.n_prefix - 1) * sizeof(int32_t));
        t->post.n_prefix--;
    }
    if (t->eos_id >= 0 && !flag(cfg, "add_eos_token", true) && t->post.n_suffix > 0 &&
        t->post.suffix[t->post.n_suffix - 1] == t->eos_id)
        t->post.n_suffix--;
    if (t->eos_id >= 0 && flag(cfg, "add_eos_token", false) &&
        !(t->post.n_suffix > 0 && t->post.suffix[t->post.n_suffix - 1] == t->eos_id)) {
        if ((rc = tok_post_push(t, false, t->eos_id, e)) < 0)
            return rc;
    }
    return 0;
}

/* ---- public ---- */

int tok_load_files(struct tokenizer **out, const char *tokenizer_json, const char *config_json,
                   struct err *e)
{
    cJSON *root = NULL, *cfg = NULL;
    char *text = NULL;
    struct tok_span spans[2] = {{0}};
    int rc;
    *out = NULL;
    struct tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return err_setf(e, ERR_NOMEM, "tokenizer");
    t->bos_id = t->eos_id = -1;
    tok_bytelevel_init(&t->bl);
    if ((rc = parse_tokenizer_json(tokenizer_json, &text, &root, spans, e)) < 0)
        goto fail;
    if ((rc = load_tokenizer_json(t, root, spans, e)) < 0) {
        err_prefix(e, "%s", tokenizer_json);
        goto fail;
    }
    if (config_json) {
        if ((rc = json_load_object(config_json, FILE_FOLDER, TOK_CONFIG_MAX, &cfg, e)) < 0)
            goto fail;
        if ((rc = apply_config(t, cfg, e)) < 0) {
            err_prefix(e, "%s", config_json);
            goto fail;
        }
    }
    free(text);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    *out = t;
    return 0;
fail:
    free(text);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    tok_free(t);
    return rc;
}

int tok_load(struct tokenizer **out, const char *dir, struct err *e)
{
    char tj[4096], cfg[4096];
    *out = NULL;
    if ((size_t)snprintf(tj, sizeof tj, "%s/tokenizer.json", dir) >= sizeof tj ||
        (size_t)snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir) >= sizeof cfg)
        return err_setf(e, ERR_ARG, "tokenizer directory path too long");
    struct stat st;
    bool has_cfg = stat(cfg, &st) == 0;
    return tok_load_files(out, tj, has_cfg ? cfg : NULL, e);
}

void tok_free(struct tokenizer *t)
{
    if (!t)
        return;
    tok_bpe_deinit(&t->bpe);
    tok_uni_deinit(&t->uni);
    tok_pretok_deinit(&t->pretok);
    tok_norm_deinit(&t->norm);
    tok_decoder_deinit(&t->dec);
    tok_pool_deinit(&t->pool);
    free(t->entry);
    free(t->added);
    free(t->added_raw.idx);
    free(t->added_norm.idx);
    free(t);
}

int tok_vocab_size(const struct tokenizer *t) { return t->n_ids; }
int32_t tok_bos_id(const struct tokenizer *t) { return t->bos_id; }
int32_t tok_eos_id(const struct tokenizer *t) { return t->eos_id; }

const char *tok_id_to_piece(const struct tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_ids || !t->entry[id].flags)
        return NULL;
    return t->pool.buf + t->entry[id].off;
}

bool tok_is_special(const struct tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && (t->entry[id].flags & TOK_E_SPECIAL);
}

int32_t tok_piece_to_id(const struct tokenizer *t, const char *piece)
{
    return tok_lookup(t, piece, strlen(piece));
}
