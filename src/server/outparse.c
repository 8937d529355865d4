/*
 * outparse: a choice's generated text split into reasoning, content and tool
 * calls (outparse.h has the contract and the exact rules).
 *
 * Think of it as a small state machine over one buffer of not-yet-decided
 * bytes. START decides whether the output opens with <think>; REASONING
 * passes text through until </think>; CONTENT passes text through until the
 * format's marker (or, for Llama 3, a '{' where a call may start); CALL
 * collects one block (marker + JSON) until it is complete, then validates it
 * with cJSON and emits the calls, or emits the whole block as text. At every
 * point the only bytes held are those that could still change meaning: a
 * suffix that is a prefix of a marker, whitespace that may be dropped, or the
 * open block (at most OUTPARSE_MAX_CALL bytes). Input is taken FEED_STEP bytes
 * at a time so one huge feed does not grow the buffer past that bound.
 *
 * Arguments are returned as the model wrote them minus the whitespace outside
 * strings, not re-printed by cJSON: cJSON would turn a 64-bit integer into a
 * double and lose digits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "outparse.h"

#define FEED_STEP 4096      /* bytes appended per scan: bounds the buffer beyond an open call */
#define MAX_NAME 256        /* longest function name accepted */
#define MAX_WS_HOLD 64      /* trailing whitespace held (and dropped) before </think> */
#define ID_MAX 40           /* bytes of the longest call id, NUL included */

static const char k_think_open[] = "<think>";
static const char k_think_close[] = "</think>";
static const char k_hermes_open[] = "<tool_call>";
static const char k_hermes_close[] = "</tool_call>";
static const char k_python_tag[] = "<|python_tag|>";
static const char k_mistral_open[] = "[TOOL_CALLS]";
static const char k_mistral_args[] = "[ARGS]";

enum state { ST_START, ST_REASONING, ST_CONTENT, ST_CALL, ST_FINISHED };

/* What the open block holds: where its JSON ends is found by the end marker
 * (Hermes) or by bracket balance (the others). */
enum call_kind {
    CK_HERMES,        /* <tool_call> ... </tool_call> */
    CK_LLAMA,         /* [<|python_tag|>] {object} */
    CK_MISTRAL,       /* [TOOL_CALLS] [array] or [TOOL_CALLS]name[ARGS]{object} */
};

enum call_phase { PH_PRE, PH_NAME, PH_VALUE };

/* Bracket balance over a JSON value being received (strings aware). */
struct jscan {
    size_t pos;       /* next byte to look at */
    size_t depth;
    bool in_str, esc;
};

enum scan_result { SCAN_MORE, SCAN_DONE, SCAN_BAD_MARKER };

struct outparse {
    struct outparse_opts o;
    enum state st;
    bool skip_ws;        /* drop whitespace at the head of the buffer */
    bool at_start;       /* Llama 3: a '{' here may begin a call */
    bool after_call;     /* Llama 3: a ';' may separate calls here */
    int rc;              /* sticky error */
    char *buf;           /* undecided bytes */
    size_t len, cap;
    /* the open block, which starts at buf[0] */
    enum call_kind ck;
    enum call_phase ph;
    size_t mark;         /* length of the opening marker */
    size_t vstart;       /* first byte of the JSON value */
    size_t name_off, name_len;  /* Mistral name[ARGS] form */
    size_t end;          /* one past the block, once SCAN_DONE */
    struct jscan js;
    size_t hpos;         /* Hermes: where the search for </tool_call> resumes */
    int n_calls;
    uint64_t rng;
};

struct call {
    const char *name;    /* borrowed from the cJSON tree or the buffer (NUL-terminated copy) */
    char *args;          /* owned */
};

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_ident(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
}

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && is_ws(s[i]))
        i++;
    return i;
}

