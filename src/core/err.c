/*
 * err: formatting of error records (see err.h).
 */
#include "err.h"

#include <stdio.h>
#include <string.h>

int err_setf(struct err *e, int code, const char *fmt, ...)
{
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
        e->code = code;
    }
    return -code;
}

int err_prefix(struct err *e, const char *fmt, ...)
{
    if (!e)
        return -ERR_INTERNAL;
    char head[ERR_MSG_MAX];
    char old[ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    snprintf(e->msg, sizeof e->msg, "%s: %s", head, old);
    return -(e->code ? e->code : ERR_INTERNAL);
}

void err_clear(struct err *e)
{
    if (e) {
        e->code = ERR_OK;
        e->msg[0] = '\0';
    }
}

const char *err_code_name(int code)
{
    if (code < 0)
        code = -code;
    switch (code) {
    case ERR_OK: return "ok";
    case ERR_IO: return "io";
    case ERR_FORMAT: return "format";
    case ERR_CONFIG: return "config";
    case ERR_UNSUPPORTED: return "unsupported";
    case ERR_NOMEM: return "out of memory";
    case ERR_ARG: return "argument";
    case ERR_MISSING: return "missing";
    case ERR_RANGE: return "range";
    default: return "internal";
    }
}
