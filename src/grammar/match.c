/*
 * match: the byte-level pushdown automaton of a compiled grammar.
 *
 * A state is a set of at most GM_PAR stacks (one per live interpretation of
 * the anyOf alternatives met so far). A stack's bottom frame is the root
 * (prefix text, the document, suffix text); above it one frame per open
 * object, array, string, number or literal. Each frame is a fixed 24-byte
 * value, so stepping a state is copy-and-modify with no allocation, and two
 * stacks that reached the same frames are merged (memcmp).
 *
 * A byte goes to the top frame, which consumes it (OK), consumes it and
 * closes ('"', '}', ']': DONE), or closes without consuming it (a number or
 * literal ends at the first byte that cannot continue it: RETRY, the byte
 * then goes to the parent), or asks for a value of a schema node to start
 * with it (VALUE: for an alternative node, each concrete alternative that
 * can start with the byte becomes its own stack; extra stacks beyond GM_PAR
 * are dropped, which only narrows what is allowed).
 *
 * Choices that keep every prefix completable (the mask must never lead the
 * model into a dead end): ',' only when another key/item can follow, '}' and
 * ']' only when required keys and minItems are met, key bytes only on a path
 * to a key not seen yet, number digits only while some completion is within
 * the bounds. No whitespace is accepted anywhere (documents are compact).
 * Object keys in additionalProperties may not contain escapes (so a key can
 * never be a known key spelled differently).
 */
#include <math.h>
#include <string.h>

#include "grammar_impl.h"

enum { R_FAIL = 0, R_OK, R_DONE, R_RETRY, R_VALUE };
enum { P_PREFIX = 0, P_VALUE, P_INVAL, P_AFTER };                   /* root */
enum { O_START = 0, O_KEY, O_COLON, O_VALUE, O_INVAL, O_AFTER, O_COMMA }; /* object */
enum { A_START = 0, A_INVAL, A_AFTER, A_COMMA };                    /* array */
enum { C_OPEN = 0, C_NAME, C_INNAME, C_MID, C_ARGS, C_INARGS, C_CLOSE }; /* forced call */
enum { N_START = 0, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP }; /* number */
/* frame flags */
#define FL_KEY    1   /* string: an object key (node is the object's) */
#define FL_DEAD   2   /* key: no known key has these bytes */
#define FL_SUR    4   /* string: \u escape whose first hex digit is D */
#define FL_NZ     8   /* string: \u escape with a nonzero digit so far */
#define FL_NEG    16  /* number: negative */

static struct gframe *top(struct gstack *s) { return &s->f[s->depth - 1]; }

static void stack_copy(struct gstack *dst, const struct gstack *src)
{
    dst->depth = src->depth;
    memcpy(dst->f, src->f, src->depth * sizeof src->f[0]);
}

void gm_set_copy(struct gset *dst, const struct gset *src)
{
    dst->n = src->n;
    for (uint32_t i = 0; i < src->n; i++)
        stack_copy(&dst->s[i], &src->s[i]);
}

static bool push(struct gstack *s, struct gframe f)
{
    if (s->depth >= GM_DEPTH)
        return false;
    s->f[s->depth++] = f;
    return true;
}

/* ---- strings ---- */

