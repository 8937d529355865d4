/*
 * alloc_hook: allocation-failure injection for the test runner only, in the
 * manner of SQLite's OOM tests.
 *
 * run_tests is linked with -Wl,--wrap=malloc,... (CMakeLists.txt), so every
 * call to malloc, calloc, realloc, reallocarray, aligned_alloc,
 * posix_memalign, strdup, strndup and free made by our code (tests and the
 * static mlxcel_lib linked into the runner) lands in __wrap_* here, which
 * forwards to __real_* (glibc's, or ASan's interceptor). The shipped binary
 * is linked without the flags and calls libc directly. Allocations made
 * inside shared libraries (cJSON unless its hooks point here, PCRE2,
 * utf8proc) are not seen.
 *
 * While armed with N, the N-th allocation counted since arming returns NULL
 * (errno ENOMEM); only that one, later ones succeed. Every allocation made
 * while armed is also tracked until freed, so alloc_hook_live() tells
 * whether an operation (plus the caller's cleanup of its results) gave back
 * everything it took, in any build, not only under LeakSanitizer.
 *
 * Single-threaded: the suite arms the hook only around code that runs on
 * the calling thread.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>

/* Where an allocation was made: the return addresses in the allocator's
 * caller and in that function's caller. */
struct alloc_site {
    const void *at, *from;
};

/* Start counting and tracking from zero; fail_at = N fails the N-th
 * allocation, 0 fails none (a counting run, which also records the call
 * site of every allocation). Also points cJSON's hooks at the wrapped
 * malloc/free so cJSON's allocations are counted. */
void alloc_hook_arm(long fail_at);
/* Stop injecting failures; tracking of live blocks continues so the
 * caller's cleanup is accounted for. */
void alloc_hook_stop(void);
/* Stop tracking, restore cJSON's default hooks, forget the live set. */
void alloc_hook_disarm(void);
/* The site of allocation i (1-based) of the last counting run, until the
 * next arm; {NULL, NULL} when out of range or not recorded. */
struct alloc_site alloc_hook_site(long i);
/* Allocations counted since arming. */
long alloc_hook_count(void);
/* Whether the armed failure was injected. */
bool alloc_hook_injected(void);
/* Blocks allocated since arming and not yet freed. */
size_t alloc_hook_live(void);
