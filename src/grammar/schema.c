/*
 * schema: a JSON Schema (the subset of grammar.h) -> the node graph of
 * grammar_impl.h.
 *
 * Every schema object becomes one node per type it allows; several types, an
 * anyOf/oneOf, a $ref and "any value" become an alternative node (GN_ALT),
 * flattened at the end into lists of concrete nodes so the matcher never
 * chases alternatives of alternatives. A $ref target is compiled once (memo by
 * the cJSON node it points to) behind an alternative node created before its
 * body, so recursive definitions become cycles in the graph; a cycle made of
 * alternatives only (A = $ref B, B = $ref A) has no document and is an error.
 * enum/const values are serialized compactly (cJSON_PrintUnformatted) and the
 * model must write them byte for byte; object keys likewise (their JSON
 * escaped form). Unknown keywords are refused, not ignored: a schema we do not
 * enforce would produce output that does not validate.
 *
 * Bounds: nesting GM_MAX_NEST, schema objects visited GM_MAX_WORK, nodes
 * GM_MAX_NODES, enum values GM_MAX_ENUM, literal bytes GM_MAX_LIT, properties
 * GM_MAX_PROPS, alternatives GM_MAX_ALT, $ref chains GM_MAX_REF_CHAIN.
 * Error messages name the keyword and the schema's JSON pointer.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

struct cc {
    struct grammar *g;
    const cJSON *root;
    struct err *e;
    uint32_t work;
    uint32_t cap_node, cap_prop, cap_list, cap_lit;
    const cJSON **ref_src;   /* [n_ref] compiled $ref targets */
    uint16_t *ref_node;
    char **ref_loc;          /* [n_ref] where the target is ("tools[2].function.parameters.$defs.a",
                              * "/$defs/a"), a NUL, then the $ref as written ("#/$defs/a") */
    char base[256];          /* the location of the root of "#/..." references (dotted paths) */
    uint32_t stack[GM_MAX_REF_CHAIN + 2];  /* flatten's nodes in progress, outermost first */
    uint32_t n_ref, cap_ref;
    size_t lit_bytes;
    int32_t n_bool, n_null;  /* shared literal nodes, -1 until made */
    char path[256];
    size_t plen;
    bool dotted;             /* path as tools[3].function.parameters.properties.x, not /properties/x */
};

static const char *const k_annotations[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "format", "$defs", "definitions", "contentMediaType",
    "contentEncoding",
};
static const char *const k_keywords[] = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref",
};

/* ---- small helpers ---- */

static bool in_list(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0)
            return true;
    return false;
}

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static const char *where(const struct cc *c) { return c->plen ? c->path : "/"; }

/* Appends "/seg" (".seg" when dotted) to the path (cut when it would not fit); returns the
 * length to restore. */
static size_t path_push(struct cc *c, const char *seg)
{
    size_t old = c->plen;
    size_t n = strlen(seg);
    if (old + 1 + n < sizeof c->path) {
        c->path[old] = c->dotted ? '.' : '/';
        memcpy(c->path + old + 1, seg, n + 1);
        c->plen = old + 1 + n;
    }
    return old;
}

/* Appends kw and the index i: "/kw/i", or "kw[i]" when dotted; returns the length to restore. */
static size_t path_push_idx(struct cc *c, const char *kw, unsigned i)
{
    size_t old = path_push(c, kw);
    int n = snprintf(c->path + c->plen, sizeof c->path - c->plen, c->dotted ? "[%u]" : "/%u", i);
    if (n > 0 && c->plen + (size_t)n < sizeof c->path)
        c->plen += (size_t)n;
    else
        c->path[c->plen] = '\0';
    return old;
}

static void path_pop(struct cc *c, size_t old)
{
    c->plen = old;
    c->path[old] = '\0';
}

static int grow(void **p, uint32_t *cap, uint32_t need, size_t elem, struct err *e)
{
    if (need <= *cap)
        return 0;
    uint32_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, (size_t)n * elem);
    if (!q)
        return err_setf(e, ERR_NOMEM, "grammar: out of memory");
    *p = q;
    *cap = n;
    return 0;
}

static int new_node(struct cc *c, enum gnode_kind kind)
{
    struct grammar *g = c->g;
    int rc;
    if (g->n_node >= GM_MAX_NODES)
        return err_setf(c->e, ERR_RANGE, "schema at %s: more than %d nodes", where(c), GM_MAX_NODES);
    if ((rc = grow((void **)&g->node, &c->cap_node, g->n_node + 1, sizeof *g->node, c->e)) < 0)
        return rc;
    g->node[g->n_node] = (struct gnode){.kind = (uint8_t)kind, .addl = -1, .items = -1,
                                        .lo = -INFINITY, .hi = INFINITY, .max_n = UINT32_MAX};
    return (int)g->n_node++;
}

static int list_add(struct cc *c, uint32_t v)
{
    int rc = grow((void **)&c->g->list, &c->cap_list, c->g->n_list + 1, sizeof *c->g->list, c->e);
    if (rc < 0)
        return rc;
    c->g->list[c->g->n_list++] = v;
    return 0;
}

/* A literal trie over n strings; returns its index in g->lit. mask: also
 * compute every node's bitmask of the terminals below (key tries). */