static int hexval(uint8_t c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* A UTF-8 lead byte: how many continuation bytes follow and the range of the
 * first (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF). */
static bool utf8_lead(uint8_t c, uint8_t *pend, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        *pend = 1;
    else if (c >= 0xE0 && c <= 0xEF)
        *pend = 2;
    else if (c >= 0xF0 && c <= 0xF4)
        *pend = 3;
    else
        return false;
    if (c == 0xE0)
        *lo = 0xA0;
    else if (c == 0xED)
        *hi = 0x9F;
    else if (c == 0xF0)
        *lo = 0x90;
    else if (c == 0xF4)
        *hi = 0x8F;
    return true;
}

/* A known key's bytes (additionalProperties false): they follow the key trie,
 * only towards keys not seen yet. */
static int key_known_step(const struct grammar *g, struct gframe *f, uint8_t c)
{
    const struct gnode *nd = &g->node[f->node];
    const struct gtrie *t = &g->lit[nd->trie];
    if (c == '"') {
        const struct gtrie_node *tn = &t->node[f->b];
        if (!tn->n_term || (f->c >> t->order[tn->lo] & 1))
            return R_FAIL;
        f->b = t->order[tn->lo];
        return R_DONE;
    }
    int32_t ch = gtrie_child(t, f->b, c);
    if (ch < 0 || !(g->lit_mask[nd->trie][ch] & ~f->c))
        return R_FAIL;
    f->b = (uint32_t)ch;
    return R_OK;
}

/* The key is complete: which property it is (GM_ADDL for another). */
static int key_close(const struct grammar *g, struct gframe *f)
{
    const struct gtrie *t = &g->lit[g->node[f->node].trie];
    const struct gtrie_node *tn = &t->node[f->b];
    if (!(f->flags & FL_DEAD) && tn->n_term) {
        if (f->c >> t->order[tn->lo] & 1)
            return R_FAIL;  /* a duplicate key */
        f->b = t->order[tn->lo];
    } else {
        f->b = GM_ADDL;
    }
    return R_DONE;
}

static int str_step(const struct grammar *g, struct gframe *f, uint8_t c)
{
    bool key = f->flags & FL_KEY;
    const struct gnode *nd = &g->node[f->node];
    if (key && nd->addl < 0)
        return key_known_step(g, f, c);
    uint32_t max_n = key ? UINT32_MAX : nd->max_n;
    if (key && !(f->flags & FL_DEAD) && !(c == '"' && f->phase == 0 && !f->pend)) {
        int32_t ch = gtrie_child(&g->lit[nd->trie], f->b, c);
        if (ch < 0)
            f->flags |= FL_DEAD;
        else
            f->b = (uint32_t)ch;
    }
    if (f->pend) {
        if (c < f->u8lo || c > f->u8hi)
            return R_FAIL;
        f->pend--;
        f->u8lo = 0x80;
        f->u8hi = 0xBF;
        return R_OK;
    }
    if (f->phase == 1) {
        if (c == 'u') {
            f->phase = 2;
            f->flags &= (uint8_t)~(FL_SUR | FL_NZ);
            return R_OK;
        }
        if (!strchr("\"\\/bfnrt", c) || c == 0)
            return R_FAIL;
        f->phase = 0;
        return R_OK;
    }
    if (f->phase >= 2) {  /* \uXXXX: no surrogates (lone ones break parsers), no \u0000 */
        int v = hexval(c);
        if (v < 0 || (f->phase == 3 && (f->flags & FL_SUR) && v >= 8) ||
            (f->phase == 5 && !(f->flags & FL_NZ) && v == 0))
            return R_FAIL;
        if (f->phase == 2 && v == 0xD)
            f->flags |= FL_SUR;
        if (v)
            f->flags |= FL_NZ;
        f->phase = f->phase == 5 ? 0 : f->phase + 1;
        return R_OK;
    }
    if (c == '"') {
        if (key)
            return key_close(g, f);
        return f->a >= nd->min_n ? R_DONE : R_FAIL;
    }
    if (c < 0x20 || f->a >= max_n || (key && c == '\\'))
        return R_FAIL;
    if (c == '\\') {
        f->phase = 1;
    } else if (c >= 0x80 && !utf8_lead(c, &f->pend, &f->u8lo, &f->u8hi)) {
        return R_FAIL;
    }
    f->a++;
    return R_OK;
}

/* ---- numbers ---- */


/* ---- bounded numbers: exact feasibility ----
 *
 * A bounded number is written without exponent in at most GM_NUM_SIG_MAX
 * digits (GM_INT_SIG_MAX for integers), so the numbers a state can still
 * become are a finite set: the digits so far (mantissa c, a integer and b
 * fraction digits) followed by j more integer digits and fraction digits up
 * to F in all. A digit is allowed only when that set meets the bounds, so
 * the mask never leads into a number that cannot end. "Meets" is decided as
 * a validator decides it: integers exactly in int64 (their bounds are exact,
 * schema.c), other numbers as the double a parser reads (N / 10^F with
 * N < 2^53 is correctly rounded, as strtod of the same digits is, and
 * monotone in N, so the least N past the lower bound is found by search). */

static const int64_t k_p10[] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000,
                                1000000000, 10000000000, 100000000000, 1000000000000,
                                10000000000000, 100000000000000, 1000000000000000,
                                10000000000000000, 100000000000000000, 1000000000000000000};

