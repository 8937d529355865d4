/*
 * oai_request: OpenAI request bodies -> struct oai_request (oai_request.h).
 *
 * A body passes three gates before cJSON sees it: one walk rejects NUL bytes
 * and invalid UTF-8 (tok_utf8_seq, the program's one validator: overlongs,
 * surrogates and code points past U+10FFFF are invalid); a pre-scan bounds
 * the nesting depth, rejects raw control bytes and finds \u0000 escapes
 * (cJSON would decode one into a NUL that silently cuts the string short).
 * The pre-scan tracks strings as cJSON does (a backslash takes the next
 * byte), so on every prefix cJSON accepts it counts the depth cJSON reaches,
 * and a 10^5-deep body is refused after 65 brackets, without recursion.
 * cJSON then parses exactly len bytes, and only JSON whitespace may follow
 * the one value.
 *
 * Fields are read by small typed readers that name the field on error
 * ("'top_p' must be a number"); a JSON null counts as absent. cJSON keeps
 * numbers as doubles, so an integer field takes a finite, integral double in
 * its range only: 1.5, 1e300 and -1 are each told apart from 1. Strings out
 * of cJSON are valid UTF-8 (the body is, and cJSON refuses lone surrogate
 * escapes) and NUL-free (the pre-scan), so they are copied as they are. User
 * text quoted back in a message is cut to QUOTE_MAX bytes on a character
 * boundary, and oai_error_json replaces whatever is still not valid UTF-8.
 */
#include "oai_request.h"

#include "../core/base64.h"
#include "../core/json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../tokenizer/tokenizer.h"  /* tok_utf8_seq: the one UTF-8 validator */

#define INVALID "invalid_request_error"
#define QUOTE_MAX 64  /* bytes of user text quoted in a message */

/* ---- errors ---- */

/* Cuts a trailing incomplete UTF-8 character off s (what a truncating snprintf leaves). */
static void trim_partial_char(char *s)
{
    size_t n = strlen(s), j = n, need;
    while (j > 0 && n - j < 3 && ((unsigned char)s[j - 1] & 0xC0) == 0x80)
        j--;
    if (j == 0 || ((unsigned char)s[j - 1] & 0xC0) != 0xC0)
        return;
    (void)tok_utf8_seq((const unsigned char *)s + j - 1, n - j + 1, &need);
    if (need > n - j + 1)
        s[j - 1] = '\0';
}

__attribute__((format(printf, 6, 0)))
static int verrorf(struct oai_error *err, int status, const char *type, const char *code, const char *param,
                   const char *fmt, va_list ap)
{
    if (!err)
        return -1;
    err->status = status;
    err->type = type;
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    trim_partial_char(err->param);
    trim_partial_char(err->message);
    return -1;
}

int oai_errorf(struct oai_error *err, int status, const char *type, const char *code, const char *param,
               const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verrorf(err, status, type, code, param, fmt, ap);
    va_end(ap);
    return -1;
}

/* A 400 invalid_request_error naming param (NULL: the body as a whole). */
__attribute__((format(printf, 3, 4)))
static int bad(struct oai_error *err, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verrorf(err, 400, INVALID, NULL, param, fmt, ap);
    va_end(ap);
    return -1;
}

static int nomem(struct oai_error *err)
{
    return oai_errorf(err, 500, "server_error", NULL, NULL, "out of memory while parsing the request");
}

static int type_error(struct oai_error *err, const char *param, const char *what)
{
    return bad(err, param, "'%s' must be %s", param, what);
}

/* s for a message: at most QUOTE_MAX bytes, cut on a character boundary, "..." when cut.
 * buf holds QUOTE_MAX + 4 bytes. */
static const char *quote(char *buf, const char *s)
{
    size_t n = s ? strnlen(s, QUOTE_MAX + 1) : 0;
    if (n <= QUOTE_MAX) {
        memcpy(buf, s ? s : "", n);
        buf[n] = '\0';
        return buf;
    }
    n = QUOTE_MAX;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
        n--;
    memcpy(buf, s, n);
    memcpy(buf + n, "...", 4);
    return buf;
}

/* Copies n bytes of src into dst[n + 1]: a byte that starts no valid UTF-8 character becomes
 * '?', an ASCII control byte ' ' (the message stays one line of valid UTF-8). */
static void sanitize(char *dst, const char *src, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)src[i];
        size_t need, k = tok_utf8_seq((const unsigned char *)src + i, n - i, &need);
        if (need == 0 || k != need) {
            dst[i++] = '?';
        } else if (c < 0x20 || c == 0x7f) {
            dst[i++] = ' ';
        } else {
            memcpy(dst + i, src + i, k);
            i += k;
        }
    }
    dst[n] = '\0';
}

char *oai_error_json(const struct oai_error *err)
{
    char msg[sizeof err->message + 1], param[sizeof err->param + 1];
    sanitize(msg, err->message, strnlen(err->message, sizeof err->message));
    sanitize(param, err->param, strnlen(err->param, sizeof err->param));
    const char *type = err->type ? err->type : err->status >= 500 ? "server_error" : INVALID;
    char *out = NULL;
    cJSON *root = cJSON_CreateObject();
    cJSON *e = root ? cJSON_AddObjectToObject(root, "error") : NULL;
    if (!e || !cJSON_AddStringToObject(e, "message", msg) || !cJSON_AddStringToObject(e, "type", type))
        goto out;
    if (!(param[0] ? cJSON_AddStringToObject(e, "param", param) : cJSON_AddNullToObject(e, "param")))
        goto out;
    if (!(err->code ? cJSON_AddStringToObject(e, "code", err->code) : cJSON_AddNullToObject(e, "code")))
        goto out;
    out = cJSON_PrintUnformatted(root);
out:
    cJSON_Delete(root);
    return out;
}

/* ---- the body ---- */

/* JSON's four whitespace bytes (RFC 8259 section 2); cJSON skips every byte <= 0x20. */
static bool is_json_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int not_json(struct oai_error *err, size_t at)
{
    return bad(err, NULL, "the request body is not valid JSON (error at byte %zu)", at);
}

