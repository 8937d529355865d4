/*
 * fuzz_preprocess: libFuzzer target for the image processors (src/image/preprocess*.c): an
 * untrusted preprocessor_config.json run on a small synthetic image. Input: byte 0 and 1 the
 * image's width and height (1..64), byte 2 bit 0 the backend, the rest the config. Any crash,
 * leak, hang or undefined behaviour is a bug; a refused config or size must leave the output
 * empty with a message; an accepted one must fill exactly the values its shape says.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image/preprocess.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    struct image im = {(uint32_t)(data[0] % 64) + 1, (uint32_t)(data[1] % 64) + 1, NULL, IMAGE_PNG};
    im.rgb = malloc((size_t)im.w * im.h * 3);
    if (!im.rgb)
        return 0;
    for (size_t i = 0; i < (size_t)im.w * im.h * 3; i++)
        im.rgb[i] = (uint8_t)(i * 131 + (i >> 7) * 17);
    struct image_proc_config cfg;
    struct err e = {0};
    if (image_proc_config_parse(&cfg, (const char *)data + 3, size - 3, "gemma3", &e) == 0) {
        cfg.backend = (data[2] & 1) ? IMAGE_BACKEND_PIL : IMAGE_BACKEND_TORCHVISION;
        struct image_pixels px;
        int rc = image_preprocess(&px, &cfg, &im, &e);
        if (rc == 0) {
            size_t want = px.patch_dim ? (size_t)px.n_patches * px.patch_dim
                                       : (size_t)px.n_images * px.channels * px.height * px.width;
            if (!px.pixel_values || px.n_values != want || !px.n_values)
                abort();
            volatile float sink = px.pixel_values[px.n_values - 1];
            (void)sink;
            image_pixels_free(&px);
        } else if (px.pixel_values || !e.msg[0]) {
            abort();
        }
    } else if (!e.msg[0]) {
        abort();
    }
    free(im.rgb);
    return 0;
}