static int add_lit(struct cc *c, const char *const *s, const uint32_t *len, uint32_t n)
{
    struct grammar *g = c->g;
    int rc;
    uint32_t cap = c->cap_lit;
    if ((rc = grow((void **)&g->lit, &cap, g->n_lit + 1, sizeof *g->lit, c->e)) < 0)
        return rc;
    if ((rc = grow((void **)&g->lit_mask, &c->cap_lit, g->n_lit + 1, sizeof *g->lit_mask, c->e)) < 0)
        return rc;
    struct gtrie *t = &g->lit[g->n_lit];
    if ((rc = gtrie_build(t, s, len, n, c->e)) < 0)
        return rc;
    uint64_t *m = calloc(t->n_node, sizeof *m);
    if (!m) {
        gtrie_deinit(t);
        return err_setf(c->e, ERR_NOMEM, "grammar: out of memory");
    }
    for (uint32_t k = 0; k < t->n_node; k++)
        for (uint32_t i = t->node[k].lo; i < t->node[k].hi; i++)
            if (t->order[i] < 64)
                m[k] |= (uint64_t)1 << t->order[i];
    g->lit_mask[g->n_lit] = m;
    return (int)g->n_lit++;
}

static int get_count(struct cc *c, const cJSON *s, const char *key, uint32_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble != floor(v->valuedouble))
        return err_setf(c->e, ERR_ARG, "schema at %s: '%s' must be a non-negative integer", where(c), key);
    *out = v->valuedouble > 2147483647.0 ? 2147483647u : (uint32_t)v->valuedouble;
    return 0;
}

/* ---- literals ---- */

/* A literal node for the values of arr (an enum) or the one value v (const). */
static int build_literal(struct cc *c, const cJSON *arr, const cJSON *v, const char *kw)
{
    uint32_t n = arr ? (uint32_t)cJSON_GetArraySize(arr) : 1, i = 0;
    if (arr && n == 0)
        return err_setf(c->e, ERR_ARG, "schema at %s: empty '%s'", where(c), kw);
    if (n > GM_MAX_ENUM)
        return err_setf(c->e, ERR_RANGE, "schema at %s: '%s' has %u values (at most %d)", where(c),
                        kw, n, GM_MAX_ENUM);
    char **s = calloc(n, sizeof *s);
    uint32_t *len = calloc(n, sizeof *len);
    int rc = s && len ? 0 : err_setf(c->e, ERR_NOMEM, "grammar: out of memory");
    const cJSON *it = arr ? arr->child : v;
    for (; rc == 0 && it && i < n; it = arr ? it->next : NULL, i++) {
        if (!(s[i] = cJSON_PrintUnformatted(it))) {
            rc = err_setf(c->e, ERR_NOMEM, "grammar: out of memory");
            break;
        }
        len[i] = (uint32_t)strlen(s[i]);
        if ((c->lit_bytes += len[i]) > GM_MAX_LIT)
            rc = err_setf(c->e, ERR_RANGE, "schema at %s: literals over %d bytes", where(c), GM_MAX_LIT);
    }
    int k = rc < 0 ? rc : new_node(c, GN_LITERAL);
    if (k >= 0 && (rc = add_lit(c, (const char *const *)s, len, i)) >= 0)
        c->g->node[k].trie = (uint32_t)rc;
    for (uint32_t j = 0; s && j < n; j++)
        free(s[j]);
    free(s);
    free(len);
    return rc < 0 ? rc : k;
}

static int shared_literal(struct cc *c, int32_t *slot, const char *text)
{
    if (*slot >= 0)
        return *slot;
    cJSON *v = cJSON_Parse(text);
    if (!v)
        return err_setf(c->e, ERR_NOMEM, "grammar: out of memory");
    int k = build_literal(c, cJSON_IsArray(v) ? v : NULL, v, "type");
    cJSON_Delete(v);
    if (k >= 0)
        *slot = k;
    return k;
}

/* ---- typed nodes ---- */

static int compile(struct cc *c, const cJSON *s, int depth);

/* Compiles s[key] (absent: any value, true: any, false: -1 = nothing). */
static int sub_or_any(struct cc *c, const cJSON *s, const char *key, int depth, int32_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v || cJSON_IsTrue(v)) {
        *out = c->g->any;
        return 0;
    }
    if (cJSON_IsFalse(v)) {
        *out = -1;
        return 0;
    }
    size_t old = path_push(c, key);
    int k = compile(c, v, depth + 1);
    path_pop(c, old);
    if (k >= 0)
        *out = k;
    return k < 0 ? k : 0;
}

static int find_prop(const cJSON *props, const char *name)
{
    int i = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++)
        if (strcmp(p->string, name) == 0)
            return i;
    return -1;
}

