/*
 * router: the models of a router-mode server, their states and references (router.h,
 * ADR 0099).
 *
 * Each model is an entry: its spec (name, folder, preset), its state (unloaded, loading,
 * loaded, unloading; a failed load leaves it unloaded with its error, which its requests
 * answer until POST /models/load tries again), its references and its memory. An HTTP
 * thread that needs a model (router_acquire) takes a reference to a loaded one, or asks
 * for the load and waits (bounded by --models-load-timeout) on the router's condition
 * variable. The router's thread does every load and unload, one at a time: it makes room
 * first (router_pick_victim: the idle loaded model used least recently goes), waits while
 * every loaded model is in use, loads with the router's lock released (the HTTP threads
 * keep answering, other models keep serving), and unloads a model only when its last
 * reference is gone. A request holds its reference until its completion and a generation
 * its own until freed (a stream's outlives the request): a model is never freed under one.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "../engine/runner.h"
#include "../core/termsafe.h"
#include "router.h"
#include "router_impl.h"
#include "srv_impl.h"

enum rt_state { RT_UNLOADED = 0, RT_LOADING, RT_LOADED, RT_UNLOADING };

struct rt_entry {
    struct srv_model sm;             /* sm.m valid in RT_LOADED (and RT_UNLOADING until freed) */
    struct router_spec spec;
    enum rt_state st;
    bool started;                    /* RT_LOADING: the thread is loading it (else queued) */
    bool failed;                     /* the last load failed: error says why */
    bool want_unload;                /* unload once its references are gone */
    bool want_load;                  /* POST /models/load while unloading: load it again after */
    char error[ERR_MSG_MAX + 64];
    int refs;                        /* requests and generations using it */
    int waiters;                     /* requests waiting in router_acquire for it (kept loaded for them) */
    uint64_t last_used;              /* router.clock at its last acquire or release */
    uint64_t bytes;                  /* measured once loaded, else its weight files' size */
    double deadline;                 /* RT_LOADING: a load that finds no room by then gives up */
    void *handle;                    /* the loader's */
};

struct router {
    pthread_mutex_t mu;              /* guards every entry's state fields, clock and stop */
    pthread_cond_t cv;               /* broadcast on every change of state or references */
    struct rt_entry *e;
    int n;
    struct router_opts o;
    struct router_loader ld;
    uint64_t clock;
    bool stop;
    pthread_t thread;
    bool thread_started;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void deadline_in(struct timespec *ts, double s)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    double t = (double)ts->tv_sec + (double)ts->tv_nsec * 1e-9 + s;
    ts->tv_sec = (time_t)t;
    ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
}

/* The router's status lines (loads, unloads, failures) on stderr, as the access log's: what
 * the operator watches whatever the log level. */
__attribute__((format(printf, 1, 2))) static void rt_log(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "mlxcel serve: router: %s\n", line);
}

// ---- the policy ----

int router_pick_victim(const struct router_lru_item *v, int n, int want, int max_loaded, uint64_t budget)
{
    int n_loaded = 0, victim = -1;
    uint64_t used = 0;
    if (budget && v[want].bytes > budget)
        return ROUTER_TOO_BIG;
    for (int i = 0; i < n; i++) {
        if (i == want || !v[i].loaded)
            continue;
        n_loaded++;
        used += v[i].bytes;
        if (v[i].refs == 0 && (victim < 0 || v[i].last_used < v[victim].last_used))
            victim = i;
    }
    bool fits = (max_loaded <= 0 || n_loaded + 1 <= max_loaded) && (!budget || used + v[want].bytes <= budget);
    if (fits)
        return ROUTER_FITS;
    return victim >= 0 ? victim : ROUTER_NO_ROOM;
}

/* The bytes of the folder's *.safetensors files: the estimate of a model not loaded yet
 * (its tensors; the KV cache is counted once it is loaded and measured). */
static uint64_t weight_file_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    uint64_t sum = 0;
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) && n++ < ROUTER_SCAN_MAX_ENTRIES) {
        size_t len = strlen(de->d_name);
        if (len < 12 || strcmp(de->d_name + len - 12, ".safetensors") != 0)
            continue;
        char p[4096 + 300];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode))
            sum += (uint64_t)st.st_size;
    }
    if (d)
        closedir(d);
    return sum;
}

