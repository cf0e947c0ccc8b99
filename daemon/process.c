/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "process.h"

/* Field 3 (state) and field 22 (start time) of /proc/pid/stat: 0, or -errno. The name may
 * hold spaces and parentheses: fields are counted after the last ')'. */
static int read_stat(pid_t pid, char *ret_state, uint64_t *ret_start)
{
	char path[32], buf[1024], *p;
	unsigned long long start;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d "
				"%*d %*d %*d %llu", ret_state, &start) != 2)
		return -EBADMSG;
	*ret_start = start;
	return 0;
}

uint64_t process_start_time(pid_t pid)
{
	uint64_t start;
	char state;

	return pid > 0 && read_stat(pid, &state, &start) == 0 ? start : 0;
}

bool process_gone(pid_t pid, uid_t uid, uint64_t start_time)
{
	char path[32], state;
	struct stat st;
	uint64_t start;
	int r;

	/* 0: a process in a pid namespace mrd cannot see; nothing tells when it goes. */
	if (pid <= 0)
		return false;
	r = read_stat(pid, &state, &start);
	if (r == -ENOENT || r == -ESRCH)
		return true;
	if (r < 0)
		return false;
	/* A zombie maps nothing any more; another start time is another process. */
	if (state == 'Z' || state == 'X' || (start_time && start != start_time))
		return true;
	if (start_time)
		return false;
	snprintf(path, sizeof(path), "/proc/%d", (int)pid);
	return stat(path, &st) == 0 && st.st_uid != uid; /* the pid went to another user */
}
