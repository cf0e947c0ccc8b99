/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/nsfs.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "macro.h"
#include "base/process.h"

/* The kernel nests user namespaces 32 deep at most. */
#define USERNS_DEPTH_MAX 33

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

/* The effective uid in /proc/pid/status, read through dir (that process's /proc directory), and
 * how many pids its NSpid line lists (one per pid namespace from the reader's down; 1 when the
 * kernel shows none). */
static int read_status(int dir, uid_t *ret_euid, unsigned *ret_pids)
{
	char line[256];
	unsigned real, effective, pids = 1;
	int r = -EBADMSG, fd;
	FILE *f;

	fd = openat(dir, "status", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return negative_errno();
	f = fdopen(fd, "re");
	if (!f) {
		close(fd);
		return -ENOMEM;
	}
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Uid: %u %u", &real, &effective) == 2) {
			*ret_euid = effective;
			r = 0;
		} else if (strncmp(line, "NSpid:", 6) == 0) {
			char *save = NULL;

			pids = 0;
			for (char *t = strtok_r(line + 6, " \t\n", &save); t;
			     t = strtok_r(NULL, " \t\n", &save))
				pids++;
		}
	fclose(f);
	if (ret_pids)
		*ret_pids = pids;
	return r;
}

static bool same_ns(int fd, dev_t dev, ino_t ino)
{
	struct stat st;

	return fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

int process_owner_uid(pid_t pid, uid_t uid, dev_t own_ns_dev, ino_t own_ns_ino,
		      uid_t *ret_owner)
{
	_cleanup_close_ int dir = -1, ns = -1;
	char path[32];
	uid_t owner = uid, euid;
	int r;

	/* pid 0: in a pid namespace mrd cannot see into; SO_PEERCRED's uid is all there is. */
	if (pid <= 0 || own_ns_ino == 0) {
		*ret_owner = uid;
		return 0;
	}
	/* The directory holds on to the process it named: what is read through it is that
	 * process's, or fails once it is gone. */
	snprintf(path, sizeof(path), "/proc/%d", (int)pid);
	dir = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dir < 0)
		return errno == ENOENT ? -ESRCH : negative_errno();
	ns = openat(dir, "ns/user", O_RDONLY | O_CLOEXEC);
	if (ns < 0 && (errno == EACCES || errno == EPERM))
		return -EACCES; /* another user's process, and no CAP_SYS_PTRACE */
	if (ns < 0)
		return errno == ENOENT ? -ESRCH : negative_errno();
	/* A process with the peer's uid is in a namespace that maps it, which only its owner
	 * (or root) could have made: the answer below is the same for any such process. */
	r = read_status(dir, &euid, NULL);
	if (r == -ENOENT)
		return -ESRCH;
	if (r < 0)
		return r;
	if (euid != uid)
		return -ESRCH;
	for (int depth = 0; !same_ns(ns, own_ns_dev, own_ns_ino); depth++) {
		uid_t made_by = 0; /* valgrind does not know the ioctl writes it */
		int parent;

		if (depth >= USERNS_DEPTH_MAX)
			return -ELOOP;
		if (ioctl(ns, NS_GET_OWNER_UID, &made_by) < 0)
			return negative_errno();
		if (made_by != 0)
			owner = made_by; /* the outermost so far */
		parent = ioctl(ns, NS_GET_PARENT);
		if (parent < 0) {
			/* EPERM: not below mrd's namespace (mrd runs in one the peer is not in). */
			if (errno != EPERM)
				return negative_errno();
			owner = uid;
			break;
		}
		close(ns);
		ns = parent;
	}
	*ret_owner = owner;
	return 0;
}

uid_t subuid_owner(const char *path, uid_t uid)
{
	char line[512], *colon;
	uid_t owner = uid;
	FILE *f;

	if (uid == 0)
		return 0; /* root answers for itself, whatever a range says */
	f = fopen(path, "re");
	if (!f)
		return uid;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long first, count;
		struct passwd *pw;
		char *end;

		colon = strchr(line, ':');
		if (!colon || sscanf(colon + 1, "%llu:%llu", &first, &count) != 2 || uid < first ||
		    uid - first >= count)
			continue;
		*colon = '\0';
		/* A name, as useradd writes them, or a number. */
		owner = (uid_t)strtoul(line, &end, 10);
		if (*end || end == line) {
			pw = getpwnam(line);
			owner = pw ? pw->pw_uid : uid;
		}
		/* Root's ranges go to containers an administrator made: their uids are their own. */
		if (owner == 0)
			owner = uid;
		break;
	}
	fclose(f);
	return owner;
}