/* A number's magnitude bounds: a negative number's magnitude lies in -hi .. -lo. */
struct mag {
    double lo, hi;
    bool los, his;
    int64_t ilo, ihi;  /* integers, inclusive */
};

static struct mag mag_of(const struct gnode *nd, bool neg)
{
    struct mag m = {neg ? -nd->hi : nd->lo, neg ? -nd->lo : nd->hi, neg ? nd->hi_strict : nd->lo_strict,
                    neg ? nd->lo_strict : nd->hi_strict, neg ? -nd->ihi : nd->ilo, neg ? -nd->ilo : nd->ihi};
    return m;
}

static bool mag_lo_ok(const struct mag *m, double v) { return m->los ? v > m->lo : v >= m->lo; }
static bool mag_hi_ok(const struct mag *m, double v) { return m->his ? v < m->hi : v <= m->hi; }

/* Whether some N in [nmin, nmax] (< 2^53) has N / 10^F within m. */
static bool grid_meets(const struct mag *m, int64_t nmin, int64_t nmax, int F)
{
    double s = (double)k_p10[F];
    if (!mag_lo_ok(m, (double)nmin / s)) {
        /* the least N whose value passes the lower bound: a guess, checked, else bisection */
        double g = ceil(m->lo * s);
        if (!(g <= (double)nmax))
            return false;
        int64_t n = g > (double)nmin ? (int64_t)g : nmin + 1;
        if (!(mag_lo_ok(m, (double)n / s) && !mag_lo_ok(m, (double)(n - 1) / s))) {
            int64_t lo = nmin, hi = nmax;  /* lo fails, hi unknown */
            if (!mag_lo_ok(m, (double)hi / s))
                return false;
            while (hi - lo > 1) {
                int64_t mid = lo + (hi - lo) / 2;
                if (mag_lo_ok(m, (double)mid / s))
                    hi = mid;
                else
                    lo = mid;
            }
            n = hi;
        }
        nmin = n;
    }
    return nmin <= nmax && mag_hi_ok(m, (double)nmin / s);
}

/* Whether a number with mantissa c (a integer digits; frac: a '.' was written, b fraction
 * digits after it) followed by j_min .. j_max more integer digits can end within nd's
 * bounds. */
static bool can_reach(const struct gnode *nd, bool neg, int64_t c, int a, bool frac, int b, int j_min,
                      int j_max)
{
    struct mag m = mag_of(nd, neg);
    int sig = nd->integer ? GM_INT_SIG_MAX : GM_NUM_SIG_MAX;
    for (int j = j_min; j <= j_max && a + j <= sig; j++) {
        if (nd->integer) {  /* N in [c 10^j, (c+1) 10^j - 1] against [ilo, ihi], exactly */
            int64_t nmin = c * k_p10[j], nmax = (c + 1) * k_p10[j] - 1;
            if (nmin <= m.ihi && nmax >= m.ilo)
                return true;
            continue;
        }
        int F = sig - a - j;  /* the finest grid: it holds every coarser one */
        if (frac && F < (b > 1 ? b : 1))
            continue;
        int k = j + F - b;
        if (grid_meets(&m, c * k_p10[k], (c + 1) * k_p10[k] - 1, F))
            return true;
    }
    return false;
}

