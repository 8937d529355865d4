/*
 * log: the one logging function. Everything that is not program output goes
 * through log_msg(), which writes one line to a settable sink (stderr by
 * default). Library code logs; it never prints to stdout.
 */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

enum log_level {
    LOG_LEVEL_ERROR = 0,
    LOG_LEVEL_WARN  = 1,
    LOG_LEVEL_INFO  = 2,
    LOG_LEVEL_DEBUG = 3,
};

typedef void (*log_sink_fn)(int level, const char *line, void *ud);

void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_set_level(int level);   /* messages above level are dropped; default WARN */
int  log_get_level(void);
void log_set_sink(log_sink_fn fn, void *ud);  /* NULL restores stderr */

#define LOG_ERR(...)   log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)
#define LOG_WARN(...)  log_msg(LOG_LEVEL_WARN, __VA_ARGS__)
#define LOG_INFO(...)  log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
