/* SPDX-License-Identifier: MIT */
/* A real mrd on a private socket, driven through libmrd, mrctl and raw frames. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "macro.h"
#include "test-util.h"
#include "check-run.h"

static struct mrd_proc mrd;
static char mrctl[512], out[16384];

static void start(const char *config_text)
{
	int r = mrd_proc_start(&mrd, config_text, NULL);

	ck_assert_msg(r == 0, "mrd did not start: %s", strerror(-r));
	test_build_path("mrctl", mrctl, sizeof(mrctl));
}

/* No huge pages: test-hugetlb, running beside, counts the free ones. */
static void setup(void)
{
	start("[limits]\nclients = 8\nprotocol_errors = 4\n[memory]\nhugepages = no\n");
}

static void teardown(void)
{
	if (mrd.pid > 0) {
		ck_assert_int_eq(mrd_proc_stop(&mrd), 0); /* clean exit on SIGTERM */
		ck_assert_msg(mrd.stopping_seen, "mrd did not send STOPPING=1");
	}
}

static int mrctl_run(uid_t uid, const char *a, const char *b)
{
	const char *argv[] = { mrctl, "--socket", mrd.socket, a, b, NULL };

	return run_capture(argv, out, sizeof(out), uid);
}

START_TEST(test_libmrd_session)
{
	mrd_client *c = NULL;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_client_protocol_version(c), 1);
	ck_assert_str_eq(mrd_client_server_version(c), PACKAGE_VERSION);
	ck_assert_str_eq(mrd_version(), PACKAGE_VERSION);
	for (int i = 0; i < 100; i++)
		ck_assert_int_eq(mrd_client_ping(c), 0);
	ck_assert_ptr_null(mrd_client_close(c));

	/* NULL-safe, and the NULL handle is rejected, not dereferenced. */
	ck_assert_ptr_null(mrd_client_close(NULL));
	ck_assert_int_eq(mrd_client_ping(NULL), -EINVAL);
	ck_assert_int_eq(mrd_client_protocol_version(NULL), -EINVAL);
	ck_assert_ptr_null(mrd_client_server_version(NULL));
	ck_assert_int_eq(mrd_client_connect(mrd.socket, NULL), -EINVAL);
}
END_TEST

static int mrctl_pools(const char *const *args)
{
	const char *argv[16] = { mrctl, "--socket", mrd.socket };
	size_t n = 3;

	for (; *args && n < ELEMENTSOF(argv) - 1; args++)
		argv[n++] = *args;
	argv[n] = NULL;
	return run_capture(argv, out, sizeof(out), (uid_t)-1);
}

/* Free and allocate again: the parked handle serves, mrctl shows it, a short aging set by
 * mrctl destroys it once parked again. */
START_TEST(test_mrctl_pools)
{
	mrd_client *c = NULL;
	mrd_cache *l;
	struct mrd_keys first, second;
	unsigned long long pages;
	char row[512];
	void *buf;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 64 * 1024, 0, 0, &buf), 0);
	ck_assert_int_eq(mrd_cache_keys(l, buf, &first), 0);
	ck_assert_int_eq(mrd_mem_free(c, buf), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 64 * 1024, 0, 0, &buf), 0);
	ck_assert_int_eq(mrd_cache_keys(l, buf, &second), 0);
	ck_assert_uint_ne(second.lkey, first.lkey);

	/* 64 KiB is 16 pages, or one 2 MiB page in a huge-page arena: the pool's size class. */
	ck_assert_int_eq(mrctl_pools((const char *[]){ "--json", "pools", NULL }), 0);
	ck_assert_msg(strstr(out, "\"pages\":"), "mrctl said: %s", out);
	pages = strtoull(strstr(out, "\"pages\":") + 8, NULL, 10);
	ck_assert_msg(pages == 16 || pages == 512, "mrctl said: %s", out);
	/* access 47: lw,rw,rr,ra and mw (soft has memory windows). */
	snprintf(row, sizeof(row), "\"on\":true,\"off_reason\":\"\",\"queued\":0,\"max_queued\":4096,"
		 "\"aging_s\":60,\"pinned\":0,\"pools\":[{\"access\":47,\"odp\":false,"
		 "\"internal\":false,\"vendor\":0,\"pages\":%llu,\"queued\":0,\"in_use\":1,"
		 "\"max_in_use\":1,\"hits\":1,\"misses\":1,\"aged\":0", pages);
	ck_assert_msg(strstr(out, row), "mrctl said: %s", out);
	/* Soft's keys never come back: no quarantine. */
	ck_assert_msg(strstr(out, "}],\"quarantine\":{\"on\":false,\"parked\":0,\"unparked\":0}}"),
		      "mrctl said: %s", out);
	ck_assert_int_eq(mrctl_pools((const char *[]){ "pools", NULL }), 0);
	ck_assert_msg(strstr(out, "1 pool, 0 handles parked"), "mrctl said: %s", out);
	ck_assert_msg(strstr(out, "  key quarantine: off (released keys do not come back on this "
				  "device)\n"), "mrctl said: %s", out);
	snprintf(row, sizeof(row), "lw,rw,rr,ra,mw no  no       0 %8llu       0       1       1"
		 "         1         1       0    60s      0", pages);
	ck_assert_msg(strstr(out, row), "mrctl said: %s", out);

	/* Bad settings are refused before anything is sent or changed. */
	ck_assert_int_eq(mrctl_pools((const char *[]){ "pools", "set", "--aging", "0", NULL }), 2);
	ck_assert_int_eq(mrctl_pools((const char *[]){ "pools", "set", "--odp", "maybe",
						       "--aging", "1", NULL }), 2);
	ck_assert_int_eq(mrctl_pools((const char *[]){ "pools", "set", "--pages", "16", NULL }),
			 2);
	ck_assert_int_eq(mrctl_pools((const char *[]){ "pools", "set", "--domain", "nobody",
						       "--aging", "1", NULL }), 1);
	ck_assert_msg(strstr(out, "no domain nobody is open"), "mrctl said: %s", out);
	ck_assert_int_eq(mrctl_pools((const char *[]){ "pools", "set", "--pages", "8",
						       "--aging", "1", NULL }), 0);
	ck_assert_msg(strstr(out, "0 pools changed"), "mrctl said: %s", out);

	snprintf(row, sizeof(row), "%llu", pages);
	ck_assert_int_eq(mrctl_pools((const char *[]){ "pools", "set", "--pages", row, "--access",
						       "lw,rw,rr,ra,mw", "--odp", "no", "--aging",
						       "1", "--pinned", "0", NULL }), 0);
	ck_assert_msg(strstr(out, "1 pool changed"), "mrctl said: %s", out);
	ck_assert_int_eq(mrd_mem_free(c, buf), 0);
	/* Parked now; the once-a-second aging destroys it a second or two later. */
	for (double t0 = test_now_s(); test_now_s() - t0 < TEST_WAIT_S;) {
		ck_assert_int_eq(mrctl_pools((const char *[]){ "--json", "pools", NULL }), 0);
		if (strstr(out, "\"aged\":1"))
			break;
		usleep(50 * 1000);
	}
	ck_assert_msg(strstr(out, "\"queued\":0,\"in_use\":0,\"max_in_use\":1,\"hits\":1,"
				  "\"misses\":1,\"aged\":1,\"aging_s\":1"), "mrctl said: %s", out);

	/* flush: options checked, then every domain, or one. */
	ck_assert_int_eq(mrctl_pools((const char *[]){ "flush", "--aging", "1", NULL }), 2);
	ck_assert_int_eq(mrctl_pools((const char *[]){ "pools", "--gc", NULL }), 2);
	ck_assert_int_eq(mrctl_pools((const char *[]){ "flush", "--uid", "0", "--domain", "uid-0",
						       NULL }), 2);
	ck_assert_int_eq(mrctl_pools((const char *[]){ "flush", "--domain", "nobody", NULL }), 1);
	ck_assert_msg(strstr(out, "no domain nobody is open"), "mrctl said: %s", out);
	ck_assert_int_eq(mrctl_pools((const char *[]){ "flush", "--gc", NULL }), 0);
	/* The aged pool stays: it was set by its key. */
	ck_assert_msg(strstr(out, "1 domain flushed: tables rebuilt, generation bumped; 0 parked "
				  "handles destroyed, 0 pools removed"), "mrctl said: %s", out);
	ck_assert_int_eq(mrctl_pools((const char *[]){ "--json", "flush", "--uid", "0", NULL }), 0);
	ck_assert_msg(strstr(out, "{\"domains\":1,\"handles\":0,\"pools_removed\":0}"),
		      "mrctl said: %s", out);
	mrd_cache_free(l);
	ck_assert_ptr_null(mrd_client_close(c));
}
END_TEST

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "we");

	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
}

