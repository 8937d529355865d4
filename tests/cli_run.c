/*
 * cli_run: helpers to drive the mlxcel binary from tests (cli_run.h).
 */
#include "cli_run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

#define MAX_OUT (4u << 20)

const char *cli_bin(void)
{
    const char *b = getenv("MLXCEL_BIN");
    return b && *b ? b : test_path("build/mlxcel");
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *buf = malloc(MAX_OUT);
    assert_non_null(buf);
    size_t n = fread(buf, 1, MAX_OUT - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

int cli_run(const char *env, const char *args, char **out, char **err)
{
    char errpath[] = "/tmp/mlxcel-stderr-XXXXXX";
    int fd = mkstemp(errpath);
    assert_true(fd >= 0);
    close(fd);
    size_t cap = strlen(args) + strlen(cli_bin()) + (env ? strlen(env) : 0) + 64;
    char *cmd = malloc(cap);
    assert_non_null(cmd);
    snprintf(cmd, cap, "%s %s %s 2>%s", env ? env : "", cli_bin(), args, errpath);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char *buf = malloc(MAX_OUT);
    assert_non_null(buf);
    size_t n = fread(buf, 1, MAX_OUT - 1, p);
    buf[n] = '\0';
    int st = pclose(p);
    free(cmd);
    if (out)
        *out = buf;
    else
        free(buf);
    if (err)
        *err = slurp(errpath);
    unlink(errpath);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void cli_expect_error(const char *args, const char *sub)
{
    char *out, *err;
    int rc = cli_run(NULL, args, &out, &err);
    const char *nl = strchr(err, '\n');
    int one_line = nl && nl[1] == '\0';
    if (rc != 1 || !one_line || strncmp(err, "mlxcel ", 7) != 0 || !strstr(err, ": error: ") || !strstr(err, sub))
        fail_msg("mlxcel %s: exit %d, stderr \"%s\" (want exit 1 and one error line with \"%s\")", args, rc,
                 err, sub);
    free(out);
    free(err);
}
