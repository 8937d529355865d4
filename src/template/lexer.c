/*
 * lexer: template text -> tokens, with jinja2's whitespace rules as
 * transformers configures them (trim_blocks, lstrip_blocks).
 *
 * The source is first normalized as jinja2 does: "\r\n" and "\r" become
 * "\n" and one trailing newline is dropped (keep_trailing_newline=False).
 * Then text runs alternate with tags. Comments vanish here; whitespace
 * control is applied here, so the parser sees final TEXT tokens:
 *   {%- / {{- / {#-   strip all whitespace before the tag
 *   -%} / -}} / -#}   strip all whitespace after it
 *   lstrip_blocks     spaces/tabs between a line start and {% or {# go
 *                     (not before {{, and not for {%+)
 *   trim_blocks       one newline right after %} or #} goes (not after +%})
 * `{% raw %}...{% endraw %}` becomes one TEXT token. Inside tags, `}}`/`%}`
 * close the tag only outside braces, as in jinja2.
 */
#include <stdlib.h>
#include <string.h>

#include "tmpl_impl.h"

struct lexer {
    struct arena *ar;
    const char *s;      /* normalized source */
    size_t n, pos;
    int line;
    struct token *t;
    size_t nt, cap;
    struct err *e;
};

static bool is_ws(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

static int lex_fail(struct lexer *L, int line, const char *msg)
{
    return err_setf(L->e, ERR_FORMAT, "template line %d: %s", line, msg);
}

static struct tstr *ar_tstr(struct arena *ar, const char *s, size_t n)
{
    struct tstr *t = ar_alloc(ar, sizeof *t + n + 1);
    if (!t)
        return NULL;
    t->len = n;
    if (n)
        memcpy(t->s, s, n);
    t->s[n] = 0;
    return t;
}

static struct token *push(struct lexer *L, int type, int line)
{
    if (L->nt == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        struct token *v = ar_alloc(L->ar, nc * sizeof *v);
        if (!v)
            return NULL;
        if (L->nt)
            memcpy(v, L->t, L->nt * sizeof *v);
        L->t = v;
        L->cap = nc;
    }
    struct token *t = &L->t[L->nt++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = line;
    return t;
}

static int count_lines(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '\n';
    return k;
}

/* Emit text s[a..b) after the whitespace rules for the tag that follows. */
static int emit_text(struct lexer *L, size_t a, size_t b, char sign, bool lstrip_ok)
{
    int line = L->line;
    L->line += count_lines(L->s + a, b - a);
    if (sign == '-') {
        while (b > a && is_ws(L->s[b - 1]))
            b--;
    } else if (sign != '+' && lstrip_ok) {
        size_t l = b;
        while (l > a && L->s[l - 1] != '\n')
            l--;
        bool line_start = l > a || a == 0 || L->s[a - 1] == '\n';
        bool blank = true;
        for (size_t i = l; i < b; i++)
            if (!is_ws(L->s[i]))
                blank = false;
        if (line_start && blank)
            b = l;
    }
    if (b == a)
        return 0;
    struct token *t = push(L, TK_TEXT, line);
    if (!t || !(t->s = ar_tstr(L->ar, L->s + a, b - a)))
        return err_setf(L->e, ERR_NOMEM, "template: out of memory");
    return 0;
}

/* After a closing tag at L->pos: '-' strips all whitespace, trim_blocks one newline. */
static void after_close(struct lexer *L, char sign, bool trim)
{
    if (sign == '-') {
        while (L->pos < L->n && is_ws(L->s[L->pos])) {
            L->line += L->s[L->pos] == '\n';
            L->pos++;
        }
    } else if (sign != '+' && trim && L->pos < L->n && L->s[L->pos] == '\n') {
        L->line++;
        L->pos++;
    }
}

static int unescape(struct lexer *L, const char *s, size_t n, struct tstr **out)
{
    struct tstr *t = ar_alloc(L->ar, sizeof *t + n + 1);
    if (!t)
        return err_setf(L->e, ERR_NOMEM, "template: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch != '\\' || i + 1 >= n) {
            t->s[o++] = ch;
            continue;
        }
        char x = s[++i];
        unsigned long cp = 0;
        int hex = 0;
        switch (x) {
        case 'n': t->s[o++] = '\n'; break;
        case 't': t->s[o++] = '\t'; break;
        case 'r': t->s[o++] = '\r'; break;
        case 'a': t->s[o++] = '\a'; break;
        case 'b': t->s[o++] = '\b'; break;
        case 'f': t->s[o++] = '\f'; break;
        case 'v': t->s[o++] = '\v'; break;
        case '\\': case '\'': case '"': t->s[o++] = x; break;
        case '\n': break;
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        default:
            if (x >= '0' && x <= '7') {
                int k = 0;
                while (k < 3 && i < n && s[i] >= '0' && s[i] <= '7')
                    cp = cp * 8 + (unsigned long)(s[i++] - '0'), k++;
                i--;
                hex = -1;
            } else {
                t->s[o++] = '\\';
                t->s[o++] = x;
            }
        }
        if (hex > 0) {
            if (i + (size_t)hex >= n)
                return lex_fail(L, L->line, "truncated \\x/\\u escape in a string");
            for (int k = 0; k < hex; k++) {
                char h = s[i + 1 + (size_t)k];
                int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (d < 0)
                    return lex_fail(L, L->line, "bad hex digit in a string escape");
                cp = cp * 16 + (unsigned long)d;
            }
            i += (size_t)hex;
        }
        if (hex) {
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                return lex_fail(L, L->line, "string escape is not a valid code point");
            unsigned char *u = (unsigned char *)t->s + o;
            if (cp < 0x80) {
                u[0] = (unsigned char)cp, o += 1;
            } else if (cp < 0x800) {
                u[0] = (unsigned char)(0xC0 | cp >> 6), u[1] = (unsigned char)(0x80 | (cp & 63)), o += 2;
            } else if (cp < 0x10000) {
                u[0] = (unsigned char)(0xE0 | cp >> 12), u[1] = (unsigned char)(0x80 | (cp >> 6 & 63));
                u[2] = (unsigned char)(0x80 | (cp & 63)), o += 3;
            } else {
                u[0] = (unsigned char)(0xF0 | cp >> 18), u[1] = (unsigned char)(0x80 | (cp >> 12 & 63));
                u[2] = (unsigned char)(0x80 | (cp >> 6 & 63)), u[3] = (unsigned char)(0x80 | (cp & 63));
                o += 4;
            }
        }
    }
    t->s[o] = 0;
    t->len = o;
    *out = t;
    return 0;
}

static const struct { const char *s; int op; } k_ops[] = {
    {"==", OP_EQ}, {"!=", OP_NE}, {">=", OP_GE}, {"<=", OP_LE}, {"//", OP_FLOORDIV},
    {"**", OP_POW}, {"+", OP_ADD}, {"-", OP_SUB}, {"*", OP_MUL}, {"/", OP_DIV}, {"%", OP_MOD},
    {"~", OP_TILDE}, {"[", OP_LBRACKET}, {"]", OP_RBRACKET}, {"(", OP_LPAREN},
    {")", OP_RPAREN}, {"{", OP_LBRACE}, {"}", OP_RBRACE}, {",", OP_COMMA}, {".", OP_DOT},
    {":", OP_COLON}, {"|", OP_PIPE}, {"=", OP_ASSIGN}, {"<", OP_LT}, {">", OP_GT},
    {";", OP_SEMI},
};

static int lex_number(struct lexer *L)
{
    const char *s = L->s;
    size_t p = L->pos, q = p;
    char buf[128];
    size_t nb = 0;
    bool is_float = false;
    while (q < L->n && ((s[q] >= '0' && s[q] <= '9') || (s[q] == '_' && q + 1 < L->n && s[q + 1] >= '0' && s[q + 1] <= '9'))) {
        if (s[q] != '_' && nb < sizeof buf - 1)
            buf[nb++] = s[q];
        q++;
    }
    if (q + 1 < L->n && s[q] == '.' && s[q + 1] >= '0' && s[q + 1] <= '9' && (p == 0 || s[p - 1] != '.')) {
        is_float = true;
        buf[nb++] = s[q++];
        while (q < L->n && ((s[q] >= '0' && s[q] <= '9') || s[q] == '_')) {
            if (s[q] != '_' && nb < sizeof buf - 1)
                buf[nb++] = s[q];
            q++;
        }
    }
    if (q < L->n && (s[q] == 'e' || s[q] == 'E')) {
        size_t r = q + 1;
        if (r < L->n && (s[r] == '+' || s[r] == '-'))
            r++;
        if (r < L->n && s[r] >= '0' && s[r] <= '9') {
            is_float = true;
            while (q < r && nb < sizeof buf - 1)
                buf[nb++] = s[q++];
            while (q < L->n && s[q] >= '0' && s[q] <= '9') {
                if (nb < sizeof buf - 1)
                    buf[nb++] = s[q];
                q++;
            }
        }
    }
    if (nb >= sizeof buf - 1)
        return lex_fail(L, L->line, "number literal too long");
    buf[nb] = 0;
    struct token *t = push(L, is_float ? TK_FLOAT : TK_INT, L->line);
    if (!t)
        return err_setf(L->e, ERR_NOMEM, "template: out of memory");
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else {
        int64_t v = 0;
        for (size_t i = 0; i < nb; i++) {
            if (v > (INT64_MAX - (buf[i] - '0')) / 10)
                return lex_fail(L, L->line, "integer literal out of range");
            v = v * 10 + (buf[i] - '0');
        }
        t->i = v;
    }
    L->pos = q;
    return 0;
}

/* Tokens of one {{ }} or {% %} tag from L->pos up to and including its end. */
static int lex_tag(struct lexer *L, bool block)
{
    int depth = 0, open_line = L->line;
    char close = block ? '%' : '}';
    const char *s = L->s;
    for (;;) {
        while (L->pos < L->n && is_ws(s[L->pos])) {
            L->line += s[L->pos] == '\n';
            L->pos++;
        }
        if (L->pos >= L->n)
            return lex_fail(L, open_line, block ? "unclosed '{%' tag" : "unclosed '{{' tag");
        size_t p = L->pos, rest = L->n - p;
        char sign = 0;
        if (depth == 0 && rest >= 3 && (s[p] == '-' || s[p] == '+') && s[p + 1] == close && s[p + 2] == '}')
            sign = s[p];
        if (depth == 0 && (sign || (rest >= 2 && s[p] == close && s[p + 1] == '}'))) {
            if (!push(L, block ? TK_BLOCK_END : TK_VAR_END, L->line))
                return err_setf(L->e, ERR_NOMEM, "template: out of memory");
            L->pos += sign ? 3 : 2;
            if (sign == '+' && !block)
                return lex_fail(L, L->line, "'+}}' is not valid");
            after_close(L, sign, block);
            return 0;
        }
        char ch = s[p];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_') {
            size_t q = p;
            while (q < L->n && ((s[q] >= 'a' && s[q] <= 'z') || (s[q] >= 'A' && s[q] <= 'Z') ||
                                (s[q] >= '0' && s[q] <= '9') || s[q] == '_'))
                q++;
            struct token *t = push(L, TK_NAME, L->line);
            if (!t || !(t->s = ar_tstr(L->ar, s + p, q - p)))
                return err_setf(L->e, ERR_NOMEM, "template: out of memory");
            L->pos = q;
        } else if (ch >= '0' && ch <= '9') {
            int rc = lex_number(L);
            if (rc < 0)
                return rc;
        } else if (ch == '\'' || ch == '"') {
            size_t q = p + 1;
            int line = L->line;
            while (q < L->n && s[q] != ch) {
                if (s[q] == '\\' && q + 1 < L->n)
                    q++;
                q++;
            }
            if (q >= L->n)
                return lex_fail(L, line, "unterminated string");
            struct token *t = push(L, TK_STRING, line);
            if (!t)
                return err_setf(L->e, ERR_NOMEM, "template: out of memory");
            int rc = unescape(L, s + p + 1, q - p - 1, &t->s);
            if (rc < 0)
                return rc;
            L->line += count_lines(s + p, q - p);
            L->pos = q + 1;
        } else {
            int op = OP_NONE;
            size_t w = 0;
            for (size_t k = 0; k < sizeof k_ops / sizeof k_ops[0]; k++) {
                size_t l = strlen(k_ops[k].s);
                if (l <= rest && memcmp(s + p, k_ops[k].s, l) == 0) {
                    op = k_ops[k].op;
                    w = l;
                    break;
                }
            }
            if (op == OP_NONE)
                return lex_fail(L, L->line, "unexpected character in a tag");
            if (op == OP_LBRACE || op == OP_LBRACKET || op == OP_LPAREN) {
                if (++depth > 256)
                    return err_setf(L->e, ERR_RANGE, "template line %d: brackets nested too deeply (over 256)", L->line);
            } else if (op == OP_RBRACE || op == OP_RBRACKET || op == OP_RPAREN) {
                if (depth == 0)
                    return lex_fail(L, L->line, "unbalanced closing bracket");
                depth--;
            }
            struct token *t = push(L, TK_OP, L->line);
            if (!t)
                return err_setf(L->e, ERR_NOMEM, "template: out of memory");
            t->op = op;
            L->pos += w;
        }
    }
}