static bool has_prefix(const char *s, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    return n >= l && memcmp(s, lit, l) == 0;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of lit. */
static size_t partial_suffix(const char *s, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    for (size_t k = (n < l - 1 ? n : l - 1); k > 0; k--)
        if (memcmp(s + n - k, lit, k) == 0)
            return k;
    return 0;
}

/* ---- emitting ---- */

static int emit_event(struct outparse *p, outparse_emit_fn emit, void *ud, const struct outparse_event *ev)
{
    int rc = emit(ud, ev);
    if (rc != 0)
        p->rc = rc < 0 ? rc : -ERR_NOMEM;
    return p->rc;
}

static int emit_text(struct outparse *p, outparse_emit_fn emit, void *ud, enum outparse_kind k,
                     const char *s, size_t n)
{
    if (n == 0)
        return 0;
    struct outparse_event ev = {.kind = k, .text = s, .len = n};
    return emit_event(p, emit, ud, &ev);
}

static void consume(struct outparse *p, size_t n)
{
    if (n == 0)
        return;
    memmove(p->buf, p->buf + n, p->len - n);
    p->len -= n;
}

/* xorshift64*: ids need to be unique, not secret. A call id in the opts' style:
 * OpenAI's "call_" + 24 alphanumerics, Anthropic's "toolu_01" + 22, or the 9
 * alphanumerics Mistral's templates demand (vLLM issues the same for Mistral models). */
static void make_id(struct outparse *p, char id[ID_MAX])
{
    static const char k_alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    static const struct { const char *prefix; int n; } k_style[] = {
        [OUTPARSE_IDS_OPENAI] = {"call_", 24},
        [OUTPARSE_IDS_ANTHROPIC] = {"toolu_01", 22},
        [OUTPARSE_IDS_MISTRAL] = {"", 9},
    };
    unsigned st = (unsigned)p->o.ids < sizeof k_style / sizeof k_style[0] ? (unsigned)p->o.ids : 0;
    size_t k = strlen(k_style[st].prefix);
    memcpy(id, k_style[st].prefix, k);
    for (int i = 0; i < k_style[st].n; i++) {
        p->rng ^= p->rng >> 12;
        p->rng ^= p->rng << 25;
        p->rng ^= p->rng >> 27;
        id[k++] = k_alnum[((p->rng * 0x2545F4914F6CDD1DULL) >> 33) % 62];
    }
    id[k] = 0;
}

bool outparse_detect_short_ids(const char *src)
{
    return src && (strstr(src, k_mistral_open) || strstr(src, "length != 9") || strstr(src, "length == 9"));
}

bool outparse_short_id_ok(const char *id)
{
    size_t n = 0;
    for (; id[n]; n++)
        if (!((id[n] >= '0' && id[n] <= '9') || (id[n] >= 'a' && id[n] <= 'z') || (id[n] >= 'A' && id[n] <= 'Z')))
            return false;
    return n == 9;
}

void outparse_short_id(const char *id, char out[10])
{
    static const char k_alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    if (outparse_short_id_ok(id)) {
        memcpy(out, id, 10);
        return;
    }
    uint64_t h = 0xcbf29ce484222325ULL;  /* FNV-1a: one id always maps to one short id */
    for (const char *q = id; *q; q++)
        h = (h ^ (uint8_t)*q) * 0x100000001b3ULL;
    for (int i = 0; i < 9; i++) {
        out[i] = k_alnum[h % 62];
        h /= 62;
    }
    out[9] = 0;
}

int outparse_shorten_ids(cJSON *messages)
{
    const cJSON *m, *t;
    char id[10];
    cJSON_ArrayForEach(m, messages) {
        cJSON *tid = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
        if (cJSON_IsString(tid) && !outparse_short_id_ok(tid->valuestring)) {
            outparse_short_id(tid->valuestring, id);
            if (!cJSON_SetValuestring(tid, id))
                return -ERR_NOMEM;
        }
        cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) {
            cJSON *cid = cJSON_GetObjectItemCaseSensitive(t, "id");
            if (cJSON_IsString(cid) && !outparse_short_id_ok(cid->valuestring)) {
                outparse_short_id(cid->valuestring, id);
                if (!cJSON_SetValuestring(cid, id))
                    return -ERR_NOMEM;
            }
        }
    }
    return 0;
}