/* Whether the number so far can still end within the bounds. */
static bool num_feasible(const struct gnode *nd, const struct gframe *f)
{
    bool neg = f->flags & FL_NEG;
    int sig = nd->integer ? GM_INT_SIG_MAX : GM_NUM_SIG_MAX;
    if (!nd->bounded)
        return true;
    switch (f->phase) {
    case N_MINUS:
        return can_reach(nd, neg, 0, 0, false, 0, 1, sig);
    case N_ZERO:
        return can_reach(nd, neg, 0, 1, false, 0, 0, 0);
    case N_INT:
        return can_reach(nd, neg, (int64_t)f->c, (int)f->a, false, 0, 0, sig);
    case N_DOT:
    case N_FRAC:
        return can_reach(nd, neg, (int64_t)f->c, (int)f->a, true, (int)f->b, 0, 0);
    default:
        return true;
    }
}

bool gm_num_satisfiable(const struct gnode *nd)
{
    int sig = nd->integer ? GM_INT_SIG_MAX : GM_NUM_SIG_MAX;
    return !nd->bounded || can_reach(nd, false, 0, 0, false, 0, 1, sig) ||
           can_reach(nd, true, 0, 0, false, 0, 1, sig);
}

/* The number is complete here: its value within the bounds. */
static bool num_end_ok(const struct gnode *nd, const struct gframe *f)
{
    if (f->phase != N_ZERO && f->phase != N_INT && f->phase != N_FRAC && f->phase != N_EXP)
        return false;
    if (!nd->bounded)
        return true;
    struct mag m = mag_of(nd, f->flags & FL_NEG);
    if (nd->integer)
        return (int64_t)f->c >= m.ilo && (int64_t)f->c <= m.ihi;
    double v = (double)f->c / (double)k_p10[f->b];
    return mag_lo_ok(&m, v) && mag_hi_ok(&m, v);
}

static int num_digit(const struct gnode *nd, struct gframe *f, int d)
{
    if (nd->bounded && f->a + f->b > (nd->integer ? GM_INT_SIG_MAX : GM_NUM_SIG_MAX))
        return R_FAIL;
    f->c = f->c * 10 + (uint64_t)d;
    return num_feasible(nd, f) ? R_OK : R_FAIL;
}

static int num_step(const struct grammar *g, struct gframe *f, uint8_t c)
{
    const struct gnode *nd = &g->node[f->node];
    bool digit = c >= '0' && c <= '9';
    bool exp_ok = !nd->integer && !nd->bounded;
    switch (f->phase) {
    case N_START:
        if (c == '-') {
            f->flags |= FL_NEG;
            f->phase = N_MINUS;
            return num_feasible(nd, f) ? R_OK : R_FAIL;
        }
        /* fall through */
    case N_MINUS:
        if (!digit)
            return R_FAIL;
        f->phase = c == '0' ? N_ZERO : N_INT;
        f->a = 1;
        f->c = 0;
        return num_digit(nd, f, c - '0');
    case N_INT:
        if (digit) {
            if (f->a >= GM_NUM_INT_MAX)
                return R_FAIL;
            f->a++;
            return num_digit(nd, f, c - '0');
        }
        /* fall through */
    case N_ZERO:
        if (c == '.' && !nd->integer && !(nd->bounded && f->a >= GM_NUM_SIG_MAX)) {
            f->phase = N_DOT;
            return num_feasible(nd, f) ? R_OK : R_FAIL;
        }
        if ((c == 'e' || c == 'E') && exp_ok) {
            f->phase = N_E;
            return R_OK;
        }
        return num_end_ok(nd, f) ? R_RETRY : R_FAIL;
    case N_DOT:
    case N_FRAC:
        if (digit) {
            if (f->b >= GM_NUM_FRAC_MAX)
                return R_FAIL;
            f->phase = N_FRAC;
            f->b++;
            return num_digit(nd, f, c - '0');
        }
        if (f->phase == N_DOT)
            return R_FAIL;
        if ((c == 'e' || c == 'E') && exp_ok) {
            f->phase = N_E;
            return R_OK;
        }
        return num_end_ok(nd, f) ? R_RETRY : R_FAIL;
    case N_E:
        if (c == '+' || c == '-') {
            f->phase = N_ESIGN;
            return R_OK;
        }
        /* fall through */
    case N_ESIGN:
        if (!digit)
            return R_FAIL;
        f->phase = N_EXP;
        f->pend = 1;
        return R_OK;
    case N_EXP:
        if (digit) {
            if (f->pend >= GM_NUM_EXP_MAX)
                return R_FAIL;
            f->pend++;
            return R_OK;
        }
        return R_RETRY;
    }
    return R_FAIL;
}

