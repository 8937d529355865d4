/*
 * model: loading a checkpoint folder into the canonical layout, and the
 * per-request context (KV cache + activation arena) that runs it.
 *
 * model_load: config.json -> registry -> parse_config -> quantization and
 * generation_config.json -> hparams_validate -> st_set_open -> map_weights.
 * Weights are never copied: every slot is a view into the mmap.
 */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "../core/fileio.h"
#include "../core/log.h"
#include "../loading/config.h"
#include "../loading/convert.h"
#include "tp.h"
#include "../loading/wmap.h"
#include "mtp.h"
#include "registry.h"
#include "vision.h"

/* ---- loading ---- */

/* generation_config.json (optional): eos ids override config.json; sampling defaults. */
static int parse_generation(struct model *m, const char *dir, struct err *e)
{
    char path[4200];
    struct generation_defaults *g = &m->gen;
    g->temperature = g->top_p = g->min_p = g->repeat_penalty = NAN;
    g->top_k = GEN_TOP_K_ABSENT;
    g->do_sample = false;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    cJSON *cfg = NULL;
    int rc, n = 0;
    int32_t ids[HP_MAX_EOS];
    if ((rc = cfg_load_file(path, FILE_FOLDER, &cfg, e)) == -ERR_MISSING) {
        err_clear(e);  /* optional */
        return 0;
    }
    if (rc < 0)
        return rc;
    if ((rc = cfg_opt_ids(cfg, "eos_token_id", ids, HP_MAX_EOS, &n, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "do_sample", false, &g->do_sample, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "temperature", NAN, &g->temperature, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "top_p", NAN, &g->top_p, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "top_k", GEN_TOP_K_ABSENT, &g->top_k, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "min_p", NAN, &g->min_p, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "repetition_penalty", NAN, &g->repeat_penalty, e)) < 0) {
        cJSON_Delete(cfg);
        return err_prefix(e, "%s", path);
    }
    /* transformers samples only with do_sample; otherwise it is greedy and the sampling
     * values are not used at all (GenerationConfig.validate only warns of them), so they
     * are dropped here: a top_p of 2 beside do_sample false does not break greedy runs.
     * repetition_penalty applies in greedy search too. */
    if (!g->do_sample) {
        g->temperature = 0.0f;
        g->top_p = g->min_p = NAN;
        g->top_k = GEN_TOP_K_ABSENT;
    }
    if (n > 0) {
        memcpy(m->hp.eos_ids, ids, (size_t)n * sizeof ids[0]);
        m->hp.n_eos = n;
    }
    cJSON_Delete(cfg);
    return 0;
}

static int parse_common_ids(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc, dtype;
    /* the dtype is only checked here (a family that needs it reads it again): one that is
     * no torch dtype ("float8") is refused as transformers refuses it */
    if ((rc = cfg_opt_int(cfg, "bos_token_id", -1, &hp->bos_id, e)) < 0 ||
        (rc = cfg_model_dtype(cfg, &dtype, e)) < 0)
        return rc;
    return cfg_opt_ids(cfg, "eos_token_id", hp->eos_ids, HP_MAX_EOS, &hp->n_eos, e);
}

/* Drop eos ids that cannot be produced (outside the vocabulary). */
static void filter_eos(struct hparams *hp)
{
    int n = 0;
    for (int i = 0; i < hp->n_eos; i++) {
        if (hp->eos_ids[i] >= 0 && hp->eos_ids[i] < hp->n_vocab)
            hp->eos_ids[n++] = hp->eos_ids[i];
        else
            LOG_WARN("ignoring eos_token_id %d outside the vocabulary", hp->eos_ids[i]);
    }
    hp->n_eos = n;
}

/* Tensors the family did not map usually mean the config and the checkpoint disagree (fewer
 * layers declared than stored, a renamed module): say so at the default level, with names. */
static void warn_unused(const struct model *m)
{
    size_t n = st_set_n_unused(m->st), shown = 0;
    if (n == 0)
        return;
    char names[256] = "";
    for (size_t i = 0; i < st_set_count(m->st) && shown < 3; i++) {
        const struct st_tensor *t = st_set_at(m->st, i);
        if (t->consumed)
            continue;
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s'%s'", shown ? ", " : "", t->name);
        shown++;
    }
    LOG_WARN("%zu checkpoint tensors are not used by the %s config (%s%s): does config.json "
             "match the checkpoint? (see `mlxcel inspect`)", n, m->ops->family, names,
             n > shown ? ", ..." : "");
}

// ---- multimodal checkpoints: the text model alone ----

/* Where a multimodal checkpoint keeps its text model, and the names the text families read
 * (transformers 5: model.language_model.*; transformers 4 and mlx-vlm: language_model.model.*
 * and language_model.lm_head.*; Idefics3: model.text_model.*, mlx-vlm's language_model.*). */
