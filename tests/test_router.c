/*
 * Router mode's plain parts (src/server/router.h, router_scan.c): the --models-dir scan
 * (models found at both levels, folders without config.json, symlinks escaping the
 * directory, invalid names, the entry bound), the list's names, the presets file (INI and
 * JSON, [*] under a model's own values, errors naming file and line) and the eviction
 * policy (LRU among idle models, --models-max, --memory-budget).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/router.h"
#include "server/router_impl.h"
#include "server/srv_impl.h"
#include "test.h"

// ---- a scratch directory ----

static char g_root[256];

static void mk(const char *rel)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_root, rel);
    assert_int_equal(mkdir(p, 0755), 0);
}

static void put(const char *rel, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_root, rel);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup_root(void **state)
{
    (void)state;
    snprintf(g_root, sizeof g_root, "/tmp/mlxcel_router_XXXXXX");
    return mkdtemp(g_root) ? 0 : -1;
}

static int teardown_root(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    return system(cmd) == 0 ? 0 : -1;
}

static const struct router_spec *find(const struct router_list *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->v[i].name, name) == 0)
            return &l->v[i];
    return NULL;
}

// ---- the scan ----

static void scan_finds_models_at_both_levels(void **state)
{
    (void)state;
    mk("dir");
    mk("dir/alpha");
    put("dir/alpha/config.json", "{}");
    mk("dir/owner");
    mk("dir/owner/beta");
    put("dir/owner/beta/config.json", "{}");
    mk("dir/empty");                       /* no config.json anywhere: no model */
    mk("dir/bad name");                    /* not a valid name: skipped */
    put("dir/bad name/config.json", "{}");
    put("dir/file.txt", "not a folder");
    mk("dir/.hidden");
    put("dir/.hidden/config.json", "{}");
    /* a symlink leading out of the directory is refused, one inside it is a model */
    mk("outside");
    put("outside/config.json", "{}");
    char dir[512], link[512], target[512];
    snprintf(target, sizeof target, "%s/outside", g_root);
    snprintf(link, sizeof link, "%s/dir/escape", g_root);
    assert_int_equal(symlink(target, link), 0);
    snprintf(link, sizeof link, "%s/dir/owner/up", g_root);
    assert_int_equal(symlink("../../outside", link), 0);
    snprintf(link, sizeof link, "%s/dir/alias", g_root);
    assert_int_equal(symlink("alpha", link), 0);

    struct router_list l = {0};
    struct err e = {0};
    int found = -1;
    snprintf(dir, sizeof dir, "%s/dir", g_root);
    assert_int_equal(router_scan_dir(&l, dir, &found, &e), 0);
    assert_int_equal(found, 3);
    assert_int_equal(l.n, 3);
    assert_non_null(find(&l, "alpha"));
    assert_non_null(find(&l, "owner/beta"));
    assert_non_null(find(&l, "alias"));
    assert_null(find(&l, "escape"));
    assert_null(find(&l, "owner/up"));
    assert_null(find(&l, "bad name"));
    assert_null(find(&l, "empty"));
    router_list_free(&l);
}

/* --models-dir at a Hugging Face hub cache: models--OWNER--NAME/refs/main names the snapshot
 * that is the model (OWNER/NAME); a ref that is not a commit hash, a missing snapshot or one
 * without config.json is no model, and nothing under models--* is scanned as an owner folder. */
