/*
 * hub_http: the Hub's HTTP as the client needs it, over libcurl (hub_impl.h).
 *
 * Requests are http(s) only, redirects are bounded (HUB_REDIRECTS; a loop is
 * an error), a stalled connection times out, and bodies are bounded: the
 * listing by HUB_LISTING_MAX, a file by the size the listing and the HEAD
 * declared (a server that sends more is refused). 429, 5xx and dropped
 * connections are retried HUB_ATTEMPTS times with doubling delays; a file
 * transfer resumes from what is on disk with Range. The bearer token goes
 * to the endpoint only: curl drops Authorization on a redirect to another
 * host (the CDN the Hub sends LFS downloads to). Timeouts are huggingface_hub's
 * (HUB_TIMEOUT_S_DEFAULT): connecting, and then less than a byte a second, for
 * that long fails an attempt, and each retry is told through hub_opts.notice
 * with its number, so a silent server costs about a minute, said as it goes.
 *
 * hub_http_transfer runs the file downloads: one curl_multi loop in the
 * calling thread, at most `jobs` transfers at a time, each appending to
 * blobs/<etag>.incomplete (flock'ed, so two pulls do not write one file),
 * then verifying its size and, for LFS files, its sha256 before the rename
 * to blobs/<etag>. A sha256 mismatch deletes the partial file.
 */
#include "hub_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "../core/fileio.h"
#include "../core/sha256.h"

#define PROGRESS_MS       100
#define BACKOFF_MAX_MS    16000

int64_t hub_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

long hub_backoff_ms(const struct hub_client *c, int attempt)
{
    long ms = c->backoff_ms;
    for (int i = 1; i < attempt && ms < BACKOFF_MAX_MS; i++)
        ms *= 2;
    return ms < BACKOFF_MAX_MS ? ms : BACKOFF_MAX_MS;
}

void hub_url_escape(char *buf, size_t cap, const char *s, bool keep_slash)
{
    size_t n = strlen(buf);
    for (; *s && n + 4 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        bool keep = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                    ch == '-' || ch == '_' || ch == '.' || ch == '~' || (keep_slash && ch == '/');
        n += (size_t)snprintf(buf + n, cap - n, keep ? "%c" : "%%%02X", ch);
    }
}

// ---- headers ----

/* Copy a header value (trimmed) into dst. */
static void header_value(char *dst, size_t cap, const char *v, size_t n)
{
    while (n > 0 && (*v == ' ' || *v == '\t'))
        v++, n--;
    while (n > 0 && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
        n--;
    snprintf(dst, cap, "%.*s", (int)(n < cap ? n : cap - 1), v);
}

static int64_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    return errno || end == s || *end || v < 0 ? -1 : (int64_t)v;
}

/* ETag: "abc" or W/"abc" -> abc */
static void strip_etag(char *s)
{
    char *p = s;
    if (strncmp(p, "W/", 2) == 0)
        p += 2;
    size_t n = strlen(p);
    if (n >= 2 && p[0] == '"' && p[n - 1] == '"') {
        p++;
        n -= 2;
    }
    memmove(s, p, n);
    s[n] = '\0';
}