static const char *const k_nest_rename[][2] = {
    {"model.language_model.", "model."},
    {"language_model.model.", "model."},
    {"language_model.lm_head.", "lm_head."},
    {"model.text_model.", "model."},
    /* mlx-vlm's Idefics3 / SmolVLM: its LanguageModel holds the llama modules directly */
    {"language_model.embed_tokens.", "model.embed_tokens."},
    {"language_model.layers.", "model.layers."},
    {"language_model.norm.", "model.norm."},
};
/* What such a checkpoint holds besides it, not loaded: vision towers, projectors,
 * multi-token-prediction heads. */
static const char *const k_nest_skip[] = {
    "model.visual.", "visual.", "model.vision_tower.", "vision_tower.", "model.vision_model.", "vision_model.",
    "model.multi_modal_projector.", "multi_modal_projector.", "model.connector.", "connector.", "mtp.",
    "model.mtp.",
};
#define N_NEST_RENAME (sizeof k_nest_rename / sizeof k_nest_rename[0])
#define N_NEST_SKIP (sizeof k_nest_skip / sizeof k_nest_skip[0])

/* A copy of object o whose keys are renamed by k_nest_rename (per-module quantization
 * entries name modules), NULL when out of memory. */
static cJSON *renamed_keys(const cJSON *o)
{
    cJSON *n = cJSON_CreateObject();
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        const char *old = it->string ? it->string : "", *to = "";
        size_t skip = 0;
        for (size_t r = 0; r < N_NEST_RENAME && !skip; r++)
            if (strncmp(old, k_nest_rename[r][0], strlen(k_nest_rename[r][0])) == 0) {
                skip = strlen(k_nest_rename[r][0]);
                to = k_nest_rename[r][1];
            }
        char *key = malloc(strlen(to) + strlen(old + skip) + 1);
        cJSON *d = cJSON_Duplicate(it, true);
        bool ok = n && key && d;
        if (ok) {
            strcpy(key, to);
            strcat(key, old + skip);
            ok = cJSON_AddItemToObject(n, key, d);
        }
        free(key);
        if (!ok) {
            cJSON_Delete(d);
            cJSON_Delete(n);
            return NULL;
        }
    }
    return n;
}

/* A published Qwen2-VL / Qwen2.5-VL config.json is flat: the text model's keys at its top
 * beside vision_config (transformers reads it into text_config). *cfg becomes a copy with
 * model_type "<outer>_text" where a family reads that (ADR 0094), *outer the whole config.
 * 1 when so, 0 when no family does. */