static void sighup_wait(char *status, size_t size)
{
	ck_assert_int_eq(kill(mrd.pid, SIGHUP), 0);
	ck_assert_int_eq(mrd_proc_notified(&mrd, "RELOADING=1", status, size, TEST_WAIT_S * 1000),
			 0);
	if (!strstr(status, "READY=1"))
		ck_assert_int_eq(mrd_proc_notified(&mrd, "READY=1", status, size,
						   TEST_WAIT_S * 1000), 0);
}

/* SIGHUP reads mrd.conf and mrd.conf.d again: a runtime key changes at once, a key read only
 * at start keeps its value and is named, and a broken file changes nothing. */
START_TEST(test_sighup_reload)
{
	mrd_client *c = NULL;
	char path[288], status[512], extra[160];
	void *buf[5];

	ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
	start("[quota]\nallocations = 2\n[memory]\nhugepages = no\n");
	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 4096, 0, 0, &buf[0]), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 4096, 0, 0, &buf[1]), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 4096, 0, 0, &buf[2]), -EDQUOT);

	/* The file raises the quota to 3, a drop-in to 4; the window cannot move while mrd runs. */
	snprintf(extra, sizeof(extra), "%s", getenv("MRD_TEST_CONF") ? getenv("MRD_TEST_CONF") : "");
	snprintf(path, sizeof(path), "%s\n[mrd]\nbus = no\nsocket_mode = 0666\n[quota]\nallocations = 3\n"
		 "[memory]\nhugepages = no\n"
		 "window_size = %s\n", extra, getenv("MRD_TEST_WRAPPER") ? "16G" : "8G");
	write_file(mrd.config, path);
	snprintf(path, sizeof(path), "%s.d", mrd.config);
	ck_assert_int_eq(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s.d/50-quota.conf", mrd.config);
	write_file(path, "[quota]\nallocations = 4\n");
	snprintf(path, sizeof(path), "%s.d/README", mrd.config); /* not *.conf: not read */
	write_file(path, "this is not INI\n");
	sighup_wait(status, sizeof(status));
	ck_assert_msg(strstr(status, "STATUS=configuration reloaded; needs a restart: "
				     "[memory] window_size"), "%s", status);
	ck_assert_int_eq(mrd_mem_alloc(c, 4096, 0, 0, &buf[2]), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 4096, 0, 0, &buf[3]), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 4096, 0, 0, &buf[4]), -EDQUOT);

	/* A bad line anywhere: nothing changes. */
	snprintf(path, sizeof(path), "%s.d/60-broken.conf", mrd.config);
	write_file(path, "[quota]\nallocations = 100\nno equals sign\n");
	sighup_wait(status, sizeof(status));
	ck_assert_msg(strstr(status, "reload failed"), "%s", status);
	ck_assert_int_eq(mrd_mem_alloc(c, 4096, 0, 0, &buf[4]), -EDQUOT);
	ck_assert_ptr_null(mrd_client_close(c));
}
END_TEST