/* ---- JSON helpers over text cJSON has already accepted ---- */

/* One past the JSON value that starts at s[i] (s[i] is not whitespace). */
static size_t json_skip(const char *s, size_t n, size_t i)
{
    if (i >= n)
        return n;
    if (s[i] == '"') {
        for (i++; i < n; i++) {
            if (s[i] == '\\')
                i++;
            else if (s[i] == '"')
                return i + 1;
        }
        return n;
    }
    if (s[i] == '{' || s[i] == '[') {
        struct jscan js = {.pos = i};
        for (; js.pos < n; js.pos++) {
            char c = s[js.pos];
            if (js.in_str) {
                if (js.esc)
                    js.esc = false;
                else if (c == '\\')
                    js.esc = true;
                else if (c == '"')
                    js.in_str = false;
            } else if (c == '"') {
                js.in_str = true;
            } else if (c == '{' || c == '[') {
                js.depth++;
            } else if ((c == '}' || c == ']') && --js.depth == 0) {
                return js.pos + 1;
            }
        }
        return n;
    }
    while (i < n && s[i] != ',' && s[i] != '}' && s[i] != ']' && !is_ws(s[i]))
        i++;
    return i;
}

/* The span [*vo, *ve) of member key's value in the object s[0..n) (valid JSON,
 * s[0] == '{'), matching the key's raw spelling; false when absent. */
static bool json_member(const char *s, size_t n, const char *key, size_t *vo, size_t *ve)
{
    size_t kl = strlen(key), i = 1;
    for (;;) {
        i = skip_ws(s, n, i);
        if (i >= n || s[i] != '"')
            return false;
        size_t ks = i;
        i = json_skip(s, n, i);
        bool match = i - ks == kl + 2 && memcmp(s + ks + 1, key, kl) == 0;
        i = skip_ws(s, n, i);
        if (i >= n || s[i] != ':')
            return false;
        i = skip_ws(s, n, i + 1);
        size_t v = i;
        i = json_skip(s, n, i);
        if (match) {
            *vo = v;
            *ve = i;
            return true;
        }
        i = skip_ws(s, n, i);
        if (i >= n || s[i] != ',')
            return false;
        i++;
    }
}

/* s[0..n) without the whitespace outside strings, malloc'd into *out (out NULL:
 * only check): 0, 1 when it holds a raw control byte, in a string or between
 * tokens (cJSON lets both through, JSON allows neither; a NUL would also cut the
 * text short), -ERR_NOMEM. */
static int json_compact(const char *s, size_t n, char **out)
{
    char *o = NULL;
    if (out && !(o = *out = malloc(n + 1)))
        return -ERR_NOMEM;
    size_t k = 0;
    bool in_str = false, esc = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if ((unsigned char)c < 0x20 && (in_str || !is_ws(c))) {
            free(o);
            if (out)
                *out = NULL;
            return 1;
        }
        if (in_str) {
            if (esc)
                esc = false;
            else if (c == '\\')
                esc = true;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (is_ws(c)) {
            continue;
        }
        if (o)
            o[k++] = c;
    }
    if (o)
        o[k] = 0;
    return 0;
}

/* ---- validating a block ---- */

static bool tool_known(const cJSON *tools, const char *name)
{
    if (!cJSON_IsArray(tools))
        return true;
    for (const cJSON *t = tools->child; t; t = t->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(f) ? f : t, "name");
        if (cJSON_IsString(n) && strcmp(n->valuestring, name) == 0)
            return true;
    }
    return false;
}

static bool name_ok(const struct outparse *p, const char *name)
{
    size_t l = strlen(name);
    return l > 0 && l <= MAX_NAME && tool_known(p->o.tools, name);
}

