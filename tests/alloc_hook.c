/*
 * alloc_hook: the --wrap'd allocators of the test runner (see alloc_hook.h).
 *
 * Disarmed, each wrapper tests two flags and calls the real function.
 * Armed, each allocation is counted, the fail_at-th returns NULL, and every
 * block handed out is recorded in an open-addressing pointer set (linear
 * probing, tombstones, grown at half load) until free or realloc gives it
 * back. The hook's own storage comes from the real allocator; if that fails
 * the runner aborts, since counts and the live set would be wrong.
 */
#include "alloc_hook.h"

#include <errno.h>
#include <execinfo.h>
#include <stdint.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

/* the allocators themselves, as the linker's --wrap names them */
void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void *__real_reallocarray(void *p, size_t k, size_t n);
void *__real_aligned_alloc(size_t al, size_t n);
int __real_posix_memalign(void **p, size_t al, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
void __real_free(void *p);

/* ---- state ---- */

#define TOMB ((void *)1)

static bool g_counting;  /* armed: count allocations, fail the g_fail_at-th */
static bool g_tracking;  /* record live blocks */
static long g_fail_at, g_count;
static bool g_injected;
static bool g_recording;          /* counting run: record call sites */
static struct alloc_site *g_sites;  /* [g_sites_cap] site of allocation i + 1 */
static size_t g_sites_cap;
static void **g_set;     /* [g_cap] NULL = empty, TOMB = deleted */
static size_t g_cap, g_used, g_live;  /* g_used counts tombstones too */

/* ---- the live-block set ---- */

static size_t slot_of(const void *p)
{
    return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull) & (g_cap - 1);
}

static void set_insert(void *p);

/* Rehash into four times the live count (at least 4096 slots), dropping tombstones. */
static void set_grow(void)
{
    void **old = g_set;
    size_t old_cap = g_cap, cap = 4096;
    while (cap < 4 * (g_live + 1))
        cap *= 2;
    g_set = __real_calloc(cap, sizeof *g_set);
    if (!g_set)
        abort();
    g_cap = cap;
    g_used = g_live = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i] && old[i] != TOMB)
            set_insert(old[i]);
    __real_free(old);
}

static void set_insert(void *p)
{
    if (2 * (g_used + 1) > g_cap)
        set_grow();
    size_t i = slot_of(p);
    while (g_set[i] && g_set[i] != TOMB)
        i = (i + 1) & (g_cap - 1);
    if (!g_set[i])
        g_used++;
    g_set[i] = p;
    g_live++;
}

static void set_clear(void)
{
    __real_free(g_set);
    g_set = NULL;
    g_cap = g_used = g_live = 0;
}

/* Removes p; false when it was not tracked (allocated before arming). */
static bool set_remove(const void *p)
{
    if (!g_cap)
        return false;
    for (size_t i = slot_of(p); g_set[i]; i = (i + 1) & (g_cap - 1)) {
        if (g_set[i] == p) {
            g_set[i] = TOMB;
            g_live--;
            return true;
        }
    }
    return false;
}

/* ---- hook points ---- */

/* Records the call site of allocation g_count (counting runs only): the
 * return address in the allocator's caller, and the one in its caller found
 * by unwinding, so each caller of a helper such as a vector's grow function
 * is a site of its own. */
static void record_site(const void *at)
{
    void *bt[10];
    if ((size_t)g_count > g_sites_cap) {
        size_t cap = g_sites_cap ? 2 * g_sites_cap : 4096;
        g_sites = __real_realloc(g_sites, cap * sizeof *g_sites);
        if (!g_sites)
            abort();
        g_sites_cap = cap;
    }
    int n = backtrace(bt, 10);
    struct alloc_site s = {at, NULL};
    for (int i = 0; i + 1 < n && !s.from; i++)
        if (bt[i] == at)
            s.from = bt[i + 1];
    g_sites[g_count - 1] = s;
}

/* Counts an allocation made from at (a return address); true when it is
 * the one to fail. */
static bool should_fail(const void *at)
{
    if (!g_counting)
        return false;
    ++g_count;
    if (g_recording)
        record_site(at);
    if (g_count != g_fail_at)
        return false;
    g_injected = true;
    errno = ENOMEM;
    return true;
}

static void *track(void *p)
{
    if (p && g_tracking)
        set_insert(p);
    return p;
}

void *__wrap_malloc(size_t n)
{
    return should_fail(__builtin_return_address(0)) ? NULL : track(__real_malloc(n));
}

void *__wrap_calloc(size_t k, size_t n)
{
    return should_fail(__builtin_return_address(0)) ? NULL : track(__real_calloc(k, n));
}

void *__wrap_aligned_alloc(size_t al, size_t n)
{
    return should_fail(__builtin_return_address(0)) ? NULL : track(__real_aligned_alloc(al, n));
}

int __wrap_posix_memalign(void **p, size_t al, size_t n)
{
    if (should_fail(__builtin_return_address(0)))
        return ENOMEM;
    int rc = __real_posix_memalign(p, al, n);
    if (rc == 0)
        track(*p);
    return rc;
}

char *__wrap_strdup(const char *s)
{
    return should_fail(__builtin_return_address(0)) ? NULL : track(__real_strdup(s));
}

char *__wrap_strndup(const char *s, size_t n)
{
    return should_fail(__builtin_return_address(0)) ? NULL : track(__real_strndup(s, n));
}

/* q is what realloc of old returned (to_zero: to 0 bytes). A moved block
 * stays tracked only if the old one was (or it is new), so growing a block
 * allocated before arming is not reported as live. */
static void *track_moved(void *old, void *q, bool to_zero)
{
    if (!g_tracking)
        return q;
    if (!q) {
        if (old && to_zero)  /* glibc's realloc(p, 0) frees p */
            set_remove(old);
        return q;
    }
    if (!old || set_remove(old))
        set_insert(q);
    return q;
}

void *__wrap_realloc(void *p, size_t n)
{
    return should_fail(__builtin_return_address(0)) ? NULL : track_moved(p, __real_realloc(p, n), n == 0);
}

void *__wrap_reallocarray(void *p, size_t k, size_t n)
{
    return should_fail(__builtin_return_address(0)) ? NULL
                                                    : track_moved(p, __real_reallocarray(p, k, n), !k || !n);
}

void __wrap_free(void *p)
{
    if (p && g_tracking)
        set_remove(p);
    __real_free(p);
}

/* ---- control ---- */

void alloc_hook_arm(long fail_at)
{
    cJSON_Hooks hooks = {__wrap_malloc, __wrap_free};
    cJSON_InitHooks(&hooks);
    g_count = 0;
    g_fail_at = fail_at;
    g_injected = false;
    g_recording = fail_at == 0;
    set_clear();
    g_tracking = true;
    g_counting = true;
}

void alloc_hook_stop(void)
{
    g_counting = false;
}

void alloc_hook_disarm(void)
{
    g_counting = false;
    g_tracking = false;
    cJSON_InitHooks(NULL);
    set_clear();
}

struct alloc_site alloc_hook_site(long i)
{
    if (i < 1 || !g_recording || (size_t)i > g_sites_cap || i > g_count)
        return (struct alloc_site){NULL, NULL};
    return g_sites[i - 1];
}

long alloc_hook_count(void)
{
    return g_count;
}

bool alloc_hook_injected(void)
{
    return g_injected;
}

size_t alloc_hook_live(void)
{
    return g_live;
}
