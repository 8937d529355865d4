/*
 * guard: what stands between a socket and the routes (srv_impl.h, docs/server.md "Limits").
 *
 * Connections. A connection opened while --max-connections are already open is an overflow
 * connection: it has SRV_OVERFLOW_HEAD_S to send its headers, then its request is answered
 * 503 JSON (`Retry-After: 1`, the connection closed), GET /health normally. One opened while
 * SRV_CONN_RESERVE overflow connections are open too is answered 503 at once, before its
 * request is read. libmicrohttpd's own limit is set SRV_CONN_REFUSE above that, since at its
 * limit it accepts and closes without a word. So a flood that fills --max-connections still
 * leaves /health and a clear 503 to everyone else.
 *
 * Deadlines. --timeout (libmicrohttpd's) counts idle time only: a client sending a byte a
 * second holds its connection forever. The watchdog thread looks at every connection each
 * SRV_WATCH_MS and, for a request whose line and headers took longer than --header-timeout
 * or whose whole request (body included) took longer than --request-timeout, writes a 408
 * JSON answer itself and shuts the socket, which ends libmicrohttpd's thread for it. The
 * clock starts when the connection opens or, on a kept-alive connection, at the first byte
 * of the next request (the kernel's count of received bytes, TCP_INFO, tells the watchdog;
 * a kept-alive connection with nothing sent stays under --timeout, as nginx's
 * client_header_timeout and keepalive_timeout split it). Node's http server has the same
 * pair, headersTimeout and requestTimeout, with these defaults (60 s and 300 s).
 * conn_mu orders the watchdog against the request handler (guard_advance): whichever moves a
 * connection's phase first wins, so a request is either answered by its handler or 408'd.
 *
 * The request head (guard_head), checked once the headers are in, before any body byte is
 * read: RFC 9112 framing (Content-Length and Transfer-Encoding, Host), sizes, the Host
 * allowlist against DNS rebinding, Origin and CORS, Content-Type.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "../engine/generate.h"
#include "srv_impl.h"

#define SRV_WATCH_MS 100              /* the watchdog's period: deadlines are this precise */
#define SRV_OVERFLOW_HEAD_S 1         /* seconds an overflow connection has to send its headers */
#define SRV_MAX_HEADER_BYTES (64u << 10)  /* request line + header fields (431 over) */
#define SRV_MAX_URI_BYTES 8192        /* the request target (414 over), as cpp-httplib */
#define SRV_DEFAULT_HEADER_TIMEOUT_S 60
#define SRV_DEFAULT_REQUEST_TIMEOUT_S 300

// ---- connections ----

static void answer_and_shut(struct srv_conn *k, const struct oai_error *err, const char *reason);

/* The kernel's count of bytes received on fd (0 when it cannot tell). */
static uint64_t rx_bytes(MHD_socket fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
        return 0;
    return ti.tcpi_bytes_received;
}

void guard_notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                             enum MHD_ConnectionNotificationCode code)
{
    struct server *s = cls;
    struct srv_conn *k = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci || !(k = calloc(1, sizeof *k)))
            return;  /* untracked: no deadline, never overflow (out of memory only) */
        k->s = s;
        k->fd = ci->connect_fd;
        k->phase = CONN_HEAD;
        k->t_begin = gen_now();
        pthread_mutex_lock(&s->conn_mu);
        k->overflow = s->n_conns >= s->o.max_connections;
        if (s->n_conns >= s->o.max_connections + SRV_CONN_RESERVE) {
            /* past the reserve too: 503 at once, before a byte of the request is read */
            struct oai_error err;
            oai_errorf(&err, 503, "server_error", "too_many_connections", NULL,
                       "the server has --max-connections %d connections open and %d more waiting; "
                       "retry later", s->o.max_connections, SRV_CONN_RESERVE);
            answer_and_shut(k, &err, "Service Unavailable");
        }
        k->next = s->conns;
        if (s->conns)
            s->conns->prev = k;
        s->conns = k;
        s->n_conns++;
        pthread_mutex_unlock(&s->conn_mu);
        *socket_context = k;
        return;
    }
    if (code == MHD_CONNECTION_NOTIFY_CLOSED && k) {
        pthread_mutex_lock(&s->conn_mu);
        if (k->prev)
            k->prev->next = k->next;
        else
            s->conns = k->next;
        if (k->next)
            k->next->prev = k->prev;
        s->n_conns--;
        pthread_mutex_unlock(&s->conn_mu);
        free(k);
        *socket_context = NULL;
    }
}