static void scan_reads_a_hub_cache(void **state)
{
    (void)state;
    mk("hub");
    mk("hub/models--acme--tiny");
    mk("hub/models--acme--tiny/refs");
    put("hub/models--acme--tiny/refs/main", "0123abcd4567\n");
    mk("hub/models--acme--tiny/snapshots");
    mk("hub/models--acme--tiny/snapshots/0123abcd4567");
    put("hub/models--acme--tiny/snapshots/0123abcd4567/config.json", "{}");
    mk("hub/models--acme--tiny/snapshots/ffff0000ffff");   /* another snapshot: not main */
    put("hub/models--acme--tiny/snapshots/ffff0000ffff/config.json", "{}");
    mk("hub/models--solo");                                  /* no owner: named "solo" */
    mk("hub/models--solo/refs");
    put("hub/models--solo/refs/main", "abcdef1");
    mk("hub/models--solo/snapshots");
    mk("hub/models--solo/snapshots/abcdef1");
    put("hub/models--solo/snapshots/abcdef1/config.json", "{}");
    mk("hub/models--evil--ref");                             /* a ref that is a path */
    mk("hub/models--evil--ref/refs");
    put("hub/models--evil--ref/refs/main", "../../../outside");
    mk("hub/models--no--snap");                              /* the ref's snapshot is missing */
    mk("hub/models--no--snap/refs");
    put("hub/models--no--snap/refs/main", "1234567");
    mk("hub/datasets--x--y");                                /* not a model entry: an owner */
    mk("hub/models--fifo--ref");                             /* refs/main a FIFO: no hang */
    mk("hub/models--fifo--ref/refs");
    char fifo[512];
    snprintf(fifo, sizeof fifo, "%s/hub/models--fifo--ref/refs/main", g_root);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/hub", g_root);
    struct router_list l = {0};
    struct err e = {0};
    int found = -1;
    assert_int_equal(router_scan_dir(&l, dir, &found, &e), 0);
    assert_int_equal(found, 2);
    const struct router_spec *t = find(&l, "acme/tiny");
    assert_non_null(t);
    assert_non_null(strstr(t->path, "/snapshots/0123abcd4567"));
    assert_non_null(find(&l, "solo"));
    assert_null(find(&l, "evil/ref"));
    assert_null(find(&l, "no/snap"));
    assert_null(find(&l, "fifo/ref"));
    router_list_free(&l);
}