// ---- the router's thread ----

static void queue_load(struct router *rt, struct rt_entry *en);

/* Frees en's model (lock held on entry and exit; released around the unload). */
static void do_unload(struct router *rt, struct rt_entry *en)
{
    en->st = RT_UNLOADING;
    pthread_mutex_unlock(&rt->mu);
    rt_log("unloading model '%s'", en->spec.name);
    rt->ld.unload(rt->ld.ud, en->handle);
    pthread_mutex_lock(&rt->mu);
    en->handle = NULL;
    memset(&en->sm.m, 0, sizeof en->sm.m);
    en->st = RT_UNLOADED;
    en->want_unload = false;
    if (en->want_load) {
        en->want_load = false;
        queue_load(rt, en);
    }
    pthread_cond_broadcast(&rt->cv);
}

/* Makes room for entry w: unloads idle models, least recently used first. ROUTER_FITS,
 * ROUTER_NO_ROOM (wait) or ROUTER_TOO_BIG. Lock held. */
static int make_room(struct router *rt, int w)
{
    struct router_lru_item *items = calloc((size_t)rt->n, sizeof *items);
    if (!items)
        return ROUTER_NO_ROOM;
    int r;
    for (;;) {
        for (int i = 0; i < rt->n; i++) {
            struct rt_entry *en = &rt->e[i];
            items[i] = (struct router_lru_item){
                .loaded = en->st == RT_LOADED || en->st == RT_UNLOADING || (en->st == RT_LOADING && en->started),
                .refs = en->refs + en->waiters + (en->st == RT_UNLOADING), .last_used = en->last_used, .bytes = en->bytes};
        }
        r = router_pick_victim(items, rt->n, w, rt->o.max_loaded, rt->o.memory_budget);
        if (r < 0)
            break;
        do_unload(rt, &rt->e[r]);
    }
    free(items);
    return r;
}

/* Loads en (lock held on entry and exit, released around the load). */
static void do_load(struct router *rt, struct rt_entry *en)
{
    en->started = true;
    pthread_mutex_unlock(&rt->mu);
    char path[1024];  /* a folder's name may hold any byte: escaped for the terminal */
    rt_log("loading model '%s' from %s", en->spec.name, termsafe_str(en->spec.path, path, sizeof path));
    struct err e = {0};
    struct server_model m = {0};
    void *handle = NULL;
    uint64_t bytes = 0;
    double t0 = now_s();
    int rc = rt->ld.load(rt->ld.ud, &en->spec, &m, &handle, &bytes, &e);
    if (rc == 0 && rt->o.memory_budget && bytes > rt->o.memory_budget) {
        rt->ld.unload(rt->ld.ud, handle);
        rc = err_setf(&e, ERR_RANGE, "it needs %llu bytes, over --memory-budget %llu", (unsigned long long)bytes,
                      (unsigned long long)rt->o.memory_budget);
    }
    pthread_mutex_lock(&rt->mu);
    en->started = false;
    if (rc < 0) {
        en->st = RT_UNLOADED;
        en->failed = true;
        snprintf(en->error, sizeof en->error, "%s", e.msg);
        rt_log("model '%s' failed to load: %s", en->spec.name, e.msg);
    } else {
        m.id = en->sm.id;
        en->sm.m = m;
        en->handle = handle;
        en->bytes = bytes ? bytes : en->bytes;
        en->st = RT_LOADED;
        en->failed = false;
        en->error[0] = 0;
        en->last_used = ++rt->clock;
        rt_log("model '%s' loaded in %.2f s (%.1f MiB)", en->spec.name, now_s() - t0,
                 (double)en->bytes / (1 << 20));
        /* measured above its estimate: others may have to go now */
        int w = (int)(en - rt->e);
        if (make_room(rt, w) == ROUTER_NO_ROOM)
            rt_log("over --models-max / --memory-budget until a model in use is idle");
    }
    pthread_cond_broadcast(&rt->cv);
}