static int build_object(struct cc *c, const cJSON *s, int depth)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required"), *p;
    struct grammar *g = c->g;
    int rc, n = props ? cJSON_GetArraySize(props) : 0, i = 0;
    if (props && !cJSON_IsObject(props))
        return err_setf(c->e, ERR_ARG, "schema at %s: 'properties' must be an object", where(c));
    if (n > GM_MAX_PROPS)
        return err_setf(c->e, ERR_RANGE, "schema at %s: 'properties' has %d entries (at most %d)",
                        where(c), n, GM_MAX_PROPS);
    int k = new_node(c, GN_OBJECT);
    if (k < 0)
        return k;
    if ((rc = grow((void **)&g->prop, &c->cap_prop, g->n_prop + (uint32_t)n, sizeof *g->prop, c->e)) < 0)
        return rc;
    uint32_t prop0 = g->n_prop;
    g->n_prop += (uint32_t)n;
    g->node[k].prop0 = prop0;
    g->node[k].n_props = (uint32_t)n;
    char *keys[GM_MAX_PROPS] = {0};
    uint32_t klen[GM_MAX_PROPS];
    rc = 0;
    for (p = props ? props->child : NULL; p && rc == 0; p = p->next, i++) {
        size_t old = path_push(c, "properties");
        path_push(c, p->string);
        int sub = compile(c, p, depth + 1);
        path_pop(c, old);
        if (sub < 0) {
            rc = sub;
            break;
        }
        g->prop[prop0 + i] = (struct gprop){.node = (uint16_t)sub};
        cJSON *str = cJSON_CreateString(p->string);
        char *q = str ? cJSON_PrintUnformatted(str) : NULL;  /* "\"escaped\"" */
        cJSON_Delete(str);
        if (!q) {
            rc = err_setf(c->e, ERR_NOMEM, "grammar: out of memory");
            break;
        }
        klen[i] = (uint32_t)strlen(q) - 2;
        memmove(q, q + 1, klen[i]);
        keys[i] = q;
        if ((c->lit_bytes += klen[i]) > GM_MAX_LIT)
            rc = err_setf(c->e, ERR_RANGE, "schema at %s: keys over %d bytes", where(c), GM_MAX_LIT);
    }
    if (rc == 0 && (rc = add_lit(c, (const char *const *)keys, klen, (uint32_t)n)) >= 0) {
        g->node[k].trie = (uint32_t)rc;
        rc = 0;
        const struct gtrie *t = &g->lit[g->node[k].trie];
        for (uint32_t m = 0; m < t->n_node; m++)
            if (t->node[m].n_term > 1)
                rc = err_setf(c->e, ERR_ARG, "schema at %s: duplicate key in 'properties'", where(c));
    }
    for (int j = 0; j < n; j++)
        free(keys[j]);
    if (rc < 0)
        return rc;
    if (req && !cJSON_IsArray(req))
        return err_setf(c->e, ERR_ARG, "schema at %s: 'required' must be an array", where(c));
    for (p = req ? req->child : NULL; p; p = p->next) {
        int at = cJSON_IsString(p) ? find_prop(props, p->valuestring) : -1;
        if (at < 0)
            return err_setf(c->e, ERR_ARG, "schema at %s: 'required' names '%.64s', not in 'properties'",
                            where(c), cJSON_IsString(p) ? p->valuestring : "(not a string)");
        g->node[k].req_mask |= (uint64_t)1 << at;
        g->prop[prop0 + at].required = true;
    }
    int32_t addl;
    if ((rc = sub_or_any(c, s, "additionalProperties", depth, &addl)) < 0)
        return rc;
    g->node[k].addl = addl;
    return k;
}

static int build_array(struct cc *c, const cJSON *s, int depth)
{
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(s, "prefixItems"), *p;
    int k = new_node(c, GN_ARRAY), rc;
    uint32_t mn = 0, mx = UINT32_MAX;
    if (k < 0)
        return k;
    if (pre && (!cJSON_IsArray(pre) || cJSON_GetArraySize(pre) > GM_MAX_PROPS))
        return err_setf(c->e, ERR_ARG, "schema at %s: 'prefixItems' must be an array of at most %d schemas",
                        where(c), GM_MAX_PROPS);
    uint32_t pre_nodes[GM_MAX_PROPS], n_pre = 0;
    for (p = pre ? pre->child : NULL; p; p = p->next) {
        size_t old = path_push_idx(c, "prefixItems", n_pre);
        int sub = compile(c, p, depth + 1);
        path_pop(c, old);
        if (sub < 0)
            return sub;
        pre_nodes[n_pre++] = (uint32_t)sub;
    }
    c->g->node[k].pre0 = c->g->n_list;
    c->g->node[k].n_pre = n_pre;
    for (uint32_t i = 0; i < n_pre; i++)
        if ((rc = list_add(c, pre_nodes[i])) < 0)
            return rc;
    int32_t items;
    if ((rc = sub_or_any(c, s, "items", depth, &items)) < 0 ||
        (rc = get_count(c, s, "minItems", &mn)) < 0 || (rc = get_count(c, s, "maxItems", &mx)) < 0)
        return rc;
    if (items < 0 && mx > n_pre)
        mx = n_pre;
    if (mn > mx)
        return err_setf(c->e, ERR_ARG, "schema at %s: 'minItems' %u exceeds the most items allowed (%u)",
                        where(c), mn, mx);
    struct gnode *nd = &c->g->node[k];
    nd->items = items;
    nd->min_n = mn;
    nd->max_n = mx;
    return k;
}

static int build_string(struct cc *c, const cJSON *s)
{
    uint32_t mn = 0, mx = UINT32_MAX;
    int rc;
    if ((rc = get_count(c, s, "minLength", &mn)) < 0 || (rc = get_count(c, s, "maxLength", &mx)) < 0)
        return rc;
    if (mn > mx)
        return err_setf(c->e, ERR_ARG, "schema at %s: 'minLength' %u exceeds 'maxLength' %u", where(c), mn, mx);
    int k = new_node(c, GN_STRING);
    if (k >= 0) {
        c->g->node[k].min_n = mn;
        c->g->node[k].max_n = mx;
    }
    return k;
}

