/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <grp.h>
#include <unistd.h>

#include "macro.h"
#include "test-util.h"

#define READY_TIMEOUT_MS 60000 /* generous: mrd may run under valgrind */

const char *test_build_path(const char *name, char *buf, size_t size)
{
	const char *dir = getenv("MRD_BUILDDIR");

	snprintf(buf, size, "%s/%s", dir ? dir : ".", name);
	return buf;
}

static int exit_status(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + WTERMSIG(status);
}

static int notify_socket(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return negative_errno();
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int r = negative_errno();
		close(fd);
		return r;
	}
	return fd;
}

/* Moves fds[0..n) to 3, 4, ... in this (child) process and says so as systemd would. */
static void pass_fds(const int *fds, char *const *names, size_t n)
{
	char num[32], list[4096] = "";
	int high[64];

	if (n == 0 || n > 64)
		return;
	for (size_t i = 0; i < n; i++)
		high[i] = fcntl(fds[i], F_DUPFD, (int)(3 + n));
	for (size_t i = 0; i < n; i++) {
		dup2(high[i], (int)(3 + i));
		close(high[i]);
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? ":" : "",
			 names[i]);
	}
	snprintf(num, sizeof(num), "%zu", n);
	setenv("LISTEN_FDS", num, 1);
	setenv("LISTEN_FDNAMES", list, 1);
	snprintf(num, sizeof(num), "%d", (int)getpid());
	setenv("LISTEN_PID", num, 1);
}

/* Starts mrd as p says, passing fds (with names) as systemd would; waits for READY=1 on nfd. */
static int spawn(struct mrd_proc *p, int nfd, const char *const *extra_args, const int *fds,
		 char *const *names, size_t n_fds)
{
	char mrd[512], notify[160], *wrapper_copy = NULL;
	const char *argv[64];
	const char *wrapper = getenv("MRD_TEST_WRAPPER");
	size_t n = 0;
	int r;

	snprintf(notify, sizeof(notify), "%s/notify", p->dir);
	if (wrapper && *wrapper) {
		wrapper_copy = strdup(wrapper);
		for (char *tok = strtok(wrapper_copy, " "); tok && n < 32; tok = strtok(NULL, " "))
			argv[n++] = tok;
	}
	argv[n++] = test_build_path("mrd", mrd, sizeof(mrd));
	argv[n++] = "--foreground";
	argv[n++] = "--config";
	argv[n++] = p->config;
	argv[n++] = "--socket";
	argv[n++] = p->socket;
	for (size_t i = 0; extra_args && extra_args[i] && n < ELEMENTSOF(argv) - 1; i++)
		argv[n++] = extra_args[i];
	argv[n] = NULL;

	p->pid = fork();
	if (p->pid < 0) {
		r = negative_errno();
		close(nfd);
		free(wrapper_copy);
		return r;
	}
	if (p->pid == 0) {
		setenv("NOTIFY_SOCKET", notify, 1);
		pass_fds(fds, names, n_fds);
		execvp(argv[0], (char **)argv);
		_exit(127);
	}
	free(wrapper_copy);

	/* Wait for READY=1; an early exit of mrd shows as a failed start. */
	for (int waited = 0; waited < READY_TIMEOUT_MS; waited += 100) {
		struct pollfd pfd = { .fd = nfd, .events = POLLIN };
		char buf[512];
		ssize_t len;
		int status;

		if (poll(&pfd, 1, 100) > 0) {
			len = recv(nfd, buf, sizeof(buf) - 1, 0);
			if (len > 0) {
				buf[len] = '\0';
				if (strstr(buf, "READY=1")) {
					p->notify_fd = nfd;
					return 0;
				}
			}
		}
		if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
			p->pid = 0;
			close(nfd);
			return -ECHILD;
		}
	}
	close(nfd);
	return -ETIMEDOUT;
}