static int flat_text_config(cJSON **cfg, cJSON **outer, const char *mt, char *wrapper, size_t cap,
                            struct err *e)
{
    char text_mt[96];
    snprintf(text_mt, sizeof text_mt, "%s_text", mt);
    if (strlen(mt) + 5 >= sizeof text_mt || !registry_find(text_mt))
        return 0;
    cJSON *n = cJSON_Duplicate(*cfg, true), *s = cJSON_CreateString(text_mt);
    if (!n || !s || !cJSON_ReplaceItemInObjectCaseSensitive(n, "model_type", s)) {
        cJSON_Delete(n);
        cJSON_Delete(s);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    snprintf(wrapper, cap, "%s", mt);
    *outer = *cfg;
    *cfg = n;
    return 1;
}

/* ADR 0080. A multimodal checkpoint (Qwen3.5, Gemma 3, Mistral 3, Llama 4, LLaVA, Idefics3, ...) whose
 * own model_type no family has, but whose text_config names one: *cfg becomes its text
 * config, with the keys about the whole checkpoint the text config lacks copied in
 * (quantization with its module names renamed, tied embeddings, special ids, dtype),
 * *outer the whole config (the caller's to free: the vision family reads it), and wrapper
 * names the outer type. 1 when nested, 0 when not. */
static int nest_text_config(cJSON **cfg, cJSON **outer, char *wrapper, size_t cap, struct err *e)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(*cfg, "model_type");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(*cfg, "text_config");
    if (!cJSON_IsString(mt) || registry_find(mt->valuestring))
        return 0;
    if (!tc && vision_find(mt->valuestring))
        return flat_text_config(cfg, outer, mt->valuestring, wrapper, cap, e);
    if (!cJSON_IsObject(tc))
        return 0;
    const cJSON *tmt = cJSON_GetObjectItemCaseSensitive(tc, "model_type");
    if (!cJSON_IsString(tmt) || !registry_find(tmt->valuestring))
        return 0;
    static const char *const whole[] = {"quantization", "quantization_config", "tie_word_embeddings",
                                        "eos_token_id", "bos_token_id", "pad_token_id", "torch_dtype", "dtype"};
    cJSON *n = cJSON_Duplicate(tc, true);
    bool ok = n != NULL;
    for (size_t i = 0; ok && i < sizeof whole / sizeof whole[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(*cfg, whole[i]);
        if (!v || cJSON_GetObjectItemCaseSensitive(n, whole[i]))
            continue;
        cJSON *d = strncmp(whole[i], "quantization", 12) == 0 && cJSON_IsObject(v) ? renamed_keys(v)
                                                                                  : cJSON_Duplicate(v, true);
        ok = d && cJSON_AddItemToObject(n, whole[i], d);
        if (!ok)
            cJSON_Delete(d);
    }
    if (!ok) {
        cJSON_Delete(n);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    snprintf(wrapper, cap, "%s", mt->valuestring);
    *outer = *cfg;
    *cfg = n;
    return 1;
}

int model_nest_config(cJSON **cfg, cJSON **outer, char *wrapper, size_t cap, struct err *e)
{
    return nest_text_config(cfg, outer, wrapper, cap, e);
}

/* The text model's tensors under the text family's names; the vision tower and projector
 * bound where the wrapper has a vision family (ADR 0087); the rest marked as not loaded. */
static int nest_weights(struct model *m, const cJSON *outer, struct err *e)
{
    int rc;
    for (size_t r = 0; r < N_NEST_RENAME; r++)
        if ((rc = st_set_rename_prefix(m->st, k_nest_rename[r][0], k_nest_rename[r][1], e)) < 0)
            return rc;
    if ((rc = vision_load(m, outer, e)) < 0)
        return rc;
    size_t skipped = 0;
    for (size_t i = 0; i < N_NEST_SKIP; i++)
        skipped += st_set_mark_prefix(m->st, k_nest_skip[i]);
    LOG_INFO("a multimodal %s checkpoint: its text model (%s)%s is loaded; %zu tensors of its "
             "vision tower, projector or prediction heads are not", m->multimodal, m->hp.model_type,
             m->vision ? " with its vision tower" : "", skipped);
    return 0;
}

// ---- decoders served as embedding models and rerankers (ADR 0097 / 0098) ----

/* Whether every layer is an attention layer over per-position K/V (full or sliding): what
 * the encoder path's scratch pool holds. */
static bool attention_only(const struct hparams *hp)
{
    for (int il = 0; il < hp->n_layer; il++)
        if (hp->layer[il].mixer != MIXER_ATTENTION ||
            (hp->layer[il].kv != KV_FULL && hp->layer[il].kv != KV_SLIDING))
            return false;
    return true;
}

/* vLLM's Qwen3-Reranker fields (its documented hf_overrides, written into config.json):
 * "classifier_from_token": ["no", "yes"] with "is_original_qwen3_reranker": true; 1 when
 * present, 0 when neither is. Other tokens, or one field without the other (vLLM's
 * classifier built from other token rows), are refused: the score here is P(yes) over
 * exactly these two. */
static int reranker_fields(const cJSON *cfg, struct err *e)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(cfg, "classifier_from_token");
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(cfg, "is_original_qwen3_reranker");
    bool has_c = c && !cJSON_IsNull(c), has_o = o && !cJSON_IsNull(o) && !cJSON_IsFalse(o);
    if (!has_c && !has_o)
        return 0;
    const cJSON *a = cJSON_GetArrayItem(c, 0), *b = cJSON_GetArrayItem(c, 1);
    if (!has_c || !cJSON_IsTrue(o) || !cJSON_IsArray(c) || cJSON_GetArraySize(c) != 2 || !cJSON_IsString(a) ||
        !cJSON_IsString(b) || strcmp(a->valuestring, "no") != 0 || strcmp(b->valuestring, "yes") != 0)
        return err_setf(e, ERR_UNSUPPORTED, "config fields 'classifier_from_token' = [\"no\", \"yes\"] and "
                        "'is_original_qwen3_reranker' = true go together (a Qwen3-Reranker: the score is "
                        "P(yes) of the last token); other forms are not supported");
    return 1;
}

/* A decoder's "<Family>ForSequenceClassification" checkpoint (transformers' score head on the
 * last token): 1 with *n_labels (id2label's entries, else num_labels, else transformers'
 * default of 2) for a Qwen3 one, a converted Qwen3-Reranker (ADR 0136); 0 when the config
 * names no such architecture; -ERR_UNSUPPORTED for another family's (its prompt is unknown). */
static int seq_cls_head(const struct model *m, const cJSON *cfg, int *n_labels, struct err *e)
{
    static const char k_sfx[] = "ForSequenceClassification";
    const cJSON *a = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(cfg, "architectures"), 0);
    if (!cJSON_IsString(a))
        return 0;
    size_t n = strlen(a->valuestring), k = sizeof k_sfx - 1;
    if (n <= k || strcmp(a->valuestring + n - k, k_sfx) != 0)
        return 0;
    if (strcmp(m->ops->family, "qwen3") != 0)
        return err_setf(e, ERR_UNSUPPORTED, "architecture '%s' (a sequence-classification head on a '%s' "
                        "decoder) is not supported: only Qwen3ForSequenceClassification (converted "
                        "Qwen3-Reranker checkpoints) is", a->valuestring, m->ops->family);
    const cJSON *labels = cJSON_GetObjectItemCaseSensitive(cfg, "id2label");
    int rc;
    if (cJSON_IsObject(labels))
        *n_labels = cJSON_GetArraySize(labels);
    else if ((rc = cfg_opt_int(cfg, "num_labels", 2, n_labels, e)) < 0)
        return rc;
    if (*n_labels < 1 || *n_labels > HP_MAX_DIM)
        return err_setf(e, ERR_CONFIG, "config: %d labels of the sequence-classification head", *n_labels);
    return 1;
}