static int get_bound(struct cc *c, const cJSON *s, const char *key, double *v, bool *present)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(s, key);
    *present = j != NULL;
    if (!j)
        return 0;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble))
        return err_setf(c->e, ERR_ARG, "schema at %s: '%s' must be a finite number", where(c), key);
    *v = j->valuedouble;
    return 0;
}

/* Integer bounds are compared exactly (int64), so they must be the bounds written: cJSON
 * reads numbers as doubles, exact for integers below 2^53 only. A bound beyond every
 * GM_INT_SIG_MAX-digit integer is kept as a double: the loose side drops out, the tight one
 * leaves nothing (refused below). */
#define GM_EXACT_INT 9007199254740992.0  /* 2^53 */
#define GM_INT_OUT   1e18                /* bounded integers have at most 18 digits */
#define GM_INT_NONE  4000000000000000000LL

static int int_bounds(struct cc *c, struct gnode *nd, double lo_w, double hi_w)
{
    const double w[2] = {lo_w, hi_w};
    for (int i = 0; i < 2; i++)
        if (isfinite(w[i]) && fabs(w[i]) >= GM_EXACT_INT && fabs(w[i]) < GM_INT_OUT)
            return err_setf(c->e, ERR_ARG,
                            "schema at %s: integer bound %.17g is not exact in a double (|bound| must be "
                            "below 2^53 = 9007199254740992)", where(c), w[i]);
    nd->ilo = nd->lo <= -GM_INT_OUT ? -GM_INT_NONE : nd->lo >= GM_INT_OUT ? GM_INT_NONE : (int64_t)nd->lo;
    nd->ihi = nd->hi >= GM_INT_OUT ? GM_INT_NONE : nd->hi <= -GM_INT_OUT ? -GM_INT_NONE : (int64_t)nd->hi;
    nd->bounded = nd->ilo != -GM_INT_NONE || nd->ihi != GM_INT_NONE;
    return 0;
}

static int build_number(struct cc *c, const cJSON *s, bool integer)
{
    double lo = -INFINITY, hi = INFINITY, v = 0;
    bool los = false, his = false, has;
    int rc;
    if ((rc = get_bound(c, s, "minimum", &v, &has)) < 0)
        return rc;
    if (has)
        lo = v;
    if ((rc = get_bound(c, s, "maximum", &v, &has)) < 0)
        return rc;
    if (has)
        hi = v;
    if ((rc = get_bound(c, s, "exclusiveMinimum", &v, &has)) < 0)
        return rc;
    if (has && v >= lo) {
        lo = v;
        los = true;
    }
    if ((rc = get_bound(c, s, "exclusiveMaximum", &v, &has)) < 0)
        return rc;
    if (has && v <= hi) {
        hi = v;
        his = true;
    }
    double lo_w = lo, hi_w = hi;
    if (integer) {  /* integer bounds become inclusive integers */
        lo = los ? floor(lo) + 1 : ceil(lo);
        hi = his ? ceil(hi) - 1 : floor(hi);
        los = his = false;
    }
    if (lo > hi || (lo == hi && (los || his)))
        return err_setf(c->e, ERR_ARG, "schema at %s: no %s satisfies the bounds ('minimum' .. 'maximum')",
                        where(c), integer ? "integer" : "number");
    int k = new_node(c, GN_NUMBER);
    if (k < 0)
        return k;
    struct gnode *nd = &c->g->node[k];
    nd->integer = integer;
    nd->lo = lo;
    nd->hi = hi;
    nd->lo_strict = los;
    nd->hi_strict = his;
    nd->bounded = isfinite(lo) || isfinite(hi);
    if (integer && (rc = int_bounds(c, nd, lo_w, hi_w)) < 0)
        return rc;
    if (!gm_num_satisfiable(nd))
        return err_setf(c->e, ERR_ARG,
                        "schema at %s: no %s the output can hold (at most %d digits, no exponent, when "
                        "bounded) satisfies the bounds ('minimum' .. 'maximum')", where(c),
                        integer ? "integer" : "number", integer ? GM_INT_SIG_MAX : GM_NUM_SIG_MAX);
    return k;
}

/* ---- alternatives, $ref ---- */

static int build_alt(struct cc *c, const cJSON *arr, const char *kw, int depth)
{
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0, i = 0, rc;
    if (n == 0)
        return err_setf(c->e, ERR_ARG, "schema at %s: '%s' must be a non-empty array", where(c), kw);
    if (n > GM_MAX_ALT)
        return err_setf(c->e, ERR_RANGE, "schema at %s: '%s' has %d alternatives (at most %d)",
                        where(c), kw, n, GM_MAX_ALT);
    uint32_t sub[GM_MAX_ALT];
    for (const cJSON *p = arr->child; p; p = p->next, i++) {
        size_t old = path_push_idx(c, kw, (unsigned)i);
        int k = compile(c, p, depth + 1);
        path_pop(c, old);
        if (k < 0)
            return k;
        sub[i] = (uint32_t)k;
    }
    int k = new_node(c, GN_ALT);
    if (k < 0)
        return k;
    c->g->node[k].alt0 = c->g->n_list;
    c->g->node[k].n_alt = (uint32_t)n;
    for (i = 0; i < n; i++)
        if ((rc = list_add(c, sub[i])) < 0)
            return rc;
    return k;
}