bool guard_advance(struct srv_req *r, enum srv_conn_phase to)
{
    struct srv_conn *k = r->conn;
    if (!k)
        return true;
    struct server *s = k->s;
    pthread_mutex_lock(&s->conn_mu);
    bool alive = k->phase != CONN_EXPIRED;
    if (alive) {
        if (to == CONN_BODY && k->phase == CONN_IDLE)
            k->t_begin = gen_now();  /* a pipelined request, whole before the watchdog saw it */
        if (to == CONN_IDLE)
            k->rx_mark = rx_bytes(k->fd);
        k->error_json = r->error_json;
        k->phase = to;
    }
    pthread_mutex_unlock(&s->conn_mu);
    return alive;
}

// ---- the watchdog ----

/* Writes an error answer on k's socket and shuts it, so that libmicrohttpd's thread sees the
 * end and closes (conn_mu held: k and its fd are alive, libmicrohttpd closes the fd only after
 * NOTIFY_CLOSED); the handler, if it is ever called, finds the phase CONN_EXPIRED. */
static void answer_and_shut(struct srv_conn *k, const struct oai_error *err, const char *reason)
{
    char *body = k->error_json ? k->error_json(err) : oai_error_json(err);
    if (body) {
        char head[256];
        int n = snprintf(head, sizeof head,
                         "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                         "%sConnection: close\r\n\r\n", err->status, reason, strlen(body),
                         err->status == 503 ? "Retry-After: 1\r\n" : "");
        /* best effort and never blocking: a client that does not read gets the close only */
        if (send(k->fd, head, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL) == n)
            (void)send(k->fd, body, strlen(body), MSG_DONTWAIT | MSG_NOSIGNAL);
        free(body);
    }
    shutdown(k->fd, SHUT_RDWR);
    k->phase = CONN_EXPIRED;
}

/* The 408 of a request past a deadline. */
static void expire(struct srv_conn *k, const char *what, int limit_s, const char *flag)
{
    struct oai_error err;
    oai_errorf(&err, 408, "invalid_request_error", "request_timeout", NULL,
               "the request's %s did not arrive within %d s (%s)", what, limit_s, flag);
    answer_and_shut(k, &err, "Request Timeout");
}

static void watch_once(struct server *s)
{
    int head_s = s->o.header_timeout_s, req_s = s->o.request_timeout_s;
    double now = gen_now();
    pthread_mutex_lock(&s->conn_mu);
    for (struct srv_conn *k = s->conns; k; k = k->next) {
        if (k->phase == CONN_IDLE && rx_bytes(k->fd) > k->rx_mark) {
            k->phase = CONN_HEAD;  /* the next request's first bytes */
            k->t_begin = now;
        }
        double age = now - k->t_begin;
        /* the headers' limit: --header-timeout, or an overflow connection's, and never past
         * --request-timeout */
        int head_limit = k->overflow && SRV_OVERFLOW_HEAD_S < head_s ? SRV_OVERFLOW_HEAD_S : head_s;
        const char *head_flag = k->overflow && SRV_OVERFLOW_HEAD_S < head_s ? "over --max-connections"
                                                                            : "--header-timeout";
        if (head_limit > req_s) {
            head_limit = req_s;
            head_flag = "--request-timeout";
        }
        if (k->phase == CONN_HEAD && age > head_limit)
            expire(k, "line and headers", head_limit, head_flag);
        else if (k->phase == CONN_BODY && age > req_s)
            expire(k, "body", req_s, "--request-timeout");
    }
    pthread_mutex_unlock(&s->conn_mu);
}

static void *watchdog_main(void *arg)
{
    struct server *s = arg;
    while (!atomic_load(&s->watchdog_stop)) {
        struct timespec ts = {0, SRV_WATCH_MS * 1000000L};
        nanosleep(&ts, NULL);
        watch_once(s);
    }
    return NULL;
}