/* A decoder as an embedding model or an LM reranker, from the folder (model_load's
 * contract); bidirectional decoders (EmbeddingGemma) set hp.encoder in their parser. */
static int decoder_role(struct model *m, const cJSON *cfg, const char *dir, struct err *e)
{
    char path[4200];
    struct err fe = {0};
    int rc, fd = -1, n_labels = 0;
    if ((rc = reranker_fields(cfg, e)) != 0)
        return rc < 0 ? rc : model_set_lm_reranker(m, e);
    if (m->hp.encoder)
        return 0;
    if ((rc = seq_cls_head(m, cfg, &n_labels, e)) != 0) {
        if (rc < 0 || (rc = model_set_lm_reranker(m, e)) < 0)
            return rc;
        /* the score head replaces the LM head (bound after map_weights), which such a
         * checkpoint does not carry: map_weights takes the embeddings' view meanwhile */
        m->hp.n_cls = n_labels;
        m->hp.tie_embd = true;
        return 0;
    }
    snprintf(path, sizeof path, "%s/modules.json", dir);
    if (file_open(path, FILE_FOLDER, &fd, NULL, &fe) < 0)
        return 0;   /* no sentence-transformers folder (unreadable: not one either) */
    close(fd);
    if (!attention_only(&m->hp))
        return err_setf(e, ERR_UNSUPPORTED, "%s: a sentence-transformers folder of a '%s' model: "
                        "embeddings from recurrent or latent-attention layers are not supported",
                        dir, m->hp.model_type);
    m->hp.encoder = true;
    m->hp.causal = true;
    return 0;
}

int model_set_lm_reranker(struct model *m, struct err *e)
{
    struct hparams *hp = &m->hp;
    if ((hp->encoder && !hp->lm_rerank) || !attention_only(hp))
        return err_setf(e, ERR_ARG, "a '%s' model cannot be an LM reranker (it needs a decoder of "
                        "attention layers with an LM head, as Qwen3-Reranker)", hp->model_type);
    if (m->layers && !tensor_is_present(&m->lm_head))
        return err_setf(e, ERR_ARG, "the model has no LM head to score with");
    hp->encoder = true;
    hp->causal = true;
    hp->lm_rerank = true;
    return 0;
}

/* A decoder's base model saved alone under its LM's names ("model." prefix), as
 * transformers loads a base model's weights into *ForCausalLM (base_model_prefix). */
static int base_model_names(struct model *m, struct err *e)
{
    static const char *const parts[] = {"embed_tokens.", "layers.", "norm."};
    char to[32];
    int rc;
    if (!st_set_find(m->st, "embed_tokens.weight") || st_set_find(m->st, "model.embed_tokens.weight"))
        return 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        snprintf(to, sizeof to, "model.%s", parts[i]);
        if ((rc = st_set_rename_prefix(m->st, parts[i], to, e)) < 0)
            return rc;
    }
    return 0;
}

/* A sequence-classification decoder's head: score.weight [n_cls, n_embd] as lm_head. */
static int map_score(struct model *m, struct err *e)
{
    struct wmap w = {m->st, &m->hp.quant};
    return wm_linear(&w, &m->lm_head, WM_REQUIRED, 0, m->hp.n_cls, m->hp.n_embd, e, "score");
}

