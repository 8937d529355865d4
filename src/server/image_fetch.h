/*
 * image_fetch: an image part's http(s) URL fetched with libcurl, only when the operator
 * started the server with `serve --allow-image-urls` (docs/server.md, "Images"). Bounded: the
 * body's bytes (a larger Content-Length is refused before it is read), the whole transfer's
 * seconds, redirects (each http or https); nothing of the client's request is forwarded (no
 * credentials, cookies, .netrc or proxy from the environment: the fetch goes out directly as
 * "mlxcel"), and an HTTP status >= 400 is an error.
 */
#pragma once
#include <stddef.h>

#include "../core/err.h"

#define IMAGE_FETCH_TIMEOUT_S 10   /* the whole transfer, redirects included */
#define IMAGE_FETCH_CONNECT_S 5
#define IMAGE_FETCH_REDIRECTS 3

/* url's body into *out (malloc'd, *n bytes, 1 .. max_bytes). ERR_IO (connection, status,
 * timeout: the message says which), ERR_RANGE (over max_bytes), ERR_NOMEM. */
int image_fetch(const char *url, size_t max_bytes, unsigned char **out, size_t *n, struct err *e);