/* ---- literals ---- */

static int lit_step(const struct grammar *g, struct gframe *f, uint8_t c)
{
    const struct gtrie *t = &g->lit[g->node[f->node].trie];
    int32_t ch = gtrie_child(t, f->a, c);
    if (ch >= 0) {
        f->a = (uint32_t)ch;
        return R_OK;
    }
    return t->node[f->a].n_term ? R_RETRY : R_FAIL;
}

/* ---- objects and arrays ---- */

static bool can_key(const struct grammar *g, const struct gframe *f)
{
    const struct gnode *nd = &g->node[f->node];
    return nd->addl >= 0 || (g->lit_mask[nd->trie][0] & ~f->c);
}

static int start_key(const struct grammar *g, struct gstack *s, struct gframe *f)
{
    if (!can_key(g, f))
        return R_FAIL;
    struct gframe k = {.node = f->node, .kind = GF_STR, .flags = FL_KEY, .u8lo = 0x80, .u8hi = 0xBF,
                       .c = f->c};
    f->phase = O_KEY;
    return push(s, k) ? R_OK : R_FAIL;
}

static int obj_step(const struct grammar *g, struct gstack *s, uint8_t c, uint32_t *vn)
{
    struct gframe *f = top(s);
    const struct gnode *nd = &g->node[f->node];
    switch (f->phase) {
    case O_START:
    case O_COMMA:
        if (c == '"')
            return start_key(g, s, f);
        if (c == '}' && f->phase == O_START && !nd->req_mask)
            return R_DONE;
        return R_FAIL;
    case O_COLON:
        if (c != ':')
            return R_FAIL;
        f->phase = O_VALUE;
        return R_OK;
    case O_VALUE:
        f->phase = O_INVAL;
        *vn = f->b == GM_ADDL ? (uint32_t)nd->addl : g->prop[nd->prop0 + f->b].node;
        return R_VALUE;
    case O_AFTER:
        if (c == ',' && can_key(g, f)) {
            f->phase = O_COMMA;
            return R_OK;
        }
        return c == '}' && !(nd->req_mask & ~f->c) ? R_DONE : R_FAIL;
    }
    return R_FAIL;
}

static int arr_step(const struct grammar *g, struct gframe *f, uint8_t c, uint32_t *vn)
{
    const struct gnode *nd = &g->node[f->node];
    switch (f->phase) {
    case A_START:
        if (c == ']')
            return nd->min_n == 0 ? R_DONE : R_FAIL;
        if (nd->max_n == 0)
            return R_FAIL;
        /* fall through */
    case A_COMMA:
        f->phase = A_INVAL;
        *vn = f->a < nd->n_pre ? g->list[nd->pre0 + f->a] : (uint32_t)nd->items;
        return R_VALUE;
    case A_AFTER:
        if (c == ',' && f->a < nd->max_n) {
            f->phase = A_COMMA;
            return R_OK;
        }
        return c == ']' && f->a >= nd->min_n ? R_DONE : R_FAIL;
    }
    return R_FAIL;
}

/* A forced call: the text {"name": (a: bytes of it written), the name, the text
 * ,"arguments": (a again), the arguments of the name written (b: its index), '}'. */
static const char k_call_open[] = "{\"name\":";

static int call_step(const struct grammar *g, struct gframe *f, uint8_t c, uint32_t *vn)
{
    const struct gnode *nd = &g->node[f->node];
    switch (f->phase) {
    case C_OPEN:
        if (c != (uint8_t)k_call_open[f->a])
            return R_FAIL;
        if (++f->a == sizeof k_call_open - 1)
            f->phase = C_NAME;
        return R_OK;
    case C_NAME:
        f->phase = C_INNAME;
        *vn = (uint32_t)nd->items;
        return R_VALUE;
    case C_MID:
        if (c != (uint8_t)g->call_mid[f->a])
            return R_FAIL;
        if (++f->a == g->call_mid_len)
            f->phase = C_ARGS;
        return R_OK;
    case C_ARGS:
        f->phase = C_INARGS;
        *vn = g->list[nd->alt0 + f->b];
        return R_VALUE;
    case C_CLOSE:
        return c == '}' ? R_DONE : R_FAIL;
    }
    return R_FAIL;
}

