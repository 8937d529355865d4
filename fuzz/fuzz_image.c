/*
 * fuzz_image: libFuzzer target for image_decode (src/image): JPEG, PNG, WebP
 * and GIF bytes under small limits (1 MiB, 2048 a side, 1 M pixels, so a
 * bomb inside them stays cheap). Any crash, leak, hang or undefined behaviour
 * is a bug. A decoded image must lie within the limits and have its pixels;
 * a refused one must leave the image empty with an error message of a kind
 * the API maps to a 400 (format or range).
 */
#include <stdint.h>
#include <stdlib.h>

#include "image/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct image_limits lim = {1 << 20, 2048, 1 << 20};
    struct image im;
    struct err e = {0};
    int rc = image_decode(&im, data, size, &lim, &e);
    if (rc == 0) {
        if (!im.rgb || im.w < 1 || im.h < 1 || im.w > lim.max_side || im.h > lim.max_side ||
            (uint64_t)im.w * im.h > lim.max_pixels)
            abort();
        volatile uint8_t sink = im.rgb[(size_t)im.w * im.h * 3 - 1];  /* the last byte is there */
        (void)sink;
        image_free(&im);
    } else if (im.rgb || !e.msg[0] || (e.code != ERR_FORMAT && e.code != ERR_RANGE && e.code != ERR_NOMEM)) {
        abort();
    }
    return 0;
}
