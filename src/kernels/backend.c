/*
 * backend: the backend-independent part of the compute seam (backend.h):
 * the one factory every command and test creates a backend through, the
 * lifetime helpers, and the loader of backend plugins (backend_plugin.h).
 *
 * Device names: "cpu" (NULL too), "cpu-<isa>", "cuda" / "cuda:N" (the CUDA
 * plugin, an error naming why when it cannot run), "auto" (CUDA when a
 * usable GPU is present, else the CPU). The CUDA backend lives in
 * libmlxcel-cuda.so, dlopen'ed on first use, so the mlxcel binary itself
 * needs no CUDA library: a machine without a driver only loses the device.
 */
#include "backend.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_plugin.h"

// ---- the CUDA plugin ----

/* Directory of the running executable into buf ("" when unknown). */
static void exe_dir(char *buf, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    buf[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash)
        *slash = '\0';
    else
        buf[0] = '\0';
}

static const struct backend_plugin *plugin_load(const char *want, struct err *e)
{
    char path[PATH_MAX + 32];
    if (want && *want) {
        snprintf(path, sizeof path, "%s", want);
    } else {
        char dir[PATH_MAX];
        exe_dir(dir, sizeof dir);
        snprintf(path, sizeof path, "%s/libmlxcel-cuda.so", dir);
    }
    /* the driver first: without it the plugin could not run anyway */
    void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!drv) {
        err_setf(e, ERR_UNSUPPORTED, "cuda: no NVIDIA driver (libcuda.so.1 cannot be loaded)");
        return NULL;
    }
    if (access(path, R_OK) != 0) {
        err_setf(e, ERR_UNSUPPORTED, "cuda: plugin %s is missing (this build has no CUDA "
                 "backend; MLXCEL_CUDA_PLUGIN names its path)", path);
        return NULL;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        err_setf(e, ERR_UNSUPPORTED, "cuda: cannot load plugin: %s", dlerror());
        return NULL;
    }
    backend_plugin_entry_fn fn;
    *(void **)&fn = dlsym(h, BACKEND_PLUGIN_ENTRY);
    const struct backend_plugin *p = fn ? fn() : NULL;
    return backend_plugin_check(p, path, e) == 0 ? p : NULL;
}

int backend_plugin_check(const struct backend_plugin *p, const char *path, struct err *e)
{
    if (!p || p->abi != BACKEND_PLUGIN_ABI)
        return err_setf(e, ERR_UNSUPPORTED, "cuda: plugin %s does not match this mlxcel (abi %d, "
                        "expected %d)", path, p ? p->abi : -1, BACKEND_PLUGIN_ABI);
    if (p->opts_size != sizeof(struct backend_opts))
        return err_setf(e, ERR_UNSUPPORTED, "cuda: plugin %s does not match this mlxcel (options of "
                        "%zu bytes, expected %zu)", path, p->opts_size, sizeof(struct backend_opts));
    return 0;
}

const struct backend_plugin *backend_cuda_plugin(const char *path, struct err *e)
{
    /* loaded once; a failure is remembered with its message */
    static const struct backend_plugin *p;
    static struct err why;
    static bool tried;
    if (!tried) {
        tried = true;
        p = plugin_load(path, &why);
    }
    if (!p && e)
        *e = why;
    return p;
}

static int cuda_new(struct backend **out, const char *name, const struct backend_opts *o,
                    struct err *e)
{
    int dev = 0;
    if (name[4] == ':') {
        char *end;
        long v = strtol(name + 5, &end, 10);
        if (end == name + 5 || *end || v < 0 || v > 255)
            return err_setf(e, ERR_ARG, "unknown device '%s' (expected cuda or cuda:N)", name);
        dev = (int)v;
    } else if (name[4]) {
        return err_setf(e, ERR_ARG, "unknown device '%s'", name);
    }
    const struct backend_plugin *p = backend_cuda_plugin(o->cuda_plugin, e);
    return p ? p->create(out, dev, o, e) : -ERR_UNSUPPORTED;
}

void backend_describe(char *buf, size_t cap, const char *plugin_path)
{
    struct err e = {0};
    int n = snprintf(buf, cap, "backends: cpu%s\n",
#ifdef MLXCEL_HAVE_CUDA
                     ", cuda (plugin)"
#else
                     ""
#endif
    );
    if (n < 0 || (size_t)n >= cap)
        return;
    const struct backend_plugin *p = backend_cuda_plugin(plugin_path, &e);
    if (p && p->describe(buf + n, cap - (size_t)n, &e) >= 0)
        return;
    snprintf(buf + n, cap - (size_t)n, "cuda: not usable: %s\n", e.msg);
}

// ---- factory ----

int backend_new(struct backend **out, const char *name, int n_threads, const struct backend_opts *o,
                struct err *e)
{
    static const struct backend_opts k_default = BACKEND_OPTS_DEFAULT;
    *out = NULL;
    if (!o)
        o = &k_default;
    if (!name || !strcmp(name, "cpu"))
        return backend_cpu_new(out, n_threads, NULL, o, e);
    if (!strcmp(name, "auto")) {
        /* a usable GPU when there is one; any reason there is none means the CPU */
        if (backend_cuda_plugin(o->cuda_plugin, NULL) && cuda_new(out, "cuda", o, NULL) == 0)
            return 0;
        return backend_cpu_new(out, n_threads, NULL, o, e);
    }
    if (!strncmp(name, "cpu-", 4))
        return backend_cpu_new(out, n_threads, name + 4, o, e);
    if (!strncmp(name, "cuda", 4))
        return cuda_new(out, name, o, e);
    return err_setf(e, ERR_ARG, "unknown device '%s' (expected auto, cpu, cuda, cuda:N, cpu-scalar, "
                    "cpu-avx2 or cpu-avx512)", name);
}

void backend_free(struct backend *be)
{
    if (be)
        be->ops->destroy(be);
}

int backend_sync(struct backend *be, struct err *e)
{
    return be ? be->ops->sync(be, e) : 0;
}
