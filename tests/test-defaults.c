/* SPDX-License-Identifier: MIT */
/* The defaults a new user gets, on a real mrd started with the shipped conf/mrd.conf and with
 * an empty file: who may connect to the socket mrd binds, quotas that fit the host, small
 * allocations kept off huge pages, a memlock warning, and libmrd's debug lines. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "test-util.h"
#include "check-run.h"

#define MiB (1ul << 20)
#define FREE_PATH HUGEPAGES_FREE_PATH
#define RESERVE_PAGES 4

static struct mrd_proc mrd;
static char conf_dir[64]; /* the configuration under test, outside mrd's own directory */
static char out[65536];

static uint64_t mem_total(void)
{
	char line[128];
	unsigned long long kb = 0;
	FILE *f = fopen("/proc/meminfo", "re");

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
			break;
	fclose(f);
	ck_assert_uint_gt(kb, 0);
	return (uint64_t)kb << 10;
}

/* Starts mrd on exactly the file given (NULL: an empty one): --config and --no-bus after the
 * helper's own, so they win. What a sanitizer or valgrind run needs goes to a drop-in. */
static void start_on(const char *source)
{
	char path[128], dropin[160], cmd[512];
	const char *wrapper = getenv("MRD_TEST_WRAPPER");
	const char *extra[] = { "--config", path, "--no-bus", NULL };
	FILE *f;

	snprintf(conf_dir, sizeof(conf_dir), "/tmp/mrd-defaults.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(conf_dir));
	snprintf(path, sizeof(path), "%s/mrd.conf", conf_dir);
	if (source) {
		snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", source, path);
		ck_assert_int_eq(system(cmd), 0);
	} else {
		f = fopen(path, "we");
		ck_assert_ptr_nonnull(f);
		fclose(f);
	}
	if ((wrapper && *wrapper) || getenv("MRD_TEST_CONF")) {
		snprintf(dropin, sizeof(dropin), "%s.d", path);
		ck_assert_int_eq(mkdir(dropin, 0755), 0);
		snprintf(dropin, sizeof(dropin), "%s.d/test.conf", path);
		f = fopen(dropin, "we");
		ck_assert_ptr_nonnull(f);
		if (wrapper && *wrapper)
			fputs("[memory]\nwindow_size = 8G\n", f);
		if (getenv("MRD_TEST_CONF"))
			fprintf(f, "%s\n", getenv("MRD_TEST_CONF"));
		fclose(f);
	}
	ck_assert_int_eq(mrd_proc_start(&mrd, NULL, extra), 0);
}

static void setup_shipped(void)
{
	char conf[512];
	const char *src = getenv("MRD_SRCDIR");

	snprintf(conf, sizeof(conf), "%s/conf/mrd.conf", src ? src : "..");
	start_on(conf);
}

static void setup_empty(void)
{
	start_on(NULL);
}

static void teardown(void)
{
	char cmd[128];

	if (mrd.pid > 0)
		ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
	if (conf_dir[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", conf_dir);
		(void)!system(cmd);
	}
}

/* The gid a socket mrd binds gets by default: group mrd's, root's where it does not exist. */
static gid_t default_socket_gid(void)
{
	struct group *g = getgrnam("mrd");

	return g ? g->gr_gid : 0;
}

/* raw_connect(path) from a child running as uid (and gid) id, no other groups. */
static int connect_as(const char *path, uid_t id)
{
	int status;
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int fd;

		if (setgroups(0, NULL) < 0 || setgid(id) < 0 || setuid(id) < 0)
			_exit(126);
		fd = raw_connect(path);
		_exit(fd >= 0 ? 0 : -fd);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFEXITED(status));
	return -WEXITSTATUS(status);
}

/* The socket is root's and its group's, not everyone's. */
START_TEST(test_socket_mode)
{
	struct stat st;

	ck_assert_int_eq(stat(mrd.socket, &st), 0);
	ck_assert_msg((st.st_mode & 07777) == 0660, "socket mode %o", st.st_mode & 07777);
	ck_assert_uint_eq(st.st_uid, 0);
	ck_assert_uint_eq(st.st_gid, default_socket_gid());
	/* nobody is in neither group: refused by the kernel, before mrd sees it. */
	ck_assert_int_eq(connect_as(mrd.socket, 65534), -EACCES);
	ck_assert_int_eq(connect_as(mrd.socket, 0), 0);
}
END_TEST

static void start_logged(const char *config, const char *log, const char *const *extra);
static void read_log(const char *log);

/* One number of mrctl's JSON: the first "key": after the first occurrence of after. */
static uint64_t json_u64(const char *json, const char *after, const char *key)
{
	const char *p = strstr(json, after);
	char k[64];

	ck_assert_msg(p != NULL, "no %s in %s", after, json);
	snprintf(k, sizeof(k), "\"%s\":", key);
	p = strstr(p, k);
	ck_assert_msg(p != NULL, "no %s after %s in %s", key, after, json);
	return strtoull(p + strlen(k), NULL, 10);
}

static void mrctl_clients(void)
{
	char mrctl[512];
	const char *argv[] = { test_build_path("mrctl", mrctl, sizeof(mrctl)), "--socket",
			       mrd.socket, "--json", "clients", NULL };

	ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 0);
}