/* The hex mask of a /proc status line ("SigBlk:\t...") of one file, or fallback if there is
 * none (a thread that ended meanwhile). */
static unsigned long long status_mask(const char *path, const char *field,
				      unsigned long long fallback)
{
	unsigned long long v = fallback;
	char line[256];
	FILE *f = fopen(path, "re");

	if (!f)
		return fallback;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, field, strlen(field)) == 0 &&
		    sscanf(line + strlen(field), ":\t%llx", &v) == 1)
			break;
	fclose(f);
	return v;
}

/* The loop's signals come through its signalfd alone: blocked in every thread of mrd, no
 * handler installed (one run by a runtime that defers handlers, ThreadSanitizer's, lost a
 * SIGTERM), and they still act: SIGHUP reloads, SIGTERM stops (the fixture's stop). */
START_TEST(test_loop_signals_only_through_the_loop)
{
	const int sigs[] = { SIGTERM, SIGINT, SIGHUP, SIGUSR2 };
	char path[64], status[512];
	unsigned long long want = 0, caught;
	struct dirent *e;
	unsigned threads = 0;
	DIR *d;

	for (size_t i = 0; i < ELEMENTSOF(sigs); i++)
		want |= 1ull << (sigs[i] - 1);
	/* Under valgrind the process is valgrind's: it catches every signal and keeps the
	 * threads' masks itself. */
	if (getenv("MRD_TEST_WRAPPER") && *getenv("MRD_TEST_WRAPPER"))
		goto reload;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)mrd.pid);
	caught = status_mask(path, "SigCgt", ~0ull);
	ck_assert_msg((caught & want) == 0, "mrd catches loop signals by a handler: %llx",
		      caught & want);
	snprintf(path, sizeof(path), "/proc/%d/task", (int)mrd.pid);
	d = opendir(path);
	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d))) {
		char task[300];
		unsigned long long blocked;

		if (e->d_name[0] == '.')
			continue;
		snprintf(task, sizeof(task), "/proc/%d/task/%s/status", (int)mrd.pid, e->d_name);
		blocked = status_mask(task, "SigBlk", want);
		ck_assert_msg((blocked & want) == want, "thread %s of mrd takes loop signals (blocked "
			      "%llx)", e->d_name, blocked);
		threads++;
	}
	closedir(d);
	ck_assert_uint_ge(threads, 2); /* the loop and its workers at least */
reload:
	sighup_wait(status, sizeof(status));
	ck_assert_msg(strstr(status, "STATUS=configuration reloaded"), "%s", status);
}
END_TEST

START_TEST(test_get_pd_on_soft)
{
	mrd_client *c = NULL;
	uint32_t handle = 7;
	int fd = -1;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_client_get_pd(c, &fd, &handle), -EOPNOTSUPP);
	ck_assert_int_eq(fd, -1);
	ck_assert_uint_eq(handle, 7); /* untouched on failure */
	ck_assert_int_eq(mrd_client_get_pd(NULL, &fd, &handle), -EINVAL);
	ck_assert_int_eq(mrd_client_get_pd(c, NULL, &handle), -EINVAL);
	ck_assert_int_eq(mrd_client_ping(c), 0); /* a refused request is no protocol error */
	mrd_client_close(c);
}
END_TEST

static bool has_rdma_device(void)
{
	DIR *d = opendir("/sys/class/infiniband");
	struct dirent *de;
	bool found = false;

	while (d && (de = readdir(d)))
		if (de->d_name[0] != '.')
			found = true;
	if (d)
		closedir(d);
	return found;
}

START_TEST(test_provider_selection)
{
	char mrd_bin[512], sock[160];
	const char *verbs[] = { test_build_path("mrd", mrd_bin, sizeof(mrd_bin)), "--foreground",
				"--config", mrd.config, "--socket", sock, "--provider", "verbs", NULL };
	const char *soft_dev[] = { mrd_bin, "--foreground", "--config", mrd.config, "--socket", sock,
				   "--provider", "soft", "--device", "mlx5_0", NULL };
	int r;

	snprintf(sock, sizeof(sock), "%s/other.sock", mrd.dir);
	if (has_rdma_device()) {
		printf("test_provider_selection: this host has an RDMA device; the no-device "
		       "refusal is not checked here\n");
		return;
	}
	r = run_capture(verbs, out, sizeof(out), (uid_t)-1);
	ck_assert_int_eq(r, 1);
	ck_assert_msg(strstr(out, "no RDMA device found"), "%s", out);
	ck_assert_int_eq(run_capture(soft_dev, out, sizeof(out), (uid_t)-1), 1);
	ck_assert_msg(strstr(out, "RDMA device 'mlx5_0' not found"), "%s", out);
}
END_TEST

START_TEST(test_socket_from_environment)
{
	mrd_client *c = NULL;

	setenv("MRD_SOCKET", mrd.socket, 1);
	ck_assert_int_eq(mrd_client_connect(NULL, &c), 0);
	ck_assert_int_eq(mrd_client_ping(c), 0);
	mrd_client_close(c);
	unsetenv("MRD_SOCKET");
}
END_TEST

START_TEST(test_not_running)
{
	mrd_client *c = (mrd_client *)0x1;
	const char *argv[] = { mrctl, "--socket", "/nonexistent/mrd.sock", "status", NULL };

	ck_assert_int_eq(mrd_client_connect("/nonexistent/mrd.sock", &c), -ENOENT);
	ck_assert_ptr_eq(c, (mrd_client *)0x1); /* untouched on failure */

	ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 1);
	ck_assert_msg(strstr(out, "is mrd running?"), "mrctl said: %s", out);
}
END_TEST