/* No NUL byte, and valid UTF-8 throughout. */
static int check_bytes(const char *body, size_t len, struct oai_error *err)
{
    const unsigned char *u = (const unsigned char *)body;
    size_t i = 0;
    while (i < len) {
        if (u[i] == 0)
            return bad(err, NULL, "the request body contains a NUL byte (at byte %zu)", i);
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t need, k = tok_utf8_seq(u + i, len - i, &need);
        if (need == 0 || k != need)
            return bad(err, NULL, "the request body is not valid UTF-8 (at byte %zu)", i);
        i += k;
    }
    return 0;
}

/* Depth of [ and { outside strings at most OAI_MAX_JSON_DEPTH, no raw control byte (other
 * than whitespace between tokens), no \u0000 escape in a string. A backslash in a string
 * takes the next byte whatever it is, so `\\u0000` is a backslash then "u0000". */
static int prescan(const char *body, size_t len, struct oai_error *err)
{
    const unsigned char *u = (const unsigned char *)body;
    bool in_string = false;
    int depth = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = u[i];
        if (in_string) {
            if (c == '"') {
                in_string = false;
            } else if (c < 0x20) {
                return not_json(err, i);
            } else if (c == '\\') {
                if (len - i > 5 && u[i + 1] == 'u' && memcmp(u + i + 2, "0000", 4) == 0)
                    return bad(err, NULL, "strings must not contain NUL characters (\\u0000 at byte %zu)", i);
                i++;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > OAI_MAX_JSON_DEPTH)
                return bad(err, NULL, "the request body is nested more than %d levels deep (at byte %zu)",
                           OAI_MAX_JSON_DEPTH, i);
        } else if (c == ']' || c == '}') {
            depth -= depth > 0;
        } else if (c < 0x20 && !is_json_space(c)) {
            return not_json(err, i);
        }
    }
    return 0;
}

cJSON *oai_parse_object(const char *body, size_t len, struct oai_error *err)
{
    if (!body || len == 0) {
        bad(err, NULL, "the request body is empty");
        return NULL;
    }
    if (check_bytes(body, len, err) < 0 || prescan(body, len, err) < 0)
        return NULL;
    const char *end = NULL;
    errno = 0;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    /* cJSON returns NULL for bad syntax and a failed allocation alike; malloc sets ENOMEM */
    if (!root && errno == ENOMEM) {
        nomem(err);
        return NULL;
    }
    if (!root) {
        not_json(err, end && end >= body && end <= body + len ? (size_t)(end - body) : 0);
        return NULL;
    }
    size_t at = (size_t)(end - body);
    while (at < len && is_json_space((unsigned char)body[at]))
        at++;
    if (at != len) {
        cJSON_Delete(root);
        not_json(err, at);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        bad(err, NULL, "the request body must be a JSON object");
        return NULL;
    }
    /* cJSON takes "02", "1." and "-.5" and keeps both members of a key given twice (and
     * reads the first, where Python's json, and so OpenAI's server, reads the last): a
     * request is strict JSON, and a duplicate key is refused rather than resolved, since
     * two readers of one body (a proxy, a client's logger) may pick different values. */
    char path[256];
    int rc = json_check_numbers(body, len, path, sizeof path, &at);
    if (rc == 0 && (rc = json_find_duplicate(root, path, sizeof path)) == 1)
        bad(err, path, "the request body is not valid: the key '%s' appears twice", path);
    else if (rc == -ERR_FORMAT)
        bad(err, path[0] ? path : NULL, "the request body is not valid JSON (error at byte %zu: a number "
            "must be written as JSON writes it, without leading zeros%s%s)", at, path[0] ? ", at " : "", path);
    else if (rc < 0)
        nomem(err);
    if (rc != 0) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* ---- typed readers: each returns 1 when v was given, 0 when absent (v NULL), -1 on error ---- */

/* obj[key] (case-sensitive, the first of duplicates), NULL when absent or null. */
static const cJSON *member(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNull(v) ? NULL : v;
}

/* Children of a, counting no further than stop. */
static size_t count_children(const cJSON *a, size_t stop)
{
    size_t n = 0;
    for (const cJSON *c = a->child; c && n < stop; c = c->next)
        n++;
    return n;
}

static int read_bool(struct oai_error *err, const cJSON *v, const char *param, bool *out)
{
    if (!v)
        return 0;
    if (!cJSON_IsBool(v))
        return type_error(err, param, "a boolean");
    *out = cJSON_IsTrue(v);
    return 1;
}

/* An integer in [lo, hi]: a finite double with no fractional part. */
static int read_int(struct oai_error *err, const cJSON *v, const char *param, int lo, int hi, int *out)
{
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v))
        return type_error(err, param, "an integer");
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || d < lo || d > hi)
        return bad(err, param, "'%s' must be an integer in [%d, %d] (got %.15g)", param, lo, hi, d);
    *out = (int)d;
    return 1;
}

/* A number in [lo, hi] ((lo, hi] when lo_open), checked again once rounded to float so
 * that 1e-50 does not become an open bound's excluded 0. */
static int read_float(struct oai_error *err, const cJSON *v, const char *param, double lo, double hi,
                      bool lo_open, float *out)
{
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v))
        return type_error(err, param, "a number");
    double d = v->valuedouble;
    bool ok = isfinite(d) && d <= hi && (lo_open ? d > lo : d >= lo);
    float f = ok ? (float)d : 0.0f;
    if (!ok || (lo_open && !(f > lo)))
        return bad(err, param, "'%s' must be in %c%g, %g] (got %.15g)", param, lo_open ? '(' : '[', lo, hi, d);
    *out = f;
    return 1;
}

/* Any int64 (the double is within [-2^63, 2^63) and integral), kept as its two's complement. */
static int read_seed(struct oai_error *err, const cJSON *v, const char *param, uint64_t *out)
{
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v))
        return type_error(err, param, "an integer");
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || d < -0x1p63 || d >= 0x1p63)
        return bad(err, param, "'%s' must be a 64-bit integer (got %.15g)", param, d);
    *out = (uint64_t)(int64_t)d;
    return 1;
}