int guard_start(struct server *s, struct err *e)
{
    if (s->o.header_timeout_s <= 0)
        s->o.header_timeout_s = SRV_DEFAULT_HEADER_TIMEOUT_S;
    if (s->o.request_timeout_s <= 0)
        s->o.request_timeout_s = SRV_DEFAULT_REQUEST_TIMEOUT_S;
    atomic_store(&s->watchdog_stop, 0);
    int rc = pthread_create(&s->watchdog, NULL, watchdog_main, s);
    if (rc != 0)
        return err_setf(e, ERR_IO, "cannot start the server's watchdog thread: %s", strerror(rc));
    s->watchdog_started = true;
    return 0;
}

void guard_stop(struct server *s)
{
    if (!s->watchdog_started)
        return;
    atomic_store(&s->watchdog_stop, 1);
    pthread_join(s->watchdog, NULL);
    s->watchdog_started = false;
}

// ---- the request head ----

/* What the header fields say about framing and origin (MHD_get_connection_values). */
struct head_scan {
    int n_cl, n_te, n_host, n_origin, n_ct;
    const char *te, *host, *origin, *ct, *acrm, *acrh;
    bool bad_name;               /* a field name that is not a token (RFC 9110 5.1) */
    bool folded;                 /* a framing field continued on the next line (obs-fold) */
    size_t bytes;                /* field names and values, + 4 per field (": ", CRLF) */
};

static bool is_tchar(unsigned char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static bool is_token(const char *p)
{
    if (!*p)
        return false;
    for (; *p; p++)
        if (!is_tchar((unsigned char)*p))
            return false;
    return true;
}

static enum MHD_Result scan_field(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct head_scan *h = cls;
    (void)kind;
    value = value ? value : "";
    h->bytes += strlen(key) + strlen(value) + 4;
    /* libmicrohttpd 0.9.75 keeps "Content-Length : 5" as the field "Content-Length ", which it
     * then does not read as a length: the body would be taken for the next request */
    if (!is_token(key))
        h->bad_name = true;
    /* libmicrohttpd 0.9.75 appends a continuation line (obs-fold, "Content-Length:\r\n 5") to
     * the field's name, not its value: the field becomes "Content-Length5", the framing field
     * disappears, and a proxy that reads the fold as RFC 9112 5.2 says (a space) would send the
     * body as this request's while this server would read it as the next request. Any name that
     * begins with a framing field's name is refused (400, as RFC 9112 5.2 allows). */
    else if ((strncasecmp(key, "content-length", 14) == 0 && key[14]) ||
             (strncasecmp(key, "transfer-encoding", 17) == 0 && key[17]))
        h->folded = true;
    else if (strcasecmp(key, "content-length") == 0)
        h->n_cl++;
    else if (strcasecmp(key, "transfer-encoding") == 0)
        h->n_te++, h->te = value;
    else if (strcasecmp(key, "host") == 0)
        h->n_host++, h->host = value;
    else if (strcasecmp(key, "origin") == 0)
        h->n_origin++, h->origin = value;
    else if (strcasecmp(key, "content-type") == 0)
        h->n_ct++, h->ct = value;
    else if (strcasecmp(key, "access-control-request-method") == 0)
        h->acrm = value;
    else if (strcasecmp(key, "access-control-request-headers") == 0)
        h->acrh = value;
    return MHD_YES;
}

static enum MHD_Result count_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    *(size_t *)cls += strlen(key) + (value ? strlen(value) + 1 : 0) + 1;
    return MHD_YES;
}

/* Whether value (a Transfer-Encoding field) is exactly the coding "chunked", as
 * libmicrohttpd 0.9.75 reads it: it skips the whitespace before a value but keeps the
 * whitespace after, and reads "chunked " as some other coding, whose body it would wait
 * for until the connection closes. What it does not read as chunked is 501 here. */
static bool is_chunked(const char *v)
{
    while (*v == ' ' || *v == '\t')
        v++;
    return strcasecmp(v, "chunked") == 0;
}

