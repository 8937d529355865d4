/*
 * outdir: staging folders renamed into place when complete (outdir.h).
 *
 * The signal path cannot call opendir or snprintf, so the folder and the
 * names written into it are recorded up front in fixed buffers; the handler
 * joins them with memcpy and calls only unlink, rmdir, signal and raise.
 * These buffers are the process's one mutable global besides the log sink:
 * a CLI process stages at most one folder at a time.
 */
#include "outdir.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define OD_MAX_NAMES 64
#define OD_NAME_MAX  256

static char g_dir[PATH_MAX];                   /* staging folder, "" when none */
static char g_names[OD_MAX_NAMES][OD_NAME_MAX];
static volatile sig_atomic_t g_n_names;        /* entries of g_names published */
static volatile sig_atomic_t g_active;         /* g_dir is set and not yet renamed */

/* ---- signal path ---- */

/* dir + "/" + name + suffix into buf (PATH_MAX); false when it does not fit. */
static bool join_safe(char *buf, const char *dir, const char *name, const char *suffix)
{
    size_t a = strlen(dir), b = strlen(name), c = strlen(suffix);
    if (a + 1 + b + c >= PATH_MAX)
        return false;
    memcpy(buf, dir, a);
    buf[a] = '/';
    memcpy(buf + a + 1, name, b);
    memcpy(buf + a + 1 + b, suffix, c + 1);
    return true;
}

/* Unlink the registered names and remove the folder: async-signal-safe. */
static void remove_registered(void)
{
    char p[PATH_MAX];
    for (sig_atomic_t i = 0; i < g_n_names; i++) {
        if (join_safe(p, g_dir, g_names[i], ""))
            unlink(p);
        if (join_safe(p, g_dir, g_names[i], ".tmp"))
            unlink(p);
    }
    rmdir(g_dir);
}

static void on_signal(int sig)
{
    if (g_active) {
        g_active = 0;
        remove_registered();
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

void outdir_catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGXFSZ, SIG_IGN);
}

/* ---- staging ---- */

/* dst must be absent or an empty folder. */
static int check_target(const char *dst, struct err *e)
{
    struct stat sb;
    if (lstat(dst, &sb) != 0) {
        if (errno == ENOENT)
            return 0;
        return err_setf(e, ERR_IO, "cannot use %s: %s", dst, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode))
        return err_setf(e, ERR_ARG, "%s exists and is not a directory", dst);
    DIR *d = opendir(dst);
    if (!d)
        return err_setf(e, ERR_IO, "cannot open %s: %s", dst, strerror(errno));
    int rc = 0;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
            rc = err_setf(e, ERR_ARG, "%s is not empty (refusing to overwrite '%s')", dst, de->d_name);
            break;
        }
    }
    closedir(d);
    return rc;
}

int outdir_begin(struct outdir *o, const char *dst, struct err *e)
{
    char parent[PATH_MAX];
    int rc;
    o->tmp[0] = '\0';
    size_t n = strlen(dst);
    while (n > 1 && dst[n - 1] == '/')
        n--;
    if (n == 0 || n >= sizeof o->dst - 32)
        return err_setf(e, ERR_ARG, "output path '%s' is empty or too long", dst);
    snprintf(o->dst, sizeof o->dst, "%.*s", (int)n, dst);
    if ((rc = check_target(o->dst, e)) < 0)
        return rc;
    const char *slash = strrchr(o->dst, '/');
    const char *base = slash ? slash + 1 : o->dst;
    if (strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
        return err_setf(e, ERR_ARG, "output path '%s' must name a folder", dst);
    snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash == o->dst ? 1 : slash - o->dst) : 1,
             slash ? o->dst : ".");
    snprintf(o->tmp, sizeof o->tmp, "%s/.%s.partial-%ld-XXXXXX", parent, base, (long)getpid());
    if (!mkdtemp(o->tmp)) {
        rc = err_setf(e, ERR_IO, "cannot create a folder beside %s: %s", o->dst, strerror(errno));
        o->tmp[0] = '\0';
        return rc;
    }
    mode_t mask = umask(022);
    umask(mask);
    chmod(o->tmp, 0777 & ~mask);  /* mkdtemp makes it 0700; a folder made by mkdir would not be */
    memcpy(g_dir, o->tmp, sizeof g_dir);
    g_n_names = 0;
    g_active = 1;
    return 0;
}

// ---- stale staging folders ----