/* The compact arguments text of member key of object obj (raw text s[0..n)):
 * 0 with *out set, 1 when the value is not an object (or a string holding one),
 * -ERR_NOMEM. An absent or null member is "{}". */
static int args_of(const cJSON *obj, const char *s, size_t n, const char *key, char **out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    size_t vo, ve;
    *out = NULL;
    if (!v || cJSON_IsNull(v)) {
        *out = strdup("{}");
    } else if (cJSON_IsObject(v)) {
        if (json_member(s, n, key, &vo, &ve))
            return json_compact(s + vo, ve - vo, out);
        /* the key was spelled with escapes: cJSON found it, the raw scan did not */
        *out = cJSON_PrintUnformatted(v);
    } else if (cJSON_IsString(v)) {
        /* arguments sent as a JSON string, as the OpenAI API itself carries them */
        cJSON *inner = cJSON_Parse(v->valuestring);
        bool ok = cJSON_IsObject(inner);
        cJSON_Delete(inner);
        if (!ok)
            return 1;
        return json_compact(v->valuestring, strlen(v->valuestring), out);
    } else {
        return 1;
    }
    return *out ? 0 : -ERR_NOMEM;
}

/* One call object (raw text s[0..n)) into c: 0, 1 when it is not a valid call,
 * -ERR_NOMEM. llama: the Llama 3 shape (parameters required, type "function"). */
static int call_of(const struct outparse *p, const cJSON *obj, const char *s, size_t n, bool llama,
                   struct call *c)
{
    if (!cJSON_IsObject(obj))
        return 1;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(obj, "name");
    if (!cJSON_IsString(name) || !name_ok(p, name->valuestring))
        return 1;
    const char *key = cJSON_GetObjectItemCaseSensitive(obj, "parameters") ? "parameters" : "arguments";
    if (llama) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(obj, "type");
        if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "function") == 0))
            return 1;
        if (!cJSON_GetObjectItemCaseSensitive(obj, key))
            return 1;
    }
    c->name = name->valuestring;
    return args_of(obj, s, n, key, &c->args);
}

/* Parse s[0..n) as exactly one JSON value (whitespace around allowed); NULL if not. */
static cJSON *parse_exact(const char *s, size_t n)
{
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s, n, &end, false);
    if (v && skip_ws(s, n, (size_t)(end - s)) != n) {
        cJSON_Delete(v);
        return NULL;
    }
    return v;
}

/* Emit the calls of the complete block buf[0..p->end): 0 when emitted, 1 when
 * the block is not a valid call (the caller emits it as text), < 0 on error. */
static int emit_block(struct outparse *p, outparse_emit_fn emit, void *ud)
{
    struct call calls[OUTPARSE_MAX_CALLS];
    int nc = 0, rc = 1;
    char name_buf[MAX_NAME + 1];
    cJSON *root = NULL;
    const char *v = p->buf + p->vstart;
    size_t vn = (p->ck == CK_HERMES ? p->end - strlen(k_hermes_close) : p->end) - p->vstart;

    if (json_compact(v, vn, NULL) != 0 || !(root = parse_exact(v, vn)))
        goto out;
    size_t vo = skip_ws(v, vn, 0);
    if (p->ck == CK_MISTRAL && p->ph == PH_VALUE && p->name_len == 0) {
        /* [TOOL_CALLS] [{...}, ...]: all the array's calls, or none */
        if (!cJSON_IsArray(root) || !root->child)
            goto out;
        size_t i = vo + 1;
        for (const cJSON *x = root->child; x; x = x->next) {
            i = skip_ws(v, vn, i);
            size_t e = json_skip(v, vn, i);
            if (nc == OUTPARSE_MAX_CALLS - p->n_calls) {
                rc = 1;
                goto out;
            }
            if ((rc = call_of(p, x, v + i, e - i, false, &calls[nc])) != 0)
                goto out;
            nc++;
            i = skip_ws(v, vn, e) + 1;  /* past the ',' */
        }
    } else if (p->ck == CK_MISTRAL) {
        /* [TOOL_CALLS]name[ARGS]{...}: the object is the arguments */
        memcpy(name_buf, p->buf + p->name_off, p->name_len);
        name_buf[p->name_len] = 0;
        if (!cJSON_IsObject(root) || !name_ok(p, name_buf))
            goto out;
        calls[0].name = name_buf;
        if ((rc = json_compact(v + vo, vn - vo, &calls[0].args)) != 0)
            goto out;
        nc = 1;
    } else {
        if ((rc = call_of(p, root, v + vo, vn - vo, p->ck == CK_LLAMA, &calls[0])) != 0)
            goto out;
        nc = 1;
    }
    rc = 0;
    for (int i = 0; i < nc && rc == 0; i++) {
        char id[ID_MAX];
        make_id(p, id);
        struct outparse_event ev = {.kind = OUTPARSE_TOOL_CALL, .text = calls[i].args,
                                    .len = strlen(calls[i].args), .name = calls[i].name, .id = id,
                                    .index = p->n_calls++, .raw = p->buf, .raw_len = i == 0 ? p->end : 0};
        rc = emit_event(p, emit, ud, &ev);
    }
out:
    for (int i = 0; i < nc; i++)
        free(calls[i].args);
    cJSON_Delete(root);
    return rc;
}

