/* SPDX-License-Identifier: MIT */
/* Helpers for tests that run the real programs: a private mrd, captured commands. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* How long a test waits for what must happen (a reply, a close, a count going down): many
 * seconds, since on a loaded machine (sanitizers, a build beside, CI's CPU hog) a thread or a
 * process waits hundreds of milliseconds and more for a CPU. Only a failing test waits it out. */
#define TEST_WAIT_S 20

/* How long mrd may take to exit once told to (a worker finishing its job, closers' 2 s). */
#define TEST_STOP_S 30

/* Seconds on the monotonic clock. */
static inline double test_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Checks cond every step_us until it holds or TEST_WAIT_S passed; the caller asserts it after. */
#define test_wait_until(cond, step_us)                                           \
	do {                                                                     \
		double test_start_ = test_now_s();                               \
		while (!(cond) && test_now_s() - test_start_ < TEST_WAIT_S)      \
			usleep(step_us);                                         \
	} while (0)

/* Waits for a byte on fd, which child pid writes when it is ready, or for the child's exit,
 * whichever comes first, up to timeout_s (-1: no bound but the test's own): 0 (the byte read), -ECHILD (the child exited before,
 * reaped into *status, -1 where it could not be), -ETIMEDOUT or -EIO. A test so reports a child that died at once, not
 * a timeout. */
int test_wait_ready(int fd, pid_t pid, int timeout_s, int *status);

/* Whether the suites run under a sanitizer (configure's --enable-asan, -ubsan, -tsan set
 * $MRD_SAN_CFLAGS for them): where a stress case's size is cut, its bound checked in the plain
 * build. */
static inline bool test_under_sanitizer(void)
{
	const char *san = getenv("MRD_SAN_CFLAGS");

	return san && *san;
}

/* First thing in a fork() child of a process with threads that makes a handle: under TSan,
 * which cannot start a thread there (it dies, or trips on the parent's thread ids: "dup thread
 * with used id"), libmrd's watcher thread is left off (MRD_WATCH=0). */
static inline void test_fork_child_of_threads(void)
{
#if defined(__SANITIZE_THREAD__)
	setenv("MRD_WATCH", "0", 1);
#endif
}

/* Every thread's stack of process pid on stderr (gdb, else each thread's wchan and syscall),
 * and its signals pending and blocked: what a test shows of a process that hangs. */
void test_show_threads(pid_t pid);

/* waitpid(pid) for up to timeout_s, a hang's bound under Check's own (a child that hangs is
 * shown, with test_show_threads, then killed): 0, or -ETIMEDOUT. */
int test_waitpid_or_show(pid_t pid, int *status, int timeout_s);

struct mrd_proc {
	pid_t pid;
	char dir[64];      /* private temporary directory */
	char socket[128];  /* dir/mrd.sock */
	char config[128];  /* dir/mrd.conf */
	int notify_fd;     /* NOTIFY_SOCKET, read for READY=1 and STOPPING=1 */
	bool stopping_seen;
};

/* Path of a program in the build tree ($MRD_BUILDDIR/name). */
const char *test_build_path(const char *name, char *buf, size_t size);

/* Writes config_text to p->config and starts mrd --foreground on p->socket, with extra_args
 * (NULL-terminated, may be NULL) appended; waits for READY=1 over NOTIFY_SOCKET.
 * $MRD_TEST_WRAPPER (e.g. "valgrind -q ...") is put in front of mrd when set, and
 * $MRD_TEST_CONF is written ahead of config_text (a sanitizer run moves the window so), and
 * so is socket_mode = 0666 (the tests' clients run as several users). */
int mrd_proc_start(struct mrd_proc *p, const char *config_text, const char *const *extra_args);

/* What mrd left in the "FD store" of a restart under an emulated systemd. */
struct mrd_fd_store {
	int fds[64];
	char names[64][64];
	size_t n;
	size_t removed; /* FDSTOREREMOVE=1 the new mrd sent once it served */
};

