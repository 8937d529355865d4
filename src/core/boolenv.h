/*
 * boolenv: the one spelling of an on/off setting (MLXCEL_FAST, MLXCEL_MMAP,
 * MLXCEL_FUSED_MOE, ...). "1", "true", "yes", "on" mean on and "0", "false",
 * "no", "off" mean off, in any ASCII case (huggingface_hub's and systemd's
 * words); anything else is no setting at all, which the CLI refuses at
 * startup (src/cli/main.c) so a typo never silently picks one side.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 (on), 0 (off) or -1 (not one of the eight words, or NULL). */
static inline int boolenv_parse(const char *s)
{
    static const char *const k_words[] = {"1", "true", "yes", "on", "0", "false", "no", "off"};
    for (size_t w = 0; s && w < sizeof k_words / sizeof k_words[0]; w++) {
        const char *a = s, *b = k_words[w];
        while (*a && *b && (*a == *b || (*a >= 'A' && *a <= 'Z' && *a + 32 == *b))) {
            a++;
            b++;
        }
        if (!*a && !*b)
            return w < 4 ? 1 : 0;
    }
    return -1;
}

#ifdef __cplusplus
}
#endif
