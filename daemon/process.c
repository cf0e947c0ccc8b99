/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "process.h"

uint64_t process_start_time(pid_t pid)
{
	char path[32], buf[1024], *p;
	unsigned long long start = 0;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* The name may hold spaces and parentheses: fields are counted after the last ')'. The
	 * state is field 3, the start time field 22. */
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d "
				"%*d %*d %*d %llu", &start) != 1)
		return 0;
	return start;
}

bool process_gone(pid_t pid, uid_t uid, uint64_t start_time)
{
	char path[32];
	struct stat st;
	uint64_t now;

	if (pid <= 0)
		return true;
	snprintf(path, sizeof(path), "/proc/%d", (int)pid);
	if (stat(path, &st) < 0)
		return errno == ENOENT || errno == ESRCH;
	if (start_time) {
		now = process_start_time(pid);
		return now != 0 && now != start_time;
	}
	return st.st_uid != uid; /* the pid went to another user's process */
}