int mrd_proc_start(struct mrd_proc *p, const char *config_text, const char *const *extra_args)
{
	const char *wrapper = getenv("MRD_TEST_WRAPPER");
	char notify[160];
	int nfd;
	FILE *f;

	memset(p, 0, sizeof(*p));
	p->notify_fd = -1;
	snprintf(p->dir, sizeof(p->dir), "/tmp/mrd-test.XXXXXX");
	if (!mkdtemp(p->dir))
		return negative_errno();
	chmod(p->dir, 0755); /* tests connect as other users too */
	snprintf(p->socket, sizeof(p->socket), "%s/mrd.sock", p->dir);
	snprintf(p->config, sizeof(p->config), "%s/mrd.conf", p->dir);
	snprintf(notify, sizeof(notify), "%s/notify", p->dir);

	f = fopen(p->config, "we");
	if (!f)
		return negative_errno();
	/* Valgrind crawls over a multi-TiB reservation: a small window keeps it quick. */
	if (wrapper && *wrapper)
		fputs("[memory]\nwindow_size = 8G\n", f);
	/* Sanitizers claim address ranges of their own (TSan the default window's): a run
	 * under one moves the window with this, e.g. "[memory]\nwindow_base = 0x4000000000". */
	if (getenv("MRD_TEST_CONF"))
		fprintf(f, "%s\n", getenv("MRD_TEST_CONF"));
	/* Off the host's system bus; the bus test turns it on, on a private one. Clients connect
	 * as several users, members of no group mrd: a socket anyone may use. */
	fputs("[mrd]\nbus = no\nsocket_mode = 0666\n", f);
	/* 4 KiB pages unless a test asks for huge ones: whether a host has free huge pages at
	 * the moment (another suite may have reserved them) must not change what a test sees. */
	fputs("[memory]\nhugepages = no\n", f);
	fputs(config_text ? config_text : "", f);
	fclose(f);

	nfd = notify_socket(notify);
	if (nfd < 0)
		return nfd;
	return spawn(p, nfd, extra_args, NULL, NULL, 0);
}

/* Takes one notification; descriptors it carried go to the store (FDSTORE=1, with FDNAME=) or
 * are closed (BARRIER=1: closing is the answer). Returns its length, or -errno. */
static ssize_t recv_notification(int nfd, char *buf, size_t size, struct mrd_fd_store *store)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * 16)];
	} control;
	struct iovec iov = { buf, size - 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &control,
			     .msg_controllen = sizeof(control) };
	struct cmsghdr *cmsg;
	ssize_t len = recvmsg(nfd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

	if (len < 0)
		return negative_errno();
	buf[len] = '\0';
	for (cmsg = CMSG_FIRSTHDR(&mh); cmsg; cmsg = CMSG_NXTHDR(&mh, cmsg)) {
		size_t n = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		const char *name = strstr(buf, "FDNAME=");
		int fds[16];

		if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS)
			continue;
		memcpy(fds, CMSG_DATA(cmsg), n * sizeof(int));
		for (size_t i = 0; i < n; i++) {
			if (store && strstr(buf, "FDSTORE=1") && name &&
			    store->n < ELEMENTSOF(store->fds)) {
				store->fds[store->n] = fds[i];
				snprintf(store->names[store->n], sizeof(store->names[0]), "%.*s",
					 (int)strcspn(name + 7, "\n"), name + 7);
				store->n++;
			} else
				close(fds[i]);
		}
	}
	return len;
}


int mrd_proc_restart_fd_store(struct mrd_proc *p, struct mrd_fd_store *store)
{
	char buf[512], *names[ELEMENTSOF(store->fds)];
	int status, r;

	memset(store, 0, sizeof(*store));
	if (p->pid <= 0)
		return -ECHILD;
	kill(p->pid, SIGTERM);
	/* Take every notification until mrd is gone: FDSTORE=1 and BARRIER=1 come before. A hang
	 * at exit gets many seconds, as in reap(), then its threads are shown. */
	for (double start = test_now_s();;) {
		struct pollfd pfd = { .fd = p->notify_fd, .events = POLLIN };
		pid_t w = waitpid(p->pid, &status, WNOHANG);

		if (poll(&pfd, 1, 50) > 0)
			(void)recv_notification(p->notify_fd, buf, sizeof(buf), store);
		if (w == p->pid)
			break;
		if (test_now_s() - start > TEST_STOP_S) {
			fprintf(stderr, "mrd (pid %d) did not exit %d s after SIGTERM (a restart "
				"through the FD store); its threads:\n", (int)p->pid, TEST_STOP_S);
			test_show_threads(p->pid);
			kill(p->pid, SIGKILL);
			waitpid(p->pid, NULL, 0);
			p->pid = 0;
			return -ETIMEDOUT;
		}
	}
	while (recv_notification(p->notify_fd, buf, sizeof(buf), store) > 0)
		;
	p->pid = 0;
	if (exit_status(status) != 0)
		return -ECHILD;
	for (size_t i = 0; i < store->n; i++)
		names[i] = store->names[i];
	r = spawn(p, p->notify_fd, NULL, store->fds, names, store->n);
	for (size_t i = 0; i < store->n; i++)
		close(store->fds[i]);
	/* Once it serves, mrd takes what it was given out of the store. */
	for (int waited = 0; r == 0 && store->removed < store->n && waited < TEST_WAIT_S * 1000;
	     waited += 100) {
		struct pollfd pfd = { .fd = p->notify_fd, .events = POLLIN };

		if (poll(&pfd, 1, 100) > 0 &&
		    recv_notification(p->notify_fd, buf, sizeof(buf), NULL) > 0 &&
		    strstr(buf, "FDSTOREREMOVE=1"))
			store->removed++;
	}
	return r;
}