/* Splits a Host value (or an origin's authority, n bytes) into its name (lower case, no
 * trailing dot) and checks the port's syntax; false when malformed. */
static bool split_host(const char *v, size_t n, char *name, size_t cap)
{
    const char *end = v + n, *colon;
    if (n && *v == '[') {
        const char *rb = memchr(v, ']', n);
        if (!rb)
            return false;
        colon = rb + 1 < end ? rb + 1 : NULL;
        if (colon && *colon != ':')
            return false;
        end = rb + 1;
    } else {
        colon = memchr(v, ':', n);
        if (colon)
            end = colon;
    }
    if (colon) {
        const char *p = colon + 1, *pe = v + n;
        long port = 0;
        if (pe - p > 5)
            return false;  /* an empty port is allowed (RFC 3986 3.2.3) */
        for (; p < pe; p++) {
            if (*p < '0' || *p > '9')
                return false;
            port = port * 10 + (*p - '0');
        }
        if (port > 65535)
            return false;
    }
    size_t len = (size_t)(end - v);
    if (len && v[len - 1] == '.')
        len--;
    if (len == 0 || len >= cap)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)v[i];
        if (ch <= ' ' || ch >= 0x7f || ch == '/' || ch == '@' || ch == '\\')
            return false;
        name[i] = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
    }
    name[len] = 0;
    return true;
}

/* Whether host name is one the server answers to: an IP literal (which DNS rebinding cannot
 * produce), localhost or a *.localhost name (RFC 6761: loopback), or --allowed-host. */
static bool host_allowed(const struct server *s, const char *name)
{
    unsigned char buf[sizeof(struct in6_addr)];
    size_t n = strlen(name);
    if (inet_pton(AF_INET, name, buf) == 1)
        return true;
    if (name[0] == '[' && n > 2 && n < 64) {
        char v6[64];
        memcpy(v6, name + 1, n - 2);
        v6[n - 2] = 0;
        if (inet_pton(AF_INET6, v6, buf) == 1)
            return true;
    }
    if (strcmp(name, "localhost") == 0 || (n > 10 && strcmp(name + n - 10, ".localhost") == 0))
        return true;
    for (int i = 0; i < s->o.n_allowed_hosts; i++) {
        const char *a = s->o.allowed_hosts[i];
        size_t an = strlen(a);
        if (strcmp(a, "*") == 0 || strcasecmp(a, name) == 0)
            return true;
        /* ".example.org": example.org and every name under it (as vite's allowedHosts) */
        if (a[0] == '.' && (strcasecmp(a + 1, name) == 0 || (n > an && strcasecmp(name + n - an, a) == 0)))
            return true;
    }
    return false;
}

/* Whether origin (serialized, RFC 6454) is this server's own: http or https with the
 * request's own Host as authority (the page at / fetching the API). */
static bool same_origin(const char *origin, const char *host)
{
    const char *auth = strncasecmp(origin, "http://", 7) == 0    ? origin + 7
                       : strncasecmp(origin, "https://", 8) == 0 ? origin + 8
                                                                 : NULL;
    return auth && host && *host && strcasecmp(auth, host) == 0;
}

/* The --cors-origin entry origin matches ("*" or the origin itself), or NULL. */
static const char *cors_match(const struct server *s, const char *origin)
{
    for (int i = 0; i < s->o.n_cors_origins; i++) {
        const char *o = s->o.cors_origins[i];
        size_t n = strlen(o);
        while (n > 1 && o[n - 1] == '/')
            n--;  /* "http://x.org/" as "http://x.org" */
        if (strcmp(o, "*") == 0 || (strlen(origin) == n && strncasecmp(o, origin, n) == 0))
            return o;
    }
    return NULL;
}

/* Whether a Content-Type value is application/json, with or without parameters. */
static bool is_json_type(const char *v)
{
    while (*v == ' ' || *v == '\t')
        v++;
    if (strncasecmp(v, "application/json", 16) != 0)
        return false;
    v += 16;
    while (*v == ' ' || *v == '\t')
        v++;
    return *v == 0 || *v == ';';
}

