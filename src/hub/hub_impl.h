/*
 * hub_impl: what the files of src/hub/ share and nothing else needs: limits,
 * the HTTP client over libcurl (hub_http.c: one request at a time with
 * retries, and the parallel transfer loop), and small helpers.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

#include "hub.h"

#define HUB_FILE_MAX    (INT64_C(1) << 50)  /* 1 PiB: larger declared sizes are hostile */
#define HUB_FILES_MAX   100000              /* files in one listing */
#define HUB_LISTING_MAX (64u << 20)         /* bytes of a listing document */
#define HUB_REDIRECTS   5                   /* huggingface_hub follows a few; more is a loop */
#define HUB_ATTEMPTS    5                   /* tries per request on 429, 5xx, dropped connections */

/* The headers of a response that the client reads (the last response of a redirect chain). */
struct hub_headers {
    long status;
    char commit[64];        /* X-Repo-Commit */
    char etag[160];         /* X-Linked-Etag, else ETag, quotes and W/ stripped */
    int64_t size;           /* X-Linked-Size, else Content-Length; -1 when absent */
    char location[1024];
    char error_code[64];    /* X-Error-Code (RepoNotFound, GatedRepo, ...) */
    char error_msg[256];    /* X-Error-Message */
    char content_range[96];
    bool linked_etag;       /* the etag came from X-Linked-Etag */
};

/* One client: the endpoint, the bearer token (may be ""), the repository (for messages). */
struct hub_client {
    char endpoint[512];
    char token[512];
    char repo[256];
    long backoff_ms;        /* first retry delay, doubling (hub_opts.backoff_ms) */
    long etag_timeout_s;    /* connect and read timeout of listing/HEAD requests (hub_opts) */
    long download_timeout_s;/* the same for file transfers */
    hub_notice_fn notice;   /* retries are told here (may be NULL) */
    void *ud;
};

bool hub_hex_is_valid(const char *s, size_t min, size_t max);

/* GET url (on the endpoint) into a malloc'd NUL-terminated *body of at most max bytes,
 * retrying 429/5xx; any final status other than 200 is an error worded for what. */
int hub_http_get(const struct hub_client *c, const char *url, size_t max, const char *what, char **body,
                 size_t *len, struct err *e);
/* HEAD url without following absolute redirects (the Hub's HEAD of an LFS file answers 302
 * with the X-Linked-* headers); relative ones (a renamed repository) are followed. */
int hub_http_head(const struct hub_client *c, const char *url, const char *what, struct hub_headers *h,
                  struct err *e);
/* Transfer the pending files of p (state HUB_FILE_PENDING, etag set) into blobs/, at most
 * jobs at a time, calling the progress callback. */
int hub_http_transfer(const struct hub_client *c, struct hub_pull *p, const struct hub_opts *o,
                      struct err *e);
/* Append s percent-encoded (RFC 3986 unreserved bytes kept, and '/' when keep_slash). */
void hub_url_escape(char *buf, size_t cap, const char *s, bool keep_slash);
/* The error for a final HTTP status (401, 403, 404, 429, 5xx, other) of what. */
int hub_status_error(const struct hub_client *c, const struct hub_headers *h, const char *what,
                     struct err *e);
/* Milliseconds on a monotonic clock. */
int64_t hub_now_ms(void);

/* ---- shared by hub_http.c and hub_xfer.c ---- */

/* Header-callback state: the headers being read (reset at each new response). */
struct hub_header_state {
    struct hub_headers *h;
    char linked_size[32], length[32], etag[160], linked_etag[160];
};
/* CURLOPT_HEADERFUNCTION for a struct hub_header_state. */
size_t hub_on_header(char *line, size_t size, size_t nitems, void *ud);
/* Settle status, etag and size once a response is complete. */
void hub_headers_finish(struct hub_header_state *st, CURL *h);
/* An easy handle for url with the common options (protocols, redirect bound, the
 * listing/HEAD timeouts, bearer token); *hdrs is the header list to free after the
 * handle. NULL: out of memory. */
CURL *hub_easy_new(const struct hub_client *c, const char *url, struct curl_slist **hdrs);
bool hub_curl_is_transient(CURLcode cc);
bool hub_status_is_transient(long status);
/* Delay before retry number attempt (1, 2, ...). */
long hub_backoff_ms(const struct hub_client *c, int attempt);
/* Tell c->notice that attempt (1, 2, ...) of what failed for reason and that it is retried
 * after delay_ms. */
void hub_notice_retry(const struct hub_client *c, const char *what, const char *reason, int attempt,
                      long delay_ms);
/* Why a curl transfer failed, in words: a timeout says which (connecting, or no byte
 * for timeout_s seconds) and the variable that sets it (download: HF_HUB_DOWNLOAD_TIMEOUT,
 * else HF_HUB_ETAG_TIMEOUT); anything else is curl's message. */
void hub_curl_reason(char *buf, size_t cap, CURLcode cc, const char *errbuf, long timeout_s, bool download);
/* The error for a failed curl transfer of what (reason as hub_curl_reason). */
int hub_curl_error(const struct hub_client *c, CURLcode cc, const char *errbuf, const char *what, int attempts,
                   bool download, struct err *e);