int process_charged_uid(pid_t pid, uid_t uid, dev_t own_ns_dev, ino_t own_ns_ino,
			const char *subuid_path, uid_t *ret_owner)
{
	uid_t owner;
	int r = process_owner_uid(pid, uid, own_ns_dev, own_ns_ino, &owner);

	if (r == -EACCES) {
		/* No CAP_SYS_PTRACE (the shipped unit): the uid is all mrd can tell. */
		owner = uid;
		r = 0;
	}
	if (r < 0)
		return r;
	/* After the walk too: with CAP_SYS_PTRACE it ran and saw only mrd's namespace, or a
	 * namespace that a subordinate uid made; either is the range's owner's. */
	*ret_owner = subuid_owner(subuid_path, owner);
	return 0;
}

/* The whole of a small /proc file read through dir, NUL-terminated, in a string the caller
 * frees; NULL with errno on failure. */
static char *read_small(int dir, const char *name)
{
	_cleanup_close_ int fd = openat(dir, name, O_RDONLY | O_CLOEXEC);
	size_t size = 4096, n = 0;
	char *buf = NULL;
	ssize_t got;

	if (fd < 0)
		return NULL;
	for (;;) {
		if (!buf || n + 1 >= size) {
			char *grown;

			if (buf)
				size *= 2;
			grown = size <= 1 << 20 ? realloc(buf, size) : NULL; /* a map or cgroup line is far smaller */
			if (!grown) {
				free(buf);
				errno = size <= 1 << 20 ? ENOMEM : EFBIG;
				return NULL;
			}
			buf = grown;
		}
		got = read(fd, buf + n, size - n - 1);
		if (got < 0) {
			free(buf);
			return NULL;
		}
		if (got == 0)
			break;
		n += (size_t)got;
	}
	buf[n] = '\0';
	return buf;
}

char *process_uid_map(const char *path)
{
	_cleanup_close_ int dir = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);

	return dir < 0 ? NULL : read_small(dir, "uid_map");
}

/* The path of the "0::" line of a /proc/pid/cgroup text, in a string the caller frees. */
static char *cgroup_v2_path(const char *text)
{
	for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL)
		if (strncmp(line, "0::", 3) == 0)
			return strndup(line + 3, strcspn(line + 3, "\n"));
	return NULL;
}

int process_place_read(pid_t pid, uid_t uid, const char *own_uid_map, struct process_place *ret)
{
	_cleanup_free_ char *map = NULL, *cgroups = NULL;
	_cleanup_close_ int dir = -1;
	unsigned pids;
	char path[32];
	uid_t euid;
	int r;

	*ret = (struct process_place){};
	if (pid <= 0)
		return -ESRCH;
	/* Read through the directory, which holds on to the process it named: what is read is
	 * that process's, or fails once it is gone. */
	snprintf(path, sizeof(path), "/proc/%d", (int)pid);
	dir = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dir < 0)
		return errno == ENOENT ? -ESRCH : negative_errno();
	r = read_status(dir, &euid, &pids);
	if (r == -ENOENT || (r == 0 && euid != uid))
		return -ESRCH;
	if (r < 0)
		return r;
	map = read_small(dir, "uid_map");
	cgroups = read_small(dir, "cgroup");
	if (!map || !cgroups)
		return errno == ENOENT || errno == ESRCH ? -ESRCH : negative_errno();
	ret->nested_pidns = pids > 1;
	/* The map is shown as the reader's namespace sees it: the same text as mrd's own
	 * only in mrd's namespace (or one a privileged process made to map the same ids). */
	ret->other_userns = !own_uid_map || strcmp(map, own_uid_map) != 0;
	ret->cgroup = cgroup_v2_path(cgroups);
	/* Above mrd's own cgroup namespace's root ("/../x"): relative to a root mrd cannot name,
	 * no path to tell containers by (mrd should run in the host's cgroup namespace). */
	if (ret->cgroup && strncmp(ret->cgroup, "/..", 3) == 0 &&
	    (ret->cgroup[3] == '/' || ret->cgroup[3] == '\0')) {
		free(ret->cgroup);
		ret->cgroup = NULL;
	}
	return 0;
}