START_TEST(test_mrctl_status)
{
	ck_assert_int_eq(mrctl_run((uid_t)-1, "status", NULL), 0);
	ck_assert_msg(strstr(out, "version:          " PACKAGE_VERSION), "%s", out);
	ck_assert_msg(strstr(out, "provider:         soft"), "%s", out);
	ck_assert_msg(strstr(out, "DMA by keys:      yes"), "%s", out);
	ck_assert_msg(strstr(out, "clients:          1 of 8"), "%s", out);

	ck_assert_int_eq(mrctl_run((uid_t)-1, "--json", "status"), 0);
	ck_assert_msg(strstr(out, "\"version\":\"" PACKAGE_VERSION "\""), "%s", out);
	ck_assert_msg(strstr(out, "\"clients\":1,"), "%s", out);
	ck_assert_msg(strstr(out, "\"provider\":\"soft\",\"device\":\"soft\""), "%s", out);
	ck_assert_msg(strstr(out, "\"odp\":true"), "%s", out);
	ck_assert_msg(out[0] == '{' && strstr(out, "}\n"), "not one JSON object: %s", out);
}
END_TEST

/* A device that fails to let go of an MR ($MRD_SOFT_DEREG_FAIL: the pools' park, then the
 * dereg): the freed run is quarantined, shown, not handed out again; a flush tries again. */
START_TEST(test_failed_dereg_quarantines_and_shows)
{
	mrd_client *c = NULL;
	mrd_cache *l;
	struct mrd_keys k;
	void *buf, *next;

	teardown();
	ck_assert_int_eq(setenv("MRD_SOFT_DEREG_FAIL", "2", 1), 0);
	setup();
	unsetenv("MRD_SOFT_DEREG_FAIL");
	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 64 * 1024, 0, 0, &buf), 0);
	ck_assert_int_eq(mrd_cache_keys(l, buf, &k), 0);
	ck_assert_int_eq(mrd_mem_free(c, buf), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 64 * 1024, 0, 0, &next), 0);
	ck_assert_ptr_ne(next, buf); /* not the run the device still holds */

	ck_assert_int_eq(mrctl_run((uid_t)-1, "--json", "status"), 0);
	ck_assert_msg(strstr(out, "\"quarantined_bytes\":65536,\"quarantined_runs\":1"), "%s", out);
	ck_assert_int_eq(mrctl_run((uid_t)-1, "status", NULL), 0);
	ck_assert_msg(strstr(out, "quarantined:      65536 bytes in 1 freed runs"), "%s", out);
	ck_assert_int_eq(mrctl_run((uid_t)-1, "--json", "clients"), 0);
	ck_assert_msg(strstr(out, "\"quarantined_bytes\":65536,\"quarantined_runs\":1,\"memory_windows\":0"), "%s", out);
	ck_assert_int_eq(mrctl_run((uid_t)-1, "clients", NULL), 0);
	ck_assert_msg(strstr(out, "(65536 bytes in 1 runs quarantined: dereg failed)"), "%s", out);
	ck_assert_int_eq(mrctl_run((uid_t)-1, "stats", NULL), 0);
	ck_assert_msg(strstr(out, "quarantined:            65536 bytes in 1 freed runs"), "%s", out);

	/* The device takes it now: the run goes back. */
	ck_assert_int_eq(mrctl_run((uid_t)-1, "flush", NULL), 0);
	ck_assert_int_eq(mrctl_run((uid_t)-1, "--json", "stats"), 0);
	ck_assert_msg(strstr(out, "\"quarantined_bytes\":0,\"quarantined_runs\":0"), "%s", out);
	ck_assert_int_eq(mrd_mem_free(c, next), 0);
	mrd_cache_free(l);
	mrd_client_close(c);
}
END_TEST

START_TEST(test_mrctl_usage)
{
	const char *help[] = { mrctl, "--help", NULL };
	const char *none[] = { mrctl, NULL };

	ck_assert_int_eq(run_capture(help, out, sizeof(out), (uid_t)-1), 0);
	ck_assert_ptr_nonnull(strstr(out, "status"));
	ck_assert_int_eq(run_capture(none, out, sizeof(out), (uid_t)-1), 2);
	ck_assert_int_eq(mrctl_run((uid_t)-1, "frobnicate", NULL), 2);
	ck_assert_ptr_nonnull(strstr(out, "unknown command"));
}
END_TEST

/* nobody may not reach the build tree (a clone in a 0700 directory): mrctl_run runs a copy
 * from mrd's own directory from here on. */
static void mrctl_for_nobody(void)
{
	char cmd[1200];

	snprintf(cmd, sizeof(cmd), "cp '%s' '%s/mrctl' && chmod 0755 '%s/mrctl'", mrctl, mrd.dir,
		 mrd.dir);
	ck_assert_int_eq(system(cmd), 0);
	snprintf(mrctl, sizeof(mrctl), "%s/mrctl", mrd.dir);
}

/* A cgroup v2 folder below this process's own, named name, made here (its path in path), as a
 * container runtime makes one per container; false with the reason on stderr where there is
 * no cgroup v2 mount or it is read-only. */
static bool container_cgroup(const char *name, char *path, size_t size)
{
	char line[1024], mount[512] = "", own[512] = "";
	FILE *f = fopen("/proc/self/mountinfo", "re");

	while (f && fgets(line, sizeof(line), f)) {
		char root[512], point[512], *dash = strstr(line, " - cgroup2 ");

		if (dash && sscanf(line, "%*s %*s %*s %511s %511s", root, point) == 2 &&
		    strcmp(root, "/") == 0)
			snprintf(mount, sizeof(mount), "%s", point);
	}
	if (f)
		fclose(f);
	f = fopen("/proc/self/cgroup", "re");
	while (f && fgets(line, sizeof(line), f))
		if (strncmp(line, "0::", 3) == 0)
			snprintf(own, sizeof(own), "%.*s", (int)strcspn(line + 3, "\n"), line + 3);
	if (f)
		fclose(f);
	snprintf(path, size, "%s%s/%s", mount, strcmp(own, "/") == 0 ? "" : own, name);
	if (!mount[0] || !own[0] || (mkdir(path, 0755) < 0 && errno != EEXIST)) {
		fprintf(stderr, "no cgroup v2 folder of our own (%s): container cases skipped\n",
			!mount[0] ? "no cgroup2 mount" : !own[0] ? "no 0:: line" : strerror(errno));
		return false;
	}
	return true;
}