/* Per-domain quotas never exceed the host's memory (nor does the sum mrd may pin). */
static void assert_quotas_fit_host(void)
{
	uint64_t total = mem_total(), allocated, pinned;
	mrd_client *c = NULL;

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0); /* opens its domain */
	mrctl_clients();
	allocated = json_u64(out, "\"quota\":", "allocated_bytes");
	pinned = json_u64(out, "\"quota\":", "pinned_bytes");
	ck_assert_msg(allocated > 0 && allocated <= total, "quota.allocated_bytes %" PRIu64
		      " on a host of %" PRIu64 " bytes", allocated, total);
	ck_assert_msg(pinned > 0 && pinned <= total, "quota.pinned_bytes %" PRIu64
		      " on a host of %" PRIu64 " bytes", pinned, total);
	mrd_client_close(c);
}

START_TEST(test_quota_within_host)
{
	assert_quotas_fit_host();
}
END_TEST

static long free_hugepages(void)
{
	return read_long(FREE_PATH);
}

/* One 4 KiB allocation takes 4 KiB, not a huge page, even while free huge pages exist; one
 * that fills huge pages still gets them. */
START_TEST(test_small_alloc_no_huge_page)
{
	mrd_client *c = NULL;
	uint8_t *small, *big;
	bool have_huge = free_hugepages() > 0;
	long kb = 0;

	if (!have_huge)
		printf("test_small_alloc_no_huge_page: no free 2 MiB huge pages (%s) and %s: "
		       "only the 4 KiB half is meaningful\n", FREE_PATH,
		       geteuid() == 0 ? "none could be reserved" : "only root may reserve them");
	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, 4096, 0, 0, (void **)&small), 0);
	memset(small, 1, 4096);
	ck_assert_int_eq(kernel_page_kb(small), 4);
	mrctl_clients();
	ck_assert_uint_eq(json_u64(out, "\"domains\":", "allocated_bytes"), 4096);

	/* Another test may hold every free huge page for a moment (it asks for more than the
	 * host has): a few tries, but one that fills a huge page must get one. */
	for (int i = 0; i < TEST_WAIT_S && have_huge && kb != 2048; i++) {
		if (i)
			sleep(1);
		if (free_hugepages() < 1)
			continue;
		ck_assert_int_eq(mrd_mem_alloc(c, 2 * MiB, 0, 0, (void **)&big), 0);
		memset(big, 1, 2 * MiB);
		kb = kernel_page_kb(big);
		if (kb != 2048) {
			ck_assert_int_eq(mrd_mem_free(c, big), 0);
			continue;
		}
		mrctl_clients();
		ck_assert_uint_eq(json_u64(out, "\"domains\":", "allocated_bytes"), 4096 + 2 * MiB);
		ck_assert_int_eq(mrd_mem_free(c, big), 0);
	}
	ck_assert_msg(!have_huge || kb == 2048, "2 MiB allocations got %ld KiB pages while free "
		      "huge pages existed", kb);
	ck_assert_int_eq(mrd_mem_free(c, small), 0);
	mrd_client_close(c);
}
END_TEST