/* A malloc'd NUL-terminated copy of s[0 .. n). */
static char *copy_bytes(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

/* ---- chat messages ---- */

/* The template's role for a request role, NULL when it is not a chat role. */
static const char *chat_role(const char *role)
{
    static const char *const k[][2] = {
        {"system", "system"}, {"developer", "system"}, {"user", "user"}, {"assistant", "assistant"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strcmp(role, k[i][0]) == 0)
            return k[i][1];
    return NULL;
}

/* An image_url part's url (param names it) into r->images: a data: URL with base64 data
 * (RFC 2397; the media type is not trusted, the bytes are sniffed when decoded). */
static int take_image_url(struct oai_request *r, struct oai_error *err, const char *param, const char *url)
{
    char q[QUOTE_MAX + 4];
    if (r->n_images >= OAI_MAX_IMAGES)
        return bad(err, param, "a request takes at most %d images", OAI_MAX_IMAGES);
    if (strncasecmp(url, "http://", 7) == 0 || strncasecmp(url, "https://", 8) == 0) {
        /* kept: the server fetches it only when started with --allow-image-urls */
        size_t n = strlen(url);
        if (n > OAI_MAX_IMAGE_URL)
            return bad(err, param, "'%s' is over %d bytes", param, OAI_MAX_IMAGE_URL);
        struct oai_image *grown = realloc(r->images, (size_t)(r->n_images + 1) * sizeof *grown);
        if (!grown)
            return nomem(err);
        r->images = grown;
        struct oai_image *im = &r->images[r->n_images];
        memset(im, 0, sizeof *im);
        if (!(im->url = copy_bytes(url, n)))
            return nomem(err);
        snprintf(im->param, sizeof im->param, "%s", param);
        r->n_images++;
        return 0;
    }
    if (strncasecmp(url, "data:", 5) != 0)
        return bad(err, param, "'%s' must be a data: URL (data:image/png;base64,...), got '%s'", param,
                   quote(q, url));
    const char *comma = strchr(url, ',');
    if (!comma || comma - url < 12 || strncasecmp(comma - 7, ";base64", 7) != 0)
        return bad(err, param, "'%s' must be a base64 data: URL (data:image/png;base64,...)", param);
    const unsigned char *d = (const unsigned char *)comma + 1;
    size_t n = strlen((const char *)d);
    while (n > 0 && d[n - 1] == '=')
        n--;
    if (n == 0)
        return bad(err, param, "'%s' holds an empty image", param);
    if (n / 4 * 3 + (n % 4) * 3 / 4 > OAI_MAX_IMAGE_BYTES)
        return bad(err, param, "the image of '%s' is over %u bytes", param, OAI_MAX_IMAGE_BYTES);
    if (n % 4 == 1)
        return bad(err, param, "the base64 data of '%s' is cut short", param);
    unsigned char *out = malloc(b64_decoded_max(n) + 1);
    size_t k, at;
    if (!out)
        return nomem(err);
    if (b64_decode((const char *)d, n, B64_URLSAFE, out, &k, &at) < 0) {
        free(out);
        return bad(err, param, "the base64 data of '%s' holds a byte that is not base64 at offset %zu",
                   param, at);
    }
    struct oai_image *grown = realloc(r->images, (size_t)(r->n_images + 1) * sizeof *grown);
    if (!grown) {
        free(out);
        return nomem(err);
    }
    r->images = grown;
    struct oai_image *im = &r->images[r->n_images++];
    im->data = out;
    im->len = k;
    im->url = NULL;
    snprintf(im->param, sizeof im->param, "%s", param);
    return 0;
}

/* Checks content parts (an array) of message i: text parts joined into *out (malloc'd), or,
 * when image_url parts are among them, *parts as the template takes them ({"type": "text",
 * "text"} and {"type": "image"} in order) with the images in r->images. */
static int join_parts(struct oai_request *r, struct oai_error *err, const cJSON *parts, int i, char **out,
                      cJSON **parts_out)
{
    char param[128];
    size_t total = 0;
    int j = 0, n_img = 0;
    const cJSON *part;
    *parts_out = NULL;
    cJSON_ArrayForEach(part, parts) {
        if (j >= OAI_MAX_CONTENT_PARTS) {
            snprintf(param, sizeof param, "messages[%d].content", i);
            return bad(err, param, "'%s' must have at most %d parts", param, OAI_MAX_CONTENT_PARTS);
        }
        snprintf(param, sizeof param, "messages[%d].content[%d]", i, j);
        if (!cJSON_IsObject(part))
            return type_error(err, param, "an object");
        snprintf(param, sizeof param, "messages[%d].content[%d].type", i, j);
        const cJSON *type = member(part, "type");
        if (!type)
            return bad(err, param, "'%s' is required", param);
        if (!cJSON_IsString(type))
            return type_error(err, param, "a string");
        char q[QUOTE_MAX + 4];
        if (strcmp(type->valuestring, "image_url") == 0) {
            snprintf(param, sizeof param, "messages[%d].content[%d].image_url", i, j);
            const cJSON *iu = member(part, "image_url"), *url = iu ? member(iu, "url") : NULL;
            if (!iu)
                return bad(err, param, "'%s' is required", param);
            if (!cJSON_IsObject(iu))
                return type_error(err, param, "an object");
            snprintf(param, sizeof param, "messages[%d].content[%d].image_url.url", i, j);
            if (!url)
                return bad(err, param, "'%s' is required", param);
            if (!cJSON_IsString(url))
                return type_error(err, param, "a string");
            if (take_image_url(r, err, param, url->valuestring) < 0)
                return -1;
            n_img++;
            j++;
            continue;
        }
        if (strcmp(type->valuestring, "text") != 0)
            return bad(err, param, "content parts of type '%s' are not supported (only 'text' and 'image_url')",
                       quote(q, type->valuestring));
        snprintf(param, sizeof param, "messages[%d].content[%d].text", i, j);
        const cJSON *text = member(part, "text");
        if (!text)
            return bad(err, param, "'%s' is required", param);
        if (!cJSON_IsString(text))
            return type_error(err, param, "a string");
        total += strlen(text->valuestring);  /* each a distinct part of the body: no overflow */
        j++;
    }
    if (n_img > 0) {
        cJSON *arr = cJSON_CreateArray(), *p;
        bool ok = arr != NULL;
        cJSON_ArrayForEach(part, parts) {
            bool img = strcmp(member(part, "type")->valuestring, "image_url") == 0;
            ok = ok && (p = cJSON_CreateObject()) && cJSON_AddItemToArray(arr, p) &&
                 cJSON_AddStringToObject(p, "type", img ? "image" : "text") &&
                 (img || cJSON_AddStringToObject(p, "text", member(part, "text")->valuestring));
        }
        if (!ok) {
            cJSON_Delete(arr);
            return nomem(err);
        }
        *parts_out = arr;
        *out = NULL;
        return 0;
    }
    char *s = malloc(total + 1);
    if (!s)
        return nomem(err);
    size_t at = 0;
    cJSON_ArrayForEach(part, parts) {
        const char *t = member(part, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(s + at, t, n);
        at += n;
    }
    s[at] = '\0';
    *out = s;
    return 0;
}

/* Checks tool_calls of assistant message i into a fresh array for the template. */
static int parse_tool_calls(struct oai_error *err, const cJSON *calls, int i, cJSON **out)
{
    char param[128];
    snprintf(param, sizeof param, "messages[%d].tool_calls", i);
    if (!cJSON_IsArray(calls))
        return type_error(err, param, "an array");
    if (count_children(calls, OAI_MAX_TOOL_CALLS + 1) > OAI_MAX_TOOL_CALLS)
        return bad(err, param, "'%s' must have at most %d entries", param, OAI_MAX_TOOL_CALLS);
    cJSON *arr = cJSON_CreateArray();
    if (!arr)
        return nomem(err);
    int j = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        snprintf(param, sizeof param, "messages[%d].tool_calls[%d]", i, j);
        const cJSON *fn = cJSON_IsObject(c) ? member(c, "function") : NULL, *id = cJSON_IsObject(c) ? member(c, "id") : NULL;
        const cJSON *nm = cJSON_IsObject(fn) ? member(fn, "name") : NULL, *args = cJSON_IsObject(fn) ? member(fn, "arguments") : NULL;
        if (!cJSON_IsObject(c) || !cJSON_IsObject(fn) || !cJSON_IsString(nm) || (id && !cJSON_IsString(id)) ||
            (args && !cJSON_IsString(args) && !cJSON_IsObject(args))) {
            cJSON_Delete(arr);
            return bad(err, param, "'%s' must be {\"id\": string, \"type\": \"function\", \"function\": "
                       "{\"name\": string, \"arguments\": string}}", param);
        }
        /* templates read arguments as a mapping (transformers' callers pass dicts): JSON text
         * that parses to an object becomes one, anything else stays the string it was */
        cJSON *a = NULL;
        if (cJSON_IsString(args)) {
            a = cJSON_Parse(args->valuestring);
            if (a && !cJSON_IsObject(a)) {
                cJSON_Delete(a);
                a = NULL;
            }
        }
        if (!a)
            a = args ? cJSON_Duplicate(args, true) : cJSON_CreateObject();
        cJSON *o = cJSON_CreateObject(), *f = NULL;
        bool ok = a && o && (!id || cJSON_AddStringToObject(o, "id", id->valuestring)) &&
                  cJSON_AddStringToObject(o, "type", "function") && (f = cJSON_AddObjectToObject(o, "function")) &&
                  cJSON_AddStringToObject(f, "name", nm->valuestring);
        bool a_owned = ok && cJSON_AddItemToObject(f, "arguments", a);  /* a belongs to o from here */
        if (!a_owned)
            cJSON_Delete(a);
        if (!a_owned || !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            cJSON_Delete(arr);
            return nomem(err);
        }
        j++;
    }
    *out = arr;
    return 0;
}

/* Appends {"role", "content" (text, or null), "tool_calls" / "tool_call_id"} for message i. */
static int add_message(struct oai_error *err, cJSON *out, const char *role, const char *text, cJSON *parts,
                       const cJSON *m, int i)
{
    char param[128];
    cJSON *calls = NULL;
    const cJSON *tc = strcmp(role, "assistant") == 0 ? member(m, "tool_calls") : NULL;
    const cJSON *call_id = strcmp(role, "tool") == 0 ? member(m, "tool_call_id") : NULL;
    if (tc && parse_tool_calls(err, tc, i, &calls) < 0) {
        cJSON_Delete(parts);
        return -1;
    }
    if (call_id && !cJSON_IsString(call_id)) {
        cJSON_Delete(parts);
        cJSON_Delete(calls);
        snprintf(param, sizeof param, "messages[%d].tool_call_id", i);
        return type_error(err, param, "a string");
    }
    cJSON *msg = cJSON_CreateObject();
    if (!msg || !cJSON_AddItemToArray(out, msg)) {
        cJSON_Delete(msg);
        cJSON_Delete(calls);
        cJSON_Delete(parts);
        return nomem(err);
    }
    /* an assistant turn of tool calls only gets "" for content: templates that join strings
     * (most of the simple ones) fail on None, and the ones that test it read "" alike */
    bool ok = cJSON_AddStringToObject(msg, "role", role);
    if (parts && !(ok && cJSON_AddItemToObject(msg, "content", parts)))
        cJSON_Delete(parts), ok = false;
    ok = ok && (parts || cJSON_AddStringToObject(msg, "content", text ? text : ""));
    if (calls && !(ok && cJSON_AddItemToObject(msg, "tool_calls", calls)))
        cJSON_Delete(calls), ok = false;
    ok = ok && (!call_id || cJSON_AddStringToObject(msg, "tool_call_id", call_id->valuestring));
    return ok ? 0 : nomem(err);
}

/* Checks message i and appends {"role", "content"} to out (its images to r->images). */
static int parse_message(struct oai_request *r, struct oai_error *err, cJSON *out, const cJSON *m, int i)
{
    char param[128], q[QUOTE_MAX + 4];
    snprintf(param, sizeof param, "messages[%d]", i);
    if (!cJSON_IsObject(m))
        return type_error(err, param, "an object");
    snprintf(param, sizeof param, "messages[%d].role", i);
    const cJSON *role = member(m, "role");
    if (!role)
        return bad(err, param, "'%s' is required", param);
    if (!cJSON_IsString(role))
        return type_error(err, param, "a string");
    const char *name = chat_role(role->valuestring);
    if (!name && strcmp(role->valuestring, "tool") == 0)
        name = "tool";
    if (!name && strcmp(role->valuestring, "function") == 0)
        return bad(err, param, "messages with role 'function' (the deprecated form) are not supported: use 'tool'");
    if (!name)
        return bad(err, param, "'%s' must be one of 'system', 'developer', 'user', 'assistant', 'tool' (got '%s')",
                   param, quote(q, role->valuestring));
    bool assistant = strcmp(name, "assistant") == 0;
    const cJSON *calls = assistant ? member(m, "tool_calls") : NULL;

    snprintf(param, sizeof param, "messages[%d].content", i);
    const cJSON *content = member(m, "content");
    char *joined = NULL;
    cJSON *parts = NULL;
    if (!content && !(calls && cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0))
        return bad(err, param, "'%s' is required", param);
    if (!content)
        return add_message(err, out, name, NULL, NULL, m, i);
    if (cJSON_IsArray(content)) {
        int n_before = r->n_images;
        if (join_parts(r, err, content, i, &joined, &parts) < 0)
            return -1;
        if (r->n_images > n_before && strcmp(name, "user") != 0) {
            cJSON_Delete(parts);
            return bad(err, param, "images go in user messages (messages[%d] is '%s')", i, name);
        }
    } else if (!cJSON_IsString(content)) {
        return type_error(err, param, "a string or an array of content parts");
    }
    int rc = add_message(err, out, name, joined ? joined : parts ? NULL : content->valuestring, parts, m, i);
    free(joined);
    return rc;
}

static int parse_messages(struct oai_request *r, const cJSON *root, struct oai_error *err)
{
    const cJSON *msgs = member(root, "messages");
    if (!msgs)
        return bad(err, "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs))
        return type_error(err, "messages", "an array");
    size_t n = count_children(msgs, OAI_MAX_MESSAGES + 1);
    if (n == 0)
        return bad(err, "messages", "'messages' must not be empty");
    if (n > OAI_MAX_MESSAGES)
        return bad(err, "messages", "'messages' must have at most %d entries", OAI_MAX_MESSAGES);
    if (!(r->messages = cJSON_CreateArray()))
        return nomem(err);
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        if (parse_message(r, err, r->messages, m, i++) < 0)
            return -1;
    }
    return 0;
}

/* ---- completions prompt ---- */

static int set_prompt_text(struct oai_request *r, const char *s, struct oai_error *err)
{
    r->prompt_len = strlen(s);
    if (!(r->prompt = copy_bytes(s, r->prompt_len)))
        return nomem(err);
    return 0;
}

static int set_prompt_ids(struct oai_request *r, const cJSON *ids, int n_vocab, struct oai_error *err)
{
    size_t n = count_children(ids, (size_t)OAI_MAX_PROMPT_IDS + 1);
    if (n > OAI_MAX_PROMPT_IDS)
        return bad(err, "prompt", "'prompt' must have at most %d token ids", OAI_MAX_PROMPT_IDS);
    if (!(r->prompt_ids = malloc(n * sizeof *r->prompt_ids)))
        return nomem(err);
    char param[64];
    const cJSON *v;
    cJSON_ArrayForEach(v, ids) {
        int id = 0;
        snprintf(param, sizeof param, "prompt[%d]", r->n_prompt_ids);
        if (read_int(err, v, param, 0, n_vocab > 0 ? n_vocab - 1 : -1, &id) < 0)
            return -1;
        r->prompt_ids[r->n_prompt_ids++] = id;
    }
    return 0;
}

/* A string, an array of token ids, or an array of exactly one string. */
static int parse_prompt(struct oai_request *r, const cJSON *root, int n_vocab, struct oai_error *err)
{
    const cJSON *p = member(root, "prompt");
    if (!p)
        return bad(err, "prompt", "'prompt' is required");
    if (cJSON_IsString(p))
        return set_prompt_text(r, p->valuestring, err);
    if (!cJSON_IsArray(p))
        return type_error(err, "prompt", "a string or an array");
    const cJSON *first = p->child;
    if (!first)
        return bad(err, "prompt", "'prompt' must not be empty");
    if (cJSON_IsArray(first) || (cJSON_IsString(first) && first->next))
        return bad(err, "prompt", "only one prompt per request is supported");
    if (cJSON_IsString(first))
        return set_prompt_text(r, first->valuestring, err);
    return set_prompt_ids(r, p, n_vocab, err);
}

/* ---- fields of both endpoints ---- */

static int add_stop(struct oai_request *r, const cJSON *v, const char *param, struct oai_error *err)
{
    if (!cJSON_IsString(v))
        return type_error(err, param, "a string");
    size_t n = strlen(v->valuestring);
    if (n == 0)
        return bad(err, param, "'%s' must not be empty", param);
    if (n > OAI_MAX_STOP_LEN)
        return bad(err, param, "'%s' must be at most %d bytes (got %zu)", param, OAI_MAX_STOP_LEN, n);
    if (!(r->stop[r->n_stop] = copy_bytes(v->valuestring, n)))
        return nomem(err);
    r->stop_len[r->n_stop++] = n;
    return 0;
}

static int parse_stop(struct oai_request *r, const cJSON *root, struct oai_error *err)
{
    const cJSON *stop = member(root, "stop");
    if (!stop)
        return 0;
    if (cJSON_IsString(stop))
        return add_stop(r, stop, "stop", err);
    if (!cJSON_IsArray(stop))
        return type_error(err, "stop", "a string or an array of strings");
    if (count_children(stop, OAI_MAX_STOP + 1) > OAI_MAX_STOP)
        return bad(err, "stop", "'stop' must have at most %d entries", OAI_MAX_STOP);
    char param[32];
    const cJSON *v;
    cJSON_ArrayForEach(v, stop) {
        snprintf(param, sizeof param, "stop[%d]", r->n_stop);
        if (add_stop(r, v, param, err) < 0)
            return -1;
    }
    return 0;
}

/* A token id in decimal digits only ("50256"; no sign, space or other byte), < n_vocab. */
static bool parse_token_id(const char *s, int n_vocab, int32_t *out)
{
    int64_t v = 0;
    if (!s || !*s)
        return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return false;
        v = v * 10 + (*s - '0');
        if (v >= n_vocab)
            return false;
    }
    *out = (int32_t)v;
    return true;
}

/* An object of token id -> bias in [-100, 100]; a repeated id keeps its last bias. */
static int parse_logit_bias(struct oai_request *r, const cJSON *root, int n_vocab, struct oai_error *err)
{
    const cJSON *b = member(root, "logit_bias");
    if (!b)
        return 0;
    if (!cJSON_IsObject(b))
        return type_error(err, "logit_bias", "an object");
    size_t n = count_children(b, OAI_MAX_BIAS + 1);
    if (n > OAI_MAX_BIAS)
        return bad(err, "logit_bias", "'logit_bias' must have at most %d entries", OAI_MAX_BIAS);
    if (n == 0)
        return 0;
    if (!(r->bias = malloc(n * sizeof *r->bias)))
        return nomem(err);
    char q[QUOTE_MAX + 4];
    const cJSON *v;
    cJSON_ArrayForEach(v, b) {
        int32_t id;
        if (!parse_token_id(v->string, n_vocab, &id))
            return bad(err, "logit_bias", "'logit_bias' key '%s' is not a token id in [0, %d)",
                       quote(q, v->string), n_vocab);
        if (!cJSON_IsNumber(v))
            return bad(err, "logit_bias", "'logit_bias' value for token %d must be a number", id);
        double d = v->valuedouble;
        if (!isfinite(d) || d < -100 || d > 100)
            return bad(err, "logit_bias", "'logit_bias' value for token %d must be in [-100, 100] (got %.15g)",
                       id, d);
        int k = 0;
        while (k < r->n_bias && r->bias[k].id != id)
            k++;
        r->bias[k] = (struct oai_bias){id, (float)d};
        r->n_bias += k == r->n_bias;
    }
    return 0;
}

static int parse_stream(struct oai_request *r, const cJSON *root, struct oai_error *err)
{
    if (read_bool(err, member(root, "stream"), "stream", &r->stream) < 0 ||
        read_bool(err, member(root, "ignore_eos"), "ignore_eos", &r->ignore_eos) < 0)
        return -1;
    const cJSON *opts = member(root, "stream_options");
    if (!opts)
        return 0;
    if (!cJSON_IsObject(opts))
        return type_error(err, "stream_options", "an object");
    if (!r->stream)
        return bad(err, "stream_options", "stream_options is only allowed when stream is true");
    return read_bool(err, member(opts, "include_usage"), "stream_options.include_usage", &r->include_usage) < 0
               ? -1 : 0;
}

/* llama-server's "lora": [{"id": int, "scale": number}], at most OAI_MAX_LORA entries. */
int oai_parse_lora(struct oai_request *r, const cJSON *root, struct oai_error *err)
{
    const cJSON *v = member(root, "lora"), *it;
    if (!v)
        return 0;
    if (!cJSON_IsArray(v))
        return type_error(err, "lora", "an array of {\"id\", \"scale\"} objects");
    if (count_children(v, OAI_MAX_LORA + 1) > OAI_MAX_LORA)
        return bad(err, "lora", "'lora' holds more than %d entries", OAI_MAX_LORA);
    r->has_lora = true;
    cJSON_ArrayForEach(it, v) {
        char where[32], wid[40], wscale[40];
        snprintf(where, sizeof where, "lora[%d]", r->n_lora);
        snprintf(wid, sizeof wid, "%s.id", where);
        snprintf(wscale, sizeof wscale, "%s.scale", where);
        if (!cJSON_IsObject(it))
            return type_error(err, "lora", "an array of {\"id\", \"scale\"} objects");
        int id = -1;
        float scale = 0.0f;
        if (read_int(err, member(it, "id"), wid, 0, OAI_MAX_LORA - 1, &id) < 0 ||
            read_float(err, member(it, "scale"), wscale, -1e4, 1e4, false, &scale) < 0)
            return -1;
        if (id < 0)
            return bad(err, "lora", "'%s' has no \"id\"", where);
        r->lora[r->n_lora].id = id;
        r->lora[r->n_lora++].scale = scale;
    }
    return 0;
}

/* model, user, sampling, seed, stop, n, logit_bias, stream, lora. */
static int parse_common(struct oai_request *r, const cJSON *root, int n_vocab, struct oai_error *err)
{
    const cJSON *v = member(root, "model");
    if (v && !cJSON_IsString(v))
        return type_error(err, "model", "a string");
    if (v && !(r->model = copy_bytes(v->valuestring, strlen(v->valuestring))))
        return nomem(err);
    v = member(root, "user");
    if (v && !cJSON_IsString(v))
        return type_error(err, "user", "a string");

    const struct {
        const char *key;
        double lo, hi;
        bool lo_open;
        float *out;
        bool *has;
    } k[] = {
        {"temperature", 0, 2, false, &r->temperature, &r->has_temperature},
        {"top_p", 0, 1, true, &r->top_p, &r->has_top_p},
        {"min_p", 0, 1, false, &r->min_p, &r->has_min_p},
        {"repetition_penalty", 0, 10, true, &r->repetition_penalty, &r->has_repetition_penalty},
        {"presence_penalty", -2, 2, false, &r->presence_penalty, NULL},
        {"frequency_penalty", -2, 2, false, &r->frequency_penalty, NULL},
    };
    int rc;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        if ((rc = read_float(err, member(root, k[i].key), k[i].key, k[i].lo, k[i].hi, k[i].lo_open, k[i].out)) < 0)
            return rc;
        if (k[i].has)
            *k[i].has = rc;
    }
    int top_k = 0;
    if ((rc = read_int(err, member(root, "top_k"), "top_k", -1, 1 << 20, &top_k)) < 0)
        return rc;
    r->has_top_k = rc;
    r->top_k = top_k < 0 ? 0 : top_k;
    if ((rc = read_seed(err, member(root, "seed"), "seed", &r->seed)) < 0)
        return rc;
    r->has_seed = rc;
    if (read_int(err, member(root, "n"), "n", 1, OAI_MAX_N, &r->n) < 0 || parse_stop(r, root, err) < 0 ||
        parse_logit_bias(r, root, n_vocab, err) < 0 || parse_stream(r, root, err) < 0 ||
        oai_parse_lora(r, root, err) < 0)
        return -1;
    return 0;
}