/* mrctl a b, as uid (root: -1) in a container of its own: a new pid namespace, made by
 * unshare(1) after the shell moved itself into cgroup (as podman starts one); output in out. */
static int mrctl_in_container(const char *cgroup, uid_t uid, const char *a, const char *b)
{
	char script[1024], who[32];
	const char *argv[] = { "/bin/sh", "-c", script, mrctl, "--socket", mrd.socket, a, b, NULL };

	snprintf(who, sizeof(who), "%u", (unsigned)uid);
	snprintf(script, sizeof(script),
		 "echo $$ > '%s/cgroup.procs' && exec unshare --pid --fork -- %s \"$0\" \"$@\"",
		 cgroup,
		 uid == (uid_t)-1 ? "" : "setpriv --reuid=65534 --regid=65534 --clear-groups --");
	return run_capture(argv, out, sizeof(out), (uid_t)-1);
}

#define CTR_A "3f2a9b1c0d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccddeeff"
#define CTR_B "aa11bb22cc33dd44ee55ff6600112233445566778899aabbccddeeff00112233"

/* Two containers of one uid get two domains, named after them, not the uid's; root in a
 * container is no admin: Flush refused, its own domain's view alone. */
START_TEST(test_containers_get_domains_of_their_own)
{
	char a[1024], b[1024];

	if (geteuid() != 0) {
		fprintf(stderr, "test_containers_get_domains_of_their_own: needs root: skipped\n");
		return;
	}
	if (!container_cgroup("libpod-" CTR_A ".scope", a, sizeof(a)) ||
	    !container_cgroup("libpod-" CTR_B ".scope", b, sizeof(b)))
		return;
	mrctl_for_nobody();
	ck_assert_int_eq(mrctl_in_container(a, 65534, "status", NULL), 0);
	ck_assert_msg(strstr(out, "ctr-3f2a9b1c0d4e-u65534 ("), "mrctl said: %s", out);
	ck_assert_int_eq(mrctl_in_container(b, 65534, "status", NULL), 0);
	ck_assert_msg(strstr(out, "ctr-aa11bb22cc33-u65534 ("), "mrctl said: %s", out);
	/* The same uid on the host: its uid's */
	ck_assert_int_eq(mrctl_run(65534, "status", NULL), 0);
	ck_assert_msg(strstr(out, "uid-65534 ("), "mrctl said: %s", out);

	ck_assert_int_eq(mrctl_in_container(a, (uid_t)-1, "flush", NULL), 1);
	ck_assert_msg(strstr(out, "mrctl flush needs root or the admin group"), "mrctl said: %s", out);
	ck_assert_int_eq(mrctl_in_container(a, (uid_t)-1, "status", NULL), 0);
	ck_assert_msg(strstr(out, "ctr-3f2a9b1c0d4e (") && !strstr(out, "requests:"),
		      "mrctl said: %s", out);
	ck_assert_int_eq(mrctl_run((uid_t)-1, "flush", NULL), 0); /* the host's root is admin */
	ck_assert_int_eq(rmdir(a), 0);
	ck_assert_int_eq(rmdir(b), 0);
}
END_TEST

/* A libmrd client in a container of its own: a new pid namespace, in cgroup, as uid; it
 * holds its connection until stopped. */
struct ctr_client {
	pid_t pid;
	char domain[64];
};

static void ctr_client_start(struct ctr_client *k, const char *cgroup, uid_t uid)
{
	struct pollfd p;
	char path[1100];
	int rep[2];

	ck_assert_int_eq(pipe2(rep, O_CLOEXEC), 0);
	snprintf(path, sizeof(path), "%s/cgroup.procs", cgroup);
	k->pid = fork();
	ck_assert_int_ge(k->pid, 0);
	if (k->pid == 0) {
		int fd = open(path, O_WRONLY | O_CLOEXEC);
		pid_t inner;

		close(rep[0]);
		/* Gone with the test, whatever way it ends. */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || fd < 0 || write(fd, "0", 1) != 1 ||
		    unshare(CLONE_NEWPID) < 0)
			_exit(2);
		inner = fork(); /* pid 1 of the new namespace */
		if (inner == 0) {
			mrd_client *c = NULL;
			char name[64] = "";

			/* Stopped by the outer one's death (other children hold our pipes too);
			 * after the uid change, which clears it. */
			if (setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0 ||
			    prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
				_exit(3);
			if (mrd_client_connect(mrd.socket, &c) == 0)
				snprintf(name, sizeof(name), "%s", mrd_client_domain(c));
			else
				snprintf(name, sizeof(name), "error: %.50s", mrd_last_error());
			if (write(rep[1], name, sizeof(name)) != sizeof(name))
				_exit(4);
			pause();
			_exit(0);
		}
		_exit(inner > 0 && waitpid(inner, NULL, 0) == inner ? 0 : 5);
	}
	close(rep[1]);
	p = (struct pollfd){ .fd = rep[0], .events = POLLIN };
	ck_assert_msg(poll(&p, 1, TEST_WAIT_S * 1000) == 1, "the container's client did not report");
	ck_assert_int_eq(read(rep[0], k->domain, sizeof(k->domain)), (ssize_t)sizeof(k->domain));
	close(rep[0]);
}