/* ---- the states ---- */

/* Drop whitespace at the head while skip_ws; false when the buffer is empty. */
static bool drop_ws(struct outparse *p)
{
    if (p->len == 0)
        return false;  /* nothing to decide (and memmem must not see a NULL buffer) */
    if (!p->skip_ws)
        return true;
    size_t i = skip_ws(p->buf, p->len, 0);
    consume(p, i);
    if (p->len == 0)
        return false;
    p->skip_ws = false;
    return true;
}

/* Each step returns 1 when it changed state (run again), 0 when it needs more
 * input, < 0 on error. */
static int step_start(struct outparse *p, bool final)
{
    size_t l = strlen(k_think_open);
    if (p->len == 0 && !final)
        return 0;
    if (p->len > 0 && has_prefix(p->buf, p->len, k_think_open)) {
        consume(p, l);
        p->st = ST_REASONING;
        p->skip_ws = true;
        return 1;
    }
    if (!final && p->len < l && memcmp(p->buf, k_think_open, p->len) == 0)  /* len > 0 here */
        return 0;
    p->st = p->o.in_reasoning ? ST_REASONING : ST_CONTENT;
    p->skip_ws = p->o.in_reasoning;
    return 1;
}

/* How many whitespace bytes (at most MAX_WS_HOLD) end s[0..n). */
static size_t trailing_ws(const char *s, size_t n)
{
    size_t k = 0;
    while (k < n && k < MAX_WS_HOLD && is_ws(s[n - 1 - k]))
        k++;
    return k;
}

static int step_reasoning(struct outparse *p, bool final, outparse_emit_fn emit, void *ud)
{
    if (!drop_ws(p))
        return 0;
    const char *m = memmem(p->buf, p->len, k_think_close, strlen(k_think_close));
    if (m) {
        size_t i = (size_t)(m - p->buf);
        int rc = emit_text(p, emit, ud, OUTPARSE_REASONING, p->buf, i - trailing_ws(p->buf, i));
        if (rc < 0)
            return rc;
        consume(p, i + strlen(k_think_close));
        p->st = ST_CONTENT;
        p->skip_ws = true;
        p->at_start = true;
        return 1;
    }
    size_t keep = 0;
    if (!final) {
        keep = partial_suffix(p->buf, p->len, k_think_close);
        keep += trailing_ws(p->buf, p->len - keep);
    }
    int rc = emit_text(p, emit, ud, OUTPARSE_REASONING, p->buf, p->len - keep);
    consume(p, p->len - keep);
    return rc < 0 ? rc : 0;
}