size_t hub_on_header(char *line, size_t size, size_t nitems, void *ud)
{
    struct hub_header_state *st = ud;
    size_t n = size * nitems;
    if (n >= 5 && strncmp(line, "HTTP/", 5) == 0) {
        /* a new response (after a redirect): forget the previous one's headers */
        struct hub_headers *h = st->h;
        memset(h, 0, sizeof *h);
        h->size = -1;
        st->linked_size[0] = st->length[0] = st->etag[0] = st->linked_etag[0] = '\0';
        return n;
    }
    const char *colon = memchr(line, ':', n);
    if (!colon)
        return n;
    size_t k = (size_t)(colon - line), vn = n - k - 1;
    const char *v = colon + 1;
    static const struct { const char *name; size_t off, cap; bool in_h; } k_fields[] = {
        {"x-repo-commit", offsetof(struct hub_headers, commit), sizeof((struct hub_headers *)0)->commit, true},
        {"location", offsetof(struct hub_headers, location), sizeof((struct hub_headers *)0)->location, true},
        {"x-error-code", offsetof(struct hub_headers, error_code), sizeof((struct hub_headers *)0)->error_code, true},
        {"x-error-message", offsetof(struct hub_headers, error_msg), sizeof((struct hub_headers *)0)->error_msg,
         true},
        {"content-range", offsetof(struct hub_headers, content_range),
         sizeof((struct hub_headers *)0)->content_range, true},
        {"x-linked-size", offsetof(struct hub_header_state, linked_size), sizeof st->linked_size, false},
        {"content-length", offsetof(struct hub_header_state, length), sizeof st->length, false},
        {"etag", offsetof(struct hub_header_state, etag), sizeof st->etag, false},
        {"x-linked-etag", offsetof(struct hub_header_state, linked_etag), sizeof st->linked_etag, false},
    };
    for (size_t i = 0; i < sizeof k_fields / sizeof k_fields[0]; i++) {
        if (strlen(k_fields[i].name) == k && strncasecmp(line, k_fields[i].name, k) == 0) {
            char *base = k_fields[i].in_h ? (char *)st->h : (char *)st;
            header_value(base + k_fields[i].off, k_fields[i].cap, v, vn);
        }
    }
    return n;
}

/* Settle the derived fields once a response is complete. */
void hub_headers_finish(struct hub_header_state *st, CURL *h)
{
    struct hub_headers *hd = st->h;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &hd->status);
    hd->linked_etag = st->linked_etag[0] != '\0';
    snprintf(hd->etag, sizeof hd->etag, "%s", hd->linked_etag ? st->linked_etag : st->etag);
    strip_etag(hd->etag);
    hd->size = parse_size(st->linked_size[0] ? st->linked_size : st->length);
}

// ---- requests ----

CURL *hub_easy_new(const struct hub_client *c, const char *url, struct curl_slist **hdrs)
{
    CURL *h = curl_easy_init();
    if (!h)
        return NULL;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, (long)HUB_REDIRECTS);
    /* requests' timeout=(connect, read) as huggingface_hub passes it: a read timeout is
     * "no byte for this long", which curl's low-speed check (< 1 byte/s) approximates */
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, c->etag_timeout_s);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, c->etag_timeout_s);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "mlxcel/0.1 (huggingface_hub-compatible)");
    *hdrs = curl_slist_append(NULL, "Accept-Encoding: identity");
    if (c->token[0]) {
        /* CURLAUTH_BEARER: curl sends it to the first host only, never across a redirect */
        curl_easy_setopt(h, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
        curl_easy_setopt(h, CURLOPT_XOAUTH2_BEARER, c->token);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, *hdrs);
    return h;
}

bool hub_curl_is_transient(CURLcode cc)
{
    return cc == CURLE_PARTIAL_FILE || cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR ||
           cc == CURLE_GOT_NOTHING || cc == CURLE_OPERATION_TIMEDOUT ||
           cc == CURLE_HTTP2 || cc == CURLE_HTTP2_STREAM || cc == CURLE_SSL_CONNECT_ERROR;
}

bool hub_status_is_transient(long s)
{
    return s == 429 || s >= 500;
}