/* The frame above f (now popped as child) has finished its value. */
static void child_done(const struct grammar *g, struct gstack *s, const struct gframe *child)
{
    struct gframe *p = top(s);
    switch (p->kind) {
    case GF_ROOT:
        p->phase = P_AFTER;
        p->a = 0;
        break;
    case GF_OBJ:
        if (p->phase == O_KEY) {
            p->b = child->b;
            if (child->b != GM_ADDL)
                p->c |= (uint64_t)1 << child->b;
            p->phase = O_COLON;
        } else {
            p->phase = O_AFTER;
        }
        break;
    case GF_ARR:
        p->a++;
        p->phase = A_AFTER;
        break;
    case GF_CALL:
        if (p->phase == C_INNAME) {  /* the name written: which function's arguments follow */
            const struct gtrie *t = &g->lit[g->node[child->node].trie];
            p->b = t->order[t->node[child->a].lo];
            p->a = 0;
            p->phase = C_MID;
        } else {
            p->phase = C_CLOSE;
        }
        break;
    }
}

/* ---- stepping a set ---- */

/* Adds out->s[out->n] (just built) to the set unless an equal stack is there. */
static void commit(struct gset *out, bool lit_byte, bool *lit)
{
    const struct gstack *w = &out->s[out->n];
    *lit = *lit && lit_byte;
    for (uint32_t i = 0; i < out->n; i++)
        if (out->s[i].depth == w->depth && !memcmp(out->s[i].f, w->f, w->depth * sizeof w->f[0]))
            return;
    out->n++;
}

/* Opens a value of concrete node k with byte c on s. */
static bool start_one(const struct grammar *g, struct gstack *s, uint32_t k, uint8_t c)
{
    const struct gnode *nd = &g->node[k];
    struct gframe f = {.node = (uint16_t)k, .u8lo = 0x80, .u8hi = 0xBF};
    switch (nd->kind) {
    case GN_OBJECT:
        f.kind = GF_OBJ;
        return c == '{' && push(s, f);
    case GN_ARRAY:
        f.kind = GF_ARR;
        return c == '[' && push(s, f);
    case GN_STRING:
        f.kind = GF_STR;
        return c == '"' && push(s, f);
    case GN_NUMBER:
        f.kind = GF_NUM;
        return (c == '-' || (c >= '0' && c <= '9')) && push(s, f) && num_step(g, top(s), c) == R_OK;
    case GN_LITERAL:
        f.kind = GF_LIT;
        return push(s, f) && lit_step(g, top(s), c) == R_OK;
    case GN_CALL:
        f.kind = GF_CALL;
        return push(s, f) && call_step(g, top(s), c, NULL) == R_OK;
    }
    return false;
}

/* Every way a value of node k can start with c, each a stack added to out
 * (s is out's next slot, holding the state before the value). */
static void start_value(const struct grammar *g, struct gset *out, uint32_t k, uint8_t c, bool *lit)
{
    const struct gnode *nd = &g->node[k];
    if (nd->kind != GN_ALT) {
        if (start_one(g, &out->s[out->n], k, c))
            commit(out, false, lit);
        return;
    }
    struct gstack base;
    stack_copy(&base, &out->s[out->n]);
    for (uint32_t i = 0; i < nd->n_alt && out->n < GM_PAR; i++) {
        struct gstack *w = &out->s[out->n];
        if (i > 0)
            stack_copy(w, &base);
        if (start_one(g, w, g->list[nd->alt0 + i], c))
            commit(out, false, lit);
    }
}