static const char *format_marker(enum outparse_format f)
{
    switch (f) {
    case OUTPARSE_HERMES: return k_hermes_open;
    case OUTPARSE_LLAMA3: return k_python_tag;
    case OUTPARSE_MISTRAL: return k_mistral_open;
    default: return NULL;
    }
}

static void open_call(struct outparse *p, enum call_kind ck, size_t mark, enum call_phase ph)
{
    p->st = ST_CALL;
    p->ck = ck;
    p->mark = mark;
    p->ph = ph;
    p->vstart = mark;
    p->name_len = 0;
    p->hpos = mark;
    p->js = (struct jscan){.pos = mark};
}

static int step_content(struct outparse *p, bool final, outparse_emit_fn emit, void *ud)
{
    if (!drop_ws(p))
        return 0;
    const char *mk = p->n_calls < OUTPARSE_MAX_CALLS ? format_marker(p->o.format) : NULL;
    if (mk && p->o.format == OUTPARSE_LLAMA3 && p->at_start) {
        /* a bare JSON object where the output (or the previous call) ends; the
         * whitespace before it is held, up to MAX_WS_HOLD bytes */
        size_t i = skip_ws(p->buf, p->len, 0);
        if (p->after_call && i < p->len && p->buf[i] == ';')
            i = skip_ws(p->buf, p->len, i + 1);
        if (i == p->len && i <= MAX_WS_HOLD && !final)
            return 0;
        if (i < p->len && i <= MAX_WS_HOLD && p->buf[i] == '{') {
            open_call(p, CK_LLAMA, i, PH_VALUE);
            return 1;
        }
        p->at_start = false;
        p->after_call = false;
    }
    const char *m = mk ? memmem(p->buf, p->len, mk, strlen(mk)) : NULL;
    if (m) {
        size_t i = (size_t)(m - p->buf);
        int rc = emit_text(p, emit, ud, OUTPARSE_TEXT, p->buf, i);
        if (rc < 0)
            return rc;
        consume(p, i);
        open_call(p, p->o.format == OUTPARSE_HERMES ? CK_HERMES
                     : p->o.format == OUTPARSE_LLAMA3 ? CK_LLAMA : CK_MISTRAL,
                  strlen(mk), PH_PRE);
        return 1;
    }
    size_t keep = mk && !final ? partial_suffix(p->buf, p->len, mk) : 0;
    int rc = emit_text(p, emit, ud, OUTPARSE_TEXT, p->buf, p->len - keep);
    consume(p, p->len - keep);
    return rc < 0 ? rc : 0;
}

/* Advance the bracket balance over buf[..lim); true when the value closed. */
static bool jscan_run(struct jscan *js, const char *b, size_t lim)
{
    for (; js->pos < lim; js->pos++) {
        char c = b[js->pos];
        if (js->in_str) {
            if (js->esc)
                js->esc = false;
            else if (c == '\\')
                js->esc = true;
            else if (c == '"')
                js->in_str = false;
        } else if (c == '"') {
            js->in_str = true;
        } else if (c == '{' || c == '[') {
            js->depth++;
        } else if ((c == '}' || c == ']') && js->depth > 0 && --js->depth == 0) {
            js->pos++;
            return true;
        }
    }
    return false;
}

/* The Mistral name[ARGS] form: name at p->name_off, scanned up to p->js.pos. */
static enum scan_result scan_mistral_name(struct outparse *p, size_t lim)
{
    size_t i = p->js.pos;
    while (i < lim && is_ident(p->buf[i]) && i - p->name_off <= MAX_NAME)
        i++;
    p->js.pos = i;
    if (i - p->name_off > MAX_NAME)
        return SCAN_BAD_MARKER;
    if (i == lim)
        return SCAN_MORE;
    size_t al = strlen(k_mistral_args), j = i;
    if (has_prefix(p->buf + i, lim - i, k_mistral_args))
        j = i + al;
    else if (lim - i < al && memcmp(p->buf + i, k_mistral_args, lim - i) == 0)
        return SCAN_MORE;
    j = skip_ws(p->buf, lim, j);
    if (j == lim)
        return SCAN_MORE;
    if (p->buf[j] != '{')
        return SCAN_BAD_MARKER;
    p->name_len = i - p->name_off;
    p->ph = PH_VALUE;
    p->vstart = j;
    p->js = (struct jscan){.pos = j};
    return SCAN_MORE;  /* the caller scans the value next */
}