/* Pinned limits beyond the host's memory are cut to it; an allocated one is kept (sparse
 * memory); mrd warns of both. */
START_TEST(test_quota_clamped)
{
	char log[] = "/tmp/mrd-defaults-log.XXXXXX";
	mrd_client *c = NULL;
	int fd = mkstemp(log);

	ck_assert_int_ge(fd, 0);
	close(fd);
	start_logged("[quota]\npinned_bytes = 64T\nallocated_bytes = 64T\n[limits]\n"
		     "pinned_bytes = 64T\n", log, NULL);
	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	mrctl_clients();
	ck_assert_uint_le(json_u64(out, "\"quota\":", "pinned_bytes"), mem_total());
	ck_assert_uint_eq(json_u64(out, "\"quota\":", "allocated_bytes"), 64ULL << 40);
	mrd_client_close(c);
	read_log(log);
	unlink(log);
	for (const char *const *want = (const char *const[]){ "[quota] pinned_bytes = ",
								"[limits] pinned_bytes = ",
								"[quota] allocated_bytes = ", NULL };
	     *want; want++)
		ck_assert_msg(strstr(out, *want) && strstr(strstr(out, *want), "more than this "
			      "host's memory"), "no warning for %s in:\n%s", *want, out);
}
END_TEST

/* mrd creates the socket's folder 0755 and the socket 0660 whatever its umask. */
START_TEST(test_socket_folder)
{
	char sock[192], folder[160];
	const char *extra[] = { "--socket", sock, NULL };
	struct stat st;
	mode_t old = umask(077);

	snprintf(conf_dir, sizeof(conf_dir), "/tmp/mrd-defaults.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(conf_dir));
	ck_assert_int_eq(chmod(conf_dir, 0755), 0);
	snprintf(folder, sizeof(folder), "%s/run", conf_dir);
	snprintf(sock, sizeof(sock), "%s/mrd.sock", folder);
	/* The helper's socket_mode = 0666 back to the default. */
	ck_assert_int_eq(mrd_proc_start(&mrd, "[mrd]\nsocket_mode = 0660\n", extra), 0);
	umask(old);
	ck_assert_int_eq(stat(folder, &st), 0);
	ck_assert_msg((st.st_mode & 07777) == 0755, "folder mode %o", st.st_mode & 07777);
	ck_assert_int_eq(stat(sock, &st), 0);
	ck_assert_msg((st.st_mode & 07777) == 0660, "socket mode %o", st.st_mode & 07777);
	ck_assert_uint_eq(st.st_gid, default_socket_gid());
}
END_TEST

/* --socket in a folder a user owns: that user can swap the socket for a link to a file only
 * root may change, between mrd's bind and what it does next to the path. bind-swap.so makes
 * the swap at the worst moment, every time: mrd changes no mode or group through the link,
 * serves on the path, and warns that the folder is the user's. */
START_TEST(test_socket_folder_of_a_user)
{
	char sock[192], folder[160], secret[192], shim[512], real[PATH_MAX], asan[512];
	char log[] = "/tmp/mrd-defaults-log.XXXXXX";
	const char *extra[] = { "--socket", sock, NULL };
	mrd_client *c = NULL;
	struct stat st;
	int fd;

	if (geteuid() != 0) {
		printf("test_socket_folder_of_a_user: not run: needs root (mrd as root, a folder "
		       "another user owns)\n");
		return;
	}
	ck_assert_ptr_nonnull(realpath(test_build_path("tests/.libs/bind-swap.so", shim,
						       sizeof(shim)), real));
	snprintf(conf_dir, sizeof(conf_dir), "/tmp/mrd-defaults.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(conf_dir));
	ck_assert_int_eq(chmod(conf_dir, 0755), 0);
	snprintf(folder, sizeof(folder), "%s/run", conf_dir);
	ck_assert_int_eq(mkdir(folder, 0755), 0);
	ck_assert_int_eq(chown(folder, 65534, 65534), 0);
	snprintf(sock, sizeof(sock), "%s/mrd.sock", folder);
	snprintf(secret, sizeof(secret), "%s/secret", conf_dir);
	fd = open(secret, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	close(fd);
	fd = mkstemp(log);
	ck_assert_int_ge(fd, 0);
	close(fd);
	/* This test runs in a child of its own: the environment goes with it. */
	setenv("LD_PRELOAD", real, 1);
	setenv("MRD_TEST_SWAP_PATH", sock, 1);
	setenv("MRD_TEST_SWAP_TARGET", secret, 1);
	snprintf(asan, sizeof(asan), "%s%sverify_asan_link_order=0",
		 getenv("ASAN_OPTIONS") ? getenv("ASAN_OPTIONS") : "",
		 getenv("ASAN_OPTIONS") ? ":" : "");
	setenv("ASAN_OPTIONS", asan, 1);
	start_logged(NULL, log, extra);
	unsetenv("LD_PRELOAD");
	ck_assert_int_eq(stat(secret, &st), 0);
	ck_assert_msg((st.st_mode & 07777) == 0600 && st.st_gid == 0,
		      "mrd changed %s through the link: mode %o, gid %u", secret,
		      st.st_mode & 07777, (unsigned)st.st_gid);
	ck_assert_int_eq(lstat(sock, &st), 0);
	ck_assert_msg(S_ISSOCK(st.st_mode), "%s is no socket (mode %o)", sock, st.st_mode);
	ck_assert_msg((st.st_mode & 07777) == 0666, "socket mode %o", st.st_mode & 07777);
	ck_assert_int_eq(mrd_client_connect(sock, &c), 0);
	ck_assert_int_eq(mrd_client_ping(c), 0);
	mrd_client_close(c);
	ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
	read_log(log);
	unlink(log);
	ck_assert_msg(strstr(out, "belongs to uid 65534"), "no warning of the folder in:\n%s", out);
	ck_assert_int_eq(lstat(sock, &st), -1); /* removed at exit */
}
END_TEST

/* [mrd] socket_group and socket_mode say who may connect: here everyone (as the other
 * suites have it, whose clients run as several users). */
START_TEST(test_socket_settings)
{
	struct stat st;

	ck_assert_int_eq(mrd_proc_start(&mrd, "[mrd]\nsocket_group = 65534\nsocket_mode = 0666\n",
					NULL), 0);
	ck_assert_int_eq(stat(mrd.socket, &st), 0);
	ck_assert_msg((st.st_mode & 07777) == 0666, "socket mode %o", st.st_mode & 07777);
	ck_assert_uint_eq(st.st_gid, 65534);
	ck_assert_int_eq(connect_as(mrd.socket, 65534), 0);
}
END_TEST

/* Runs mrd as p->config says, with its stderr in log (the helper leaves it on ours). */
static void start_logged(const char *config, const char *log, const char *const *extra)
{
	int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), saved = dup(2);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_ge(saved, 0);
	ck_assert_int_eq(dup2(fd, 2), 2);
	close(fd);
	fd = mrd_proc_start(&mrd, config, extra);
	ck_assert_int_eq(dup2(saved, 2), 2);
	close(saved);
	ck_assert_int_eq(fd, 0);
}

static void read_log(const char *log)
{
	FILE *f = fopen(log, "re");
	size_t n;

	ck_assert_ptr_nonnull(f);
	n = fread(out, 1, sizeof(out) - 1, f);
	out[n] = '\0';
	fclose(f);
}

/* Without CAP_IPC_LOCK and with a small memlock limit, mrd says at start that it cannot pin
 * what its quotas allow; with the capability it says nothing of the kind. */
START_TEST(test_memlock_warning)
{
	const char *wrapper = getenv("MRD_TEST_WRAPPER");
	char log[] = "/tmp/mrd-defaults-log.XXXXXX", prefix[512];
	struct rlimit small = { 64 << 10, 64 << 10 };
	int fd = mkstemp(log);

	ck_assert_int_ge(fd, 0);
	close(fd);
	if (geteuid() != 0 || system("setpriv --help >/dev/null 2>&1") != 0) {
		printf("test_memlock_warning: not run: needs root and setpriv (util-linux)\n");
		unlink(log);
		return;
	}
	start_logged(NULL, log, NULL);
	ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
	read_log(log);
	ck_assert_msg(strstr(out, "CAP_IPC_LOCK") == NULL, "%s", out);

	/* This test runs in a child of its own: the limit and the wrapper go with it. */
	ck_assert_int_eq(setrlimit(RLIMIT_MEMLOCK, &small), 0);
	snprintf(prefix, sizeof(prefix), "setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock %s",
		 wrapper ? wrapper : "");
	setenv("MRD_TEST_WRAPPER", prefix, 1);
	start_logged(NULL, log, NULL);
	ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
	read_log(log);
	unlink(log);
	ck_assert_msg(strstr(out, "CAP_IPC_LOCK") && strstr(out, "65536"), "%s", out);
}
END_TEST

/* One capability set of process pid, from /proc/pid/status ("CapEff", "CapBnd", ...). */
static uint64_t proc_caps(pid_t pid, const char *set)
{
	char path[64], line[256];
	uint64_t v = UINT64_MAX;
	size_t n = strlen(set);
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, set, n) == 0 && line[n] == ':')
			v = strtoull(line + n + 1, NULL, 16);
	fclose(f);
	ck_assert_msg(v != UINT64_MAX, "no %s in %s", set, path);
	return v;
}