/* The schema a local $ref ("#", "#/$defs/name", any JSON pointer) points to. */
static const cJSON *resolve(struct cc *c, const char *ref)
{
    const cJSON *cur = c->root;
    char seg[256];
    if (ref[0] != '#')
        return NULL;
    const char *p = ref + 1;
    for (int n = 0; *p; n++) {
        if (*p != '/' || n >= 32 || !cur)
            return NULL;
        size_t k = 0;
        for (p++; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~' && (p[1] == '0' || p[1] == '1'))
                ch = *++p == '0' ? '~' : '/';
            if (k + 1 >= sizeof seg)
                return NULL;
            seg[k++] = ch;
        }
        seg[k] = '\0';
        if (cJSON_IsArray(cur)) {
            char *end;
            long i = strtol(seg, &end, 10);
            cur = *end || k == 0 || i < 0 || i > 1 << 20 ? NULL : cJSON_GetArrayItem(cur, (int)i);
        } else {
            cur = cJSON_IsObject(cur) ? cJSON_GetObjectItemCaseSensitive(cur, seg) : NULL;
        }
    }
    return cur;
}

/* The target of the local $ref "#/a/b" as the user's path: base.a.b when dotted, else /a/b. */
static char *ref_location(const struct cc *c, const char *ref)
{
    char buf[512];
    const char *base = c->dotted ? c->base : "";
    size_t n = strlen(base) < 256 ? strlen(base) : 255;
    memcpy(buf, base, n);
    for (const char *p = ref + 1; *p && n + 2 < sizeof buf; p++) {
        if (*p == '/')
            buf[n++] = c->dotted ? '.' : '/';
        else if (*p == '~' && (p[1] == '0' || p[1] == '1'))
            buf[n++] = *++p == '0' ? '~' : '/';
        else
            buf[n++] = *p;
    }
    buf[n] = '\0';
    const char *s = n == 0 ? "/" : buf[0] == '.' ? buf + 1 : buf;
    size_t ls = strlen(s), lr = 0;
    while (lr < 128 && ref[lr])
        lr++;
    char *out = malloc(ls + lr + 2);  /* the location, then the $ref as written */
    if (out) {
        memcpy(out, s, ls + 1);
        memcpy(out + ls + 1, ref, lr);
        out[ls + 1 + lr] = '\0';
    }
    return out;
}

static int build_ref(struct cc *c, const cJSON *ref, int depth)
{
    if (!cJSON_IsString(ref))
        return err_setf(c->e, ERR_ARG, "schema at %s: '$ref' must be a string", where(c));
    const cJSON *t = resolve(c, ref->valuestring);
    if (!t || !(cJSON_IsObject(t) || cJSON_IsBool(t)))
        return err_setf(c->e, ERR_ARG, "schema at %s: '$ref' '%.128s' is not a local schema (#/$defs/...)",
                        where(c), ref->valuestring);
    for (uint32_t i = 0; i < c->n_ref; i++)
        if (c->ref_src[i] == t)
            return c->ref_node[i];
    int rc, k = new_node(c, GN_ALT);
    uint32_t cap = c->cap_ref, cap2 = c->cap_ref;
    if (k < 0)
        return k;
    if ((rc = grow((void **)&c->ref_src, &cap, c->n_ref + 1, sizeof *c->ref_src, c->e)) < 0 ||
        (rc = grow((void **)&c->ref_loc, &cap2, c->n_ref + 1, sizeof *c->ref_loc, c->e)) < 0 ||
        (rc = grow((void **)&c->ref_node, &c->cap_ref, c->n_ref + 1, sizeof *c->ref_node, c->e)) < 0)
        return rc;
    if (!(c->ref_loc[c->n_ref] = ref_location(c, ref->valuestring)))
        return err_setf(c->e, ERR_NOMEM, "grammar: out of memory");
    c->ref_src[c->n_ref] = t;
    c->ref_node[c->n_ref++] = (uint16_t)k;
    /* the target's errors are reported at the referring place, naming the $ref */
    size_t old = path_push(c, "$ref");
    int sub = compile(c, t, depth + 1);
    path_pop(c, old);
    if (sub < 0)
        return sub;
    c->g->node[k].alt0 = c->g->n_list;
    c->g->node[k].n_alt = 1;
    return (rc = list_add(c, (uint32_t)sub)) < 0 ? rc : k;
}

/* ---- one schema object ---- */

enum { T_OBJ = 1, T_ARR = 2, T_STR = 4, T_INT = 8, T_NUM = 16, T_BOOL = 32, T_NULL = 64 };

