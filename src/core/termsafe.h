/*
 * termsafe: untrusted text made safe to show on a terminal.
 *
 * Names and strings read from files (tensor names, config.json values, chat
 * templates, paths found on disk) and from the network can hold bytes that a
 * terminal acts on: ESC starts CSI/OSC sequences (colours, cursor moves, window
 * titles, OSC 8 links, clipboard writes), BEL rings, a C1 control such as
 * U+009B is a one-character CSI on many terminals, and bidi overrides
 * (U+202A-U+202E, U+2066-U+2069) reorder what is shown ("Trojan Source").
 * Every such string goes through one of these functions before it reaches
 * stderr or a text table on stdout; log_msg() and the CLI's error printer do
 * it for every message, so a message is always one line of valid UTF-8.
 *
 * The escapes: \n, \r, \t for those three; \xNN (two upper-case hex digits)
 * for any other C0 control, DEL and every byte that does not start a valid
 * UTF-8 character; \unnnn (lower-case hex, as JSON and Python write it) for C1
 * controls and bidi controls. A backslash is
 * kept as it is (the output is for people, not to be parsed back).
 */
#pragma once
#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Length of the valid UTF-8 character at s (n bytes left; overlongs, surrogates and
 * code points past U+10FFFF are not valid); 0 when s[0] does not start one. */
size_t termsafe_utf8_len(const char *s, size_t n);

/* The code point of the valid k-byte character at s when it is a C1 or bidi control
 * (escaped as \uNNNN), else 0. For writers that escape in their own syntax (JSON). */
unsigned termsafe_unicode_control(const char *s, size_t k);

/* Escape n bytes of s into dst (cap bytes, always NUL-terminated when cap > 0). An escape
 * or character that does not fit is left out whole, never cut. Returns the length the
 * whole escaped text has (as snprintf does), so a result >= cap means it was cut. */
size_t termsafe_escape(char *dst, size_t cap, const char *s, size_t n);

/* Write the NUL-terminated s to f escaped; returns what fputs returns for the last write
 * (EOF on an error). */
int termsafe_fputs(const char *s, FILE *f);

/* s escaped into buf (cap bytes, cut as termsafe_escape cuts) and returned, for one
 * printf argument: printf("%s\n", termsafe_str(name, buf, sizeof buf)). NULL prints
 * as "(null)". */
const char *termsafe_str(const char *s, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
