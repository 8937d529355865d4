/*
 * err: the one error type of mlxcel.
 *
 * Every fallible function returns 0 on success or a negative error code
 * (-ERR_*) and, on failure, fills a caller-supplied struct err with a
 * message that says what failed, where, and expected versus actual.
 * err_setf() returns the negative code so callers can write
 *     return err_setf(e, ERR_FORMAT, "tensor '%s': ...", name);
 * A NULL err pointer is allowed: the message is then dropped.
 */
#pragma once
#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

enum err_code {
    ERR_OK          = 0,
    ERR_IO          = 1,  /* open/read/mmap failed */
    ERR_FORMAT      = 2,  /* malformed file contents (safetensors, JSON, ...) */
    ERR_CONFIG      = 3,  /* config.json missing a field or holding a bad value */
    ERR_UNSUPPORTED = 4,  /* valid input we do not handle (model_type, dtype) */
    ERR_NOMEM       = 5,
    ERR_ARG         = 6,  /* bad argument from the user (CLI flag, request) */
    ERR_MISSING     = 7,  /* a required tensor or file is absent */
    ERR_RANGE       = 8,  /* value out of range (context overflow, token id) */
    ERR_INTERNAL    = 9,
};

#define ERR_MSG_MAX 512

struct err {
    int  code;              /* enum err_code, ERR_OK when clear */
    char msg[ERR_MSG_MAX];  /* human-readable, no trailing newline */
};

/* Record an error; returns -code. e may be NULL. */
int err_setf(struct err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix the existing message with more context ("loading X: <old>"). */
int err_prefix(struct err *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void err_clear(struct err *e);

/* Short name of a code, e.g. "format". */
const char *err_code_name(int code);

#ifdef __cplusplus
}
#endif