/* mrd gives up CAP_NET_RAW and CAP_SYS_RAWIO, in every set, before it opens a device: on
 * mlx5 a context opened with them has raw-packet and device-internal rights that a client
 * importing it would inherit. What it needs (CAP_IPC_LOCK to pin) it keeps. */
START_TEST(test_raw_capabilities_dropped)
{
	const uint64_t raw = (1ull << 13) | (1ull << 17); /* CAP_NET_RAW, CAP_SYS_RAWIO */
	const char *sets[] = { "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb" };

	if (geteuid() != 0 || (proc_caps(getpid(), "CapEff") & raw) != raw) {
		printf("test_raw_capabilities_dropped: not run: needs root with CAP_NET_RAW\n");
		return;
	}
	ck_assert_int_eq(mrd_proc_start(&mrd, NULL, NULL), 0);
	for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++)
		ck_assert_msg(!(proc_caps(mrd.pid, sets[i]) & raw), "mrd's %s is %" PRIx64, sets[i],
			      proc_caps(mrd.pid, sets[i]));
	ck_assert(proc_caps(mrd.pid, "CapEff") & (1ull << 14)); /* CAP_IPC_LOCK */
	ck_assert(proc_caps(mrd.pid, "CapBnd") & (1ull << 14));
	ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
}
END_TEST