static int type_bits(struct cc *c, const cJSON *type, unsigned *bits)
{
    static const struct { const char *name; unsigned bit; } k_types[] = {
        {"object", T_OBJ}, {"array", T_ARR},   {"string", T_STR}, {"integer", T_INT},
        {"number", T_NUM}, {"boolean", T_BOOL}, {"null", T_NULL},
    };
    const cJSON *it = cJSON_IsArray(type) ? type->child : type;
    if (cJSON_IsArray(type) && !it)
        return err_setf(c->e, ERR_ARG, "schema at %s: empty 'type'", where(c));
    for (; it; it = cJSON_IsArray(type) ? it->next : NULL) {
        size_t i = 0;
        while (i < N_OF(k_types) && !(cJSON_IsString(it) && strcmp(it->valuestring, k_types[i].name) == 0))
            i++;
        if (i == N_OF(k_types))
            return err_setf(c->e, ERR_ARG, "schema at %s: unknown 'type' %.64s", where(c),
                            cJSON_IsString(it) ? it->valuestring : "(not a string)");
        *bits |= k_types[i].bit;
    }
    if ((*bits & (T_INT | T_NUM)) == (T_INT | T_NUM))
        *bits &= ~(unsigned)T_INT;
    return 0;
}

/* Types implied by the keywords when "type" is absent (0: any value). */
static unsigned implied_types(const cJSON *s)
{
    static const struct { const char *kw; unsigned bit; } k_imply[] = {
        {"properties", T_OBJ}, {"required", T_OBJ}, {"additionalProperties", T_OBJ},
        {"items", T_ARR}, {"prefixItems", T_ARR}, {"minItems", T_ARR}, {"maxItems", T_ARR},
        {"minLength", T_STR}, {"maxLength", T_STR}, {"minimum", T_NUM}, {"maximum", T_NUM},
        {"exclusiveMinimum", T_NUM}, {"exclusiveMaximum", T_NUM},
    };
    unsigned bits = 0;
    for (size_t i = 0; i < N_OF(k_imply); i++)
        if (cJSON_GetObjectItemCaseSensitive(s, k_imply[i].kw))
            bits |= k_imply[i].bit;
    return bits;
}

static int build_typed(struct cc *c, const cJSON *s, unsigned bits, int depth)
{
    uint32_t sub[7], n = 0;
    int k = 0, rc;
    for (unsigned b = 1; b <= T_NULL && k >= 0; b <<= 1) {
        if (!(bits & b))
            continue;
        switch (b) {
        case T_OBJ: k = build_object(c, s, depth); break;
        case T_ARR: k = build_array(c, s, depth); break;
        case T_STR: k = build_string(c, s); break;
        case T_INT: k = build_number(c, s, true); break;
        case T_NUM: k = build_number(c, s, false); break;
        case T_BOOL: k = shared_literal(c, &c->n_bool, "[true,false]"); break;
        default: k = shared_literal(c, &c->n_null, "null"); break;
        }
        if (k >= 0)
            sub[n++] = (uint32_t)k;
    }
    if (k < 0 || n == 1)
        return k < 0 ? k : (int)sub[0];
    if ((k = new_node(c, GN_ALT)) < 0)
        return k;
    c->g->node[k].alt0 = c->g->n_list;
    c->g->node[k].n_alt = n;
    for (uint32_t i = 0; i < n; i++)
        if ((rc = list_add(c, sub[i])) < 0)
            return rc;
    return k;
}

/* Refuses unknown keywords and keywords that cannot be combined (a $ref or an
 * anyOf with constraints beside it: we do not intersect schemas). */
static int check_keywords(struct cc *c, const cJSON *s, const char **combo)
{
    *combo = NULL;
    for (const cJSON *k = s->child; k; k = k->next) {
        if (in_list(k->string, k_annotations, N_OF(k_annotations)))
            continue;
        if (!in_list(k->string, k_keywords, N_OF(k_keywords)))
            return err_setf(c->e, ERR_ARG, "schema at %s: unsupported keyword '%.64s'", where(c), k->string);
        if (strcmp(k->string, "anyOf") == 0 || strcmp(k->string, "oneOf") == 0 ||
            strcmp(k->string, "allOf") == 0 || strcmp(k->string, "$ref") == 0) {
            if (*combo)
                return err_setf(c->e, ERR_ARG, "schema at %s: '%s' combined with '%s' is not supported",
                                where(c), k->string, *combo);
            *combo = k->string;
        }
    }
    if (!*combo)
        return 0;
    for (const cJSON *k = s->child; k; k = k->next)
        if (!in_list(k->string, k_annotations, N_OF(k_annotations)) && strcmp(k->string, *combo) != 0)
            return err_setf(c->e, ERR_ARG, "schema at %s: '%s' combined with '%.64s' is not supported",
                            where(c), *combo, k->string);
    return 0;
}

static int compile(struct cc *c, const cJSON *s, int depth)
{
    const char *combo;
    unsigned bits = 0;
    int rc;
    if (depth > GM_MAX_NEST)
        return err_setf(c->e, ERR_RANGE, "schema at %s: nested deeper than %d", where(c), GM_MAX_NEST);
    if (++c->work > GM_MAX_WORK)
        return err_setf(c->e, ERR_RANGE, "schema: more than %d subschemas to compile", GM_MAX_WORK);
    if (cJSON_IsTrue(s))
        return c->g->any;
    if (!cJSON_IsObject(s))
        return err_setf(c->e, ERR_ARG, "schema at %s: %s", where(c),
                        cJSON_IsFalse(s) ? "'false' allows nothing" : "must be an object or a boolean");
    if ((rc = check_keywords(c, s, &combo)) < 0)
        return rc;
    if (combo && strcmp(combo, "$ref") == 0)
        return build_ref(c, cJSON_GetObjectItemCaseSensitive(s, "$ref"), depth);
    if (combo && strcmp(combo, "allOf") == 0) {
        const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1)
            return err_setf(c->e, ERR_ARG, "schema at %s: 'allOf' is supported with one schema only", where(c));
        size_t old = path_push_idx(c, "allOf", 0);
        rc = compile(c, all->child, depth + 1);
        path_pop(c, old);
        return rc;
    }
    if (combo)
        return build_alt(c, cJSON_GetObjectItemCaseSensitive(s, combo), combo, depth);
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (en && !cJSON_IsArray(en))
        return err_setf(c->e, ERR_ARG, "schema at %s: 'enum' must be an array", where(c));
    if (en || cJSON_GetObjectItemCaseSensitive(s, "const"))
        return build_literal(c, en, en ? NULL : cJSON_GetObjectItemCaseSensitive(s, "const"),
                             en ? "enum" : "const");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (type && (rc = type_bits(c, type, &bits)) < 0)
        return rc;
    if (!type && !(bits = implied_types(s)))
        return c->g->any;
    return build_typed(c, s, bits, depth);
}

