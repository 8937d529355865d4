/*
 * backend_plugin: the contract between mlxcel and a backend plugin loaded at
 * run time (libmlxcel-cuda.so, ADR 0021). The plugin exports one C symbol,
 * BACKEND_PLUGIN_ENTRY, a function returning its struct backend_plugin; the
 * loader (backend.c) refuses a plugin whose abi differs from BACKEND_PLUGIN_ABI,
 * which changes whenever struct backend_ops, struct backend or anything they
 * take changes shape, or whose opts_size differs from sizeof(struct backend_opts)
 * (a second check on the one struct the loader hands the plugin, ADR 0056). The plugin reports "no device" or "driver too old"
 * through its own error messages; the loader reports "no driver" and "plugin
 * missing" before it loads anything.
 */
#pragma once
#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BACKEND_PLUGIN_ABI 7
#define BACKEND_PLUGIN_ENTRY "mlxcel_backend_plugin"

struct backend_plugin {
    int abi;                    /* BACKEND_PLUGIN_ABI of the plugin's build */
    size_t opts_size;           /* sizeof(struct backend_opts) of the plugin's build */
    const char *name;           /* "cuda" */
    /* A backend on device dev (>= 0) with the options o (never NULL; its cuda_* fields). */
    int (*create)(struct backend **out, int dev, const struct backend_opts *o, struct err *e);
    /* One line per usable device ("cuda:0  NVIDIA H200, 139.8 GiB") into buf; the
     * number of devices, or a negative error (no device, driver too old). */
    int (*describe)(char *buf, size_t cap, struct err *e);
};

typedef const struct backend_plugin *(*backend_plugin_entry_fn)(void);

/* Load the CUDA plugin (path, else libmlxcel-cuda.so beside the executable) once per
 * process (a later call's path is not looked at); the plugin table, or NULL with why in e
 * (no driver, plugin missing, wrong ABI). */
const struct backend_plugin *backend_cuda_plugin(const char *path, struct err *e);
/* Whether the table p (NULL: no entry point) matches this build: 0, or -ERR_UNSUPPORTED
 * naming path and the abi or options size that differs. */
int backend_plugin_check(const struct backend_plugin *p, const char *path, struct err *e);
/* What `mlxcel --version` prints: the compiled-in backends and, per usable device, its
 * name and memory, one line each into buf; plugin_path as for backend_cuda_plugin. */
void backend_describe(char *buf, size_t cap, const char *plugin_path);

#ifdef __cplusplus
}
#endif
