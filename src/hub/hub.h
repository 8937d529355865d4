/*
 * hub: downloads from the Hugging Face Hub into the shared Hugging Face cache,
 * laid out exactly as huggingface_hub lays it out, so transformers, mlx-lm and
 * huggingface-cli reuse what mlxcel fetched (and the other way round):
 *
 *   <cache>/models--<owner>--<name>/blobs/<etag>          file contents
 *   <cache>/models--<owner>--<name>/snapshots/<commit>/<file> -> ../../blobs/<etag>
 *   <cache>/models--<owner>--<name>/refs/<revision>       the commit, for a branch or tag
 *
 * <cache>, the Hub's endpoint and the token come in struct hub_opts: the CLI
 * resolves them from HF_HUB_CACHE / HF_HOME / HF_ENDPOINT / HF_TOKEN as
 * huggingface_hub does (src/cli/config.c); this module reads no environment.
 *
 * Everything the server says is untrusted: the repository listing is parsed
 * with the one JSON reader, file names must stay inside the snapshot, etags
 * and commits must be hex, sizes are bounded by what the listing declared and
 * by the free disk space. Transfers go to blobs/<etag>.incomplete, resume
 * with Range, are verified against the sha256 of large files, and are renamed
 * into place; the snapshot's links are written only once every file is there.
 * Dependencies: hub -> core (json, fileio, sha256, err), libcurl.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HUB_DEFAULT_ENDPOINT "https://huggingface.co"
#define HUB_NAME_MAX 1024   /* bytes of a file name inside a repository */

/* One file of a repository, from the listing, then the HEAD of its resolve URL. */
enum hub_file_state {
    HUB_FILE_PENDING = 0,   /* to fetch */
    HUB_FILE_CACHED  = 1,   /* blobs/<etag> was already there */
    HUB_FILE_ACTIVE  = 2,   /* transfer running */
    HUB_FILE_DONE    = 3,   /* fetched and verified */
};
struct hub_file {
    char *name;             /* path inside the repository (checked: hub_name_is_safe) */
    int64_t size;           /* bytes; -1 when the listing gave none (the HEAD fills it) */
    char sha256[65];        /* LFS files: the sha256 the listing declares, else "" */
    char etag[129];         /* from the HEAD: the sha256 (LFS) or git blob id, hex */
    enum hub_file_state state;
    int64_t done;           /* bytes on disk so far (progress) */
};

/* The repository listing: GET /api/models/<repo>/revision/<rev>?blobs=true. */
struct hub_listing {
    char commit[41];        /* "sha", 40 hex digits */
    struct hub_file *files; /* "siblings" (owned) */
    size_t n_files;
};

/* Progress callback: called from the calling thread after each change worth showing
 * (a file starts, moves on, ends), at most every ~100 ms while bytes flow. */
struct hub_pull;
typedef void (*hub_progress_fn)(void *ud, const struct hub_pull *p);
/* Notice callback: one line (no newline) worth telling the user now, such as a retry
 * ("listing tiny/llama: Operation timed out (...); retrying in 1.0 s (attempt 2 of 5)"). */
typedef void (*hub_notice_fn)(void *ud, const char *line);

/* huggingface_hub's defaults (constants.py: DEFAULT_ETAG_TIMEOUT, DEFAULT_DOWNLOAD_TIMEOUT,
 * both 10 s, the connect timeout of its requests the same): a server that accepts and then
 * says nothing fails an attempt after this long instead of stalling the pull. */
#define HUB_TIMEOUT_S_DEFAULT 10

