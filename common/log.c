/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <syslog.h>

#include "log.h"

static enum log_level max_level = LOG_LEVEL_INFO;
static const char *ident = "mrd";
static bool to_syslog;

static const char *const level_names[] = {
	[LOG_LEVEL_ERR] = "err",
	[LOG_LEVEL_WARNING] = "warning",
	[LOG_LEVEL_NOTICE] = "notice",
	[LOG_LEVEL_INFO] = "info",
	[LOG_LEVEL_DEBUG] = "debug",
};

void log_set_level(enum log_level level) { max_level = level; }
enum log_level log_get_level(void) { return max_level; }
void log_set_ident(const char *name) { ident = name; }

void log_open_syslog(void)
{
	openlog(ident, LOG_PID | LOG_NDELAY, LOG_DAEMON);
	to_syslog = true;
}

int log_level_from_string(const char *s)
{
	if (!s || !*s)
		return -EINVAL;
	for (int i = LOG_LEVEL_ERR; i <= LOG_LEVEL_DEBUG; i++)
		if (strcasecmp(s, level_names[i]) == 0)
			return i;
	if (s[1] == '\0' && s[0] >= '0' + LOG_LEVEL_ERR && s[0] <= '0' + LOG_LEVEL_DEBUG)
		return s[0] - '0';
	return -EINVAL;
}

const char *log_level_to_string(enum log_level level)
{
	if (level < LOG_LEVEL_ERR || level > LOG_LEVEL_DEBUG)
		return "unknown";
	return level_names[level];
}

int log_full_errno(enum log_level level, int error, const char *fmt, ...)
{
	char msg[1024], fmt_expanded[512];
	const char *m;
	va_list ap;

	if (level > max_level)
		return error;

	/* Expand %m ourselves: the error we were handed, not whatever errno is now. */
	m = strstr(fmt, "%m");
	if (m && error != 0 && (size_t)(m - fmt) < sizeof(fmt_expanded) / 2) {
		snprintf(fmt_expanded, sizeof(fmt_expanded), "%.*s%s%s", (int)(m - fmt), fmt,
			 strerror(error < 0 ? -error : error), m + 2);
		fmt = fmt_expanded;
	}

	va_start(ap, fmt);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
	vsnprintf(msg, sizeof(msg), fmt, ap);
#pragma GCC diagnostic pop
	va_end(ap);

	if (to_syslog) {
		syslog((int)level, "%s", msg);
		return error;
	}
	/* Under systemd (JOURNAL_STREAM set) the priority prefix lets journald file the line. */
	if (getenv("JOURNAL_STREAM"))
		fprintf(stderr, "<%d>%s\n", (int)level, msg);
	else
		fprintf(stderr, "%s: %s\n", ident, msg);
	return error;
}