/* On a device that cannot do DMA through keys (iWARP; soft with $MRD_SOFT_DMA=iwarp) mrctl
 * status says so and why, and a Dma request fails with that reason. */
START_TEST(test_no_dma_said_why)
{
	char mrctl[512];
	const char *argv[] = { test_build_path("mrctl", mrctl, sizeof(mrctl)), "--socket",
			       mrd.socket, "--json", "status", NULL };
	const char *text[] = { argv[0], "--socket", mrd.socket, "status", NULL };
	struct mrd_keys mr;
	mrd_cache *l;
	mrd_client *c;
	char *p;

	ck_assert_int_eq(setenv("MRD_SOFT_DMA", "iwarp", 1), 0); /* mrd inherits it */
	ck_assert_int_eq(setenv("MRD_SOFT_MW", "none", 1), 0);   /* and siw has no windows */
	ck_assert_int_eq(mrd_proc_start(&mrd, NULL, NULL), 0);
	ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 0);
	ck_assert_msg(strstr(out, "\"dma\":false,\"no_dma\":\"iWARP ($MRD_SOFT_DMA=iwarp): its RC QPs "
			     "connect only over a TCP connection made by rdma_cm"), "%s", out);
	ck_assert_msg(strstr(out, "\"mw\":false,\"no_mw\":\"no memory windows ($MRD_SOFT_MW=none, "
				  "as siw)\",\"atomic\""), "%s", out);
	ck_assert_int_eq(run_capture(text, out, sizeof(out), (uid_t)-1), 0);
	ck_assert_msg(strstr(out, "DMA by keys:      no (iWARP ($MRD_SOFT_DMA=iwarp)"), "%s", out);
	ck_assert_msg(strstr(out, "memory windows:   no (no memory windows ($MRD_SOFT_MW=none, as "
				  "siw))\n"), "%s", out);

	ck_assert_int_eq(mrd_client_connect(mrd.socket, &c), 0);
	ck_assert_int_eq(mrd_cache_new(c, &l), 0);
	ck_assert_int_eq(mrd_mem_alloc(c, MiB, 0, 0, (void **)&p), 0);
	ck_assert_int_eq(mrd_cache_keys(l, p, &mr), 0);
	ck_assert_int_eq(mrd_dma(c, MRD_DMA_WRITE, mr.lkey, p, mr.rkey, p + 4096, 64), -EOPNOTSUPP);
	ck_assert_msg(strstr(mrd_last_error(), "soft does no DMA through keys: iWARP"), "%s",
		      mrd_last_error());
	ck_assert_int_eq(mrd_mem_free(c, p), 0);
	mrd_cache_free(l);
	mrd_client_close(c);
	ck_assert_int_eq(mrd_proc_stop(&mrd), 0);
}
END_TEST

