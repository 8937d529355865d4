/*
 * fuzz_safetensors: libFuzzer target for the safetensors reader.
 *
 * The input is a whole .safetensors file. Every input goes through
 * st_header_parse() on the header bytes twice: with the data-section length
 * the file would have (a header length past the end is clamped to what is
 * there, so the JSON parser still sees mutated bytes), and with a data
 * section of 2^53 bytes, the largest offset the format allows, so headers cut
 * from real checkpoints (whose data is not in the input) still reach the
 * shape, overlap and duplicate checks. Then the loader's answer is
 * checked against the format's invariants: any accepted tensor must have a
 * known dtype, at most ST_MAX_DIMS dims, shape x itemsize == end - begin,
 * end inside the data section, a name no other tensor has, and no byte shared
 * with another tensor. A violated invariant traps, so logic bugs count as
 * crashes, not only memory errors.
 *
 * Inputs whose last byte is a multiple of 4 (a quarter, chosen by the input so
 * the fuzzer can steer it) also go through the real file path: written to a
 * memfd, opened with st_set_open_file() via /proc/self/fd, and every tensor
 * taken and read, which exercises the 8-byte length checks, the mmap views
 * and st_set_take. Nothing touches the disk.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/safetensors.h"

/* Beyond this many tensors the quadratic overlap re-check is skipped. */
#define FUZZ_MAX_PAIRWISE 512

static uint64_t read_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Trap unless the accepted tensors t[0..n) obey the format for data_len bytes. */
static void check_invariants(const struct st_tensor *t, size_t n, uint64_t data_len)
{
    for (size_t i = 0; i < n; i++) {
        if ((unsigned)t[i].dtype >= DTYPE_COUNT || t[i].ndim < 0 || t[i].ndim > ST_MAX_DIMS)
            __builtin_trap();
        unsigned __int128 bytes = dtype_size(t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++) {
            if (t[i].shape[d] < 0)
                __builtin_trap();
            bytes *= (uint64_t)t[i].shape[d];
            if (bytes >> 64)
                __builtin_trap(); /* would have overflowed the loader's arithmetic */
        }
        if (t[i].begin > t[i].end || t[i].end > data_len || bytes != t[i].end - t[i].begin)
            __builtin_trap();
        if (i > 0 && strcmp(t[i - 1].name, t[i].name) >= 0)
            __builtin_trap(); /* sorted by name, no duplicates */
    }
    if (n > FUZZ_MAX_PAIRWISE)
        return;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (t[i].begin < t[i].end && t[j].begin < t[j].end && /* an empty tensor owns no byte */
                t[i].begin < t[j].end && t[j].begin < t[i].end)
                __builtin_trap();
}

static void fuzz_header(const char *json, size_t json_len, uint64_t data_len)
{
    struct st_tensor *t = NULL;
    size_t n = 0;
    struct err e = {0};
    if (st_header_parse(json, json_len, data_len, &t, &n, &e) == 0) {
        check_invariants(t, n, data_len);
    } else if (t || n || e.code == ERR_OK || e.msg[0] == '\0') {
        __builtin_trap(); /* failures must say why and hand nothing back */
    }
    st_tensors_free(t, n);
}

static void fuzz_file(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz_safetensors", MFD_CLOEXEC);
    if (fd < 0)
        return;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0)
            goto out;
        off += (size_t)w;
    }
    struct st_set *s = NULL;
    struct err e = {0};
    if (st_set_open_file(&s, path, &e) < 0) {
        if (s)
            __builtin_trap();
        goto out;
    }
    uint64_t data_len = size - 8 - read_le64(data);
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < st_set_count(s); i++) {
        const struct st_tensor *st = st_set_at(s, i);
        if (st_set_find(s, st->name) != st)
            __builtin_trap();
        if (st->end > data_len)
            __builtin_trap();
        /* touch every byte of the view: outside the mapping would fault */
        for (uint64_t b = 0; b < st->end - st->begin; b++)
            sink ^= ((const uint8_t *)st->data)[b];
        struct tensor v;
        if (st_set_take(s, st->name, &v, &e) < 0)
            st_set_mark(s, st->name);
    }
    (void)sink;
    if (st_set_n_unused(s) != 0)
        __builtin_trap();
    st_set_free(s);
out:
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size >= 8) {
        uint64_t hlen = read_le64(data);
        size_t avail = size - 8;
        size_t json_len = hlen < avail ? (size_t)hlen : avail;
        fuzz_header((const char *)data + 8, json_len, avail - json_len);
        fuzz_header((const char *)data + 8, json_len, UINT64_C(1) << 53);
    }
    if (size == 0 || data[size - 1] % 4 == 0)
        fuzz_file(data, size);
    return 0;
}