/* One step of work (lock held): true when it did something. */
static bool work_once(struct router *rt)
{
    for (int i = 0; i < rt->n; i++) {
        struct rt_entry *en = &rt->e[i];
        if (en->st == RT_LOADED && en->want_unload && en->refs == 0) {
            do_unload(rt, en);
            return true;
        }
    }
    for (int i = 0; i < rt->n; i++) {
        struct rt_entry *en = &rt->e[i];
        if (en->st != RT_LOADING || en->started)
            continue;
        if (!en->bytes && rt->o.memory_budget)
            en->bytes = weight_file_bytes(en->spec.path);
        int r = make_room(rt, i);
        if (r == ROUTER_TOO_BIG) {
            en->st = RT_UNLOADED;
            en->failed = true;
            snprintf(en->error, sizeof en->error, "its weights (%llu bytes) are over --memory-budget %llu",
                     (unsigned long long)en->bytes, (unsigned long long)rt->o.memory_budget);
            pthread_cond_broadcast(&rt->cv);
            return true;
        }
        if (r == ROUTER_NO_ROOM) {
            if (now_s() < en->deadline)
                continue;  /* a model in use may become idle */
            en->st = RT_UNLOADED;
            snprintf(en->error, sizeof en->error, "no room: every loaded model is in use (--models-max %d, "
                     "--memory-budget %llu)", rt->o.max_loaded, (unsigned long long)rt->o.memory_budget);
            pthread_cond_broadcast(&rt->cv);
            return true;
        }
        do_load(rt, en);
        return true;
    }
    return false;
}

static void *router_main(void *arg)
{
    struct router *rt = arg;
    pthread_mutex_lock(&rt->mu);
    while (!rt->stop) {
        if (work_once(rt))
            continue;
        struct timespec ts;
        deadline_in(&ts, 0.25);  /* bounded: a waiting load re-checks its deadline */
        pthread_cond_timedwait(&rt->cv, &rt->mu, &ts);
    }
    pthread_mutex_unlock(&rt->mu);
    return NULL;
}

// ---- the server's side ----

static void queue_load(struct router *rt, struct rt_entry *en)
{
    en->st = RT_LOADING;
    en->started = false;
    en->deadline = now_s() + rt->o.load_timeout_s;
    en->error[0] = 0;
    pthread_cond_broadcast(&rt->cv);
}

static struct rt_entry *find(struct router *rt, const char *name)
{
    for (int i = 0; i < rt->n; i++)
        if (strcmp(rt->e[i].spec.name, name) == 0)
            return &rt->e[i];
    return NULL;
}

