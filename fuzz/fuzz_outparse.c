/*
 * fuzz_outparse: libFuzzer target for the tool-call / reasoning splitter.
 * Byte 0 picks the options (bits 0-1 the format, bit 2 reasoning, bit 3
 * in_reasoning, bit 4 a tools list), byte 1 seeds the split points, the rest
 * is the model's output. It is parsed twice, fed whole and fed in random
 * pieces of 1..32 bytes, and must hold to:
 *  - the same events both ways (TEXT/REASONING deltas merged; ids too, the
 *    id seed being fixed);
 *  - REASONING events only before any TEXT or TOOL_CALL event;
 *  - nothing lost or invented but whitespace and the think tags: the input
 *    without whitespace equals, without whitespace, ["<think>"] + reasoning +
 *    ["</think>"] + the TEXT deltas and the raw blocks of the TOOL_CALL
 *    events in order, for some choice of the two optional tags;
 *  - every call has a known name (when tools are given), an id "call_" + 24
 *    alphanumerics and arguments that parse as a JSON object.
 * Any crash, leak or undefined behaviour is a bug.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/outparse.h"

struct out {
    char *reason, *rest, *full;   /* reasoning; text + raw blocks; everything, tagged */
    size_t nr, nrest, nfull, cap_r, cap_rest, cap_full;
    int last;                     /* kind of the previous event, -1 none */
    bool seen_content;
    const cJSON *tools;
};

static void put(char **b, size_t *n, size_t *cap, const char *s, size_t l)
{
    if (*n + l + 1 > *cap) {
        *cap = (*n + l + 1) * 2;
        if (!(*b = realloc(*b, *cap)))
            abort();
    }
    memcpy(*b + *n, s, l);
    *n += l;
    (*b)[*n] = 0;
}

static bool known(const cJSON *tools, const char *name)
{
    for (const cJSON *t = tools ? tools->child : NULL; t; t = t->next)
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name")->valuestring,
                    name))
            return true;
    return !tools;
}

static int on_event(void *ud, const struct outparse_event *ev)
{
    struct out *o = ud;
    if (ev->kind == OUTPARSE_REASONING) {
        if (o->seen_content || ev->len == 0)
            abort();
        put(&o->reason, &o->nr, &o->cap_r, ev->text, ev->len);
    } else if (ev->kind == OUTPARSE_TEXT) {
        if (ev->len == 0)
            abort();
        o->seen_content = true;
        put(&o->rest, &o->nrest, &o->cap_rest, ev->text, ev->len);
    } else {
        o->seen_content = true;
        put(&o->rest, &o->nrest, &o->cap_rest, ev->raw, ev->raw_len);
        if (!ev->name[0] || !known(o->tools, ev->name) || strlen(ev->id) != 29 || memcmp(ev->id, "call_", 5))
            abort();
        cJSON *a = cJSON_ParseWithLength(ev->text, ev->len);
        if (!cJSON_IsObject(a))
            abort();
        cJSON_Delete(a);
    }
    /* the merged record compared between the two runs */
    if (ev->kind == OUTPARSE_TOOL_CALL || (int)ev->kind != o->last) {
        char tag[2] = {"TRC"[ev->kind], 0};
        put(&o->full, &o->nfull, &o->cap_full, "\x01", 1);
        put(&o->full, &o->nfull, &o->cap_full, tag, 1);
    }
    if (ev->kind == OUTPARSE_TOOL_CALL) {
        put(&o->full, &o->nfull, &o->cap_full, ev->name, strlen(ev->name));
        put(&o->full, &o->nfull, &o->cap_full, "\x02", 1);
        put(&o->full, &o->nfull, &o->cap_full, ev->id, strlen(ev->id));
        put(&o->full, &o->nfull, &o->cap_full, "\x02", 1);
        put(&o->full, &o->nfull, &o->cap_full, ev->raw, ev->raw_len);
        put(&o->full, &o->nfull, &o->cap_full, "\x02", 1);
    }
    put(&o->full, &o->nfull, &o->cap_full, ev->text, ev->len);
    o->last = (int)ev->kind;
    return 0;
}

static void parse(const struct outparse_opts *opts, const uint8_t *d, size_t n, uint32_t seed, struct out *o)
{
    struct outparse *p = NULL;
    memset(o, 0, sizeof *o);
    o->last = -1;
    o->tools = opts->tools;
    if (outparse_new(&p, opts, NULL) < 0)
        abort();
    for (size_t at = 0; at < n;) {
        size_t c = n - at;
        if (seed) {
            seed = seed * 1103515245u + 12345u;
            size_t r = 1 + (seed >> 16) % 32;
            c = r < c ? r : c;
        }
        if (outparse_feed(p, (const char *)d + at, c, on_event, o) < 0)
            abort();
        at += c;
    }
    if (outparse_finish(p, on_event, o) < 0)
        abort();
    outparse_free(p);
}

static size_t strip_ws(char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r')
            s[o++] = s[i];
    return o;
}

/* in (stripped) == [<think>] + reason + [</think>] + rest (each stripped)? */
static bool accounts(const char *in, size_t n, struct out *o)
{
    size_t nr = strip_ws(o->reason ? o->reason : (char *)"", o->nr);
    size_t ns = strip_ws(o->rest ? o->rest : (char *)"", o->nrest);
    for (int open = 0; open < 2; open++) {
        for (int close = 0; close < 2; close++) {
            size_t at = 0;
            if (open && !(n >= 7 && !memcmp(in, "<think>", 7)))
                continue;
            at += open ? 7 : 0;
            if (n - at < nr || (nr && memcmp(in + at, o->reason, nr)))
                continue;
            at += nr;
            if (close && !(n - at >= 8 && !memcmp(in + at, "</think>", 8)))
                continue;
            at += close ? 8 : 0;
            if (n - at == ns && (!ns || !memcmp(in + at, o->rest, ns)))
                return true;
        }
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static cJSON *tools;
    if (!tools && !(tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\"}},"
                                        " {\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}},"
                                        " {\"type\": \"function\", \"function\": {\"name\": \"search\"}}]")))
        abort();
    if (size < 2)
        return 0;
    struct outparse_opts opts = {
        .format = (enum outparse_format)(data[0] & 3),
        .reasoning = data[0] & 4,
        .in_reasoning = data[0] & 8,
        .tools = data[0] & 16 ? tools : NULL,
        .id_seed = 7,
    };
    const uint8_t *d = data + 2;
    size_t n = size - 2;
    struct out whole, split;
    parse(&opts, d, n, 0, &whole);
    parse(&opts, d, n, 0x9E37u * data[1] + 1, &split);
    if (whole.nfull != split.nfull || (whole.nfull && memcmp(whole.full, split.full, whole.nfull)))
        abort();
    char *in = malloc(n + 1);
    if (!in)
        abort();
    memcpy(in, d, n);
    if (!accounts(in, strip_ws(in, n), &whole))
        abort();
    free(in);
    struct out *os[] = {&whole, &split};
    for (int i = 0; i < 2; i++) {
        free(os[i]->reason);
        free(os[i]->rest);
        free(os[i]->full);
    }
    return 0;
}
