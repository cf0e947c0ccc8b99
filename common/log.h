/* SPDX-License-Identifier: MIT */
/* Logging for mrd, libmrd and mrctl: one line per message at a syslog priority, to stderr (with
 * a "<N>" prefix journald parses) or to syslog once a daemon detaches. */
#pragma once

#include <stdbool.h>

#include "macro.h"

/* Syslog priorities, so a journald stream can parse our "<N>" prefixes. */
enum log_level {
	LOG_LEVEL_SILENT = 0, /* nothing, not even errors (libmrd's default) */
	LOG_LEVEL_ERR = 3,
	LOG_LEVEL_WARNING = 4,
	LOG_LEVEL_NOTICE = 5,
	LOG_LEVEL_INFO = 6,
	LOG_LEVEL_DEBUG = 7,
};

void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* Name used in each line ("mrd", "libmrd", "mrctl"). */
void log_set_ident(const char *ident);
/* From now on lines go to syslog (a detached daemon has no stderr), unless a log file is open. */
void log_open_syslog(void);
/* From now on lines go to path (appended, with time, ident, pid and level), also once
 * detached; opening it again (SIGHUP, after logrotate moved it) starts a new file. 0 or -errno. */
int log_open_file(const char *path);
/* "err", "warning", "notice", "info", "debug" or a number 3..7; -EINVAL otherwise. */
int log_level_from_string(const char *s);
const char *log_level_to_string(enum log_level level);

/* Logs and returns error (negative errno); "%m" in fmt prints strerror(-error). */
int log_full_errno(enum log_level level, int error, const char *fmt, ...) _printf_(3, 4);

#define log_full(level, ...) ((void)log_full_errno((level), 0, __VA_ARGS__))
#define log_error(...) log_full(LOG_LEVEL_ERR, __VA_ARGS__)
#define log_warning(...) log_full(LOG_LEVEL_WARNING, __VA_ARGS__)
#define log_notice(...) log_full(LOG_LEVEL_NOTICE, __VA_ARGS__)
#define log_info(...) log_full(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...) log_full(LOG_LEVEL_DEBUG, __VA_ARGS__)
#define log_error_errno(e, ...) log_full_errno(LOG_LEVEL_ERR, (e), __VA_ARGS__)
#define log_warning_errno(e, ...) log_full_errno(LOG_LEVEL_WARNING, (e), __VA_ARGS__)
#define log_debug_errno(e, ...) log_full_errno(LOG_LEVEL_DEBUG, (e), __VA_ARGS__)