static void ctr_client_stop(struct ctr_client *k)
{
	ck_assert_int_eq(kill(k->pid, SIGKILL), 0);
	ck_assert_int_eq(waitpid(k->pid, NULL, 0), k->pid);
}

static bool clients_show(const char *domain)
{
	return mrctl_run((uid_t)-1, "clients", NULL) == 0 && strstr(out, domain);
}

/* Containers in cgroups a user made (rootless ones: a user may make any number, of any name,
 * in its own systemd subtree) are a few domains per user, [limits]
 * container_domains_per_user (4); then the user's own. A domain that goes frees its slot.
 * Root's cgroups (rootful runtimes) are not counted. */
START_TEST(test_user_made_containers_are_few_per_user)
{
	struct ctr_client k[6];
	char cg[6][1024], name[96], want[64];

	if (geteuid() != 0) {
		fprintf(stderr, "test_user_made_containers_are_few_per_user: needs root: skipped\n");
		return;
	}
	for (int i = 0; i < 6; i++) {
		snprintf(name, sizeof(name), "libpod-%02d%s.scope", i, CTR_A + 2);
		if (!container_cgroup(name, cg[i], sizeof(cg[i])))
			return;
		ck_assert_int_eq(chown(cg[i], 65534, 65534), 0); /* as systemd delegates to a user */
	}
	for (int i = 0; i < 5; i++) {
		ctr_client_start(&k[i], cg[i], 65534);
		snprintf(want, sizeof(want), "ctr-%02d%.10s-user65534", i, CTR_A + 2);
		ck_assert_str_eq(k[i].domain, i < 4 ? want : "uid-65534");
	}
	/* Another client of an open one joins it: no slot of its own. */
	ctr_client_start(&k[5], cg[1], 65534);
	ck_assert_str_eq(k[5].domain, k[1].domain);
	/* Container 2's domain goes: its slot is free for container 4. */
	snprintf(want, sizeof(want), "%s", k[2].domain);
	ctr_client_stop(&k[2]);
	test_wait_until(!clients_show(want), 10000);
	ck_assert_msg(!clients_show(want), "%s is still open: %s", want, out);
	ctr_client_stop(&k[4]);
	ctr_client_start(&k[4], cg[4], 65534);
	snprintf(want, sizeof(want), "ctr-04%.10s-user65534", CTR_A + 2);
	ck_assert_str_eq(k[4].domain, want);
	for (int i = 0; i < 6; i++)
		if (i != 2)
			ctr_client_stop(&k[i]);
	/* Root's cgroups: every container its own, however many. */
	for (int i = 0; i < 6; i++)
		ck_assert_int_eq(chown(cg[i], 0, 0), 0);
	for (int i = 0; i < 6; i++) {
		ctr_client_start(&k[i], cg[i], 65534);
		snprintf(want, sizeof(want), "ctr-%02d%.10s-u65534", i, CTR_A + 2);
		ck_assert_str_eq(k[i].domain, want);
	}
	for (int i = 0; i < 6; i++) {
		ctr_client_stop(&k[i]);
		test_wait_until(rmdir(cg[i]) == 0 || errno != EBUSY, 10000); /* its exit to land */
		ck_assert_msg(access(cg[i], F_OK) < 0, "%s stays: %m", cg[i]);
	}
}
END_TEST

/* Review: a user's pid namespaces in cgroups of root's that no runtime made (a login's session
 * scope: one more each login) count among its container_domains_per_user (4) too. */
START_TEST(test_rev_session_scopes_are_few_per_user)
{
	struct ctr_client k[5];
	char cg[5][1024], name[64];

	if (geteuid() != 0) {
		fprintf(stderr, "test_rev_session_scopes_are_few_per_user: needs root: skipped\n");
		return;
	}
	for (int i = 0; i < 5; i++) {
		snprintf(name, sizeof(name), "rev-session-%d.scope", i);
		if (!container_cgroup(name, cg[i], sizeof(cg[i])))
			return;
	}
	for (int i = 0; i < 5; i++)
		ctr_client_start(&k[i], cg[i], 65534);
	ck_assert_msg(strcmp(k[4].domain, "uid-65534") == 0,
		      "a fifth session scope got a domain of its own: %s", k[4].domain);
	for (int i = 0; i < 5; i++) {
		ctr_client_stop(&k[i]);
		test_wait_until(rmdir(cg[i]) == 0 || errno != EBUSY, 10000); /* its exit to land */
		ck_assert_msg(access(cg[i], F_OK) < 0, "%s stays: %m", cg[i]);
	}
}
END_TEST

/* Review: a user may make a cgroup of any name in its own subtree and a pid namespace to be in
 * it; one named as a rootful container's (whose id /proc/PID/cgroup shows anyone) must not make
 * it a client of that container's domain, whose memory Map hands out. */
START_TEST(test_rev_user_cgroup_does_not_join_rootful_container)
{
	char top[1024], parent[2][1100], cg[2][1200];
	struct ctr_client k[2];

	if (geteuid() != 0) {
		fprintf(stderr, "test_rev_user_cgroup_does_not_join_rootful_container: needs root: "
				"skipped\n");
		return;
	}
	if (!container_cgroup("rev-collide", top, sizeof(top)))
		return;
	/* 0: root's (/machine.slice of rootful podman); 1: the user's delegated subtree */
	for (int i = 0; i < 2; i++) {
		snprintf(parent[i], sizeof(parent[i]), "%s/%s", top, i ? "user" : "machine");
		snprintf(cg[i], sizeof(cg[i]), "%.1100s/libpod-" CTR_A ".scope", parent[i]);
		ck_assert_int_eq(mkdir(parent[i], 0755), 0);
		ck_assert_int_eq(mkdir(cg[i], 0755), 0);
		if (i)
			ck_assert_int_eq(chown(parent[i], 65534, 65534) | chown(cg[i], 65534, 65534), 0);
	}
	ctr_client_start(&k[0], cg[0], 65534); /* podman run --user 65534, rootful */
	ctr_client_start(&k[1], cg[1], 65534); /* the host's uid 65534, unshare -Urp */
	ck_assert_msg(strcmp(k[0].domain, k[1].domain) != 0,
		      "the user's own cgroup joined the rootful container's domain %s", k[0].domain);
	for (int i = 0; i < 2; i++) {
		ctr_client_stop(&k[i]);
		test_wait_until(rmdir(cg[i]) == 0 || errno != EBUSY, 10000); /* its exit to land */
		ck_assert_int_eq(rmdir(parent[i]), 0);
	}
	ck_assert_int_eq(rmdir(top), 0);
}
END_TEST

