/*
 * image: decoding equals what transformers' load_image gets from PIL
 * (tests/fixtures/images/expected.json, made by tests/fixtures/gen/gen_images.py
 * with Debian's Pillow: per file the RGB bytes' SHA-256 after exif_transpose
 * and convert("RGB"), or the fact that PIL refuses it); hostile files and
 * every limit give a clear error of the right kind.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/sha256.h"
#include "image/image_impl.h"
#include "test.h"

static const char *img_path(const char *name)
{
    static char p[4][512];
    static int k;
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/images/%s", name);
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s", test_path(rel));
    return p[k];
}

static cJSON *expected(void)
{
    char *txt = NULL;
    size_t n = 0;
    struct err e = {0};
    if (file_read_all(img_path("expected.json"), 1 << 20, &txt, &n, &e) < 0)
        fail_msg("%s", e.msg);
    cJSON *j = cJSON_ParseWithLength(txt, n);
    free(txt);
    assert_non_null(j);
    return j;
}

static void rgb_sha(const struct image *im, char hex[65])
{
    struct sha256 s;
    sha256_init(&s);
    sha256_update(&s, im->rgb, (size_t)im->w * im->h * 3);
    sha256_final_hex(&s, hex);
}

/* Every fixture: PIL's bytes, or an error where PIL refuses the file. */
static void test_as_pil(void **state)
{
    (void)state;
    cJSON *j = expected();
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files");
    int n_ok = 0, n_err = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, files) {
        struct image im;
        struct err e = {0};
        int rc = image_load(&im, img_path(f->string), NULL, &e);
        const cJSON *perr = cJSON_GetObjectItemCaseSensitive(f, "error");
        if (perr) {
            if (rc == 0)
                fail_msg("%s: decoded (%u x %u), but PIL refuses it (%s)", f->string, im.w, im.h, perr->valuestring);
            assert_true(e.msg[0] != 0);
            assert_true(e.code == ERR_FORMAT || e.code == ERR_RANGE);
            assert_null(im.rgb);
            printf("image %-22s refused: %s\n", f->string, e.msg);
            n_err++;
            continue;
        }
        if (rc < 0)
            fail_msg("%s: %s", f->string, e.msg);
        int w = cJSON_GetObjectItemCaseSensitive(f, "w")->valueint;
        int h = cJSON_GetObjectItemCaseSensitive(f, "h")->valueint;
        if ((int)im.w != w || (int)im.h != h)
            fail_msg("%s: %u x %u, PIL %d x %d", f->string, im.w, im.h, w, h);
        char hex[65];
        rgb_sha(&im, hex);
        if (strcmp(hex, cJSON_GetObjectItemCaseSensitive(f, "sha256")->valuestring) != 0)
            fail_msg("%s (%s, %u x %u): the RGB bytes differ from PIL's", f->string, image_format_name(im.format),
                     im.w, im.h);
        image_free(&im);
        n_ok++;
    }
    printf("image: %d files equal PIL's RGB, %d refused as PIL refuses them\n", n_ok, n_err);
    assert_true(n_ok >= 25 && n_err >= 8);
    cJSON_Delete(j);
}

static int load_with(const char *name, struct image_limits lim, struct err *e)
{
    struct image im;
    int rc = image_load(&im, img_path(name), &lim, e);
    image_free(&im);
    return rc;
}

/* Each limit stops a file just over it, with ERR_RANGE, and passes one at it. */
static void test_limits(void **state)
{
    (void)state;
    static const char *const files[] = {"photo.jpg", "edges.png", "photo.webp", "edges.gif"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        struct image im;
        struct err e = {0};
        assert_int_equal(image_load(&im, img_path(files[i]), NULL, &e), 0);
        struct image_limits at = {IMAGE_MAX_BYTES_DEFAULT, im.w > im.h ? im.w : im.h, (uint64_t)im.w * im.h};
        image_free(&im);
        assert_int_equal(load_with(files[i], at, &e), 0);
        struct image_limits side = at, px = at;
        side.max_side--;
        px.max_pixels--;
        err_clear(&e);
        assert_int_equal(load_with(files[i], side, &e), -ERR_RANGE);
        assert_non_null(strstr(e.msg, "side over the limit"));
        err_clear(&e);
        assert_int_equal(load_with(files[i], px, &e), -ERR_RANGE);
        assert_non_null(strstr(e.msg, "pixels, over the limit"));
    }
    /* bytes: a file one byte over the limit is refused before decoding */
    char *buf = NULL;
    size_t n = 0;
    struct err e = {0};
    assert_int_equal(file_read_all(img_path("photo.jpg"), 1 << 20, &buf, &n, &e), 0);
    struct image im;
    struct image_limits lim = image_limits_default();
    lim.max_bytes = n - 1;
    assert_int_equal(image_decode(&im, buf, n, &lim, &e), -ERR_RANGE);
    assert_non_null(strstr(e.msg, "bytes, over the limit"));
    lim.max_bytes = n;
    assert_int_equal(image_decode(&im, buf, n, &lim, &e), 0);
    image_free(&im);
    free(buf);
    /* the bombs are refused by their header, with the size in the message */
    err_clear(&e);
    assert_int_equal(load_with("huge_header.png", image_limits_default(), &e), -ERR_RANGE);
    assert_non_null(strstr(e.msg, "60000"));
    err_clear(&e);
    assert_int_equal(load_with("bomb.png", image_limits_default(), &e), -ERR_RANGE);
}

