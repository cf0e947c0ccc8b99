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

/* The effective uid in /proc/pid/status, read through dir (that process's /proc directory). */
static int status_euid(int dir, uid_t *ret)
{
	char line[256];
	unsigned real, effective;
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
			*ret = effective;
			r = 0;
			break;
		}
	fclose(f);
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
	r = status_euid(dir, &euid);
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