/* Review: where mrd runs in a pid namespace of its own (a pod without hostPID), a peer outside
 * it has pid 0 to SO_PEERCRED; root in a sibling pid namespace (a rootful container) is in no
 * namespace of mrd's, and so no admin. */
START_TEST(test_rev_peer_outside_mrds_pid_namespace_is_no_admin)
{
	const char *wrapper = getenv("MRD_TEST_WRAPPER");
	struct mrd_proc inner;
	const char *argv[] = { "/usr/bin/unshare", "--pid", "--fork", "--", mrctl, "--socket", inner.socket,
			       "flush", NULL };
	int r;

	if (geteuid() != 0 || (wrapper && *wrapper)) {
		fprintf(stderr, "test_rev_peer_outside_mrds_pid_namespace_is_no_admin: needs root "
				"and no MRD_TEST_WRAPPER: skipped\n");
		return;
	}
	/* unshare waits for mrd, and its death kills it (--kill-child) */
	setenv("MRD_TEST_WRAPPER", "unshare --pid --fork --kill-child", 1);
	r = mrd_proc_start(&inner, "", NULL);
	unsetenv("MRD_TEST_WRAPPER");
	if (r < 0) {
		fprintf(stderr, "test_rev_peer_outside_mrds_pid_namespace_is_no_admin: mrd in a pid "
				"namespace did not start (%s): skipped\n", strerror(-r));
		return;
	}
	r = run_capture(argv, out, sizeof(out), (uid_t)-1);
	mrd_proc_signal(&inner, SIGKILL);
	ck_assert_msg(r == 1 && strstr(out, "mrctl flush needs root or the admin group"),
		      "root outside mrd's pid namespace flushed (%d): %s", r, out);
}
END_TEST

/* Someone else (nobody): the views work and show their own domain alone; changes are refused. */
START_TEST(test_views_and_changes_for_others)
{
	/* As root, drop to nobody; as a user, we are not admin anyway. nobody may not reach the
	 * build tree (a clone in a 0700 directory): it runs a copy from mrd's own directory. */
	uid_t uid = geteuid() == 0 ? 65534 : (uid_t)-1;
	mrd_client *c = NULL;
	void *buf;

	if (uid != (uid_t)-1)
		mrctl_for_nobody();
	/* Our own domain, with memory in it, that nobody must not see. */
	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 4096, 0, 0, &buf), 0);
	ck_assert_int_eq(mrctl_run(uid, "status", NULL), 0);
	/* Its own domain's figures, no daemon-wide count. */
	ck_assert_msg(strstr(out, "domain: ") && !strstr(out, "requests:"), "mrctl said: %s", out);
	ck_assert_int_eq(mrctl_run(uid, "clients", NULL), 0);
	ck_assert_msg(!strstr(out, mrd_client_domain(c)), "mrctl said: %s", out);
	ck_assert_int_eq(mrctl_run(uid, "--json", "pools"), 0);
	ck_assert_msg(strstr(out, "{\"domains\":[],"), "mrctl said: %s", out);
	ck_assert_int_eq(mrctl_run(uid, "dump", NULL), 0);
	ck_assert_msg(!strstr(out, mrd_client_domain(c)), "mrctl said: %s", out);
	ck_assert_int_eq(mrctl_run(uid, "flush", NULL), 1);
	ck_assert_msg(strstr(out, "mrctl flush needs root or the admin group"), "mrctl said: %s", out);
	ck_assert_int_eq(mrctl_run((uid_t)-1, "clients", NULL), 0); /* root sees it */
	ck_assert_msg(strstr(out, mrd_client_domain(c)), "mrctl said: %s", out);
	ck_assert_ptr_null(mrd_client_close(c));
}
END_TEST

/* 1,000 malformed frames from one client: it is dropped, and another is served throughout. */
START_TEST(test_flood_of_malformed_frames)
{
	static const uint8_t garbage[] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01 };
	mrd_client *good = NULL;
	int bad, sent = 0;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &good), 0);
	bad = raw_connect(mrd.socket);
	ck_assert_int_ge(bad, 0);
	for (int i = 0; i < 1000; i++) {
		if (send(bad, garbage, sizeof(garbage), MSG_NOSIGNAL) < 0)
			break; /* mrd hung up on us */
		sent++;
		if (i % 100 == 0)
			ck_assert_int_eq(mrd_client_ping(good), 0);
	}
	ck_assert_int_gt(sent, 4);
	/* The bad client sees the end of its connection. */
	for (;;) {
		char buf[512];
		ssize_t n = recv(bad, buf, sizeof(buf), 0);
		if (n <= 0)
			break;
	}
	close(bad);
	ck_assert_int_eq(mrd_client_ping(good), 0);
	mrd_client_close(good);

	ck_assert_int_eq(mrctl_run((uid_t)-1, "status", NULL), 0);
	ck_assert_msg(strstr(out, "clients dropped:  1"), "%s", out);
}
END_TEST