/* systemctl restart, as systemd does it with an FD store: SIGTERM, keeping the descriptors
 * mrd stores (FDSTORE=1, FDNAME=) and answering BARRIER=1; then mrd again (same directory,
 * same configuration, no extra arguments) with them as LISTEN_FDS/LISTEN_FDNAMES. What was
 * stored is in *store (its descriptors closed by then). 0, or -ECHILD when the old mrd did not
 * exit cleanly or the new one did not start, -ETIMEDOUT when the old one did not exit within
 * TEST_STOP_S (its threads shown, then killed). mrd stores only when $FDSTORE is set. */
int mrd_proc_restart_fd_store(struct mrd_proc *p, struct mrd_fd_store *store);

/* Reads mrd's notifications until one holds want (copied to buf), up to timeout_ms:
 * 0, or -ETIMEDOUT. */
int mrd_proc_notified(struct mrd_proc *p, const char *want, char *buf, size_t size,
		      int timeout_ms);

/* SIGTERM, wait, remove the directory. Returns mrd's exit status (or 128+signal) and sets
 * p->stopping_seen when mrd told systemd STOPPING=1. */
int mrd_proc_stop(struct mrd_proc *p);
/* The same with another signal (SIGKILL: mrd dies on the spot). */
int mrd_proc_signal(struct mrd_proc *p, int sig);

/* Runs argv with stdout and stderr captured into out (NUL-terminated). Returns the exit
 * status (or 128+signal). When run_as_uid is not (uid_t)-1, the child drops to that uid. */
int run_capture(const char *const *argv, char *out, size_t size, uid_t run_as_uid);

/* How many descriptors process pid has open (pid 0: this process); 0 when /proc does not say. */
unsigned count_open_fds(pid_t pid);

/* RLIMIT_NOFILE to n, soft and hard (for this process and the mrd it starts); where the hard
 * limit cannot move, the soft one up to it. 0, or -errno when the limits cannot be read. */
int open_files_limit_set(rlim_t n);

/* The number after "key": in domain's object of `mrctl --json clients` output json, -1 when
 * that domain is not there. */
long long json_domain_number(const char *json, const char *domain, const char *key);

/* A raw SOCK_SEQPACKET connection to path; -errno on failure. */
int raw_connect(const char *path);

#define HUGEPAGES_FREE_PATH "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"

/* The number a file such as /proc/sys/vm/nr_hugepages holds, -1 when unreadable. */
long read_long(const char *path);
/* Writes v to such a file: 0 or -errno. */
int write_long(const char *path, long v);
/* The number after "<field>:" in a /proc status file (/proc/PID/status, .../task/TID/status),
 * -1 when it has none. */
long read_status_field(const char *path, const char *field);

/* Makes sure at least want 2 MiB huge pages are free: as root, by reserving more (given back
 * when this process exits). 0, or -ENOSPC with the reason in why. */
int hugepages_reserve(long want, char *why, size_t why_size);

/* The page size (KiB) the kernel uses for this process's mapping holding p, from
 * /proc/self/smaps; -1 when none holds it. */
long kernel_page_kb(const void *p);

/* The soft provider's gate ($MRD_SOFT_GATE, daemon/provider/provider-soft.c): makes a
 * directory with the FIFOs entered and release and sets $MRD_SOFT_GATE (and
 * $MRD_SOFT_GATE_BYTES to min_bytes), so that every soft provider opened from now on (here or
 * in an mrd started after) holds each reg, moving rereg and advise of min_bytes or more until
 * released. The directory goes to dir_out. 0 or -errno. */
int soft_gate_setenv(char *dir_out, size_t size, uint64_t min_bytes);
/* Waits up to timeout_ms for a gated op to enter: its letter ('r' reg, 'm' rereg, 'a' advise,
 * 'f' a DMA's page faults), or -ETIMEDOUT. */
int soft_gate_wait(const char *dir, int timeout_ms);
/* Lets n gated ops (entered or still to come) go on. */
void soft_gate_release(const char *dir, unsigned n);
/* Releases whatever may still wait, unsets the variables, removes the directory. */
void soft_gate_cleanup(const char *dir);