struct hub_opts {
    const char *revision;          /* NULL: "main" */
    const char *cache_dir;         /* the cache root; NULL: "." (the CLI passes the HF cache) */
    const char *endpoint;          /* NULL: HUB_DEFAULT_ENDPOINT; no trailing '/' */
    const char *token;             /* NULL or "": the token file */
    const char *token_path;        /* the token file `huggingface-cli login` writes; NULL: none */
    long backoff_ms;               /* first retry's wait, doubled per attempt; < 0: 500 */
    const char *const *include;    /* globs (fnmatch, '*' crosses '/'); none: the inference set */
    size_t n_include;
    const char *const *exclude;
    size_t n_exclude;
    int jobs;                      /* parallel transfers, <= 0: 4 */
    bool offline;                  /* resolve from the cache only */
    int etag_timeout_s;            /* listing and HEAD requests: connect, and no byte for this long,
                                    * fail an attempt ($HF_HUB_ETAG_TIMEOUT); <= 0: 10 */
    int download_timeout_s;        /* file transfers, the same ($HF_HUB_DOWNLOAD_TIMEOUT); <= 0: 10 */
    hub_progress_fn progress;      /* may be NULL */
    hub_notice_fn notice;          /* retries; may be NULL */
    void *ud;                      /* for progress and notice */
};

/* The outcome of a pull (and what the progress callback sees). */
struct hub_pull {
    char repo[256];
    char endpoint[512];
    char revision[256];
    char repo_dir[4096];           /* <cache>/models--owner--name */
    char snapshot[4608];           /* <repo_dir>/snapshots/<commit> */
    struct hub_listing list;       /* the wanted files only */
    int64_t total_bytes;           /* of the wanted files */
    int64_t fetch_bytes;           /* of those not cached */
    int64_t fetched_bytes;         /* transferred in this run */
    size_t n_fetched, n_cached;
};

/* Download repo (owner/name) into the cache. On success p holds the snapshot path and
 * per-file states; p is filled as far as it got either way and must be released with
 * hub_pull_deinit. Errors (-ERR_ARG bad name, -ERR_MISSING 404, -ERR_IO network, HTTP,
 * disk, -ERR_FORMAT a broken or hostile server) name the repository or file. */
int hub_pull_run(struct hub_pull *p, const char *repo, const struct hub_opts *o, struct err *e);
void hub_pull_deinit(struct hub_pull *p);

/* ---- pure checks (unit-tested) ---- */

/* owner/name with the Hub's rules: each part 1..96 of [A-Za-z0-9._-], not starting or
 * ending with '-' or '.', no "--" or "..", exactly one '/'. -ERR_ARG says what is wrong. */
int hub_repo_check(const char *repo, struct err *e);
/* A revision: a branch, tag or commit ([A-Za-z0-9._/-], no "..", no leading '/', <= 255). */
int hub_revision_check(const char *rev, struct err *e);
/* A file name from the server that may become snapshots/<commit>/<name>: relative, no
 * empty, "." or ".." component, no backslash or control byte, < HUB_NAME_MAX bytes,
 * components < 256 bytes. (A NUL cannot reach it: hub_listing_parse refuses a listing
 * with a \u0000 escape, which the JSON reader would cut the name at.) */
bool hub_name_is_safe(const char *name);
/* Whether name is pulled: it matches an include glob (none given: the inference set,
 * hub_default_include) and no exclude glob. */
bool hub_name_is_wanted(const char *name, const char *const *include, size_t n_include,
                        const char *const *exclude, size_t n_exclude);
/* Whether name is in the default set: weights (*.safetensors and their index), configs
 * (*.json), tokenizer files, chat templates (*.jinja), the model card. */
bool hub_name_is_default(const char *name);
/* Parse a listing document (len bytes). Every file name is checked (an unsafe name, a
 * duplicate, a bad commit, a negative or huge size, a bad sha256 is -ERR_FORMAT naming it);
 * a NUL in any string (\u0000) is -ERR_FORMAT: the reader's strings end there, so a name
 * "a.json\u0000../x" would arrive cut to "a.json".
 * l is filled on success (release with hub_listing_deinit). */
int hub_listing_parse(struct hub_listing *l, const char *doc, size_t len, struct err *e);
void hub_listing_deinit(struct hub_listing *l);

#ifdef __cplusplus
}
#endif