int hub_status_error(const struct hub_client *c, const struct hub_headers *h, const char *what,
                     struct err *e)
{
    const char *code = h->error_code, *msg = h->error_msg;
    char extra[400] = "";
    if (msg[0])
        snprintf(extra, sizeof extra, " (%s)", msg);
    switch (h->status) {
    case 401:
        if (c->token[0])
            return err_setf(e, ERR_IO, "%s: HTTP 401: the token was refused for %s; check HF_TOKEN, --token or "
                            "`huggingface-cli login`%s", what, c->repo, extra);
        return err_setf(e, ERR_IO, "%s: HTTP 401: %s is private or gated, or does not exist; authenticate with "
                        "HF_TOKEN=hf_..., --token or `huggingface-cli login`%s", what, c->repo, extra);
    case 403:
        return err_setf(e, ERR_IO, "%s: HTTP 403: access to %s is denied%s; if it is gated, accept its "
                        "conditions at %s/%s with the account of your token", what, c->repo,
                        strcmp(code, "GatedRepo") == 0 ? " (gated)" : "", c->endpoint, c->repo);
    case 404:
        if (strcmp(code, "RevisionNotFound") == 0)
            return err_setf(e, ERR_MISSING, "%s: HTTP 404: %s has no such revision%s", what, c->repo, extra);
        if (strcmp(code, "EntryNotFound") == 0)
            return err_setf(e, ERR_MISSING, "%s: HTTP 404: no such file in %s%s", what, c->repo, extra);
        return err_setf(e, ERR_MISSING, "%s: HTTP 404: repository %s or its revision was not found on %s%s", what,
                        c->repo, c->endpoint, extra);
    case 429:
        return err_setf(e, ERR_IO, "%s: HTTP 429: rate limited by %s after %d attempts; try again later%s", what,
                        c->endpoint, HUB_ATTEMPTS, extra);
    default:
        if (h->status >= 500)
            return err_setf(e, ERR_IO, "%s: HTTP %ld: server error from %s after %d attempts%s", what, h->status,
                            c->endpoint, HUB_ATTEMPTS, extra);
        return err_setf(e, ERR_IO, "%s: unexpected HTTP %ld from %s%s", what, h->status, c->endpoint, extra);
    }
}

void hub_notice_retry(const struct hub_client *c, const char *what, const char *reason, int attempt,
                      long delay_ms)
{
    if (!c->notice)
        return;
    char line[HUB_NAME_MAX + 512];
    snprintf(line, sizeof line, "%.*s: %.200s; retrying in %.1f s (attempt %d of %d)", HUB_NAME_MAX, what, reason,
             (double)delay_ms / 1000.0, attempt + 1, HUB_ATTEMPTS);
    c->notice(c->ud, line);
}

void hub_curl_reason(char *buf, size_t cap, CURLcode cc, const char *errbuf, long timeout_s, bool download)
{
    const char *var = download ? "HF_HUB_DOWNLOAD_TIMEOUT" : "HF_HUB_ETAG_TIMEOUT";
    if (cc == CURLE_OPERATION_TIMEDOUT && strncmp(errbuf, "Connection timed out", 20) == 0)
        snprintf(buf, cap, "could not connect within %ld s (%s)", timeout_s, var);
    else if (cc == CURLE_OPERATION_TIMEDOUT)
        snprintf(buf, cap, "the server sent nothing for %ld s (%s)", timeout_s, var);
    else
        snprintf(buf, cap, "%s", errbuf[0] ? errbuf : curl_easy_strerror(cc));
}

int hub_curl_error(const struct hub_client *c, CURLcode cc, const char *errbuf, const char *what, int attempts,
                   bool download, struct err *e)
{
    if (cc == CURLE_TOO_MANY_REDIRECTS)
        return err_setf(e, ERR_FORMAT, "%s: more than %d redirects (a redirect loop?)", what, HUB_REDIRECTS);
    char reason[CURL_ERROR_SIZE + 64];
    hub_curl_reason(reason, sizeof reason, cc, errbuf, download ? c->download_timeout_s : c->etag_timeout_s,
                    download);
    return err_setf(e, ERR_IO, "%s: %s (%s)%s", what, reason, c->endpoint,
                    attempts > 1 ? ", after retries" : "");
}

struct body {
    char *buf;
    size_t len, cap, max;
    bool too_long;
};

static size_t on_body(char *data, size_t size, size_t nitems, void *ud)
{
    struct body *b = ud;
    size_t n = size * nitems;
    if (b->len + n > b->max) {
        b->too_long = true;
        return 0;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb)
            return 0;
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, data, n);
    b->len += n;
    b->buf[b->len] = '\0';
    return n;
}