/* Truncation at every length of a small file of each format: refused (ERR_FORMAT) up to
 * some length and the whole image from there on (only an animation's later frames, or
 * chunks past the image data, may be missing), never a crash or a partial image. */
static void test_every_truncation(void **state)
{
    (void)state;
    static const char *const files[] = {"photo.jpg", "photo_progressive.jpg", "edges.png", "interlaced.png",
                                        "exif8.png", "photo.webp", "animated.webp", "edges.gif", "animated.gif"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *buf = NULL;
        size_t n = 0;
        struct err e = {0};
        assert_int_equal(file_read_all(img_path(files[i]), 1 << 20, &buf, &n, &e), 0);
        struct image full;
        assert_int_equal(image_decode(&full, buf, n, NULL, &e), 0);
        char want[65];
        rgb_sha(&full, want);
        size_t first_ok = n;
        for (size_t len = 0; len < n; len++) {
            struct image im;
            err_clear(&e);
            char *cut = malloc(len ? len : 1);
            memcpy(cut, buf, len);
            int rc = image_decode(&im, cut, len, NULL, &e);
            free(cut);
            if (rc == 0) {
                char hex[65];
                rgb_sha(&im, hex);
                image_free(&im);
                if (strcmp(hex, want) != 0)
                    fail_msg("%s cut to %zu of %zu bytes: decoded an image that is not the whole one", files[i],
                             len, n);
                if (first_ok == n)
                    first_ok = len;
            } else if (first_ok < n) {
                fail_msg("%s: whole at %zu bytes, refused at %zu: %s", files[i], first_ok, len, e.msg);
            } else if (e.code != ERR_FORMAT || !e.msg[0]) {
                fail_msg("%s cut to %zu bytes: error %s '%s'", files[i], len, err_code_name(e.code), e.msg);
            }
        }
        printf("image %-22s refused when cut to under %zu of %zu bytes\n", files[i], first_ok, n);
        assert_true(first_ok > n / 5);  /* an animation's first frame may end early in the file */
        image_free(&full);
        free(buf);
    }
}

/* Every single-byte change of the first 400 bytes of each small file: whatever comes out,
 * no crash, no hang, and a success is an image within the limits. */
static void test_byte_flips(void **state)
{
    (void)state;
    static const char *const files[] = {"photo.jpg", "edges.png", "palette4.png", "photo.webp", "edges.gif",
                                        "exif6.jpg"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *buf = NULL;
        size_t n = 0;
        struct err e = {0};
        assert_int_equal(file_read_all(img_path(files[i]), 1 << 20, &buf, &n, &e), 0);
        for (size_t at = 0; at < n && at < 400; at++) {
            static const uint8_t xo[] = {0x01, 0x80, 0xff};
            for (size_t k = 0; k < sizeof xo; k++) {
                buf[at] = (char)(buf[at] ^ xo[k]);
                struct image im;
                struct image_limits lim = {1 << 20, 4096, 1 << 20};
                err_clear(&e);
                if (image_decode(&im, buf, n, &lim, &e) == 0) {
                    assert_true(im.w >= 1 && im.h >= 1 && im.w <= 4096 && (uint64_t)im.w * im.h <= (1 << 20));
                    image_free(&im);
                } else {
                    assert_true(e.msg[0] != 0);
                }
                buf[at] = (char)(buf[at] ^ xo[k]);
            }
        }
        free(buf);
    }
}

static void test_sniff_and_orientation(void **state)
{
    (void)state;
    assert_int_equal(image_sniff("\xff\xd8\xff", 3), IMAGE_JPEG);
    assert_int_equal(image_sniff("\x89PNG\r\n\x1a\n", 8), IMAGE_PNG);
    assert_int_equal(image_sniff("RIFF\0\0\0\0WEBP", 12), IMAGE_WEBP);
    assert_int_equal(image_sniff("GIF89a", 6), IMAGE_GIF);
    assert_int_equal(image_sniff("GIF89", 5), IMAGE_UNKNOWN);
    assert_int_equal(image_sniff("BM", 2), IMAGE_UNKNOWN);
    /* the orientation of a hand-made TIFF block, both byte orders; bad ones read as 1 */
    static const uint8_t le[] = {'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0, 0x12, 0x01, 3, 0, 1, 0, 0, 0, 6, 0, 0, 0};
    static const uint8_t be[] = {'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1, 0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 8, 0, 0};
    assert_int_equal(img_exif_orientation(le, sizeof le), 6);
    assert_int_equal(img_exif_orientation(be, sizeof be), 8);
    assert_int_equal(img_exif_orientation(le, sizeof le - 4), 1);  /* the entry cut short */
    uint8_t far[sizeof le];
    memcpy(far, le, sizeof le);
    far[4] = 0xf0;  /* IFD offset past the end */
    assert_int_equal(img_exif_orientation(far, sizeof far), 1);
    memcpy(far, le, sizeof le);
    far[18] = 9;  /* no such orientation */
    assert_int_equal(img_exif_orientation(far, sizeof far), 1);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_as_pil),
    cmocka_unit_test(test_limits),
    cmocka_unit_test(test_every_truncation),
    cmocka_unit_test(test_byte_flips),
    cmocka_unit_test(test_sniff_and_orientation),
};

TEST_SUITE(image, tests);