/* model_load, or with mtp model_load_mtp (the MTP steps in mtp.c). */
static int load(struct model **out, const char *dir, bool mtp, struct err *e)
{
    char path[4200];
    cJSON *cfg = NULL, *outer = NULL;
    int rc, n_main = 0, n_next = 0;
    *out = NULL;
    if (strlen(dir) >= sizeof((struct model *)0)->dir)
        return err_setf(e, ERR_ARG, "model path is too long");
    struct model *m = calloc(1, sizeof *m);
    if (!m)
        return err_setf(e, ERR_NOMEM, "out of memory");
    snprintf(m->dir, sizeof m->dir, "%s", dir);

    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = cfg_load_file(path, FILE_FOLDER, &cfg, e)) < 0)
        goto fail;
    if ((rc = nest_text_config(&cfg, &outer, m->multimodal, sizeof m->multimodal, e)) < 0)
        goto fail_prefix;
    if ((rc = registry_resolve(cfg, &m->ops, e)) < 0 || (mtp && (rc = mtp_config(cfg, m->ops, &n_main, e)) < 0) ||
        (!mtp && m->ops->mtp == MTP_DEEPSEEK && (rc = mtp_count(cfg, &n_next, e)) < 0))
        goto fail_prefix;
    hparams_init(&m->hp);
    if ((rc = cfg_opt_str(cfg, "model_type", "", m->hp.model_type, sizeof m->hp.model_type, e)) < 0 ||
        (rc = m->ops->parse_config(&m->hp, cfg, e)) < 0 ||
        (rc = parse_common_ids(&m->hp, cfg, e)) < 0 ||
        (rc = qconfig_parse(&m->hp.quant, cfg, e)) < 0)
        goto fail_prefix;
    if ((rc = parse_generation(m, dir, e)) < 0)
        goto fail;
    if (mtp)
        mtp_layer_spec(&m->hp, n_main, m->ops->mtp);
    if ((rc = hparams_validate(&m->hp, e)) < 0 || (!mtp && (rc = decoder_role(m, cfg, dir, e)) < 0))
        goto fail_prefix;
    filter_eos(&m->hp);
    cJSON_Delete(cfg);
    cfg = NULL;

    if ((rc = st_set_open(&m->st, dir, e)) < 0 || (m->multimodal[0] && (rc = nest_weights(m, outer, e)) < 0) ||
        (!m->multimodal[0] && (rc = base_model_names(m, e)) < 0))
        goto fail;
    if (mtp && (rc = mtp_rename(m->st, n_main, m->ops->mtp, e)) < 0) {
        err_prefix(e, "%s", dir);
        goto fail;
    }
    mtp_skip(m->st, m->hp.n_layer, n_next);
    cJSON_Delete(outer);
    outer = NULL;
    m->layers = calloc((size_t)m->hp.n_layer, sizeof *m->layers);
    if (!m->layers) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((rc = m->ops->map_weights(m, m->st, e)) < 0 || (mtp && (rc = mtp_map(m, m->st, e)) < 0) ||
        (m->hp.lm_rerank && m->hp.n_cls > 0 && (rc = map_score(m, e)) < 0) ||
        (m->hp.lm_rerank && (rc = model_set_lm_reranker(m, e)) < 0)) {
        err_prefix(e, "%s%s", dir, mtp ? " (its multi-token-prediction layer)" : "");
        goto fail;
    }
    warn_unused(m);
    *out = m;
    return 0;

fail_prefix:
    err_prefix(e, "%s", path);
fail:
    cJSON_Delete(cfg);
    cJSON_Delete(outer);
    model_free(m);
    return rc;
}

int model_load(struct model **out, const char *dir, struct err *e)
{
    return load(out, dir, false, e);
}

int model_load_mtp(struct model **out, const char *dir, struct err *e)
{
    return load(out, dir, true, e);
}

int model_alloc_owned(struct model *m, size_t bytes, void **out, struct err *e)
{
    void **list = realloc(m->owned, (m->n_owned + 1) * sizeof *list);
    if (!list)
        return err_setf(e, ERR_NOMEM, "out of memory for an owned weight");
    m->owned = list;
    if (!(*out = malloc(bytes ? bytes : 1)))
        return err_setf(e, ERR_NOMEM, "out of memory for an owned weight of %zu bytes", bytes);
    m->owned[m->n_owned++] = *out;
    return 0;
}