/* MRD_LOG_LEVEL=debug makes libmrd say what it does: connect, negotiation, memory. */
START_TEST(test_libmrd_debug)
{
	char hello[512];
	const char *argv[] = { test_build_path("examples/mrd-hello", hello, sizeof(hello)),
			       mrd.socket, NULL };

	ck_assert_int_eq(mrd_proc_start(&mrd, NULL, NULL), 0);
	setenv("MRD_LOG_LEVEL", "debug", 1);
	ck_assert_int_eq(run_capture(argv, out, sizeof(out), (uid_t)-1), 0);
	unsetenv("MRD_LOG_LEVEL");
	for (const char *const *want = (const char *const[]){ "libmrd: connected to", "protocol",
								"domain uid-0", "libmrd: allocated", "libmrd: closing",
								"libmrd: freed", NULL };
	     *want; want++)
		ck_assert_msg(strstr(out, *want), "no \"%s\" in:\n%s", *want, out);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("defaults");
	TCase *shipped = tcase_create("shipped"), *empty = tcase_create("empty");
	TCase *other = tcase_create("settings");
	char why[256];

	if (hugepages_reserve(RESERVE_PAGES, why, sizeof(why)) < 0)
		printf("huge pages: %s\n", why);
	tcase_add_checked_fixture(shipped, setup_shipped, teardown);
	tcase_add_checked_fixture(empty, setup_empty, teardown);
	tcase_add_checked_fixture(other, NULL, teardown);
	for (TCase **tc = (TCase *[]){ shipped, empty, NULL }; *tc; tc++) {
		tcase_add_test(*tc, test_socket_mode);
		tcase_add_test(*tc, test_quota_within_host);
		tcase_add_test(*tc, test_small_alloc_no_huge_page);
		suite_add_tcase(s, *tc);
	}
	tcase_add_test(other, test_quota_clamped);
	tcase_add_test(other, test_socket_folder);
	tcase_add_test(other, test_socket_folder_of_a_user);
	tcase_add_test(other, test_socket_settings);
	tcase_add_test(other, test_memlock_warning);
	tcase_add_test(other, test_raw_capabilities_dropped);
	tcase_add_test(other, test_no_dma_said_why);
	tcase_add_test(other, test_libmrd_debug);
	suite_add_tcase(s, other);
	return run_suite(s);
}
