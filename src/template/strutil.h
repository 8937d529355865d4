/*
 * strutil: Python str operations on UTF-8 for the template interpreter
 * (see strutil.c). Functions returning struct tstr * return NULL with the
 * render error set; int functions return 0 or a negative ERR_*.
 */
#pragma once
#include "tmpl_impl.h"

enum su_case { SU_LOWER, SU_UPPER, SU_CAPITALIZE, SU_PY_TITLE, SU_JINJA_TITLE };

int32_t su_decode(const char *s, size_t len, size_t i, size_t *next);
bool su_is_space(int32_t cp);
/* str.strip/lstrip/rstrip(chars); chars NULL = whitespace. */
struct tstr *su_strip(struct rctx *c, const struct tstr *s, const struct tstr *chars, bool left, bool right);
struct tstr *su_case(struct rctx *c, const struct tstr *s, enum su_case mode);
/* str.replace(old, new, count); count < 0 = all. */
struct tstr *su_replace(struct rctx *c, const struct tstr *s, const struct tstr *old,
                        const struct tstr *new_, int64_t count);
/* str.split / str.rsplit(sep, maxsplit); sep NULL = runs of whitespace. */
int su_split(struct rctx *c, const struct tstr *s, const struct tstr *sep, int64_t maxsplit, bool from_right,
             struct tlist **out);
int su_splitlines(struct rctx *c, const struct tstr *s, struct tlist **out);
int64_t su_cp_index(const struct tstr *s, size_t byte_off);  /* code points before byte_off */