int model_widen_f32(struct model *m, struct tensor *t, struct err *e)
{
    if (!tensor_is_present(t) || t->dtype == DTYPE_F32)
        return 0;
    if (t->qbits || !tensor_is_contiguous(t))
        return err_setf(e, ERR_FORMAT, "tensor %s: a quantized or strided tensor where a float "
                        "one is read", t->name ? t->name : "?");
    int64_t n = tensor_nelem(t);
    float *dst;
    int rc = model_alloc_owned(m, (size_t)n * sizeof *dst, (void **)&dst, e);
    if (rc < 0)
        return rc;
    dtype_to_f32_ref(dst, t->data, t->dtype, (size_t)n);
    const char *name = t->name;
    int64_t shape[TENSOR_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    tensor_init(t, DTYPE_F32, dst, t->ndim, shape);
    t->name = name;
    return 0;
}

void model_free(struct model *m)
{
    if (!m)
        return;
    model_tp_free(m->tp);
    for (size_t i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    vision_free(m->vision);
    st_set_free(m->st);
    free(m->layers);
    free(m->expert_views);
    free(m->prepared);
    free(m->derived);
    qconfig_free(&m->hp.quant);
    free(m);
}

int64_t model_n_params(const struct model *m)
{
    int64_t n = 0;
    for (size_t i = 0; i < st_set_count(m->st); i++) {
        const struct st_tensor *t = st_set_at(m->st, i);
        if (!t->consumed)
            continue;
        int64_t k = 1;
        for (int d = 0; d < t->ndim; d++)
            k *= t->shape[d];
        /* packed quantized words hold 32 / bits weights (wmap checked the
         * bits against the shapes); scales and biases are bookkeeping, not
         * parameters */
        size_t len = strlen(t->name);
        bool qaux = t->dtype != DTYPE_U32 && len > 7 &&
                    (strcmp(t->name + len - 7, ".scales") == 0 || strcmp(t->name + len - 7, ".biases") == 0);
        if (qaux)
            continue;
        if (t->dtype == DTYPE_U32 && len > 7 && strcmp(t->name + len - 7, ".weight") == 0) {
            char path[QCFG_MAX_PATH];
            snprintf(path, sizeof path, "%.*s", (int)(len - 7), t->name);
            struct qparams p = qconfig_resolve(&m->hp.quant, path);
            if (p.bits > 0)
                k = k * 32 / p.bits;
        }
        n += k;
    }
    return n;
}

uint64_t model_weight_bytes(const struct model *m)
{
    uint64_t b = 0;
    for (size_t i = 0; i < st_set_count(m->st); i++) {
        const struct st_tensor *t = st_set_at(m->st, i);
        if (t->consumed)
            b += t->end - t->begin;
    }
    return b;
}

/* ---- preparing the weights for a backend ----
 * Every weight view is handed to the backend once. Views that are the same
 * tensor (a head tied to the embedding) are prepared once and share the
 * result. A view whose stored bytes no other view reads, inside the
 * checkpoint's mapping, is prepared with PREP_SOURCE_DISPOSABLE: a backend
 * that copies or repacks it may give those pages back as it goes, so a
 * repacked model does not hold both layouts at once. The others (views
 * overlapping without being the same: rows of another view, slices of a
 * stacked tensor also bound whole; bytes a host-read tensor such as the
 * attention sinks shares; tensors derived in memory) are prepared without
 * it, and the CPU leaves them in their stored layout. Pages of a file
 * mapping given back are read from the file again if touched, so the model
 * can be prepared again for another backend. */

struct prepared_view {
    struct tensor *t;
    void *data;
    const void *qscales, *qbiases;
};

struct prep_item {
    struct tensor *t;
    int root;      /* first item of its twins (identical views): the one prepared */
    bool shared;   /* its bytes are also read through a view that is not a twin */
    bool host;     /* read on the host, never prepared (sinks) */
    bool given;    /* prepared with PREP_SOURCE_DISPOSABLE and moved: its source pages go back */
    unsigned uses; /* how ops read it, joined over its twins: USE_* */
};

/* How the ops read a weight view: by linear products, and / or as values (norm weights,
 * biases); neither: embedding rows only. Prepared with PREP_MATRIX when its twins' uses are
 * linear products alone. */
#define USE_LINEAR 1u
#define USE_VALUES 2u

struct prep_range {
    uintptr_t lo, hi;
    int item;
};

static int prep_range_cmp(const void *a, const void *b)
{
    const struct prep_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static bool same_view(const struct tensor *a, const struct tensor *b)
{
    if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim || a->qbits != b->qbits ||
        a->qgroup != b->qgroup || a->qmode != b->qmode || a->qsdtype != b->qsdtype ||
        a->qscales != b->qscales || a->qbiases != b->qbiases)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || a->stride[d] != b->stride[d])
            return false;
    return true;
}

/* The byte ranges a view reads: its data, scales and biases (n written, <= 3). */
static int view_ranges(const struct tensor *t, struct prep_range *r, int item)
{
    int n = 0;
    r[n++] = (struct prep_range){(uintptr_t)t->data, (uintptr_t)t->data + tensor_data_extent(t), item};
    uint64_t sb = tensor_qaux_bytes(t);
    if (sb) {
        if (t->qscales)
            r[n++] = (struct prep_range){(uintptr_t)t->qscales, (uintptr_t)t->qscales + sb, item};
        if (t->qbiases)
            r[n++] = (struct prep_range){(uintptr_t)t->qbiases, (uintptr_t)t->qbiases + sb, item};
    }
    return n;
}

struct prep_vision {
    struct prep_item *it;
    size_t n;
};

static void prep_add_vision(void *ud, struct tensor *t, bool linear)
{
    struct prep_vision *pv = ud;
    if (!tensor_is_present(t))
        return;
    if (pv->it)
        pv->it[pv->n] = (struct prep_item){t, (int)pv->n, false, false, false, linear ? USE_LINEAR : USE_VALUES};
    pv->n++;
}

static int prep_root(struct prep_item *it, int i)
{
    while (it[i].root != i)
        i = it[i].root;
    return i;
}

/* Every weight view of m in preparation order (sinks marked host-read); it NULL: count. */
static size_t prep_items(struct model *m, struct prep_item *it)
{
    size_t n = 0;
#define PREP_ADD(tp, h, u)                                                  \
    do {                                                                    \
        if (tensor_is_present(tp)) {                                        \
            if (it)                                                         \
                it[n] = (struct prep_item){(tp), (int)n, false, (h), false, (u)}; \
            n++;                                                            \
        }                                                                   \
    } while (0)
    PREP_ADD(&m->tok_embd, false, 0u); /* embedding rows (and the head, when a twin joins) */
    PREP_ADD(&m->out_norm, false, USE_VALUES);
    PREP_ADD(&m->out_norm_b, false, USE_VALUES);
    PREP_ADD(&m->lm_head, false, USE_LINEAR);
    PREP_ADD(&m->lm_head_b, false, USE_VALUES);
    PREP_ADD(&m->pos_embd, false, 0u);   /* embedding rows */
    PREP_ADD(&m->type_embd, false, 0u);
    PREP_ADD(&m->embd_norm, false, USE_VALUES);
    PREP_ADD(&m->embd_norm_b, false, USE_VALUES);
    PREP_ADD(&m->cls_dense, false, USE_LINEAR);
    PREP_ADD(&m->cls_dense_b, false, USE_VALUES);
    PREP_ADD(&m->cls_norm, false, USE_VALUES);
    PREP_ADD(&m->cls_norm_b, false, USE_VALUES);
    PREP_ADD(&m->cls_out, false, USE_LINEAR);
    PREP_ADD(&m->cls_out_b, false, USE_VALUES);
    PREP_ADD(&m->mtp.enorm, false, USE_VALUES);
    PREP_ADD(&m->mtp.hnorm, false, USE_VALUES);
    PREP_ADD(&m->mtp.eh_proj, false, USE_LINEAR);
    for (int il = 0; il < m->hp.n_layer; il++) {
        struct layer *L = &m->layers[il];
#define LAYER_PTR(name) &L->name,
        struct tensor *ts[] = {LAYER_TENSORS(LAYER_PTR)};
        /* the slots only linear products read (the rest: norms, biases, sinks) */
        const struct tensor *mats[] = {LAYER_MATRICES(LAYER_PTR)};
#undef LAYER_PTR
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            bool mx = false;
            for (size_t j = 0; j < sizeof mats / sizeof mats[0] && !mx; j++)
                mx = ts[i] == mats[j];
            /* sinks are read on the host (model_ctx_new uploads them widened), never by an op */
            PREP_ADD(ts[i], ts[i] == &L->sinks, mx ? USE_LINEAR : USE_VALUES);
        }
    }
    for (int il = 0; il < m->hp.n_layer; il++) /* MLA per-head views */
        for (int i = 0; m->layers[il].mla_heads && i < 4 * m->hp.n_head; i++)
            PREP_ADD(&m->layers[il].mla_heads[i], false, USE_LINEAR);
    for (size_t i = 0; i < m->expert_views_used; i++) /* expert views of every layer (biases: 1-D) */
        PREP_ADD(&m->expert_views[i], false, m->expert_views[i].ndim == 2 ? USE_LINEAR : USE_VALUES);
#undef PREP_ADD
    struct prep_vision pv = {it, n};
    vision_each_weight(m->vision, prep_add_vision, &pv); /* the image tower and projector */
    return pv.n;
}