/* ---- the endpoints ---- */

/* A function name as OpenAI allows it: 1 to 64 of [A-Za-z0-9_-]. */
static bool tool_name_ok(const char *n)
{
    size_t len = strlen(n);
    if (len == 0 || len > 64)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!((n[i] >= 'a' && n[i] <= 'z') || (n[i] >= 'A' && n[i] <= 'Z') || (n[i] >= '0' && n[i] <= '9') ||
              n[i] == '_' || n[i] == '-' || n[i] == '.'))
            return false;
    return true;
}

/* tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}];
 * tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name"}}. */
static int parse_tools(struct oai_request *r, const cJSON *root, struct oai_error *err)
{
    const cJSON *tools = member(root, "tools"), *t, *choice = member(root, "tool_choice");
    char param[64], q[QUOTE_MAX + 4];
    if (tools && !cJSON_IsArray(tools))
        return type_error(err, "tools", "an array");
    if (tools && count_children(tools, OAI_MAX_TOOLS + 1) > OAI_MAX_TOOLS)
        return bad(err, "tools", "'tools' must have at most %d entries", OAI_MAX_TOOLS);
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        snprintf(param, sizeof param, "tools[%d]", i);
        const cJSON *type = cJSON_IsObject(t) ? member(t, "type") : NULL;
        const cJSON *fn = cJSON_IsObject(t) ? member(t, "function") : NULL;
        const cJSON *name = cJSON_IsObject(fn) ? member(fn, "name") : NULL;
        const cJSON *desc = cJSON_IsObject(fn) ? member(fn, "description") : NULL;
        const cJSON *params = cJSON_IsObject(fn) ? member(fn, "parameters") : NULL;
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 ||
            !cJSON_IsObject(fn))
            return bad(err, param, "'%s' must be {\"type\": \"function\", \"function\": {...}}", param);
        snprintf(param, sizeof param, "tools[%d].function.name", i);
        if (!cJSON_IsString(name) || !tool_name_ok(name->valuestring))
            return bad(err, param, "'%s' must be 1 to 64 letters, digits, '_', '-' or '.'", param);
        if ((desc && !cJSON_IsString(desc)) || (params && !cJSON_IsObject(params))) {
            snprintf(param, sizeof param, "tools[%d].function", i);
            return bad(err, param, "'%s': description must be a string and parameters an object", param);
        }
        /* a call's arguments are an object (OpenAI: "schema must be a JSON Schema of 'type:
         * \"object\"'"; Anthropic's input_schema likewise): another type would force a call
         * whose arguments are a string or a number */
        const cJSON *ptype = params ? member(params, "type") : NULL;
        if (ptype && !(cJSON_IsString(ptype) && strcmp(ptype->valuestring, "object") == 0)) {
            snprintf(param, sizeof param, "tools[%d].function.parameters", i);
            return bad(err, param, "'%s' must be a schema of type 'object' (a call's arguments are an object)",
                       param);
        }
        i++;
    }
    r->tool_choice = OAI_TOOL_CHOICE_AUTO;
    if (choice && cJSON_IsString(choice)) {
        const char *c = choice->valuestring;
        if (strcmp(c, "none") == 0)
            r->tool_choice = OAI_TOOL_CHOICE_NONE;
        else if (strcmp(c, "required") == 0)
            r->tool_choice = OAI_TOOL_CHOICE_REQUIRED;
        else if (strcmp(c, "auto") != 0)
            return bad(err, "tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or a function (got '%s')",
                       quote(q, c));
    } else if (choice) {
        const cJSON *fn = cJSON_IsObject(choice) ? member(choice, "function") : NULL;
        const cJSON *name = cJSON_IsObject(fn) ? member(fn, "name") : NULL;
        if (!cJSON_IsString(name))
            return bad(err, "tool_choice", "'tool_choice' must be a string or {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}");
        r->tool_choice = OAI_TOOL_CHOICE_NAMED;
        if (!(r->tool_choice_name = copy_bytes(name->valuestring, strlen(name->valuestring))))
            return nomem(err);
    }
    if ((r->tool_choice == OAI_TOOL_CHOICE_REQUIRED || r->tool_choice == OAI_TOOL_CHOICE_NAMED) && i == 0)
        return bad(err, "tool_choice", "'tool_choice' asks for a tool call but 'tools' is empty");
    if (r->tool_choice == OAI_TOOL_CHOICE_NAMED) {
        bool found = false;
        cJSON_ArrayForEach(t, tools)
            found |= strcmp(member(member(t, "function"), "name")->valuestring, r->tool_choice_name) == 0;
        if (!found)
            return bad(err, "tool_choice", "'tool_choice' names '%s', which is not among 'tools'",
                       quote(q, r->tool_choice_name));
    }
    if (i > 0 && !(r->tools = cJSON_Duplicate(tools, true)))
        return nomem(err);
    return 0;
}