/* ---- flattening ---- */

/* The $ref node k's index in ref_node, or -1 (an anyOf). */
static int ref_index(const struct cc *c, uint32_t k)
{
    for (uint32_t i = 0; i < c->n_ref; i++)
        if (c->ref_node[i] == k)
            return (int)i;
    return -1;
}

/* Node k is reached again while in progress (c->stack[0..depth-1]): a cycle of $refs and
 * anyOf with no value in between. Every such cycle passes a $ref (only a $ref's node is
 * made before the nodes it reaches), so the error names the first $ref target in the cycle
 * where the user wrote it, and the chain of $refs: "schema at
 * tools[0].function.parameters.$defs.a: '$ref' cycle that never reaches a value
 * (#/$defs/a -> #/$defs/b -> #/$defs/a)". */
static int cycle_error(struct cc *c, uint32_t k, int depth)
{
    int from = depth - 1;
    while (from > 0 && c->stack[from] != k)
        from--;
    char chain[384];
    size_t n = 0;
    const char *first = NULL;
    for (int d = from; d <= depth; d++) {
        int r = ref_index(c, d < depth ? c->stack[d] : k);
        if (r < 0 || !c->ref_loc[r])
            continue;
        if (!first)
            first = c->ref_loc[r];
        const char *ref = c->ref_loc[r] + strlen(c->ref_loc[r]) + 1;
        int m = snprintf(chain + n, sizeof chain - n, "%s%s", n ? " -> " : "", ref);
        if (m < 0 || n + (size_t)m >= sizeof chain) {
            chain[n] = '\0';
            break;
        }
        n += (size_t)m;
    }
    if (!first)
        return err_setf(c->e, ERR_ARG, "schema: '$ref'/'anyOf' cycle that never reaches a value");
    return err_setf(c->e, ERR_ARG, "schema at %s: '$ref' cycle that never reaches a value (%s)", first, chain);
}

/* Replaces node k's alternatives by the concrete nodes they reach. */
static int flatten(struct cc *c, uint8_t *state, uint32_t k, int depth)
{
    struct grammar *g = c->g;
    uint32_t out[GM_MAX_ALT], n = 0;
    int rc;
    if (state[k] == 2)
        return 0;
    if (state[k] == 1)
        return cycle_error(c, k, depth);
    if (depth > GM_MAX_REF_CHAIN)
        return err_setf(c->e, ERR_RANGE, "schema: '$ref'/'anyOf' chain longer than %d", GM_MAX_REF_CHAIN);
    state[k] = 1;
    c->stack[depth] = k;
    uint32_t a0 = g->node[k].alt0, na = g->node[k].n_alt;
    for (uint32_t i = 0; i < na; i++) {
        uint32_t sub = g->list[a0 + i];
        uint32_t s0 = sub, sn = 1;
        const uint32_t *src = &sub;
        if (g->node[sub].kind == GN_ALT) {
            if ((rc = flatten(c, state, sub, depth + 1)) < 0)
                return rc;
            s0 = g->node[sub].alt0;
            sn = g->node[sub].n_alt;
            src = NULL;
        }
        for (uint32_t j = 0; j < sn; j++) {
            uint32_t v = src ? src[j] : g->list[s0 + j], m = 0;
            while (m < n && out[m] != v)
                m++;
            if (m < n)
                continue;
            if (n == GM_MAX_ALT)
                return err_setf(c->e, ERR_RANGE, "schema: more than %d alternatives for one value", GM_MAX_ALT);
            out[n++] = v;
        }
    }
    g->node[k].alt0 = g->n_list;
    g->node[k].n_alt = n;
    for (uint32_t i = 0; i < n; i++)
        if ((rc = list_add(c, out[i])) < 0)
            return rc;
    state[k] = 2;
    return 0;
}

/* The "any JSON value" nodes: an alternative of an object with any properties,
 * an array of anything, a string, a number and true/false/null. */