int router_new(struct router **out, const struct router_list *l, const struct router_opts *o,
               const struct router_loader *ld, struct err *e)
{
    *out = NULL;
    struct router *rt = calloc(1, sizeof *rt);
    if (!rt || (l->n && !(rt->e = calloc((size_t)l->n, sizeof *rt->e)))) {
        free(rt);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    rt->n = l->n;
    rt->o = *o;
    if (rt->o.load_timeout_s <= 0)
        rt->o.load_timeout_s = 600;
    rt->ld = *ld;
    pthread_mutex_init(&rt->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&rt->cv, &ca);
    pthread_condattr_destroy(&ca);
    for (int i = 0; i < rt->n; i++) {
        struct rt_entry *en = &rt->e[i];
        en->spec = l->v[i];
        snprintf(en->sm.id, sizeof en->sm.id, "%s", en->spec.name);
        emb_batcher_init(&en->sm.embed_b, SRV_EMBED_BATCH_TOKENS, &(struct err){0});
        en->sm.rt = rt;
        if (en->spec.preset.load_on_startup && o->autoload)
            queue_load(rt, en);
    }
    if (pthread_create(&rt->thread, NULL, router_main, rt) != 0) {
        router_free(rt);
        return err_setf(e, ERR_INTERNAL, "cannot start the router's thread");
    }
    rt->thread_started = true;
    *out = rt;
    return 0;
}

void router_free(struct router *rt)
{
    if (!rt)
        return;
    if (rt->thread_started) {
        pthread_mutex_lock(&rt->mu);
        rt->stop = true;
        pthread_cond_broadcast(&rt->cv);
        pthread_mutex_unlock(&rt->mu);
        pthread_join(rt->thread, NULL);
    }
    for (int i = 0; i < rt->n; i++) {
        struct rt_entry *en = &rt->e[i];
        if (en->st == RT_LOADED)
            rt->ld.unload(rt->ld.ud, en->handle);
        emb_batcher_destroy(&en->sm.embed_b);
    }
    pthread_cond_destroy(&rt->cv);
    pthread_mutex_destroy(&rt->mu);
    free(rt->e);
    free(rt);
}

int router_acquire(struct router *rt, const char *name, const atomic_int *stopping, struct srv_model **out,
                   struct oai_error *err)
{
    *out = NULL;
    pthread_mutex_lock(&rt->mu);
    struct rt_entry *en = find(rt, name);
    int rc = 0;
    bool asked = false;  /* this request queued the load (a failure then is its answer) */
    double until = now_s() + rt->o.load_timeout_s;
    if (!en) {
        pthread_mutex_unlock(&rt->mu);
        return oai_errorf(err, 404, "invalid_request_error", "model_not_found", "model",
                          "the model '%.64s' does not exist; GET /v1/models lists the models served", name);
    }
    for (;;) {
        if (atomic_load(stopping)) {
            rc = oai_errorf(err, 503, "server_error", NULL, NULL, "the server is shutting down");
            break;
        }
        if (en->st == RT_LOADED) {
            en->refs++;
            en->last_used = ++rt->clock;
            *out = &en->sm;
            break;
        }
        if (en->st == RT_UNLOADED) {
            if (en->failed && !asked) {
                rc = oai_errorf(err, 500, "server_error", "model_load_failed", "model", "the model '%s' failed to "
                                "load: %s (POST /models/load retries)", name, en->error);
                break;
            }
            if (asked && !en->failed && !en->error[0]) {
                queue_load(rt, en);  /* unloaded again before this request could take it */
            } else if (asked || !rt->o.autoload) {
                rc = asked ? oai_errorf(err, en->failed ? 500 : 503, "server_error",
                                        en->failed ? "model_load_failed" : NULL, "model",
                                        "the model '%s' did not load: %s", name, en->error)
                           : oai_errorf(err, 400, "invalid_request_error", "model_not_loaded", "model",
                                        "the model '%s' is not loaded (--no-models-autoload): POST /models/load "
                                        "loads it", name);
                break;
            } else {
                queue_load(rt, en);
                asked = true;
            }
        }
        /* loading or unloading: wait, bounded */
        if (now_s() >= until) {
            rc = oai_errorf(err, 503, "server_error", NULL, "model", "the model '%s' is still loading; retry later",
                            name);
            break;
        }
        struct timespec ts;
        deadline_in(&ts, 0.1);  /* stopping is looked at again */
        en->waiters++;
        pthread_cond_timedwait(&rt->cv, &rt->mu, &ts);
        en->waiters--;
    }
    pthread_mutex_unlock(&rt->mu);
    return rc;
}

void router_release(struct router *rt, struct srv_model *sm)
{
    struct rt_entry *en = (struct rt_entry *)((char *)sm - offsetof(struct rt_entry, sm));
    pthread_mutex_lock(&rt->mu);
    en->refs--;
    en->last_used = ++rt->clock;
    if (en->refs == 0)
        pthread_cond_broadcast(&rt->cv);
    pthread_mutex_unlock(&rt->mu);
}

int router_request(struct router *rt, const char *name, bool load, struct oai_error *err)
{
    pthread_mutex_lock(&rt->mu);
    struct rt_entry *en = find(rt, name);
    int rc = 0;
    if (!en) {
        rc = oai_errorf(err, 404, "invalid_request_error", "model_not_found", "model",
                        "the model '%.64s' does not exist; GET /models lists the models served", name);
    } else if (load) {
        en->want_unload = false;
        if (en->st == RT_UNLOADED) {
            en->failed = false;
            queue_load(rt, en);
        } else if (en->st == RT_UNLOADING) {
            en->want_load = true;
        }
    } else if (en->st == RT_UNLOADING) {
        en->want_load = false;
    } else if (en->st == RT_LOADING && !en->started) {
        en->st = RT_UNLOADED;  /* queued, not begun: dropped */
        snprintf(en->error, sizeof en->error, "its load was cancelled by POST /models/unload");
        pthread_cond_broadcast(&rt->cv);
    } else if (en->st == RT_LOADED || en->st == RT_LOADING) {
        en->want_unload = true;  /* a load in progress ends, then the model goes once idle */
        pthread_cond_broadcast(&rt->cv);
    }
    pthread_mutex_unlock(&rt->mu);
    return rc;
}

/* One model's object of /v1/models and /models: llama-server's shape (id, object, owned_by,
 * created, path, status {value, failed?, error?}). */
static cJSON *entry_json(const struct rt_entry *en, long created)
{
    static const char *k_state[] = {"unloaded", "loading", "loaded", "unloading"};
    cJSON *m = cJSON_CreateObject(), *st;
    bool ok = m && cJSON_AddStringToObject(m, "id", en->spec.name) && cJSON_AddStringToObject(m, "object", "model") &&
              cJSON_AddNumberToObject(m, "created", (double)created) &&
              cJSON_AddStringToObject(m, "owned_by", "mlxcel") && cJSON_AddStringToObject(m, "path", en->spec.path) &&
              (st = cJSON_AddObjectToObject(m, "status")) && cJSON_AddStringToObject(st, "value", k_state[en->st]);
    if (ok && en->failed)
        ok = cJSON_AddTrueToObject(st, "failed") && cJSON_AddStringToObject(st, "error", en->error);
    else if (ok && en->st == RT_UNLOADED && en->error[0])
        ok = cJSON_AddStringToObject(st, "error", en->error);
    if (ok && en->st == RT_LOADED)
        ok = cJSON_AddNumberToObject(st, "bytes", (double)en->bytes) &&
             cJSON_AddNumberToObject(st, "in_use", en->refs);
    if (!ok) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

cJSON *router_models_json(struct router *rt, const char *one, long created, bool *found)
{
    pthread_mutex_lock(&rt->mu);
    cJSON *out = NULL, *data = NULL;
    *found = true;
    if (one) {
        struct rt_entry *en = find(rt, one);
        *found = en != NULL;
        out = en ? entry_json(en, created) : NULL;
    } else if ((out = cJSON_CreateObject()) && cJSON_AddStringToObject(out, "object", "list") &&
               (data = cJSON_AddArrayToObject(out, "data"))) {
        for (int i = 0; i < rt->n; i++) {
            cJSON *m = entry_json(&rt->e[i], created);
            if (!m || !cJSON_AddItemToArray(data, m)) {
                cJSON_Delete(m);
                cJSON_Delete(out);
                out = NULL;
                break;
            }
        }
    } else {
        cJSON_Delete(out);
        out = NULL;
    }
    pthread_mutex_unlock(&rt->mu);
    return out;
}

void router_stats(struct router *rt, struct runner_stats *sum, int *slots)
{
    memset(sum, 0, sizeof *sum);
    *slots = 0;
    pthread_mutex_lock(&rt->mu);
    for (int i = 0; i < rt->n; i++) {
        struct rt_entry *en = &rt->e[i];
        if (en->st != RT_LOADED || !en->sm.m.runner)
            continue;
        struct runner_stats st = {0};
        runner_get_stats(en->sm.m.runner, &st);
        sum->n_waiting += st.n_waiting;
        sum->n_running += st.n_running;
        sum->kv_blocks_used += st.kv_blocks_used;
        sum->kv_blocks_total += st.kv_blocks_total;
        sum->kv_blocks_cached += st.kv_blocks_cached;
        sum->kv_snapshots += st.kv_snapshots;
        sum->prefix_query_tokens += st.prefix_query_tokens;
        sum->prefix_hit_tokens += st.prefix_hit_tokens;
        sum->spec_draft_tokens += st.spec_draft_tokens;
        sum->spec_accepted_tokens += st.spec_accepted_tokens;
        *slots += en->spec.preset.parallel;
    }
    pthread_mutex_unlock(&rt->mu);
}

// ---- references ----

void srv_model_retain(struct srv_model *sm)
{
    if (!sm || !sm->rt)
        return;
    struct rt_entry *en = (struct rt_entry *)((char *)sm - offsetof(struct rt_entry, sm));
    pthread_mutex_lock(&sm->rt->mu);
    en->refs++;
    pthread_mutex_unlock(&sm->rt->mu);
}

void srv_model_release(struct srv_model *sm)
{
    if (sm && sm->rt)
        router_release(sm->rt, sm);
}