/* The parent folder of dst (without trailing '/') into buf. */
static void parent_of(const char *dst, char *buf, size_t cap)
{
    size_t n = strlen(dst);
    while (n > 1 && dst[n - 1] == '/')
        n--;
    const char *slash = NULL;
    for (size_t i = 0; i < n; i++)
        if (dst[i] == '/')
            slash = dst + i;
    if (!slash)
        snprintf(buf, cap, ".");
    else
        snprintf(buf, cap, "%.*s", slash == dst ? 1 : (int)(slash - dst), dst);
}

/* Whether name is a staging folder's (.<x>.partial-<pid>-XXXXXX or .<x>.partial-XXXXXX); *pid is
 * its pid, or 0 when the name has none. */
static bool staging_name(const char *name, long *pid)
{
    const char *p = name[0] == '.' ? strstr(name, ".partial-") : NULL;
    if (!p || p == name)
        return false;
    p += strlen(".partial-");
    const char *dash = strchr(p, '-');
    *pid = 0;
    if (!dash)
        return strlen(p) == 6;  /* mkdtemp's six characters */
    char *end;
    long v = strtol(p, &end, 10);
    if (end != dash || v <= 0 || strlen(dash + 1) != 6)
        return false;
    *pid = v;
    return true;
}

/* Remove dir if it holds only regular files: true when it is gone. */
static bool remove_flat(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return false;
    char p[PATH_MAX + 260];
    bool flat = true;
    for (struct dirent *de; flat && (de = readdir(d)) != NULL;) {
        struct stat st;
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        flat = lstat(p, &st) == 0 && S_ISREG(st.st_mode);
    }
    if (flat) {
        rewinddir(d);
        for (struct dirent *de; (de = readdir(d)) != NULL;) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            unlink(p);
        }
    }
    closedir(d);
    return flat && rmdir(dir) == 0;
}

int outdir_sweep(const char *dst, outdir_swept_fn fn, void *ud)
{
    char parent[PATH_MAX];
    parent_of(dst, parent, sizeof parent);
    DIR *d = opendir(parent);
    if (!d)
        return 0;
    int n = 0;
    time_t now = time(NULL);
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        char p[PATH_MAX + 260], why[64];
        struct stat st;
        long pid;
        if (!staging_name(de->d_name, &pid) ||
            (size_t)snprintf(p, sizeof p, "%s/%s", parent, de->d_name) >= sizeof p ||
            lstat(p, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid())
            continue;
        if (pid > 0 && pid == (long)getpid())
            continue;
        if (pid > 0 && !(kill((pid_t)pid, 0) < 0 && errno == ESRCH))
            continue;  /* its process runs (or we cannot tell) */
        if (pid == 0 && !(now - st.st_mtime > OUTDIR_STALE_S))
            continue;
        if (pid > 0)
            snprintf(why, sizeof why, "its process %ld is gone", pid);
        else
            snprintf(why, sizeof why, "untouched for more than a day");
        if (remove_flat(p)) {
            n++;
            if (fn)
                fn(ud, p, why);
        }
    }
    closedir(d);
    return n;
}

int outdir_file(struct outdir *o, const char *name, char *buf, size_t cap, struct err *e)
{
    size_t n = strlen(name);
    if (n >= OD_NAME_MAX || strchr(name, '/') || (size_t)snprintf(buf, cap, "%s/%s", o->tmp, name) >= cap)
        return err_setf(e, ERR_ARG, "output file name too long: %s", name);
    for (sig_atomic_t i = 0; i < g_n_names; i++)
        if (strcmp(g_names[i], name) == 0)
            return 0;
    if (g_n_names == OD_MAX_NAMES)
        return err_setf(e, ERR_INTERNAL, "more than %d output files", OD_MAX_NAMES);
    memcpy(g_names[g_n_names], name, n + 1);
    g_n_names = g_n_names + 1;  /* published after the name is complete */
    return 0;
}

void outdir_abort(struct outdir *o)
{
    if (!o->tmp[0])
        return;
    g_active = 0;
    DIR *d = opendir(o->tmp);
    if (d) {
        char p[PATH_MAX + 260];
        for (struct dirent *de; (de = readdir(d)) != NULL;) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(p, sizeof p, "%s/%s", o->tmp, de->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(o->tmp);
    o->tmp[0] = '\0';
}

int outdir_commit(struct outdir *o, struct err *e)
{
    /* rename() replaces an empty folder; check_target allowed only that */
    if (rename(o->tmp, o->dst) != 0) {
        int rc = err_setf(e, ERR_IO, "cannot rename %s to %s: %s", o->tmp, o->dst, strerror(errno));
        outdir_abort(o);
        return rc;
    }
    g_active = 0;
    o->tmp[0] = '\0';
    return 0;
}