static void scan_bounds_the_entries(void **state)
{
    (void)state;
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s/many", g_root);
    assert_int_equal(mkdir(dir, 0755), 0);
    /* a few thousand empty folders: scanned, no model, quickly */
    for (int i = 0; i < 3000; i++) {
        snprintf(p, sizeof p, "%s/f%04d", dir, i);
        assert_int_equal(mkdir(p, 0755), 0);
    }
    snprintf(p, sizeof p, "%s/f0007/config.json", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fclose(f);
    struct router_list l = {0};
    struct err e = {0};
    int found = 0;
    assert_int_equal(router_scan_dir(&l, dir, &found, &e), 0);
    assert_int_equal(found, 1);
    assert_string_equal(l.v[0].name, "f0007");
    router_list_free(&l);
    /* past ROUTER_SCAN_MAX_ENTRIES: refused, not walked */
    for (int i = 3000; i <= ROUTER_SCAN_MAX_ENTRIES; i++) {
        snprintf(p, sizeof p, "%s/f%05d", dir, i);
        assert_int_equal(mkdir(p, 0755), 0);
    }
    assert_int_equal(router_scan_dir(&l, dir, &found, &e), -ERR_RANGE);
    assert_non_null(strstr(e.msg, "entries"));
    router_list_free(&l);
    snprintf(p, sizeof p, "%s/nope", g_root);
    assert_int_equal(router_scan_dir(&l, p, &found, &e), -ERR_IO);
}

static void list_names_are_checked(void **state)
{
    (void)state;
    struct router_list l = {0};
    struct err e = {0};
    assert_int_equal(router_list_add(&l, "a", "/x", &e), 0);
    assert_int_equal(router_list_add(&l, "owner/name:q4", "/y", &e), 0);
    assert_int_equal(router_list_add(&l, "a", "/z", &e), -ERR_ARG);
    assert_non_null(strstr(e.msg, "two models"));
    assert_int_equal(router_list_add(&l, "", "/z", &e), -ERR_ARG);
    assert_int_equal(router_list_add(&l, "a b", "/z", &e), -ERR_ARG);
    assert_int_equal(router_list_add(&l, "/abs", "/z", &e), -ERR_ARG);
    assert_int_equal(router_list_add(&l, "x\"y", "/z", &e), -ERR_ARG);
    char longname[ROUTER_NAME_MAX + 1];
    memset(longname, 'a', ROUTER_NAME_MAX);
    longname[ROUTER_NAME_MAX] = 0;
    assert_int_equal(router_list_add(&l, longname, "/z", &e), -ERR_ARG);
    assert_int_equal(l.n, 2);
    router_list_free(&l);
}

// ---- presets ----

static void presets_ini(void **state)
{
    (void)state;
    put("p.ini", "version = 1\n"
                 "; llama-server's format\n"
                 "[*]\n"
                 "ctx-size = 1024\n"
                 "temp = 0.5\n"
                 "n-gpu-layers = 99\n"       /* a llama-server flag we do not read: ignored */
                 "\n"
                 "[a]\n"
                 "temp = 0.2\n"
                 "parallel = 2\n"
                 "chat-template-file = /t/chat.jinja\n"
                 "lora = /ad/one,/ad/two:0.5\n"
                 "load-on-startup = true\n"
                 "[extra]\n"
                 "model = /models/extra\n"
                 "top-k = 40\n");
    struct router_list l = {0};
    struct err e = {0};
    char p[512];
    snprintf(p, sizeof p, "%s/p.ini", g_root);
    assert_int_equal(router_list_add(&l, "a", "/models/a", &e), 0);
    assert_int_equal(router_list_add(&l, "b", "/models/b", &e), 0);
    assert_int_equal(router_presets_load(&l, p, &e), 0);
    assert_int_equal(l.n, 3);
    const struct router_spec *a = find(&l, "a"), *b = find(&l, "b"), *x = find(&l, "extra");
    assert_non_null(x);
    /* the model's own values over [*]'s */
    assert_true(a->preset.temp == 0.2f && a->preset.ctx_size == 1024 && a->preset.parallel == 2);
    assert_string_equal(a->preset.chat_template_file, "/t/chat.jinja");
    assert_true(a->preset.set & ROUTER_SET_LORA);
    assert_string_equal(a->preset.lora, "/ad/one,/ad/two:0.5");
    assert_false(b->preset.set & ROUTER_SET_LORA);
    assert_true(a->preset.load_on_startup);
    assert_true(b->preset.temp == 0.5f && b->preset.ctx_size == 1024 && !(b->preset.set & ROUTER_SET_PARALLEL));
    assert_false(b->preset.load_on_startup);
    assert_string_equal(x->path, "/models/extra");
    assert_true(x->preset.top_k == 40 && x->preset.temp == 0.5f);
    router_list_free(&l);
}

static void presets_errors_name_the_line(void **state)
{
    (void)state;
    static const struct {
        const char *text, *want;
    } k_cases[] = {
        {"[a]\ntemp = 3\n", "p2.ini:2"},               /* out of range */
        {"[a]\nctx-size = 1.5\n", "an integer"},
        {"[a]\nlora =\n", "adapter paths"},
        {"[nosuch]\ntemp = 1\n", "names no model"},
        {"[a\n", "p2.ini:1"},
        {"[a]\njust words\n", "key = value"},
        {"[a]\nload-on-startup = maybe\n", "true or false"},
        {"[*]\nmodel = /x\n", "in a model's section"},
        {"{\"a\": {\"temp\": [1]}}", "string, number or boolean"},
        {"{\"a\": 3}", "a section is an object"},
        {"[1, 2]", "p2.ini"},
    };
    char p[512];
    snprintf(p, sizeof p, "%s/p2.ini", g_root);
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        put("p2.ini", k_cases[i].text);
        struct router_list l = {0};
        struct err e = {0};
        assert_int_equal(router_list_add(&l, "a", "/models/a", &e), 0);
        assert_true(router_presets_load(&l, p, &e) < 0);
        if (!strstr(e.msg, k_cases[i].want))
            fail_msg("case %zu: '%s' does not say '%s'", i, e.msg, k_cases[i].want);
        router_list_free(&l);
    }
    struct router_list l = {0};
    struct err e = {0};
    snprintf(p, sizeof p, "%s/absent.ini", g_root);
    assert_true(router_presets_load(&l, p, &e) < 0);
}

