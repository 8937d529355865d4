/*
 * log: one sink, one level, set at startup (the only mutable globals besides
 * the kernel dispatch table).
 *
 * Messages quote names read from files and requests (tensor names, config
 * values, paths), so each line is escaped (termsafe.h) before it reaches
 * the sink: a name holding ESC, BEL or a newline shows as \x1B, \x07, \n
 * and cannot drive the terminal or forge a second log line.
 */
#include "log.h"

#include "termsafe.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int g_level = LOG_LEVEL_WARN;
static log_sink_fn g_sink;
static void *g_sink_ud;

void log_set_level(int level) { g_level = level; }
int log_get_level(void) { return g_level; }

void log_set_sink(log_sink_fn fn, void *ud)
{
    g_sink = fn;
    g_sink_ud = ud;
}

void log_msg(int level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (level > g_level)
        return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char safe[4096];
    termsafe_escape(safe, sizeof safe, line, strlen(line));
    if (g_sink) {
        g_sink(level, safe, g_sink_ud);
        return;
    }
    if (level < 0 || level > LOG_LEVEL_DEBUG)
        level = LOG_LEVEL_DEBUG;
    fprintf(stderr, "mlxcel: %s: %s\n", names[level], safe);
}