/* A list of header names (Access-Control-Request-Headers): tokens, commas, spaces only. */
static bool is_name_list(const char *v)
{
    size_t n = 0;
    for (; *v; v++, n++)
        if (!is_tchar((unsigned char)*v) && *v != ',' && *v != ' ' && *v != '\t')
            return false;
    return n < 1024;
}

/* The answer to OPTIONS on a known route: 204 with Allow and, for an allowed cross-origin
 * preflight, the Access-Control-Allow-* fields. kind NONE: "OPTIONS *", the server as a
 * whole (RFC 9110 9.3.7): every method it implements. */
static int answer_options(struct MHD_Connection *c, struct srv_req *r, enum srv_route_kind kind,
                          const struct head_scan *h)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return -1;
    const char *methods = kind == ROUTE_KIND_POST  ? "POST, OPTIONS"
                          : kind == ROUTE_KIND_GET ? "GET, HEAD, OPTIONS"
                                                   : "GET, HEAD, POST, OPTIONS";
    bool ok = MHD_add_response_header(resp, "Allow", methods) == MHD_YES;
    if (r->cors_origin[0] && h->acrm) {
        const char *hdrs = h->acrh && is_name_list(h->acrh) ? h->acrh
                                                            : "authorization, content-type, x-api-key, anthropic-version";
        ok = ok && MHD_add_response_header(resp, "Access-Control-Allow-Methods", methods) == MHD_YES &&
             MHD_add_response_header(resp, "Access-Control-Allow-Headers", hdrs) == MHD_YES &&
             MHD_add_response_header(resp, "Access-Control-Max-Age", "600") == MHD_YES;
    }
    enum MHD_Result q = ok ? srv_queue(c, r, 204, resp) : MHD_NO;
    MHD_destroy_response(resp);
    return q == MHD_YES ? 1 : -1;
}

/* 400/501 for framing RFC 9112 cannot read safely; the connection closes after the answer. */
static int check_framing(struct srv_req *r, const struct head_scan *h, const char *version, struct oai_error *err)
{
    const char *inv = "invalid_request_error";
    r->must_close = true;
    if (h->bad_name)
        return oai_errorf(err, 400, inv, NULL, NULL, "a header field name is not a token (RFC 9110 5.1)");
    if (h->folded)
        return oai_errorf(err, 400, inv, NULL, NULL,
                          "a Content-Length or Transfer-Encoding field continued on the next line (obs-fold, "
                          "RFC 9112 5.2)");
    if (h->n_te && strcmp(version, "HTTP/1.0") == 0)
        return oai_errorf(err, 400, inv, NULL, NULL, "Transfer-Encoding in an HTTP/1.0 request (RFC 9112 6.1)");
    if (h->n_te && h->n_cl)
        return oai_errorf(err, 400, inv, NULL, NULL,
                          "both Content-Length and Transfer-Encoding: the framing is ambiguous (RFC 9112 6.1)");
    if (h->n_cl > 1)
        return oai_errorf(err, 400, inv, NULL, NULL, "more than one Content-Length field (RFC 9112 6.3)");
    if (h->n_te > 1 || (h->n_te && !is_chunked(h->te)))
        return oai_errorf(err, 501, inv, "unsupported_transfer_encoding", NULL,
                          "Transfer-Encoding other than chunked is not implemented (RFC 9112 6.1)");
    bool v11 = strcmp(version, "HTTP/1.0") != 0;  /* libmicrohttpd passes 1.x only */
    if ((v11 && h->n_host == 0) || h->n_host > 1)
        return oai_errorf(err, 400, inv, NULL, NULL, h->n_host ? "more than one Host field (RFC 9112 3.2)"
                                                                : "an HTTP/1.1 request without Host (RFC 9112 3.2)");
    r->must_close = false;
    return 0;
}

int guard_head(struct server *s, struct MHD_Connection *c, struct srv_req *r, const char *url, const char *authority,
               const char *method, const char *version, enum srv_route_kind kind, bool health,
               struct oai_error *err)
{
    struct head_scan h = {0};
    const char *inv = "invalid_request_error";
    MHD_get_connection_values(c, MHD_HEADER_KIND, scan_field, &h);
    if (check_framing(r, &h, version, err) < 0)
        return -1;