static void presets_json(void **state)
{
    (void)state;
    put("p.json", "{\"*\": {\"ctx-size\": 2048, \"min-p\": 0.1}, \"a\": {\"parallel\": 3, \"load-on-startup\": true},"
                  " \"new\": {\"model\": \"/m/new\", \"repeat-penalty\": 1.1}}");
    struct router_list l = {0};
    struct err e = {0};
    char p[512];
    snprintf(p, sizeof p, "%s/p.json", g_root);
    assert_int_equal(router_list_add(&l, "a", "/models/a", &e), 0);
    assert_int_equal(router_presets_load(&l, p, &e), 0);
    const struct router_spec *a = find(&l, "a"), *n = find(&l, "new");
    assert_non_null(n);
    assert_true(a->preset.parallel == 3 && a->preset.ctx_size == 2048 && a->preset.load_on_startup);
    assert_true(n->preset.ctx_size == 2048 && n->preset.repeat_penalty == 1.1f && n->preset.min_p == 0.1f);
    router_list_free(&l);
}

// ---- the eviction policy ----

static void lru_picks_the_idle_model_used_least_recently(void **state)
{
    (void)state;
    struct router_lru_item v[4] = {
        {.loaded = true, .refs = 0, .last_used = 5, .bytes = 100},
        {.loaded = true, .refs = 0, .last_used = 2, .bytes = 100},
        {.loaded = true, .refs = 1, .last_used = 1, .bytes = 100},  /* oldest, but in use */
        {.loaded = false, .bytes = 100},                            /* the one to load */
    };
    /* no limits: fits */
    assert_int_equal(router_pick_victim(v, 4, 3, 0, 0), ROUTER_FITS);
    assert_int_equal(router_pick_victim(v, 4, 3, 4, 0), ROUTER_FITS);
    /* three loaded, at most three: the idle one used least recently goes, never the busy one */
    assert_int_equal(router_pick_victim(v, 4, 3, 3, 0), 1);
    v[1].loaded = false;
    assert_int_equal(router_pick_victim(v, 4, 3, 3, 0), ROUTER_FITS);
    assert_int_equal(router_pick_victim(v, 4, 3, 2, 0), 0);
    /* every other loaded model in use: no room (wait) */
    v[0].refs = 2;
    assert_int_equal(router_pick_victim(v, 4, 3, 2, 0), ROUTER_NO_ROOM);
    /* --models-max 1 */
    v[0].refs = 0;
    assert_int_equal(router_pick_victim(v, 4, 3, 1, 0), 0);
}

static void budget_counts_bytes(void **state)
{
    (void)state;
    struct router_lru_item v[3] = {
        {.loaded = true, .last_used = 1, .bytes = 600},
        {.loaded = true, .last_used = 2, .bytes = 300},
        {.loaded = false, .bytes = 200},
    };
    assert_int_equal(router_pick_victim(v, 3, 2, 0, 1100), ROUTER_FITS);
    assert_int_equal(router_pick_victim(v, 3, 2, 0, 1000), 0);   /* 1100 > 1000: the LRU goes */
    v[0].last_used = 3;
    assert_int_equal(router_pick_victim(v, 3, 2, 0, 1000), 1);
    /* what goes frees enough or the next call picks another */
    v[1].loaded = false;
    assert_int_equal(router_pick_victim(v, 3, 2, 0, 1000), ROUTER_FITS);
    /* alone over the budget: never fits */
    v[2].bytes = 2000;
    assert_int_equal(router_pick_victim(v, 3, 2, 0, 1000), ROUTER_TOO_BIG);
    /* the model itself, loaded already, is not counted twice */
    struct router_lru_item w[2] = {{.loaded = true, .bytes = 900}, {.loaded = true, .bytes = 100, .last_used = 1}};
    assert_int_equal(router_pick_victim(w, 2, 0, 0, 1000), ROUTER_FITS);
}

// ---- the router with a fake loader: references, eviction, failures ----

struct fake {
    int loads, unloads;
    char last_loaded[64], last_unloaded[64];
    uint64_t bytes;
};

static int fake_load(void *ud, const struct router_spec *spec, struct server_model *out, void **handle,
                     uint64_t *bytes, struct err *e)
{
    struct fake *f = ud;
    if (strcmp(spec->name, "bad") == 0) {
        f->loads++;
        return err_setf(e, ERR_FORMAT, "%s/config.json: not JSON", spec->path);
    }
    f->loads++;
    snprintf(f->last_loaded, sizeof f->last_loaded, "%s", spec->name);
    memset(out, 0, sizeof *out);
    out->n_vocab = 7;
    *handle = strdup(spec->name);
    *bytes = f->bytes;
    return 0;
}