static int build_any(struct cc *c)
{
    int any = new_node(c, GN_ALT), k, rc;
    if (any < 0)
        return any;
    c->g->any = (uint16_t)any;
    uint32_t sub[5];
    if ((k = new_node(c, GN_OBJECT)) < 0)
        return k;
    if ((rc = add_lit(c, NULL, NULL, 0)) < 0)
        return rc;
    c->g->node[k].trie = (uint32_t)rc;
    c->g->node[k].addl = any;
    sub[0] = (uint32_t)k;
    if ((k = new_node(c, GN_ARRAY)) < 0)
        return k;
    c->g->node[k].items = any;
    c->g->node[k].max_n = UINT32_MAX;
    sub[1] = (uint32_t)k;
    if ((k = new_node(c, GN_STRING)) < 0)
        return k;
    sub[2] = (uint32_t)k;
    if ((k = new_node(c, GN_NUMBER)) < 0)
        return k;
    sub[3] = (uint32_t)k;
    cJSON *v = cJSON_Parse("[true,false,null]");
    k = v ? build_literal(c, v, NULL, "type") : err_setf(c->e, ERR_NOMEM, "grammar: out of memory");
    cJSON_Delete(v);
    if (k < 0)
        return k;
    sub[4] = (uint32_t)k;
    c->g->node[any].alt0 = c->g->n_list;
    c->g->node[any].n_alt = 5;
    for (int i = 0; i < 5; i++)
        if ((rc = list_add(c, sub[i])) < 0)
            return rc;
    return 0;
}

/* A forced tool call: a GN_CALL node over the names' literal and each function's arguments,
 * each compiled against its own parameters as the root of its "#/..." references, with
 * errors named by the call's path (tools[i].function.parameters...). */
static int build_calls(struct cc *c, const struct grammar_opts *o)
{
    struct grammar *g = c->g;
    const char *key = o->args_key ? o->args_key : "arguments";
    int n = o->n_calls, rc, k;
    uint32_t args[GRAMMAR_MAX_CALLS];
    if (n < 1 || n > GRAMMAR_MAX_CALLS || !o->calls)
        return err_setf(c->e, ERR_RANGE, "grammar: %d functions to call (1 to %d)", n, GRAMMAR_MAX_CALLS);
    int m = snprintf(g->call_mid, sizeof g->call_mid, ",\"%s\":", key);
    if (m < 0 || (size_t)m >= sizeof g->call_mid || strpbrk(key, "\"\\"))
        return err_setf(c->e, ERR_ARG, "grammar: arguments key '%.32s'", key);
    g->call_mid_len = (uint32_t)m;
    cJSON *names = cJSON_CreateArray();
    if (!names)
        return err_setf(c->e, ERR_NOMEM, "grammar: out of memory");
    c->dotted = true;
    for (int i = 0; i < n; i++) {
        const struct grammar_call *call = &o->calls[i];
        if (!call->name || !cJSON_AddItemToArray(names, cJSON_CreateString(call->name))) {
            cJSON_Delete(names);
            return err_setf(c->e, call->name ? ERR_NOMEM : ERR_ARG, "grammar: call %d without a name", i);
        }
        snprintf(c->path, sizeof c->path, "%s", call->where ? call->where : "parameters");
        c->plen = strlen(c->path);
        c->root = call->params;
        snprintf(c->base, sizeof c->base, "%s", c->path);
        k = call->params ? compile(c, call->params, 0) : (int)g->list[g->node[g->any].alt0];
        if (k < 0) {
            cJSON_Delete(names);
            return k;
        }
        args[i] = (uint32_t)k;
    }
    c->plen = 0;
    c->path[0] = '\0';
    int lit = build_literal(c, names, NULL, "name");
    cJSON_Delete(names);
    if (lit < 0)
        return lit;
    const struct gtrie *t = &g->lit[g->node[lit].trie];
    for (uint32_t j = 0; j < t->n_node; j++)
        if (t->node[j].n_term > 1)
            return err_setf(c->e, ERR_ARG, "tools: two functions named '%.64s' (a forced call needs distinct names)",
                            o->calls[t->order[t->node[j].lo]].name);
    if ((k = new_node(c, GN_CALL)) < 0)
        return k;
    g->node[k].items = lit;
    g->node[k].alt0 = g->n_list;
    g->node[k].n_alt = (uint32_t)n;
    for (int i = 0; i < n; i++)
        if ((rc = list_add(c, args[i])) < 0)
            return rc;
    return k;
}

int gm_schema_compile(struct grammar *g, const cJSON *schema, const struct grammar_opts *opts,
                      struct err *e)
{
    struct cc c = {.g = g, .root = schema, .e = e, .n_bool = -1, .n_null = -1};
    uint8_t *state = NULL;
    int rc = build_any(&c);
    if (rc < 0)
        goto out;
    if (!schema && opts->n_calls > 0) {
        rc = build_calls(&c, opts);
    } else if (!schema) {
        rc = opts->any_object ? (int)g->list[g->node[g->any].alt0] : g->any;  /* the object alternative */
    } else {
        rc = compile(&c, schema, 0);
    }
    if (rc < 0)
        goto out;
    g->root = (uint16_t)rc;
    if (!(state = calloc(g->n_node, 1))) {
        rc = err_setf(e, ERR_NOMEM, "grammar: out of memory");
        goto out;
    }
    rc = 0;
    for (uint32_t k = 0; k < g->n_node && rc == 0; k++)
        if (g->node[k].kind == GN_ALT)
            rc = flatten(&c, state, k, 0);
out:
    free(state);
    for (uint32_t i = 0; i < c.n_ref; i++)
        free(c.ref_loc[i]);
    free(c.ref_loc);
    free(c.ref_src);
    free(c.ref_node);
    return rc < 0 ? rc : 0;
}
