/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "macro.h"
#include "base/pid-file.h"

int pid_file_check(const char *path)
{
	/* Root opens it: never through a link, nor anything but a file (a FIFO, a device someone
	 * put there in a folder others may write). */
	_cleanup_close_ int fd =
		open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW);
	char buf[32] = "";
	struct stat st;
	ssize_t n;

	if (fd < 0)
		return errno == ENOENT ? 0 : log_error_errno(-errno, "cannot open %s: %m", path);
	if (fstat(fd, &st) < 0)
		return log_error_errno(-errno, "cannot stat %s: %m", path);
	if (!S_ISREG(st.st_mode))
		return log_error_errno(-EINVAL, "%s is not a regular file: not a pid file", path);
	if (flock(fd, LOCK_SH | LOCK_NB) == 0)
		return 0; /* nobody holds it: stale */
	if (errno != EWOULDBLOCK)
		return log_error_errno(-errno, "cannot lock %s: %m", path);
	n = read(fd, buf, sizeof(buf) - 1);
	buf[n > 0 ? n : 0] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
	return log_error_errno(-EBUSY, "another mrd (pid %s) holds %s: not starting",
			       *buf ? buf : "unknown", path);
}

int pid_file_write(const char *path, int *ret_fd)
{
	char tmp[PATH_MAX], line[32];
	int fd, n, r;

	if (snprintf(tmp, sizeof(tmp), "%s.XXXXXX", path) >= (int)sizeof(tmp))
		return log_error_errno(-ENAMETOOLONG, "pid file path too long: %s", path);
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0)
		return log_error_errno(-errno, "cannot create a file beside %s: %m", path);
	n = snprintf(line, sizeof(line), "%d\n", (int)getpid());
	errno = 0; /* a short write sets none */
	if (flock(fd, LOCK_EX | LOCK_NB) < 0 || fchmod(fd, 0644) < 0 ||
	    write(fd, line, (size_t)n) != n || rename(tmp, path) < 0) {
		r = errno ? -errno : -EIO;
		unlink(tmp);
		close(fd);
		return log_error_errno(r, "cannot write pid file %s: %m", path);
	}
	*ret_fd = fd;
	return 0;
}

void pid_file_remove(const char *path, int fd)
{
	struct stat mine, now;

	if (fd < 0)
		return;
	/* Another mrd may have replaced it since (it found ours stale): its file stays. */
	if (fstat(fd, &mine) == 0 && stat(path, &now) == 0 && mine.st_dev == now.st_dev &&
	    mine.st_ino == now.st_ino)
		(void)unlink(path);
	close(fd);
}
