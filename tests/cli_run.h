/*
 * cli_run: run the real `mlxcel` binary from a test ($MLXCEL_BIN, set by
 * CTest; build/mlxcel otherwise) and capture what it printed.
 */
#pragma once
#include <stddef.h>

/* Path of the binary under test. */
const char *cli_bin(void);
/* Run `sh -c "<env> <bin> <args>"`; *out gets stdout (malloc'd, NUL-terminated) and, when
 * err is non-NULL, *err gets stderr. Returns the exit status (-1 if killed). */
int cli_run(const char *env, const char *args, char **out, char **err);
/* Require a failed run: exit status 1 and exactly one line on stderr of the form
 * "mlxcel <cmd>: error: ..." containing sub. Fails the current test otherwise. */
void cli_expect_error(const char *args, const char *sub);