int mrd_proc_notified(struct mrd_proc *p, const char *want, char *buf, size_t size,
		      int timeout_ms)
{
	for (int waited = 0; waited < timeout_ms; waited += 100) {
		struct pollfd pfd = { .fd = p->notify_fd, .events = POLLIN };
		ssize_t len;

		if (poll(&pfd, 1, 100) <= 0)
			continue;
		len = recv(p->notify_fd, buf, size - 1, 0);
		if (len <= 0)
			continue;
		buf[len] = '\0';
		if (strstr(buf, want))
			return 0;
	}
	return -ETIMEDOUT;
}

/* What each thread of a process that does not exit is doing: its stacks from gdb where the
 * host has it, else each thread's kernel wait channel and system call. */
void test_show_threads(pid_t pid)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "command -v gdb > /dev/null && timeout -k 5 20 gdb -batch -nx -p %d "
		 "-ex 'thread apply all bt' 2>&1 | grep -E '^(Thread|#)' >&2 || "
		 "for t in /proc/%d/task/*; do echo \"$t: $(cat $t/comm) $(cat $t/wchan) "
		 "syscall $(cut -d' ' -f1 $t/syscall)\" >&2; done", (int)pid, (int)pid);
	(void)!system(cmd);
	/* A signal it never took: pending for the process (ShdPnd) or a thread, blocked where. */
	snprintf(cmd, sizeof(cmd), "grep -E '^(SigPnd|ShdPnd|SigBlk)' /proc/%d/task/*/status >&2",
		 (int)pid);
	(void)!system(cmd);
}

/* The exit status of pid, sent sig: a signal that should end it (SIGTERM) gets many seconds,
 * then its threads are shown and it is killed, so a hang at exit fails the test saying where
 * rather than running into the suite's timeout. */
static int reap(pid_t pid, int sig)
{
	double start = test_now_s();
	int status;
	pid_t r;

	while ((r = waitpid(pid, &status, sig == SIGKILL ? 0 : WNOHANG)) == 0) {
		if (test_now_s() - start > TEST_STOP_S) {
			fprintf(stderr, "mrd (pid %d) did not exit %d s after signal %d; its threads:\n",
				(int)pid, TEST_STOP_S, sig);
			test_show_threads(pid);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			return -ETIMEDOUT;
		}
		usleep(10000);
	}
	return r == pid ? exit_status(status) : -ECHILD;
}

int mrd_proc_signal(struct mrd_proc *p, int sig)
{
	char cmd[128];
	int r = -ECHILD;

	if (p->pid > 0) {
		kill(p->pid, sig);
		r = reap(p->pid, sig);
		p->pid = 0;
	}
	if (p->notify_fd >= 0) {
		char buf[512];
		ssize_t len;

		while ((len = recv(p->notify_fd, buf, sizeof(buf) - 1, MSG_DONTWAIT)) > 0) {
			buf[len] = '\0';
			if (strstr(buf, "STOPPING=1"))
				p->stopping_seen = true;
		}
		p->notify_fd = safe_close(p->notify_fd);
	}
	if (p->dir[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", p->dir);
		(void)!system(cmd);
		p->dir[0] = '\0';
	}
	return r;
}

int mrd_proc_stop(struct mrd_proc *p) { return mrd_proc_signal(p, SIGTERM); }

int run_capture(const char *const *argv, char *out, size_t size, uid_t run_as_uid)
{
	int pipefd[2], status;
	size_t len = 0;
	pid_t pid;

	if (pipe2(pipefd, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		dup2(pipefd[1], STDOUT_FILENO);
		dup2(pipefd[1], STDERR_FILENO);
		if (run_as_uid != (uid_t)-1 && (setgroups(0, NULL) < 0 || setgid(run_as_uid) < 0 ||
						setuid(run_as_uid) < 0))
			_exit(126);
		execv(argv[0], (char **)argv);
		_exit(127);
	}
	close(pipefd[1]);
	for (;;) {
		char discard[4096];
		ssize_t n;

		/* Keep draining past a full buffer so the child never blocks on the pipe. */
		if (len < size - 1)
			n = read(pipefd[0], out + len, size - 1 - len);
		else
			n = read(pipefd[0], discard, sizeof(discard));
		if (n <= 0)
			break;
		if (len < size - 1)
			len += (size_t)n;
	}
	out[len] = '\0';
	close(pipefd[0]);
	if (waitpid(pid, &status, 0) != pid)
		return -ECHILD;
	return exit_status(status);
}

unsigned count_open_fds(pid_t pid)
{
	char path[64];
	struct dirent *e;
	unsigned n = 0;
	DIR *d;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	else
		snprintf(path, sizeof(path), "/proc/self/fd");
	d = opendir(path);
	if (!d)
		return 0;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return pid ? n : n - 1; /* not the directory's own */
}

int open_files_limit_set(rlim_t n)
{
	struct rlimit rl = { n, n };

	if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
		return 0;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return -errno;
	rl.rlim_cur = rl.rlim_max;
	(void)setrlimit(RLIMIT_NOFILE, &rl);
	return 0;
}

int raw_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return negative_errno();
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int r = negative_errno();
		close(fd);
		return r;
	}
	return fd;
}