/* A fault in a weight's pages maps the page-cache folio around it (up to 2 MiB on this kernel),
 * neighbours' pages that their preparation gave back among them: so once a view is prepared,
 * the given-back sources within 2 MiB of its ranges (sorted in r) go back again, its own
 * included (vr: the view's k ranges as stored; phi-2 bf16 held 46 MiB of them after loading). */
#define RELEASE_REACH ((uintptr_t)2 << 20)
static void release_around(const struct prep_item *it, const struct prep_range *r, size_t nr,
                           const struct prep_range *vr, int k)
{
    for (int j = 0; j < k; j++) {
        const uintptr_t lo = vr[j].lo > RELEASE_REACH ? vr[j].lo - RELEASE_REACH : 0,
                        hi = vr[j].hi + RELEASE_REACH;
        size_t a = 0, b = nr; /* the first range starting at lo or later, then one before it */
        while (a < b) {
            const size_t mid = a + (b - a) / 2;
            if (r[mid].lo < lo)
                a = mid + 1;
            else
                b = mid;
        }
        for (a = a ? a - 1 : 0; a < nr && r[a].lo < hi; a++)
            if (it[r[a].item].given && r[a].hi > lo)
                mem_release((const void *)r[a].lo, r[a].hi - r[a].lo);
    }
}

