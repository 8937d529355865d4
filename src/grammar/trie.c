/*
 * trie: byte tries over a set of strings, for the vocabulary (the mask walks
 * it with a matcher state and drops a whole subtree at the first byte the
 * grammar refuses) and for the literals of enums and object keys.
 *
 * The strings are sorted once; every node then covers a contiguous range of
 * the sorted order (its subtree), the strings that end at the node come first
 * in that range, and a node's children are stored next to each other, sorted
 * by byte. The build is breadth-first over the node array itself (no
 * recursion: a hostile literal may be long), costing O(total bytes + n log n).
 */
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

#define TRIE_STR_MAX 65535u  /* node.left and the walk's depth are 16-bit */

struct sort_ctx {
    const char *const *s;
    const uint32_t *len;
};

static int cmp_str(const void *pa, const void *pb, void *arg)
{
    const struct sort_ctx *c = arg;
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    uint32_t la = c->len[a], lb = c->len[b], n = la < lb ? la : lb;
    int r = n ? memcmp(c->s[a], c->s[b], n) : 0;
    if (r)
        return r;
    if (la != lb)
        return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;  /* stable: equal strings keep their order */
}

static int add_node(struct gtrie *t, uint32_t lo, uint32_t hi, uint8_t byte, struct err *e)
{
    if (t->n_node == t->cap) {
        uint32_t cap = t->cap ? 2 * t->cap : 64;
        struct gtrie_node *n = realloc(t->node, (size_t)cap * sizeof *n);
        if (!n)
            return err_setf(e, ERR_NOMEM, "grammar: trie of %u nodes", cap);
        t->node = n;
        t->cap = cap;
    }
    t->node[t->n_node++] = (struct gtrie_node){.lo = lo, .hi = hi, .byte = byte};
    return 0;
}

int gtrie_build(struct gtrie *t, const char *const *s, const uint32_t *len, uint32_t n,
                struct err *e)
{
    struct sort_ctx ctx = {s, len};
    uint32_t *depth = NULL;
    int rc;
    memset(t, 0, sizeof *t);
    for (uint32_t i = 0; i < n; i++)
        if (len[i] > TRIE_STR_MAX)
            return err_setf(e, ERR_RANGE, "grammar: a string of %u bytes (at most %u)", len[i],
                            TRIE_STR_MAX);
    t->order = malloc((size_t)(n ? n : 1) * sizeof *t->order);
    if (!t->order)
        return err_setf(e, ERR_NOMEM, "grammar: trie of %u strings", n);
    t->n_str = n;
    for (uint32_t i = 0; i < n; i++)
        t->order[i] = i;
    qsort_r(t->order, n, sizeof *t->order, cmp_str, &ctx);
    if ((rc = add_node(t, 0, n, 0, e)) < 0)
        goto fail;
    uint32_t dcap = 0;
    /* breadth first: node k's children are appended, contiguous, when k is expanded */
    for (uint32_t k = 0; k < t->n_node; k++) {
        struct gtrie_node nd = t->node[k];
        uint32_t d = k ? depth[k] : 0, i = nd.lo;
        while (i < nd.hi && len[t->order[i]] == d)
            i++;
        if (i - nd.lo > 0xFFFF) {
            rc = err_setf(e, ERR_RANGE, "grammar: %u equal strings", i - nd.lo);
            goto fail;
        }
        t->node[k].n_term = (uint16_t)(i - nd.lo);
        t->node[k].child = t->n_node;
        while (i < nd.hi) {
            uint8_t b = (uint8_t)s[t->order[i]][d];
            uint32_t j = i;
            while (j < nd.hi && (uint8_t)s[t->order[j]][d] == b)
                j++;
            if ((rc = add_node(t, i, j, b, e)) < 0)
                goto fail;
            if (t->cap > dcap) {
                uint32_t *dd = realloc(depth, (size_t)t->cap * sizeof *dd);
                if (!dd) {
                    rc = err_setf(e, ERR_NOMEM, "grammar: trie depths");
                    goto fail;
                }
                depth = dd;
                dcap = t->cap;
            }
            depth[t->n_node - 1] = d + 1;
            t->node[k].n_child++;
            i = j;
        }
    }
    /* children come after their parent: a reverse pass sees them first */
    for (uint32_t k = t->n_node; k-- > 0;) {
        struct gtrie_node *nd = &t->node[k];
        uint16_t left = 0;
        for (uint32_t c = 0; c < nd->n_child; c++) {
            uint16_t l = (uint16_t)(t->node[nd->child + c].left + 1);
            left = l > left ? l : left;
        }
        nd->left = left;
    }
    free(depth);
    return 0;
fail:
    free(depth);
    gtrie_deinit(t);
    return rc;
}

void gtrie_deinit(struct gtrie *t)
{
    free(t->node);
    free(t->order);
    memset(t, 0, sizeof *t);
}

int32_t gtrie_child(const struct gtrie *t, uint32_t k, uint8_t c)
{
    const struct gtrie_node *nd = &t->node[k];
    uint32_t lo = nd->child, hi = nd->child + nd->n_child;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        uint8_t b = t->node[mid].byte;
        if (b == c)
            return (int32_t)mid;
        if (b < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}