/* response_format: {"type": "text"} | {"type": "json_object"} |
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict"?}}. */
static int parse_format(struct oai_request *r, const cJSON *root, struct oai_error *err)
{
    const cJSON *f = member(root, "response_format");
    char q[QUOTE_MAX + 4];
    if (!f)
        return 0;
    const cJSON *type = cJSON_IsObject(f) ? member(f, "type") : NULL;
    if (!cJSON_IsString(type))
        return bad(err, "response_format", "'response_format' must be an object with a string 'type'");
    if (strcmp(type->valuestring, "text") == 0)
        return 0;
    if (strcmp(type->valuestring, "json_object") == 0) {
        r->format = OAI_FORMAT_JSON_OBJECT;
        return 0;
    }
    if (strcmp(type->valuestring, "json_schema") != 0)
        return bad(err, "response_format.type", "'response_format.type' must be 'text', 'json_object' or "
                   "'json_schema' (got '%s')", quote(q, type->valuestring));
    const cJSON *js = member(f, "json_schema"), *schema = cJSON_IsObject(js) ? member(js, "schema") : NULL;
    if (!cJSON_IsObject(js))
        return bad(err, "response_format.json_schema", "'response_format.json_schema' must be an object");
    if (schema && !cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return type_error(err, "response_format.json_schema.schema", "an object");
    r->format = OAI_FORMAT_JSON_SCHEMA;
    if (!(r->format_schema = schema ? cJSON_Duplicate(schema, true) : cJSON_CreateObject()))
        return nomem(err);
    return 0;
}

static int parse_chat(struct oai_request *r, const cJSON *root, struct oai_error *err)
{
    int rc;
    if (parse_messages(r, root, err) < 0)
        return -1;
    /* both names; max_completion_tokens (the newer) wins */
    if (read_int(err, member(root, "max_tokens"), "max_tokens", 1, OAI_MAX_TOKENS_VALUE, &r->max_tokens) < 0 ||
        read_int(err, member(root, "max_completion_tokens"), "max_completion_tokens", 1, OAI_MAX_TOKENS_VALUE,
                 &r->max_tokens) < 0)
        return -1;
    if (read_bool(err, member(root, "logprobs"), "logprobs", &r->logprobs) < 0)
        return -1;
    if ((rc = read_int(err, member(root, "top_logprobs"), "top_logprobs", 0, OAI_MAX_TOP_LOGPROBS,
                       &r->top_logprobs)) < 0)
        return rc;
    if (rc == 1 && !r->logprobs)
        return bad(err, "top_logprobs", "'top_logprobs' is only allowed when 'logprobs' is true");
    if (parse_tools(r, root, err) < 0 || parse_format(r, root, err) < 0)
        return -1;
    const cJSON *kw = member(root, "chat_template_kwargs");
    if (kw && !cJSON_IsObject(kw))
        return type_error(err, "chat_template_kwargs", "an object");
    if (kw && !(r->template_kwargs = cJSON_Duplicate(kw, true)))
        return nomem(err);
    return 0;
}

static int parse_completions(struct oai_request *r, const cJSON *root, int n_vocab, struct oai_error *err)
{
    int rc;
    if (parse_prompt(r, root, n_vocab, err) < 0)
        return -1;
    if (read_int(err, member(root, "max_tokens"), "max_tokens", 0, OAI_MAX_TOKENS_VALUE, &r->max_tokens) < 0 ||
        read_bool(err, member(root, "echo"), "echo", &r->echo) < 0)
        return -1;
    const cJSON *suffix = member(root, "suffix");
    if (suffix && !cJSON_IsString(suffix))
        return type_error(err, "suffix", "a string");
    if (suffix && suffix->valuestring[0])
        return bad(err, "suffix", "suffix is not supported");
    if ((rc = read_int(err, member(root, "logprobs"), "logprobs", 0, OAI_MAX_LOGPROBS, &r->top_logprobs)) < 0)
        return rc;
    r->logprobs = rc == 1;
    return 0;
}

void oai_request_init(struct oai_request *r)
{
    memset(r, 0, sizeof *r);
    r->max_tokens = -1;
    r->n = 1;
}

void oai_request_free(struct oai_request *r)
{
    free(r->model);
    cJSON_Delete(r->messages);
    for (int i = 0; i < r->n_images; i++) {
        free(r->images[i].data);
        free(r->images[i].url);
    }
    free(r->images);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->bias);
    cJSON_Delete(r->tools);
    free(r->tool_choice_name);
    cJSON_Delete(r->format_schema);
    cJSON_Delete(r->template_kwargs);
    enum oai_endpoint ep = r->endpoint;
    oai_request_init(r);
    r->endpoint = ep;
}

int oai_request_parse(struct oai_request *r, enum oai_endpoint ep, const char *body, size_t len, int n_vocab,
                      struct oai_error *err)
{
    oai_request_init(r);
    r->endpoint = ep;
    if (ep != OAI_CHAT && ep != OAI_COMPLETIONS)
        return oai_errorf(err, 500, "server_error", NULL, NULL, "unknown endpoint %d", (int)ep);
    cJSON *root = oai_parse_object(body, len, err);
    if (!root)
        return -1;
    int rc = oai_request_from_object(r, ep, root, n_vocab, err);
    cJSON_Delete(root);
    return rc;
}

int oai_request_from_object(struct oai_request *r, enum oai_endpoint ep, const cJSON *root, int n_vocab,
                            struct oai_error *err)
{
    oai_request_init(r);
    r->endpoint = ep;
    int rc = ep == OAI_CHAT ? parse_chat(r, root, err) : parse_completions(r, root, n_vocab, err);
    if (rc == 0)
        rc = parse_common(r, root, n_vocab, err);
    if (rc < 0) {
        oai_request_free(r);
        return -1;
    }
    return 0;
}