/* Scan the open block within buf[0..lim). */
static enum scan_result scan_call(struct outparse *p, size_t lim)
{
    if (p->ph == PH_PRE) {
        size_t i = skip_ws(p->buf, lim, p->mark);
        if (i == lim)
            return SCAN_MORE;
        char c = p->buf[i];
        if (c == '{' || (p->ck == CK_MISTRAL && c == '[')) {
            p->ph = PH_VALUE;
            p->vstart = i;
            p->js = (struct jscan){.pos = i};
            p->hpos = i;
        } else if (p->ck == CK_MISTRAL && is_ident(c)) {
            p->ph = PH_NAME;
            p->name_off = i;
            p->js.pos = i;
        } else {
            return SCAN_BAD_MARKER;
        }
    }
    if (p->ph == PH_NAME) {
        enum scan_result r = scan_mistral_name(p, lim);
        if (r != SCAN_MORE || p->ph == PH_NAME)
            return r;
    }
    if (p->ck == CK_HERMES) {
        size_t cl = strlen(k_hermes_close);
        const char *m = lim > p->hpos ? memmem(p->buf + p->hpos, lim - p->hpos, k_hermes_close, cl) : NULL;
        if (!m) {
            if (lim >= p->hpos + cl)
                p->hpos = lim - cl + 1;
            return SCAN_MORE;
        }
        p->end = (size_t)(m - p->buf) + cl;
        return SCAN_DONE;
    }
    if (!jscan_run(&p->js, p->buf, lim))
        return SCAN_MORE;
    p->end = p->js.pos;
    return SCAN_DONE;
}

/* The open block, or its first n bytes, turned out to be text. */
static int block_as_text(struct outparse *p, size_t n, outparse_emit_fn emit, void *ud)
{
    int rc = emit_text(p, emit, ud, OUTPARSE_TEXT, p->buf, n);
    consume(p, n);
    p->st = ST_CONTENT;
    p->at_start = false;
    p->after_call = false;
    return rc < 0 ? rc : 1;
}

static int step_call(struct outparse *p, bool final, outparse_emit_fn emit, void *ud)
{
    size_t lim = p->len < OUTPARSE_MAX_CALL ? p->len : OUTPARSE_MAX_CALL;
    enum scan_result r = scan_call(p, lim);
    if (r == SCAN_BAD_MARKER)
        return block_as_text(p, p->mark, emit, ud);
    if (r == SCAN_MORE) {
        if (lim == OUTPARSE_MAX_CALL)
            return block_as_text(p, lim, emit, ud);  /* too long to be a call */
        if (final)
            return block_as_text(p, p->len, emit, ud);  /* truncated */
        return 0;
    }
    int rc = emit_block(p, emit, ud);
    if (rc < 0)
        return rc;
    if (rc > 0)
        return block_as_text(p, p->end, emit, ud);
    consume(p, p->end);
    p->st = ST_CONTENT;
    p->skip_ws = true;
    p->at_start = true;
    p->after_call = true;
    return 1;
}

/* Process the buffer as far as it can be decided; final: no more input comes. */
static int run(struct outparse *p, bool final, outparse_emit_fn emit, void *ud)
{
    for (;;) {
        int rc;
        switch (p->st) {
        case ST_START: rc = step_start(p, final); break;
        case ST_REASONING: rc = step_reasoning(p, final, emit, ud); break;
        case ST_CONTENT: rc = step_content(p, final, emit, ud); break;
        case ST_CALL: rc = step_call(p, final, emit, ud); break;
        default: rc = 0; break;
        }
        if (rc <= 0)
            return rc;
    }
}