int model_prepare(struct model *m, struct backend *be, struct err *e)
{
    size_t n = prep_items(m, NULL);
    struct prep_item *it = calloc(n ? n : 1, sizeof *it);
    struct prep_range *r = calloc(3 * n + 1, sizeof *r);
    int rc = 0;
    if (!it || !r) {
        rc = err_setf(e, ERR_NOMEM, "out of memory preparing %zu weights", n);
        goto out;
    }
    prep_items(m, it);
    for (size_t i = 0; i < m->n_prepared; i++) { /* prepared before: the views as bound */
        struct prepared_view *pv = &m->prepared[i];
        pv->t->data = pv->data;
        pv->t->qscales = pv->qscales;
        pv->t->qbiases = pv->qbiases;
        pv->t->packed = 0;
    }
    m->n_prepared = 0;
    if (n > m->cap_prepared) { /* kept across preparations: a second one allocates nothing */
        free(m->prepared);
        m->cap_prepared = 0;
        m->prepared = malloc(n * sizeof *m->prepared);
        if (!m->prepared) {
            rc = err_setf(e, ERR_NOMEM, "out of memory preparing %zu weights", n);
            goto out;
        }
        m->cap_prepared = n;
    }
    size_t nr = 0;
    for (size_t i = 0; i < n; i++)
        nr += (size_t)view_ranges(it[i].t, r + nr, (int)i);
    qsort(r, nr, sizeof *r, prep_range_cmp);
    /* every pair of overlapping ranges: twins join, anything else shares */
    for (size_t a = 0; a < nr; a++)
        for (size_t b = a + 1; b < nr && r[b].lo < r[a].hi; b++) {
            int x = prep_root(it, r[a].item), y = prep_root(it, r[b].item);
            if (x == y)
                continue;
            if (!it[r[a].item].host && !it[r[b].item].host &&
                same_view(it[r[a].item].t, it[r[b].item].t)) {
                it[x > y ? x : y].root = x < y ? x : y;
                it[x < y ? x : y].shared |= it[x > y ? x : y].shared;
                it[x < y ? x : y].uses |= it[x > y ? x : y].uses;
            } else {
                it[x].shared = it[y].shared = true;
            }
        }
    for (size_t i = 0; i < n && rc == 0; i++) {
        int root = prep_root(it, (int)i);
        struct tensor *t = it[i].t;
        if (it[i].host)
            continue;
        m->prepared[m->n_prepared] = (struct prepared_view){t, t->data, t->qscales, t->qbiases};
        struct prep_range vr[3]; /* its ranges as stored */
        int k = 0;
        bool mine = false;
        if (root != (int)i) { /* a twin: the view its root became */
            *t = *it[root].t;
        } else {
            k = view_ranges(t, vr, (int)i);
            mine = !it[root].shared;
            for (int j = 0; j < k && mine; j++)
                mine = st_set_holds(m->st, (const void *)vr[j].lo, vr[j].hi - vr[j].lo);
            rc = be->ops->prepare_weight(be, t, (mine ? PREP_SOURCE_DISPOSABLE : 0u) |
                                                    (it[root].uses == USE_LINEAR ? PREP_MATRIX : 0u), e);
        }
        const struct prepared_view *pv = &m->prepared[m->n_prepared];
        const bool moved = t->data != pv->data || t->qscales != pv->qscales ||
                           t->qbiases != pv->qbiases || t->packed;
        if (moved)
            m->n_prepared++;
        it[i].given = mine && moved;
        if (it[i].given)
            release_around(it, r, nr, vr, k);
    }
    /* the experts' views as tables the backend can index on the device (ADR 0143) */
    for (int il = 0; il < m->hp.n_layer && rc == 0 && be->ops->prepare_experts; il++) {
        struct experts *ex = &m->layers[il].ex;
        const struct expert_linear *els[] = {&ex->up, &ex->gate, &ex->down, &ex->gate_up};
        for (size_t j = 0; j < sizeof els / sizeof els[0] && rc == 0; j++)
            if (els[j]->w)
                rc = be->ops->prepare_experts(be, els[j], m->hp.n_expert, e);
    }
out:
    free(it);
    free(r);
    return rc < 0 ? rc : 0;
}

int model_convert_views(const struct model_ops *ops, const cJSON *cfg, struct ck_view_rule *out,
                        const struct ck_view_rule **views, struct err *e)
{
    struct hparams hp;
    int rc;
    *views = NULL;
    if (!ops->convert_views)
        return 0;
    hparams_init(&hp);
    if ((rc = ops->parse_config(&hp, cfg, e)) < 0)
        return rc;
    ops->convert_views(&hp, out);
    *views = out;
    return 0;
}

void model_kv_sizes(const struct model *m, enum dtype kv_dtype, struct model_kv_sizes *out)
{
    const struct hparams *hp = &m->hp;
    const uint64_t esz = dtype_size(kv_dtype);
    memset(out, 0, sizeof *out);
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        if (ls->kv == KV_RECURRENT) {
            /* no rows: an f32 state per sequence (ADR 0057) */
            out->n_rec++;
            out->rec_per_seq += ((uint64_t)ls->state_conv + (uint64_t)ls->state_rec) * sizeof(float);
            continue;
        }
        uint64_t row = ls->kv == KV_LATENT ? (uint64_t)(hp->kv_lora_rank + hp->qk_rope_dim)
                                           : 2ull * hp->n_kv_head * hp->head_dim;
        if (ls->kv == KV_SLIDING && ls->window > 0) {
            out->n_swa++;
            out->swa_per_token += row * esz;
            out->window = ls->window > out->window ? ls->window : out->window;
        } else {
            out->n_full++;
            out->full_per_token += row * esz;
        }
    }
}

uint64_t model_kv_bytes_per_token(const struct model *m, enum dtype kv_dtype)
{
    struct model_kv_sizes z;
    model_kv_sizes(m, kv_dtype, &z);
    return z.full_per_token + z.swa_per_token;
}

int model_kv_window_positions(int window, int n_tokens, int block_size)
{
    int64_t most = ((int64_t)(window + block_size - 1) / block_size + 1) * block_size;
    return most < n_tokens ? (int)most : n_tokens;
}

uint64_t model_kv_bytes(const struct model *m, int n_tokens, int block_size, enum dtype kv_dtype)
{
    struct model_kv_sizes z;
    model_kv_sizes(m, kv_dtype, &z);
    return z.rec_per_seq + z.full_per_token * (uint64_t)n_tokens +
           z.swa_per_token * (uint64_t)model_kv_window_positions(z.window, n_tokens, block_size);
}
