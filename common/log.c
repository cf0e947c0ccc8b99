/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static enum log_level max_level = LOG_LEVEL_INFO;
static const char *ident = "mrd";
static bool to_syslog;
static int log_fd = -1; /* --log-file: wins over syslog and stderr */

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

int log_open_file(const char *path)
{
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0640);

	if (fd < 0)
		return -errno;
	if (log_fd >= 0)
		close(log_fd);
	log_fd = fd;
	return 0;
}

void log_open_syslog(void)
{
	if (log_fd >= 0)
		return;
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

	if (log_fd >= 0) {
		char line[sizeof(msg) + 128], when[32];
		struct timespec ts;
		struct tm tm;
		int n;

		clock_gettime(CLOCK_REALTIME, &ts);
		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", localtime_r(&ts.tv_sec, &tm));
		/* One write: lines of several processes (a re-exec) never interleave. */
		n = snprintf(line, sizeof(line), "%s.%03ld %s[%d]: %s: %s\n", when,
			     ts.tv_nsec / 1000000, ident, (int)getpid(), level_names[level], msg);
		if (n > (int)sizeof(line) - 1)
			n = (int)sizeof(line) - 1;
		(void)!write(log_fd, line, (size_t)n);
		return error;
	}
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