/* ---- public ---- */

enum outparse_format outparse_detect_format(const char *src)
{
    if (!src)
        return OUTPARSE_NONE;
    if (strstr(src, k_hermes_open))
        return OUTPARSE_HERMES;
    if (strstr(src, k_mistral_open))
        return OUTPARSE_MISTRAL;
    /* Llama 3.1/3.3 name <|python_tag|> for built-in tools; 3.2 only teaches
     * the {"name": ..., "parameters": ...} answer in its header-id turns */
    if (strstr(src, k_python_tag) || (strstr(src, "<|start_header_id|>") && strstr(src, "\"parameters\"")))
        return OUTPARSE_LLAMA3;
    return OUTPARSE_NONE;
}

bool outparse_detect_reasoning(const char *src)
{
    return src && (strstr(src, k_think_open) || strstr(src, k_think_close));
}

bool outparse_prompt_opens_reasoning(const char *prompt, size_t len)
{
    size_t l = strlen(k_think_open);
    for (size_t i = len; i >= l; i--) {
        if (memcmp(prompt + i - l, k_think_open, l) == 0)
            return skip_ws(prompt, len, i) == len;
        if (!is_ws(prompt[i - 1]))
            return false;
    }
    return false;
}

const char *outparse_format_name(enum outparse_format f)
{
    switch (f) {
    case OUTPARSE_NONE: return "none";
    case OUTPARSE_HERMES: return "hermes";
    case OUTPARSE_LLAMA3: return "llama3";
    case OUTPARSE_MISTRAL: return "mistral";
    }
    return "?";
}

int outparse_new(struct outparse **out, const struct outparse_opts *o, struct err *e)
{
    *out = NULL;
    if (o->format < OUTPARSE_NONE || o->format > OUTPARSE_MISTRAL)
        return err_setf(e, ERR_ARG, "outparse: unknown tool-call format %d", (int)o->format);
    struct outparse *p = calloc(1, sizeof *p);
    if (!p)
        return err_setf(e, ERR_NOMEM, "out of memory");
    p->o = *o;
    p->o.reasoning = o->reasoning || o->in_reasoning;
    p->st = p->o.reasoning ? ST_START : ST_CONTENT;
    p->at_start = true;
    p->rng = o->id_seed;
    if (!p->rng && getrandom(&p->rng, sizeof p->rng, GRND_NONBLOCK) != sizeof p->rng)
        p->rng = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)p;
    if (!p->rng)
        p->rng = 0x9E3779B97F4A7C15ULL;  /* xorshift must not start at 0 */
    *out = p;
    return 0;
}

void outparse_free(struct outparse *p)
{
    if (!p)
        return;
    free(p->buf);
    free(p);
}

int outparse_feed(struct outparse *p, const char *text, size_t len, outparse_emit_fn emit, void *ud)
{
    if (p->rc)
        return p->rc;
    if (p->st == ST_FINISHED)
        return -ERR_ARG;
    while (len > 0) {
        size_t n = len < FEED_STEP ? len : FEED_STEP;
        if (p->len + n > p->cap) {
            size_t cap = p->cap ? p->cap : 256;
            while (cap < p->len + n)
                cap *= 2;
            char *b = realloc(p->buf, cap);
            if (!b)
                return p->rc = -ERR_NOMEM;
            p->buf = b;
            p->cap = cap;
        }
        memcpy(p->buf + p->len, text, n);
        p->len += n;
        text += n;
        len -= n;
        int rc = run(p, false, emit, ud);
        if (rc < 0)
            return p->rc = rc;
    }
    return 0;
}

int outparse_finish(struct outparse *p, outparse_emit_fn emit, void *ud)
{
    if (p->rc)
        return p->rc;
    if (p->st == ST_FINISHED)
        return -ERR_ARG;
    int rc = run(p, true, emit, ud);
    if (rc < 0)
        return p->rc = rc;
    p->st = ST_FINISHED;
    return 0;
}
