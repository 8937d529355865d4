/*
 * sha256: FIPS 180-4 SHA-256, streaming. Used to verify downloaded weights
 * against the sha256 the Hugging Face Hub publishes for large (LFS) files.
 * A portable scalar implementation: hashing runs at a few hundred MB/s, well
 * above download speeds, so no ISA variants.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct sha256 {
    uint32_t h[8];
    uint64_t n_bytes;      /* total bytes fed */
    uint8_t  buf[64];      /* pending partial block */
    size_t   n_buf;
};

void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t len);
/* Finish and write the digest as 64 lowercase hex digits plus NUL into hex[65]. */
void sha256_final_hex(struct sha256 *s, char hex[65]);

#ifdef __cplusplus
}
#endif