#define NR_HUGEPAGES_PATH "/proc/sys/vm/nr_hugepages"

static long reserved_added;
static pid_t reserver; /* Check forks a child per test: only this process gives them back */

long read_long(const char *path)
{
	long v = -1;
	FILE *f = fopen(path, "re");

	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

long read_status_field(const char *path, const char *field)
{
	size_t n = strlen(field);
	char line[256];
	long v = -1;
	FILE *f = fopen(path, "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, field, n) == 0 && line[n] == ':' &&
		    sscanf(line + n + 1, "%ld", &v) == 1)
			break;
	fclose(f);
	return v;
}

int write_long(const char *path, long v)
{
	FILE *f = fopen(path, "we");
	int r;

	if (!f)
		return negative_errno();
	r = fprintf(f, "%ld\n", v) > 0 ? 0 : -EIO;
	if (fclose(f) != 0)
		r = negative_errno();
	return r;
}

/* What this process added, not the count it found: others may reserve meanwhile. */
static void hugepages_give_back(void)
{
	long now = read_long(NR_HUGEPAGES_PATH);

	if (getpid() == reserver && now >= 0)
		(void)write_long(NR_HUGEPAGES_PATH, now > reserved_added ? now - reserved_added : 0);
}

/* Suites that use huge pages take turns, whole processes at a time: one takes every free
 * page on purpose (test-hostile's holes), another counts them (test-hugetlb), and make -j2
 * check runs them side by side. Released when the process exits. */
#define HUGEPAGES_LOCK_PATH "/tmp/mrd-tests-hugepages.lock"

static void hugepages_take_turn(void)
{
	static int lock_fd = -1;

	if (lock_fd >= 0)
		return;
	lock_fd = open(HUGEPAGES_LOCK_PATH, O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
	if (lock_fd >= 0)
		while (flock(lock_fd, LOCK_EX) < 0 && errno == EINTR)
			;
}

int hugepages_reserve(long want, char *why, size_t why_size)
{
	long before;

	hugepages_take_turn();
	before = read_long(NR_HUGEPAGES_PATH);

	if (geteuid() == 0 && read_long(HUGEPAGES_FREE_PATH) < want && reserved_added == 0 &&
	    before >= 0 && write_long(NR_HUGEPAGES_PATH, before + 2 * want) == 0) {
		reserved_added = read_long(NR_HUGEPAGES_PATH) - before;
		reserver = getpid();
		if (reserved_added > 0)
			atexit(hugepages_give_back);
	}
	if (read_long(HUGEPAGES_FREE_PATH) >= want)
		return 0;
	snprintf(why, why_size, "fewer than %ld free 2 MiB huge pages (%s) and %s", want,
		 HUGEPAGES_FREE_PATH, geteuid() == 0 ? "the kernel reserved none when asked" :
						       "only root may reserve them");
	return -ENOSPC;
}

/* The page size the kernel uses for the mapping holding p, from /proc/self/smaps. */
long kernel_page_kb(const void *p)
{
	char line[256];
	unsigned long lo, hi;
	bool inside = false;
	long kb = -1;
	FILE *f = fopen("/proc/self/smaps", "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
			inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
		else if (inside && sscanf(line, "KernelPageSize: %ld kB", &kb) == 1)
			break;
	}
	fclose(f);
	return kb;
}

int soft_gate_setenv(char *dir_out, size_t size, uint64_t min_bytes)
{
	char path[PATH_MAX], bytes[32];

	if (snprintf(dir_out, size, "/tmp/mrd-gate.XXXXXX") >= (int)size || !mkdtemp(dir_out))
		return -EINVAL;
	snprintf(path, sizeof(path), "%s/entered", dir_out);
	if (mkfifo(path, 0600) < 0)
		return negative_errno();
	snprintf(path, sizeof(path), "%s/release", dir_out);
	if (mkfifo(path, 0600) < 0)
		return negative_errno();
	snprintf(bytes, sizeof(bytes), "%" PRIu64, min_bytes);
	if (setenv("MRD_SOFT_GATE", dir_out, 1) < 0 || setenv("MRD_SOFT_GATE_BYTES", bytes, 1) < 0)
		return negative_errno();
	return 0;
}

static int gate_fifo(const char *dir, const char *name)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC); /* never blocks on a FIFO */
}

