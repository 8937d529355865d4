/*
 * base64: RFC 4648 decoding and encoding of untrusted text. Used by the tokenizer
 * (SentencePiece charsmaps, padded standard base64), the server's data: URLs
 * (padding optional, the URL-safe alphabet too) and embeddings' encoding_format.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define B64_URLSAFE 1u  /* also take '-' and '_' for 62 and 63 (RFC 4648 section 5) */
#define B64_PADDED  2u  /* a length that is a multiple of 4, '=' only as its last one or two */

/* The most bytes n characters decode to. */
static inline size_t b64_decoded_max(size_t n)
{
    return n / 4 * 3 + (n % 4) * 3 / 4;
}

/* Decodes s[0, n) into out (room for b64_decoded_max(n) bytes): 0 with *len the bytes
 * written, or -1 with *bad the offset of the first character that is not base64 where it
 * stands (n when the length itself is wrong: n % 4 == 1 unpadded, n % 4 != 0 padded).
 * Without B64_PADDED up to two '=' may end s. */
int b64_decode(const char *s, size_t n, unsigned flags, unsigned char *out, size_t *len, size_t *bad);

/* Characters of in[0, n) encoded with padding. */
static inline size_t b64_encoded_len(size_t n)
{
    return (n + 2) / 3 * 4;
}

/* in[0, n) as standard padded base64 into out (room for b64_encoded_len(n) + 1), NUL-ended. */
void b64_encode(const unsigned char *in, size_t n, char *out);

#ifdef __cplusplus
}
#endif
