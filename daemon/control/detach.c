/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "macro.h"
#include "control/detach.h"
#include "control/manager.h"

static int ready_fd = -1;

int detach_begin(void)
{
	int pipefd[2], result = -EIO;
	pid_t pid;

	if (pipe2(pipefd, O_CLOEXEC) < 0)
		return negative_errno();
	pid = fork();
	if (pid < 0) {
		int r = negative_errno();
		safe_close(pipefd[0]);
		safe_close(pipefd[1]);
		return r;
	}
	if (pid == 0) {
		safe_close(pipefd[0]);
		ready_fd = pipefd[1];
		if (setsid() < 0 || chdir("/") < 0)
			return negative_errno();
		return 0;
	}

	/* Parent: exit with the child's verdict; a child that died says nothing. Ctrl-C stops
	 * the wait (main blocked it for the daemon's loop). */
	manager_block_signals(false);
	safe_close(pipefd[1]);
	if (read(pipefd[0], &result, sizeof(result)) != sizeof(result))
		result = -EIO;
	_exit(result < 0 ? EXIT_FAILURE : EXIT_SUCCESS);
}

void detach_finish(int result)
{
	int null_fd;

	if (ready_fd < 0)
		return;
	if (result >= 0) {
		null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (null_fd >= 0) {
			dup2(null_fd, STDIN_FILENO);
			dup2(null_fd, STDOUT_FILENO);
			dup2(null_fd, STDERR_FILENO);
			safe_close(null_fd);
		}
		log_open_syslog();
	}
	(void)!write(ready_fd, &result, sizeof(result));
	ready_fd = safe_close(ready_fd);
}