static int root_step(const struct grammar *g, struct gframe *f, uint8_t c, uint32_t *vn, bool *lit_byte)
{
    switch (f->phase) {
    case P_PREFIX:
        if (c != (uint8_t)g->prefix[f->a])
            return R_FAIL;
        if (++f->a == g->prefix_len)
            f->phase = P_VALUE;
        *lit_byte = true;
        return R_OK;
    case P_VALUE:
        f->phase = P_INVAL;
        *vn = g->root;
        return R_VALUE;
    case P_AFTER:
        if (f->a >= g->suffix_len || c != (uint8_t)g->suffix[f->a])
            return R_FAIL;
        f->a++;
        *lit_byte = true;
        return R_OK;
    }
    return R_FAIL;
}

/* Steps one stack by c, adding what it becomes to out. */
static void step_one(const struct grammar *g, const struct gstack *in, uint8_t c, struct gset *out,
                     bool *lit)
{
    if (out->n >= GM_PAR)
        return;
    struct gstack *w = &out->s[out->n];
    stack_copy(w, in);
    for (;;) {
        struct gframe *f = top(w);
        uint32_t vn = 0;
        bool lit_byte = false;
        int r = R_FAIL;
        switch (f->kind) {
        case GF_ROOT: r = root_step(g, f, c, &vn, &lit_byte); break;
        case GF_OBJ: r = obj_step(g, w, c, &vn); break;
        case GF_ARR: r = arr_step(g, f, c, &vn); break;
        case GF_STR: r = str_step(g, f, c); break;
        case GF_NUM: r = num_step(g, f, c); break;
        case GF_LIT: r = lit_step(g, f, c); break;
        case GF_CALL: r = call_step(g, f, c, &vn); break;
        }
        if (r == R_FAIL)
            return;
        if (r == R_OK) {
            commit(out, lit_byte, lit);
            return;
        }
        if (r == R_VALUE) {
            start_value(g, out, vn, c, lit);
            return;
        }
        struct gframe child = *f;
        w->depth--;
        child_done(g, w, &child);
        if (r == R_DONE) {
            commit(out, false, lit);
            return;
        }
    }
}

void gm_start(const struct grammar *g, struct gset *out)
{
    out->n = 1;
    out->s[0].depth = 1;
    out->s[0].f[0] = (struct gframe){.node = g->root, .kind = GF_ROOT,
                                     .phase = g->prefix_len ? P_PREFIX : P_VALUE};
}

bool gm_step(const struct grammar *g, const struct gset *in, uint8_t c, struct gset *out, bool *lit)
{
    out->n = 0;
    *lit = true;
    for (uint32_t i = 0; i < in->n; i++)
        step_one(g, &in->s[i], c, out, lit);
    return out->n > 0;
}

bool gm_complete(const struct grammar *g, const struct gset *s)
{
    for (uint32_t i = 0; i < s->n; i++) {
        struct gstack w;
        stack_copy(&w, &s->s[i]);
        for (;;) {
            struct gframe *f = top(&w);
            bool ends = (f->kind == GF_NUM && num_end_ok(&g->node[f->node], f)) ||
                        (f->kind == GF_LIT && g->lit[g->node[f->node].trie].node[f->a].n_term);
            if (!ends)
                break;
            struct gframe child = *f;
            w.depth--;
            child_done(g, &w, &child);
        }
        const struct gframe *r = top(&w);
        if (r->kind == GF_ROOT && r->phase == P_AFTER && r->a == g->suffix_len)
            return true;
    }
    return false;
}

int64_t gm_plain_room(const struct grammar *g, const struct gset *s)
{
    int64_t room = INT64_MAX;
    for (uint32_t i = 0; i < s->n; i++) {
        const struct gframe *f = &s->s[i].f[s->s[i].depth - 1];
        const struct gnode *nd = &g->node[f->node];
        if (f->kind != GF_STR || f->phase || f->pend)
            return -1;
        /* a free key (no known key to track) is plain text as well */
        if ((f->flags & FL_KEY) && (nd->addl < 0 || (!(f->flags & FL_DEAD) && nd->n_props)))
            return -1;
        int64_t r = (f->flags & FL_KEY) ? INT64_MAX : (int64_t)nd->max_n - f->a;
        room = r < room ? r : room;
    }
    return room;
}