/* Is s[p..] "{%[-+]? raw [-]?%}"-shaped? On success *end is past the tag. */
static bool match_tag_word(const char *s, size_t n, size_t p, const char *word, size_t *end,
                           char *open_sign, char *close_sign)
{
    if (p + 2 > n || s[p] != '{' || s[p + 1] != '%')
        return false;
    p += 2;
    *open_sign = 0;
    if (p < n && (s[p] == '-' || s[p] == '+'))
        *open_sign = s[p++];
    while (p < n && is_ws(s[p]))
        p++;
    size_t wl = strlen(word);
    if (p + wl > n || memcmp(s + p, word, wl) != 0)
        return false;
    p += wl;
    while (p < n && is_ws(s[p]))
        p++;
    *close_sign = 0;
    if (p < n && (s[p] == '-' || s[p] == '+'))
        *close_sign = s[p++];
    if (p + 2 > n || s[p] != '%' || s[p + 1] != '}')
        return false;
    *end = p + 2;
    return true;
}

/* At a {% raw %} tag (text before it already emitted): emit the raw body. */
static int lex_raw(struct lexer *L, size_t tag_end, char close_sign)
{
    L->line += count_lines(L->s + L->pos, tag_end - L->pos);
    L->pos = tag_end;
    after_close(L, close_sign, false);
    for (size_t p = L->pos; p + 1 < L->n; p++) {
        size_t end;
        char os, cs;
        if (L->s[p] == '{' && match_tag_word(L->s, L->n, p, "endraw", &end, &os, &cs)) {
            int rc = emit_text(L, L->pos, p, os, false);
            if (rc < 0)
                return rc;
            L->line += count_lines(L->s + p, end - p);
            L->pos = end;
            after_close(L, cs, true);
            return 0;
        }
    }
    return lex_fail(L, L->line, "missing {% endraw %}");
}