static void fake_unload(void *ud, void *handle)
{
    struct fake *f = ud;
    f->unloads++;
    snprintf(f->last_unloaded, sizeof f->last_unloaded, "%s", (char *)handle);
    free(handle);
}

/* The model's status value in the list. */
static const char *status_of(struct router *rt, const char *name)
{
    static char buf[32];
    bool found;
    cJSON *m = router_models_json(rt, name, 0, &found);
    assert_non_null(m);
    snprintf(buf, sizeof buf, "%s", cJSON_GetObjectItem(cJSON_GetObjectItem(m, "status"), "value")->valuestring);
    cJSON_Delete(m);
    return buf;
}

/* Waits (bounded) until name's status is want. */
static void wait_status(struct router *rt, const char *name, const char *want)
{
    for (int i = 0; i < 500 && strcmp(status_of(rt, name), want) != 0; i++)
        usleep(10000);
    assert_string_equal(status_of(rt, name), want);
}

static void router_references_and_eviction(void **state)
{
    (void)state;
    struct router_list l = {0};
    struct err e = {0};
    assert_int_equal(router_list_add(&l, "a", "/m/a", &e), 0);
    assert_int_equal(router_list_add(&l, "b", "/m/b", &e), 0);
    assert_int_equal(router_list_add(&l, "bad", "/m/bad", &e), 0);
    struct fake f = {.bytes = 100};
    struct router_opts o = {.max_loaded = 1, .autoload = true, .load_timeout_s = 1};
    struct router_loader ld = {.ud = &f, .load = fake_load, .unload = fake_unload};
    struct router *rt = NULL;
    atomic_int stopping = 0;
    assert_int_equal(router_new(&rt, &l, &o, &ld, &e), 0);
    struct srv_model *ma = NULL, *mb = NULL;
    struct oai_error err;

    /* first use loads; the model answers with its own values */
    assert_int_equal(router_acquire(rt, "a", &stopping, &ma, &err), 0);
    assert_non_null(ma);
    assert_string_equal(ma->id, "a");
    assert_int_equal(ma->m.n_vocab, 7);
    assert_int_equal(f.loads, 1);
    /* --models-max 1 and a in use: b finds no room, a stays (503 after the timeout) */
    assert_int_equal(router_acquire(rt, "b", &stopping, &mb, &err), -1);
    assert_int_equal(err.status, 503);
    assert_null(mb);
    assert_string_equal(status_of(rt, "a"), "loaded");
    assert_int_equal(f.unloads, 0);
    /* a idle: b evicts it */
    srv_model_release(ma);
    assert_int_equal(router_acquire(rt, "b", &stopping, &mb, &err), 0);
    assert_string_equal(f.last_unloaded, "a");
    assert_string_equal(status_of(rt, "a"), "unloaded");

    /* an unload asked for while in use waits for the last reference */
    srv_model_retain(mb);  /* a generation's own reference */
    assert_int_equal(router_request(rt, "b", false, &err), 0);
    usleep(100000);
    assert_string_equal(status_of(rt, "b"), "loaded");
    srv_model_release(mb);
    usleep(100000);
    assert_string_equal(status_of(rt, "b"), "loaded");
    srv_model_release(mb);
    wait_status(rt, "b", "unloaded");
    assert_string_equal(f.last_unloaded, "b");

    /* a failed load: its error, not retried per request, retried by a load request */
    int loads = f.loads;
    assert_int_equal(router_acquire(rt, "bad", &stopping, &mb, &err), -1);
    assert_int_equal(err.status, 500);
    assert_non_null(strstr(err.message, "not JSON"));
    assert_int_equal(router_acquire(rt, "bad", &stopping, &mb, &err), -1);
    assert_int_equal(err.status, 500);
    assert_int_equal(f.loads, loads + 1);
    assert_int_equal(router_request(rt, "bad", true, &err), 0);
    wait_status(rt, "bad", "unloaded");
    for (int i = 0; i < 200 && f.loads < loads + 2; i++)
        usleep(10000);
    assert_int_equal(f.loads, loads + 2);

    /* unknown names; shutting down */
    assert_int_equal(router_acquire(rt, "zzz", &stopping, &mb, &err), -1);
    assert_int_equal(err.status, 404);
    assert_int_equal(router_request(rt, "zzz", true, &err), -1);
    atomic_store(&stopping, 1);
    assert_int_equal(router_acquire(rt, "a", &stopping, &mb, &err), -1);
    assert_int_equal(err.status, 503);

    router_free(rt);  /* unloads what is loaded: nothing is left */
    assert_int_equal(f.unloads, 2);  /* a (evicted) and b (asked), each once */
    router_list_free(&l);
}

