/*
 * outparse_stub: until src/server/outparse.c lands, no output is parsed (gen
 * never creates a parser, so these are never called). Deleted with its arrival.
 */
#include "outparse.h"

int outparse_feed(struct outparse *p, const char *text, size_t len, outparse_emit_fn emit, void *ud)
{
    (void)p;
    (void)text;
    (void)len;
    (void)emit;
    (void)ud;
    return -1;
}

int outparse_finish(struct outparse *p, outparse_emit_fn emit, void *ud)
{
    (void)p;
    (void)emit;
    (void)ud;
    return -1;
}

void outparse_free(struct outparse *p)
{
    (void)p;
}

enum outparse_format outparse_detect_format(const char *template_src)
{
    (void)template_src;
    return OUTPARSE_NONE;
}

bool outparse_detect_reasoning(const char *template_src)
{
    (void)template_src;
    return false;
}

int outparse_new(struct outparse **out, const struct outparse_opts *o, struct err *e)
{
    (void)o;
    *out = NULL;
    return err_setf(e, ERR_UNSUPPORTED, "output parsing is not built in");
}
