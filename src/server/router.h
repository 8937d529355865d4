/*
 * router: several models behind one server (`serve --models-dir DIR`, or -m given more than
 * once), as llama-server's router mode (ADR 0099).
 *
 * The CLI builds the list of servable models (router_scan_dir, router_list_add; per-model
 * defaults from a presets file, router_presets_load) and hands it to the server with a
 * loader (struct router_loader: its callbacks load one model into a struct server_model and
 * free it again). The server owns the router from then on: a request's "model" field names
 * the model, which loads on first use on the router's own thread (never an HTTP thread),
 * within --models-max models and --memory-budget bytes, the least recently used idle model
 * unloaded first; a model in use (its requests and their generations hold references) is
 * never unloaded, an unload asked for while it is in use happens once it is idle.
 *
 * The scan and the eviction policy are plain functions, tested alone (tests/test_router.c).
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/err.h"
#include "server.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ROUTER_NAME_MAX 128          /* a model's name in the API, bytes with the NUL */
#define ROUTER_MAX_MODELS 1024       /* servable models at most */
/* Directory entries a --models-dir scan reads at most, over both levels: a directory of a
 * few thousand folders is scanned in milliseconds; one of millions is refused rather than
 * walked. */
#define ROUTER_SCAN_MAX_ENTRIES 8192

/* Which preset values are set (struct router_preset.set). */
enum router_preset_bits {
    ROUTER_SET_TEMP = 1u << 0,
    ROUTER_SET_TOP_P = 1u << 1,
    ROUTER_SET_TOP_K = 1u << 2,
    ROUTER_SET_MIN_P = 1u << 3,
    ROUTER_SET_REPEAT_PENALTY = 1u << 4,
    ROUTER_SET_CTX = 1u << 5,
    ROUTER_SET_PARALLEL = 1u << 6,
    ROUTER_SET_TEMPLATE = 1u << 7,
    ROUTER_SET_LOAD = 1u << 8,
    ROUTER_SET_LORA = 1u << 9,
};

/* One model's defaults from the presets file; 0 / "" / unset: the serve flags' (or the
 * checkpoint's generation_config.json for the sampling values). */
struct router_preset {
    long ctx_size;                   /* ctx-size: KV cache tokens */
    long parallel;                   /* parallel: sequences decoded together */
    float temp, top_p, min_p, repeat_penalty;
    int top_k;
    unsigned set;                    /* enum router_preset_bits */
    char chat_template_file[4096];   /* chat-template-file: a Jinja file replacing the checkpoint's */
    bool load_on_startup;            /* load-on-startup */
    char lora[4096];                 /* lora: the model's adapters, "PATH[:S],PATH[:S]..." as
                                      * --lora takes each (llama-server's flag) */
};

/* One servable model. */
struct router_spec {
    char name[ROUTER_NAME_MAX];      /* its name in the API ("model" field) */
    char path[4096];                 /* its folder */
    struct router_preset preset;
};

/* The servable models, in the order found (owned; router_list_free). */
struct router_list {
    struct router_spec *v;
    int n, cap;
};

/* Adds a model named name (1 to ROUTER_NAME_MAX - 1 printable bytes, no '/' first) in folder
 * path. -ERR_ARG for a bad or duplicate name or past ROUTER_MAX_MODELS. */
int router_list_add(struct router_list *l, const char *name, const char *path, struct err *e);
void router_list_free(struct router_list *l);

/* Adds every model of dir: each subfolder holding a config.json, named by the folder's name;
 * a folder without one is looked into once more (owner/name layouts: named "owner/name").
 * Entries whose real path leaves dir (symlinks escaping it) are skipped with a warning,
 * as are names that are not valid; more than ROUTER_SCAN_MAX_ENTRIES entries is -ERR_RANGE.
 * Models found: *n_found. 0 or -ERR_*. */
int router_scan_dir(struct router_list *l, const char *dir, int *n_found, struct err *e);

/* Applies the presets file (llama-server's INI: "[*]" for every model, "[NAME]" for one,
 * keys as the long flags: ctx-size, parallel, temp, top-p, top-k, min-p, repeat-penalty,
 * chat-template-file, load-on-startup, model = PATH to add a model; or the same as JSON:
 * {"*": {...}, "NAME": {...}}). -ERR_FORMAT / -ERR_ARG naming the file, line and key. */
int router_presets_load(struct router_list *l, const char *file, struct err *e);

/* How a model loads and unloads (the CLI's: src/cli/cmd_serve.c). Called on the router's
 * thread only, one at a time. load fills *out (its pointers valid until unload(handle)),
 * *handle and *bytes (the memory it holds: weights + KV cache); 0 or -ERR_* with e set. */
struct router_loader {
    void *ud;
    int (*load)(void *ud, const struct router_spec *spec, struct server_model *out, void **handle,
                uint64_t *bytes, struct err *e);
    void (*unload)(void *ud, void *handle);
};

struct router_opts {
    int max_loaded;                  /* --models-max: models loaded at once (0: no limit) */
    uint64_t memory_budget;          /* --memory-budget: bytes of loaded models (0: no limit) */
    bool autoload;                   /* load on a request's first use (--no-models-autoload: off) */
    int load_timeout_s;              /* a request waits this long for its model, then 503 */
};

/* Hands the models to the server (copied) and starts the router's thread; the server owns
 * the router from here on (server_free stops it and unloads every model). Models with
 * load-on-startup are queued. 0 or -ERR_*. */
int server_set_router(struct server *s, const struct router_list *l, const struct router_opts *o,
                      const struct router_loader *ld, struct err *e);

// ---- the eviction policy (router.c), a pure function ----

struct router_lru_item {
    bool loaded;                     /* loaded (or loading: it holds its room) */
    int refs;                        /* requests using it */
    uint64_t last_used;              /* a clock: larger is more recent */
    uint64_t bytes;                  /* its memory */
};

enum {
    ROUTER_FITS = -1,                /* item want fits beside the loaded ones */
    ROUTER_NO_ROOM = -2,             /* it does not, and every other loaded model is in use */
    ROUTER_TOO_BIG = -3,             /* it alone is over the budget */
};

/* What to do to load item want (of n) within max_loaded models (0: no limit) and budget
 * bytes (0: none): ROUTER_FITS, the index of the idle loaded model used least recently to
 * unload first, ROUTER_NO_ROOM or ROUTER_TOO_BIG. */
int router_pick_victim(const struct router_lru_item *v, int n, int want, int max_loaded, uint64_t budget);

#ifdef __cplusplus
}
#endif