static int lex_all(struct lexer *L)
{
    const char *s = L->s;
    for (;;) {
        size_t p = L->pos;
        while (p + 1 < L->n && !(s[p] == '{' && (s[p + 1] == '{' || s[p + 1] == '%' || s[p + 1] == '#')))
            p++;
        if (p + 1 >= L->n) {
            int rc = emit_text(L, L->pos, L->n, 0, false);
            if (rc < 0)
                return rc;
            L->pos = L->n;
            return push(L, TK_EOF, L->line) ? 0 : err_setf(L->e, ERR_NOMEM, "template: out of memory");
        }
        char kind = s[p + 1];
        char sign = p + 2 < L->n && (s[p + 2] == '-' || s[p + 2] == '+') ? s[p + 2] : 0;
        size_t raw_end;
        char ros, rcs;
        bool raw = kind == '%' && match_tag_word(s, L->n, p, "raw", &raw_end, &ros, &rcs);
        int rc = emit_text(L, L->pos, p, sign, kind != '{');
        if (rc < 0)
            return rc;
        L->pos = p + 2 + (sign ? 1 : 0);
        if (raw) {
            L->pos = p;
            if ((rc = lex_raw(L, raw_end, rcs)) < 0)
                return rc;
            continue;
        }
        if (kind == '#') {
            int line = L->line;
            size_t q = L->pos;
            while (q + 1 < L->n && !(s[q] == '#' && s[q + 1] == '}'))
                q++;
            if (q + 1 >= L->n)
                return lex_fail(L, line, "unclosed comment");
            char cs = q > L->pos && (s[q - 1] == '-' || s[q - 1] == '+') ? s[q - 1] : 0;
            L->line += count_lines(s + L->pos, q - L->pos);
            L->pos = q + 2;
            after_close(L, cs, true);
            continue;
        }
        if (!push(L, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, L->line))
            return err_setf(L->e, ERR_NOMEM, "template: out of memory");
        if ((rc = lex_tag(L, kind == '%')) < 0)
            return rc;
    }
}

int tmpl_lex(struct arena *ar, const char *src, size_t len, struct token **toks, size_t *n,
             struct err *e)
{
    /* normalize newlines, drop one trailing newline */
    char *s = ar_alloc(ar, len + 1);
    if (!s)
        return err_setf(e, ERR_NOMEM, "template: out of memory");
    size_t m = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[m++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[m++] = src[i];
        }
    }
    if (m > 0 && s[m - 1] == '\n')
        m--;
    s[m] = 0;
    struct lexer L = {.ar = ar, .s = s, .n = m, .line = 1, .e = e};
    int rc = lex_all(&L);
    if (rc < 0)
        return rc;
    *toks = L.t;
    *n = L.nt;
    return 0;
}