START_TEST(test_client_limit)
{
	mrd_client *c[8] = { NULL }, *extra = NULL;

	for (int i = 0; i < 8; i++)
		ck_assert_int_eq(mrd_client_connect(mrd.socket, &c[i]), 0);
	ck_assert_int_eq(mrd_client_connect(mrd.socket, &extra), -EUSERS);
	ck_assert_ptr_null(extra);
	mrd_client_close(c[0]);
	ck_assert_int_eq(mrd_client_ping(c[1]), 0); /* the round trip lets mrd see the close */
	test_wait_until(mrd_client_connect(mrd.socket, &extra) >= 0, 10000);
	ck_assert_ptr_nonnull(extra);
	mrd_client_close(extra);
	for (int i = 1; i < 8; i++)
		mrd_client_close(c[i]);
}
END_TEST

START_TEST(test_second_daemon_refused)
{
	char mrd_bin[512];
	const char *argv[] = { test_build_path("mrd", mrd_bin, sizeof(mrd_bin)), "--foreground",
			       "--config", mrd.config, "--socket", mrd.socket, NULL };
	mrd_client *c = NULL;

	ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 1);
	ck_assert_msg(strstr(out, "another mrd is serving"), "%s", out);
	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0); /* the first still serves */
	mrd_client_close(c);
}
END_TEST

START_TEST(test_stale_socket_detach_sigterm)
{
	char mrd_bin[512], pidbuf[32];
	const char *argv[] = { test_build_path("mrd", mrd_bin, sizeof(mrd_bin)), "--config",
			       mrd.config, "--socket", mrd.socket, NULL };
	mrd_client *c = NULL;
	struct stat st;
	FILE *f;

	/* SIGKILL leaves the socket file behind; the next mrd replaces it. */
	kill(mrd.pid, SIGKILL);
	waitpid(mrd.pid, NULL, 0);
	mrd.pid = 0;
	ck_assert_int_eq(stat(mrd.socket, &st), 0);

	/* Without --foreground mrd detaches; its parent exits 0 once the child serves. */
	ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 0);
	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_client_ping(c), 0);
	mrd_client_close(c);

	ck_assert_int_eq(mrctl_run((uid_t)-1, "--json", "status"), 0);
	f = fmemopen(out, strlen(out), "r");
	ck_assert_int_eq(fscanf(f, "{\"version\":\"%*[^\"]\",\"pid\":%31[0-9]", pidbuf), 1);
	fclose(f);
	ck_assert_int_ne(atoi(pidbuf), getpid());

	/* SIGTERM: a clean exit that removes the socket it bound. */
	ck_assert_int_eq(kill(atoi(pidbuf), SIGTERM), 0);
	test_wait_until(stat(mrd.socket, &st) < 0, 10000);
	ck_assert_msg(stat(mrd.socket, &st) < 0, "socket not removed after SIGTERM");
	mrd_proc_stop(&mrd); /* removes the directory */
}
END_TEST

START_TEST(test_bad_config_refused)
{
	char mrd_bin[512];
	const char *missing[] = { test_build_path("mrd", mrd_bin, sizeof(mrd_bin)), "--foreground",
				  "--config", "/nonexistent/mrd.conf", NULL };
	const char *bad_provider[] = { mrd_bin, "--foreground", "--provider", "magic", NULL };
	const char *extra_arg[] = { mrd_bin, "--foreground", "stray", NULL };
	const char *version[] = { mrd_bin, "--version", NULL };
	struct mrd_proc bad;

	ck_assert_int_eq(run_capture(missing, out, sizeof(out), (uid_t)-1), 1);
	ck_assert_msg(strstr(out, "/nonexistent/mrd.conf"), "%s", out);
	ck_assert_int_eq(run_capture(bad_provider, out, sizeof(out), (uid_t)-1), 1);
	ck_assert_msg(strstr(out, "--provider"), "%s", out);
	ck_assert_int_eq(run_capture(extra_arg, out, sizeof(out), (uid_t)-1), 1);
	ck_assert_int_eq(run_capture(version, out, sizeof(out), (uid_t)-1), 0);
	ck_assert_str_eq(out, "mrd " PACKAGE_VERSION "\n");

	/* A bad line is named by file and line, and mrd does not start. */
	ck_assert_int_eq(mrd_proc_start(&bad, "[limits]\n\nclients = lots\n", NULL), -ECHILD);
	mrd_proc_stop(&bad);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("integration");
	TCase *tc = tcase_create("mrd");

	signal(SIGPIPE, SIG_IGN);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_libmrd_session);
	tcase_add_test(tc, test_socket_from_environment);
	tcase_add_test(tc, test_get_pd_on_soft);
	tcase_add_test(tc, test_provider_selection);
	tcase_add_test(tc, test_not_running);
	tcase_add_test(tc, test_mrctl_status);
	tcase_add_test(tc, test_failed_dereg_quarantines_and_shows);
	tcase_add_test(tc, test_mrctl_usage);
	tcase_add_test(tc, test_mrctl_pools);
	tcase_add_test(tc, test_sighup_reload);
	tcase_add_test(tc, test_loop_signals_only_through_the_loop);
	tcase_add_test(tc, test_views_and_changes_for_others);
	tcase_add_test(tc, test_containers_get_domains_of_their_own);
	tcase_add_test(tc, test_user_made_containers_are_few_per_user);
	tcase_add_test(tc, test_rev_session_scopes_are_few_per_user);
	tcase_add_test(tc, test_rev_user_cgroup_does_not_join_rootful_container);
	tcase_add_test(tc, test_rev_peer_outside_mrds_pid_namespace_is_no_admin);
	tcase_add_test(tc, test_flood_of_malformed_frames);
	tcase_add_test(tc, test_client_limit);
	tcase_add_test(tc, test_second_daemon_refused);
	tcase_add_test(tc, test_stale_socket_detach_sigterm);
	tcase_add_test(tc, test_bad_config_refused);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