int soft_gate_wait(const char *dir, int timeout_ms)
{
	int fd = gate_fifo(dir, "entered"), r = -ETIMEDOUT;
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	char op;

	if (fd < 0)
		return negative_errno();
	if (poll(&pfd, 1, timeout_ms) == 1 && read(fd, &op, 1) == 1)
		r = (unsigned char)op;
	close(fd);
	return r;
}

void soft_gate_release(const char *dir, unsigned n)
{
	int fd = gate_fifo(dir, "release");

	if (fd < 0)
		return;
	for (unsigned i = 0; i < n; i++)
		if (write(fd, "g", 1) != 1)
			break;
	close(fd);
}

void soft_gate_cleanup(const char *dir)
{
	char path[PATH_MAX];

	soft_gate_release(dir, 4096); /* whatever still waits must not hang a teardown */
	unsetenv("MRD_SOFT_GATE");
	unsetenv("MRD_SOFT_GATE_BYTES");
	snprintf(path, sizeof(path), "%s/entered", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/release", dir);
	unlink(path);
	rmdir(dir);
}

long long json_domain_number(const char *json, const char *domain, const char *key)
{
	char pattern[128];
	const char *d, *p;

	snprintf(pattern, sizeof(pattern), "{\"name\":\"%s\",", domain);
	d = strstr(json, pattern);
	if (!d)
		return -1;
	snprintf(pattern, sizeof(pattern), "\"%s\":", key);
	p = strstr(d, pattern);
	return p ? strtoll(p + strlen(pattern), NULL, 10) : -1;
}

int test_wait_ready(int fd, pid_t pid, int timeout_s, int *status)
{
	int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	struct pollfd p[2] = { { .fd = fd, .events = POLLIN }, { .fd = pidfd, .events = POLLIN } };
	int n, r = -ETIMEDOUT;
	char b;

	n = poll(p, pidfd >= 0 ? 2 : 1, timeout_s < 0 ? -1 : timeout_s * 1000);
	if (n > 0 && (p[0].revents & POLLIN))
		r = read(fd, &b, 1) == 1 ? 0 : -EIO;
	else if (n > 0) { /* the child is gone (or the pipe's writers are) */
		*status = -1;
		(void)waitpid(pid, status, 0);
		r = -ECHILD;
	}
	if (pidfd >= 0)
		close(pidfd);
	return r;
}

int test_waitpid_or_show(pid_t pid, int *status, int timeout_s)
{
	int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	double t0 = test_now_s();
	pid_t r;

	/* Its exit wakes the wait (a pidfd), else a look every 100 ms. */
	while ((r = waitpid(pid, status, WNOHANG)) == 0 && test_now_s() - t0 < timeout_s) {
		if (pidfd < 0 ||
		    poll(&(struct pollfd){ .fd = pidfd, .events = POLLIN }, 1, 100) < 0)
			usleep(100 * 1000);
	}
	if (pidfd >= 0)
		close(pidfd);
	if (r == pid)
		return 0;
	fprintf(stderr, "child %d still runs after %d s: its threads\n", (int)pid, timeout_s);
	test_show_threads(pid);
	kill(pid, SIGKILL);
	(void)waitpid(pid, status, 0);
	return -ETIMEDOUT;
}
