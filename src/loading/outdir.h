/*
 * outdir: an output folder that appears whole or not at all (convert, synth).
 *
 * outdir_begin checks the target (absent, or an empty folder; its parent
 * writable) and creates a staging folder beside it, on the same filesystem:
 * <parent>/.<name>.partial-XXXXXX. Everything is written there; outdir_commit
 * renames it onto the target, outdir_abort removes it. A SIGINT, SIGTERM or
 * SIGHUP during the work removes it too (outdir_catch_signals): the handler
 * only unlinks the file names registered with outdir_file (and their ".tmp"
 * twins) and rmdirs the folder, which is async-signal-safe, then dies of the
 * signal. One staging folder exists at a time per process.
 *
 * A run killed outright (SIGKILL, a crash, power) leaves its staging folder;
 * the name carries the pid that made it (.<name>.partial-<pid>-XXXXXX), and
 * outdir_sweep, called before the next outdir_begin into the same parent,
 * removes those whose process is gone, and those without a pid (older
 * versions) untouched for OUTDIR_STALE_S.
 */
#pragma once
#include <limits.h>
#include <stddef.h>

#include "../core/err.h"

#ifdef __cplusplus
extern "C" {
#endif

struct outdir {
    char dst[PATH_MAX];  /* the target folder */
    char tmp[PATH_MAX];  /* the staging folder; "" when none */
};

/* Check dst and create its staging folder (mode 0777 less the umask, like mkdir). An
 * existing non-empty dst or a non-folder -> -ERR_ARG, nothing created. */
int outdir_begin(struct outdir *o, const char *dst, struct err *e);
/* Register name (a plain file name) for removal on a signal and write o->tmp/name into buf. */
int outdir_file(struct outdir *o, const char *name, char *buf, size_t cap, struct err *e);
/* Rename the staging folder onto dst. On failure the staging folder is removed. */
int outdir_commit(struct outdir *o, struct err *e);
/* Remove the staging folder and everything in it; a no-op after commit or when none. */
void outdir_abort(struct outdir *o);
/* A staging folder without a pid in its name is stale after this long untouched (1 day). */
#define OUTDIR_STALE_S (24 * 3600)
/* Called for each staging folder outdir_sweep removed: its path and why ("pid N is gone" or
 * "untouched for more than a day"). */
typedef void (*outdir_swept_fn)(void *ud, const char *path, const char *why);
/* Remove stale staging folders of killed runs in dst's parent: folders owned by this user
 * named .<name>.partial-<pid>-XXXXXX whose pid no longer exists (kill(pid, 0): ESRCH), or
 * .<name>.partial-XXXXXX untouched for OUTDIR_STALE_S; only folders holding nothing but
 * regular files (what a run writes) are removed. The number removed (0 when the parent
 * cannot be read); fn may be NULL. */
int outdir_sweep(const char *dst, outdir_swept_fn fn, void *ud);
/* Install the signal handlers (SIGINT, SIGTERM, SIGHUP) and ignore SIGXFSZ, so a file-size
 * limit is a write error (cleaned up) rather than death with a partial folder. */
void outdir_catch_signals(void);

#ifdef __cplusplus
}
#endif
