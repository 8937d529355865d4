/*
 * image_fetch: an image URL through libcurl, bounded (image_fetch.h).
 */
#include "image_fetch.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

struct sink {
    unsigned char *p;
    size_t n, cap, max;
    bool over;
};

static size_t on_data(char *data, size_t size, size_t nmemb, void *ud)
{
    struct sink *s = ud;
    size_t n = size * nmemb;
    if (n > s->max - s->n) {
        s->over = true;
        return 0;  /* aborts the transfer */
    }
    if (s->n + n > s->cap) {
        size_t cap = s->cap ? s->cap : 64 << 10;
        while (cap < s->n + n)
            cap *= 2;
        cap = cap < s->max ? cap : s->max;
        unsigned char *p = realloc(s->p, cap);
        if (!p)
            return 0;
        s->p = p;
        s->cap = cap;
    }
    memcpy(s->p + s->n, data, n);
    s->n += n;
    return n;
}

int image_fetch(const char *url, size_t max_bytes, unsigned char **out, size_t *n, struct err *e)
{
    struct sink s = {.max = max_bytes};
    char ebuf[CURL_ERROR_SIZE] = "";
    long status = 0;
    int rc = 0;
    *out = NULL;
    *n = 0;
    CURL *c = curl_easy_init();
    if (!c)
        return err_setf(e, ERR_NOMEM, "cannot start a transfer");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, (long)IMAGE_FETCH_REDIRECTS);
    curl_easy_setopt(c, CURLOPT_UNRESTRICTED_AUTH, 0L);
    curl_easy_setopt(c, CURLOPT_NETRC, (long)CURL_NETRC_IGNORED);
    curl_easy_setopt(c, CURLOPT_PROXY, "");  /* not the environment's */
    curl_easy_setopt(c, CURLOPT_USERAGENT, "mlxcel");
    curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)IMAGE_FETCH_TIMEOUT_S);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, (long)IMAGE_FETCH_CONNECT_S);
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max_bytes);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, ebuf);
    CURLcode cc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (s.over || cc == CURLE_FILESIZE_EXCEEDED)
        rc = err_setf(e, ERR_RANGE, "the image at the URL is over %zu bytes", max_bytes);
    else if (cc == CURLE_HTTP_RETURNED_ERROR)
        rc = err_setf(e, ERR_IO, "fetching the image URL: HTTP status %ld", status);
    else if (cc == CURLE_OPERATION_TIMEDOUT)
        rc = err_setf(e, ERR_IO, "fetching the image URL took over %d seconds", IMAGE_FETCH_TIMEOUT_S);
    else if (cc == CURLE_TOO_MANY_REDIRECTS)
        rc = err_setf(e, ERR_IO, "fetching the image URL: more than %d redirects", IMAGE_FETCH_REDIRECTS);
    else if (cc != CURLE_OK)
        rc = err_setf(e, ERR_IO, "fetching the image URL: %s", ebuf[0] ? ebuf : curl_easy_strerror(cc));
    else if (s.n == 0)
        rc = err_setf(e, ERR_IO, "the image URL answered no bytes");
    curl_easy_cleanup(c);
    if (rc < 0) {
        free(s.p);
        return rc;
    }
    *out = s.p;
    *n = s.n;
    return 0;
}