static void router_budget_and_autoload_off(void **state)
{
    (void)state;
    struct router_list l = {0};
    struct err e = {0};
    assert_int_equal(router_list_add(&l, "a", "/m/a", &e), 0);
    assert_int_equal(router_list_add(&l, "b", "/m/b", &e), 0);
    assert_int_equal(router_list_add(&l, "c", "/m/c", &e), 0);
    struct fake f = {.bytes = 400};
    /* 1000 bytes: two models of 400 fit, a third evicts the least recently used */
    struct router_opts o = {.memory_budget = 1000, .autoload = false, .load_timeout_s = 5};
    struct router_loader ld = {.ud = &f, .load = fake_load, .unload = fake_unload};
    struct router *rt = NULL;
    atomic_int stopping = 0;
    struct oai_error err;
    struct srv_model *m = NULL;
    assert_int_equal(router_new(&rt, &l, &o, &ld, &e), 0);
    assert_int_equal(router_acquire(rt, "a", &stopping, &m, &err), -1);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.code, "model_not_loaded");
    const char *order[] = {"a", "b", "a", "c"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(router_request(rt, order[i], true, &err), 0);
        wait_status(rt, order[i], "loaded");
        assert_int_equal(router_acquire(rt, order[i], &stopping, &m, &err), 0);
        srv_model_release(m);
    }
    /* b was used least recently */
    assert_string_equal(status_of(rt, "b"), "unloaded");
    assert_string_equal(status_of(rt, "a"), "loaded");
    assert_string_equal(status_of(rt, "c"), "loaded");
    /* a model alone over the budget fails, saying so */
    f.bytes = 2000;
    assert_int_equal(router_request(rt, "b", true, &err), 0);
    bool found;
    cJSON *j = NULL;
    const cJSON *st = NULL;
    for (int i = 0; i < 300; i++) {
        cJSON_Delete(j);
        j = router_models_json(rt, "b", 0, &found);
        st = cJSON_GetObjectItem(j, "status");
        if (cJSON_GetObjectItem(st, "failed"))
            break;
        usleep(10000);
    }
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(st, "failed")));
    assert_non_null(strstr(cJSON_GetObjectItem(st, "error")->valuestring, "--memory-budget"));
    cJSON_Delete(j);
    router_free(rt);
    router_list_free(&l);
}

static const struct CMUnitTest k_tests[] = {
    cmocka_unit_test(router_references_and_eviction),
    cmocka_unit_test(router_budget_and_autoload_off),
    cmocka_unit_test_setup_teardown(scan_finds_models_at_both_levels, setup_root, teardown_root),
    cmocka_unit_test_setup_teardown(scan_reads_a_hub_cache, setup_root, teardown_root),
    cmocka_unit_test_setup_teardown(scan_bounds_the_entries, setup_root, teardown_root),
    cmocka_unit_test(list_names_are_checked),
    cmocka_unit_test_setup_teardown(presets_ini, setup_root, teardown_root),
    cmocka_unit_test_setup_teardown(presets_errors_name_the_line, setup_root, teardown_root),
    cmocka_unit_test_setup_teardown(presets_json, setup_root, teardown_root),
    cmocka_unit_test(lru_picks_the_idle_model_used_least_recently),
    cmocka_unit_test(budget_counts_bytes),
};

TEST_SUITE(router, k_tests);