/* One request with retries; head: no body, no absolute redirects. */
static int request(const struct hub_client *c, const char *url, bool head, struct body *b, const char *what,
                   struct hub_headers *hd, struct err *e)
{
    char errbuf[CURL_ERROR_SIZE];
    for (int attempt = 1;; attempt++) {
        struct curl_slist *hl = NULL;
        struct hub_header_state st = {.h = hd};
        memset(hd, 0, sizeof *hd);
        hd->size = -1;
        b->len = 0;
        b->too_long = false;
        errbuf[0] = '\0';
        CURL *h = hub_easy_new(c, url, &hl);
        if (!h) {
            curl_slist_free_all(hl);
            return err_setf(e, ERR_NOMEM, "out of memory");
        }
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, hub_on_header);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, &st);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
        curl_easy_setopt(h, CURLOPT_NOBODY, head ? 1L : 0L);
        curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, head ? 0L : 1L);
        CURLcode cc = curl_easy_perform(h);
        hub_headers_finish(&st, h);
        curl_easy_cleanup(h);
        curl_slist_free_all(hl);
        if (b->too_long)
            return err_setf(e, ERR_FORMAT, "%s: the response is larger than %zu bytes", what, b->max);
        bool transient = cc != CURLE_OK ? hub_curl_is_transient(cc) : hub_status_is_transient(hd->status);
        if (transient && attempt < HUB_ATTEMPTS) {
            char reason[CURL_ERROR_SIZE + 64];
            if (cc != CURLE_OK)
                hub_curl_reason(reason, sizeof reason, cc, errbuf, c->etag_timeout_s, false);
            else
                snprintf(reason, sizeof reason, "HTTP %ld", hd->status);
            hub_notice_retry(c, what, reason, attempt, hub_backoff_ms(c, attempt));
            sleep_ms(hub_backoff_ms(c, attempt));
            continue;
        }
        if (cc != CURLE_OK)
            return hub_curl_error(c, cc, errbuf, what, attempt, false, e);
        return 0;
    }
}

int hub_http_get(const struct hub_client *c, const char *url, size_t max, const char *what, char **body,
                 size_t *len, struct err *e)
{
    struct body b = {.max = max};
    struct hub_headers hd;
    int rc = request(c, url, false, &b, what, &hd, e);
    if (rc == 0 && hd.status != 200)
        rc = hub_status_error(c, &hd, what, e);
    if (rc == 0 && !b.buf)
        b.buf = calloc(1, 1);
    if (rc == 0 && !b.buf)
        rc = err_setf(e, ERR_NOMEM, "out of memory");
    if (rc < 0) {
        free(b.buf);
        return rc;
    }
    *body = b.buf;
    *len = b.len;
    return 0;
}

int hub_http_head(const struct hub_client *c, const char *url, const char *what, struct hub_headers *h,
                  struct err *e)
{
    char cur[4096];
    snprintf(cur, sizeof cur, "%s", url);
    for (int hop = 0;; hop++) {
        struct body b = {.max = 0};
        int rc = request(c, cur, true, &b, what, h, e);
        free(b.buf);
        if (rc < 0)
            return rc;
        bool redirect = h->status >= 300 && h->status < 400;
        if (!redirect || h->etag[0])
            break;
        /* a relative redirect (a renamed repository) stays on the endpoint */
        if (h->location[0] != '/')
            return err_setf(e, ERR_FORMAT, "%s: HTTP %ld redirect without an ETag", what, h->status);
        if (hop >= HUB_REDIRECTS)
            return err_setf(e, ERR_FORMAT, "%s: more than %d redirects (a redirect loop?)", what, HUB_REDIRECTS);
        snprintf(cur, sizeof cur, "%s%s", c->endpoint, h->location);
    }
    if (h->status >= 400)
        return hub_status_error(c, h, what, e);
    return 0;
}