    size_t uri = strlen(url);
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, count_arg, &uri);
    if (uri > SRV_MAX_URI_BYTES) {
        r->must_close = true;
        return oai_errorf(err, 414, inv, NULL, NULL, "the request target is longer than %d bytes", SRV_MAX_URI_BYTES);
    }
    if (h.bytes + uri + strlen(method) > SRV_MAX_HEADER_BYTES) {
        r->must_close = true;
        return oai_errorf(err, 431, inv, NULL, NULL, "the request line and headers are larger than %u bytes",
                          SRV_MAX_HEADER_BYTES);
    }

    /* an absolute-form target's authority stands for Host (RFC 9112 3.2.2: a Host field
     * then is ignored), for the allowlist and the same-origin check alike */
    char name[256];
    const char *host = authority ? authority : h.host;
    if (host && !(split_host(host, strlen(host), name, sizeof name) && host_allowed(s, name)))
        return oai_errorf(err, 403, inv, "host_not_allowed", NULL,
                          "%s '%.100s' is not allowed: this server answers IP addresses, localhost and "
                          "--allowed-host names (against DNS rebinding)",
                          authority ? "the request target's authority" : "Host", host);

    if (h.n_origin > 1)
        return oai_errorf(err, 403, inv, "origin_not_allowed", NULL, "more than one Origin field");
    if (h.origin) {
        const char *m = cors_match(s, h.origin);
        if (m)
            snprintf(r->cors_origin, sizeof r->cors_origin, "%s", strcmp(m, "*") == 0 ? "*" : h.origin);
        else if (!same_origin(h.origin, host))
            return oai_errorf(err, 403, inv, "origin_not_allowed", NULL,
                              "cross-origin requests from '%.100s' are not allowed (start the server with "
                              "--cors-origin %.100s to allow them)", h.origin, h.origin);
        if (m && strlen(h.origin) >= sizeof r->cors_origin)
            return oai_errorf(err, 403, inv, "origin_not_allowed", NULL, "the Origin field is too long");
    }

    /* RFC 9110 9.1: methods are case-sensitive, and one the server does not recognize is 501
     * ("get", "FOO"); a standard method it does not implement on a known path is 405 there */
    static const char *const k_known[] = {"GET", "HEAD", "POST", "OPTIONS", "PUT", "DELETE", "PATCH",
                                          "CONNECT", "TRACE"};
    bool known = false;
    for (size_t i = 0; i < sizeof k_known / sizeof k_known[0]; i++)
        known |= strcmp(method, k_known[i]) == 0;
    if (!known)
        return oai_errorf(err, 501, inv, "method_not_implemented", NULL,
                          "the method '%.32s' is not implemented: GET, HEAD, POST and OPTIONS are (methods are "
                          "case-sensitive, RFC 9110 9.1)", method);
    /* the asterisk-form target is for OPTIONS only (RFC 9112 3.2.4): 204 with the server's
     * methods in Allow, as for a path */
    bool star = strcmp(url, "*") == 0;
    if (star && strcmp(method, "OPTIONS") != 0)
        return oai_errorf(err, 400, inv, NULL, NULL, "the request target '*' is for OPTIONS only (RFC 9112 3.2.4)");
    if (strcmp(method, "OPTIONS") == 0 && (kind != ROUTE_KIND_NONE || star))
        return answer_options(c, r, kind, &h) > 0 ? 1 : oai_errorf(err, 500, "server_error", NULL, NULL,
                                                                     "out of memory");

    if (r->conn && r->conn->overflow && !health) {
        r->must_close = true;
        return oai_errorf(err, 503, "server_error", "too_many_connections", NULL,
                          "the server has --max-connections %d connections open; retry later",
                          s->o.max_connections);
    }

    if (kind == ROUTE_KIND_POST && strcmp(method, "POST") == 0 && !(h.n_ct == 1 && is_json_type(h.ct)))
        return oai_errorf(err, 415, inv, "unsupported_media_type", NULL,
                          "the body must be sent as 'Content-Type: application/json' (got %s%.100s%s)",
                          h.ct ? "'" : "", h.ct ? h.ct : "none", h.ct ? "'" : "");
    return 0;
}
