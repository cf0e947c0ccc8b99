/* SPDX-License-Identifier: MIT */
/* mrd.conf parsing: keys, bounds, errors that name the line. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/config.h"
#include "registration/mr-cache.h"
#include "wire.h"
#include "check-run.h"

static char path[64];

static void write_file(const char *text)
{
	FILE *f;
	int fd;

	snprintf(path, sizeof(path), "/tmp/mrd-conf.XXXXXX");
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	f = fdopen(fd, "w");
	fputs(text, f);
	fclose(f);
}

static void teardown(void)
{
	if (path[0])
		unlink(path);
	path[0] = '\0';
}

START_TEST(test_defaults)
{
	struct config c;

	config_init(&c);
	ck_assert_int_eq(config_finish(&c), 0);
	ck_assert_str_eq(c.socket_path, MRD_SOCKET_DEFAULT);
	ck_assert_str_eq(c.provider, "auto");
	ck_assert_ptr_null(c.device);
	ck_assert_ptr_null(c.admin_group);
	ck_assert_uint_eq(c.max_frame, WIRE_FRAME_DEFAULT);
	ck_assert_uint_eq(c.max_fds, 4);
	ck_assert_uint_gt(c.max_clients, 0);
	ck_assert_uint_gt(c.max_inflight, 0);
	config_done(&c);
}
END_TEST

START_TEST(test_full_file)
{
	struct config c;

	write_file("# comment\n"
		   "; another\n"
		   "[mrd]\n"
		   "socket = /tmp/x.sock\n"
		   "  provider=soft  \n"
		   "device = mlx5_0\n"
		   "log_level = debug\n"
		   "admin_group = 0\n"
		   "\n"
		   "[limits]\n"
		   "clients = 7\n"
		   "requests_in_flight = 9\n"
		   "frame_bytes = 4096\n"
		   "fds_per_message = 2\n"
		   "protocol_errors = 0\n");
	config_init(&c);
	ck_assert_int_eq(config_load_file(&c, path), 0);
	ck_assert_int_eq(config_finish(&c), 0);
	ck_assert_str_eq(c.socket_path, "/tmp/x.sock");
	ck_assert_str_eq(c.provider, "soft");
	ck_assert_str_eq(c.device, "mlx5_0");
	ck_assert_int_eq(c.log_level, LOG_LEVEL_DEBUG);
	ck_assert_uint_eq(c.admin_gid, 0);
	ck_assert_uint_eq(c.max_clients, 7);
	ck_assert_uint_eq(c.max_inflight, 9);
	ck_assert_uint_eq(c.max_frame, 4096);
	ck_assert_uint_eq(c.max_fds, 2);
	ck_assert_uint_eq(c.max_protocol_errors, 0);
	config_done(&c);
}
END_TEST

START_TEST(test_bad_files)
{
	static const char *const bad[] = {
		"[mrd]\nsocket = relative.sock\n",
		"[mrd]\nprovider = magic\n",
		"[mrd]\nlog_level = loud\n",
		"[mrd]\nno_such_key = 1\n",
		"[nosection]\nclients = 1\n",
		"clients = 1\n", /* key outside a section */
		"[limits]\nclients = 0\n",
		"[limits]\nclients = -1\n",
		"[limits]\nclients = 12abc\n",
		"[limits]\nframe_bytes = 100\n",
		"[limits]\nframe_bytes = 99999999\n",
		"[limits]\nfds_per_message = 17\n",
		"[limits\n",
		"[mrd]\njust words\n",
		"[domains]\nuid-5 = uid:5\n",       /* would merge with uid 5's own domain */
		"[domains]\nlab = uid:1\nlab = uid:2\n",
		"[domains]\nbad name = uid:1\n",
		"[domains]\nlab = user:1\n",
		"[policies]\nlab = fast\n",
		"[cache]\nodp_chunk = 1M\n", /* below 2 MiB */
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct config c;
		int r;

		write_file(bad[i]);
		config_init(&c);
		r = config_load_file(&c, path);
		ck_assert_msg(r == -EINVAL, "accepted (%d): %s", r, bad[i]);
		config_done(&c);
		teardown();
	}
}
END_TEST

START_TEST(test_missing_file)
{
	struct config c;

	config_init(&c);
	ck_assert_int_eq(config_load_file(&c, "/nonexistent/mrd.conf"), -ENOENT);
	config_done(&c);
}
END_TEST

static void put(const char *dir, const char *name, const char *text)
{
	char file[256];
	FILE *f;

	snprintf(file, sizeof(file), "%s/%s", dir, name);
	f = fopen(file, "we");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

/* The file, then path.d/ *.conf in lexical order; a missing file is fine unless asked for. */
START_TEST(test_drop_in_folder)
{
	char dir[] = "/tmp/mrd-conf.XXXXXX", conf[128], dropins[128];
	struct config c;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(conf, sizeof(conf), "%s/mrd.conf", dir);
	snprintf(dropins, sizeof(dropins), "%s/mrd.conf.d", dir);
	config_init(&c);
	ck_assert_int_eq(config_load(&c, conf, true), -ENOENT);
	ck_assert_int_eq(config_load(&c, conf, false), 0); /* neither file nor folder */

	put(dir, "mrd.conf", "[quota]\nallocations = 10\nmempools = 5\n");
	ck_assert_int_eq(mkdir(dropins, 0755), 0);
	put(dropins, "20-b.conf", "[quota]\nallocations = 30\n");
	put(dropins, "10-a.conf", "[quota]\nallocations = 20\narenas = 7\n");
	put(dropins, "30-c.conf.disabled", "[quota]\nallocations = 99\n");
	put(dropins, ".40-hidden.conf", "[quota]\nallocations = 98\n");
	ck_assert_int_eq(config_load(&c, conf, true), 0);
	ck_assert_uint_eq(c.quota.allocations, 30); /* 20-b after 10-a */
	ck_assert_uint_eq(c.quota.arenas, 7);
	ck_assert_uint_eq(c.quota.mempools, 5);

	put(dropins, "15-bad.conf", "[quota]\nallocations = many\n");
	ck_assert_int_eq(config_load(&c, conf, true), -EINVAL);
	config_done(&c);
	snprintf(conf, sizeof(conf), "rm -rf '%s'", dir);
	ck_assert_int_eq(system(conf), 0);
}
END_TEST

START_TEST(test_set_errors)
{
	struct config c;

	config_init(&c);
	ck_assert_int_eq(config_set(&c, "limits", "clients", "0"), -ERANGE);
	ck_assert_int_eq(config_set(&c, "limits", "clients", "x"), -EINVAL);
	ck_assert_int_eq(config_set(&c, "limits", "nope", "1"), -ENOENT);
	ck_assert_int_eq(config_set_assignment(&c, "limits.clients=7"), 0);
	ck_assert_uint_eq(c.max_clients, 7);
	ck_assert_int_eq(config_set_assignment(&c, "limits.clients=0"), -ERANGE);
	ck_assert_int_eq(config_set_assignment(&c, "clients=7"), -EINVAL);
	ck_assert_int_eq(config_set_assignment(&c, "limits.clients"), -EINVAL);
	ck_assert_int_eq(config_set(&c, "mrd", "device", ""), 0);
	ck_assert_ptr_null(c.device); /* empty means "the first device" */
	config_done(&c);
}
END_TEST

/* [mrd] devices: names a client's context may be of (BindPd); empty means every one. */
START_TEST(test_devices)
{
	struct config c;
	char many[33 * 4 + 1] = "";

	config_init(&c);
	ck_assert(config_serves_device(&c, "mlx5_0")); /* unset: every device */
	ck_assert_int_eq(config_set(&c, "mrd", "devices", "rxe0, mlx5_1 rxe1"), 0);
	ck_assert(config_serves_device(&c, "rxe0"));
	ck_assert(config_serves_device(&c, "mlx5_1"));
	ck_assert(config_serves_device(&c, "rxe1"));
	ck_assert(!config_serves_device(&c, "rxe")); /* whole names only */
	ck_assert(!config_serves_device(&c, "mlx5_10"));
	ck_assert(!config_serves_device(&c, "siw0"));
	ck_assert_int_eq(config_set(&c, "mrd", "devices", "rxe0;rm -rf"), -EINVAL);
	ck_assert_int_eq(config_set(&c, "mrd", "devices", "../uverbs0"), -EINVAL);
	for (int i = 0; i < 33; i++)
		strcat(many, "d12 ");
	ck_assert_int_eq(config_set(&c, "mrd", "devices", many), -EINVAL); /* 33 names */
	ck_assert(config_serves_device(&c, "rxe1")); /* a refused value changes nothing */
	ck_assert_int_eq(config_set(&c, "mrd", "devices", ""), 0);
	ck_assert_ptr_null(c.devices);
	ck_assert(config_serves_device(&c, "siw0"));
	config_done(&c);
}
END_TEST

START_TEST(test_memory_keys)
{
	struct config c;

	config_init(&c);
	ck_assert_int_eq(config_set(&c, "memory", "window_size", "010G"), 0);
	ck_assert_uint_eq(c.window_size, 10ULL << 30); /* decimal, not octal */
	ck_assert_int_eq(config_set(&c, "memory", "window_base", "0x300000000000"), 0);
	ck_assert_int_eq(config_set(&c, "memory", "arena_size", "256M"), 0);
	ck_assert_int_eq(config_finish(&c), 0);
	ck_assert_int_eq(config_set(&c, "memory", "arena_size", "3M"), 0);
	ck_assert_int_eq(config_finish(&c), -EINVAL); /* not a power of two */
	ck_assert_int_eq(config_set(&c, "memory", "arena_size", "1G"), 0);
	ck_assert_int_eq(config_set(&c, "memory", "window_base", "0x7fffc0000000"), 0);
	ck_assert_int_eq(config_set(&c, "memory", "window_size", "1G"), 0);
	ck_assert_int_eq(config_finish(&c), -EINVAL); /* reaches the unmappable top */
	ck_assert_int_eq(config_set(&c, "memory", "hugepages", "maybe"), -EINVAL);
	ck_assert_int_eq(config_set(&c, "quota", "allocated_bytes", "12Q"), -EINVAL);
	config_done(&c);
}
END_TEST

START_TEST(test_per_user_keys)
{
	struct config c;

	config_init(&c);
	ck_assert_int_eq(config_finish(&c), 0);
	ck_assert_uint_eq(c.max_clients_per_user, 256); /* a quarter of the 1024 [limits] clients */
	/* An eighth of the window by default: 512 GiB of 4 TiB. */
	ck_assert_uint_eq(config_window_bytes(&c, &c.quota), 512ULL << 30);
	ck_assert_int_eq(config_set(&c, "memory", "window_size", "8G"), 0);
	ck_assert_uint_eq(config_window_bytes(&c, &c.quota), 4ULL << 30); /* at least 4 arenas */
	ck_assert_int_eq(config_set(&c, "memory", "window_size", "2G"), 0);
	ck_assert_uint_eq(config_window_bytes(&c, &c.quota), 2ULL << 30); /* at most the window */
	ck_assert_int_eq(config_set(&c, "quota", "window_bytes", "1G"), 0);
	ck_assert_uint_eq(config_window_bytes(&c, &c.quota), 1ULL << 30);
	ck_assert_int_eq(config_finish(&c), 0);
	ck_assert_int_eq(config_set(&c, "quota", "window_bytes", "512M"), 0);
	ck_assert_int_eq(config_finish(&c), -EINVAL); /* not even one arena */
	ck_assert_int_eq(config_set(&c, "quota", "window_bytes", "0"), 0); /* the default again */
	ck_assert_int_eq(config_finish(&c), 0);
	ck_assert_int_eq(config_set(&c, "limits", "clients_per_user", "3"), 0);
	ck_assert_uint_eq(c.max_clients_per_user, 3);
	ck_assert_int_eq(config_set(&c, "limits", "clients_per_user", "0"), -ERANGE);
	ck_assert_uint_eq(c.max_user_containers, 4);
	ck_assert_int_eq(config_set(&c, "limits", "container_domains_per_user", "0"), 0);
	ck_assert_uint_eq(c.max_user_containers, 0);
	ck_assert_int_eq(config_set(&c, "limits", "container_domains_per_user", "65"), -ERANGE);
	config_done(&c);
}
END_TEST

START_TEST(test_cache_keys)
{
	struct config c;

	config_init(&c);
	ck_assert_int_eq(config_set(&c, "cache", "policy", "page"), 0);
	ck_assert_int_eq(config_set(&c, "policies", "lab", "odp"), 0);
	ck_assert_int_eq(config_set(&c, "policies", "uid-7", "page"), 0);
	ck_assert_int_eq(config_set(&c, "policies", "uid-7", "contig"), 0); /* the later wins */
	ck_assert_int_eq(config_set(&c, "cache", "odp_chunk", "64M"), 0);
	ck_assert_int_eq(config_finish(&c), 0);
	ck_assert_int_eq(config_policy_for(&c, "lab"), MR_POLICY_ODP);
	ck_assert_int_eq(config_policy_for(&c, "uid-7"), MR_POLICY_CONTIG);
	ck_assert_int_eq(config_policy_for(&c, "uid-8"), MR_POLICY_PAGE); /* [cache] policy */
	ck_assert_uint_eq(c.odp_chunk, 64ULL << 20);
	ck_assert_int_eq(config_set(&c, "cache", "odp_chunk", "3M"), 0);
	ck_assert_int_eq(config_finish(&c), -EINVAL); /* not a power of two */
	config_done(&c);
}
END_TEST

START_TEST(test_pools_keys)
{
	struct config c;

	config_init(&c);
	ck_assert(c.pools.enabled);
	ck_assert_uint_eq(c.pools.aging_s, 60);
	ck_assert_uint_eq(c.pools.pinned, 0);
	ck_assert_uint_eq(c.pools.max_queued, 4096);
	ck_assert_int_eq(config_set(&c, "pools", "enabled", "no"), 0);
	ck_assert(!c.pools.enabled);
	ck_assert_int_eq(config_set(&c, "pools", "enabled", "yes"), 0);
	ck_assert(c.pools.enabled);
	ck_assert_int_eq(config_set(&c, "pools", "enabled", "maybe"), -EINVAL);
	ck_assert_int_eq(config_set(&c, "pools", "aging", "5"), 0);
	ck_assert_uint_eq(c.pools.aging_s, 5);
	ck_assert_int_eq(config_set(&c, "pools", "aging", "0"), -ERANGE);
	ck_assert_int_eq(config_set(&c, "pools", "pinned", "8"), 0);
	ck_assert_uint_eq(c.pools.pinned, 8);
	ck_assert_int_eq(config_set(&c, "pools", "max_queued", "0"), 0);
	ck_assert_uint_eq(c.pools.max_queued, 0);
	ck_assert_int_eq(config_set(&c, "pools", "max_queued", "-1"), -EINVAL);
	ck_assert_int_eq(config_set(&c, "pools", "size", "1"), -ENOENT);
	ck_assert_int_eq(config_finish(&c), 0);
	config_done(&c);
}
END_TEST

START_TEST(test_admin_group_names)
{
	struct config c;

	config_init(&c);
	ck_assert_int_eq(config_set(&c, "mrd", "admin_group", "root"), 0);
	ck_assert_int_eq(config_finish(&c), 0);
	ck_assert_uint_eq(c.admin_gid, 0);
	config_done(&c);

	config_init(&c);
	ck_assert_int_eq(config_set(&c, "mrd", "admin_group", "no-such-group-mrd"), 0);
	ck_assert_int_eq(config_finish(&c), -ENOENT);
	config_done(&c);
}
END_TEST

/* Byte limits left to their defaults are fractions of the host's memory; a pinned one set
 * above it is cut to it; one below it stays. */
/* A quota refusal reaches the client whole, how to raise the quota included, in the reply's
 * message (struct reply, 256 bytes): for the longest domain name [domains] takes (63
 * characters) and byte counts of a big host (2^40 and more); set by a [quotas] line, for that
 * name and a glob of 17 characters, and for a pod's name (pod-UID) and a line naming it. */
START_TEST(test_quota_refusal_fits_a_reply)
{
	const char *name = "lab-0123456789-0123456789-0123456789-0123456789-0123456789-abcd";
	const char *pod = "pod-0f3c2d9e-5b7a-4c1e-9d2f-8a6b4e3c1d0a";
	char why[256];
	struct config c;
	struct quota q;

	ck_assert_uint_eq(strlen(name), 63);
	config_init(&c);
	ck_assert_int_eq(config_set(&c, "quota", "allocated_bytes", "2T"), 0);
	ck_assert_int_eq(config_quota_refusal(&c, &c.quota, QUOTA_ALLOCATED_BYTES, name,
					      2198754099200ull, 1099511627776ull, why, sizeof(why)),
			 -EDQUOT);
	ck_assert_msg(strstr(why, "reload mrd"), "truncated (%zu bytes): %s", strlen(why), why);

	ck_assert_int_eq(config_set(&c, "quotas", "lab-0123456789-*", "allocated_bytes=2T"), 0);
	config_quota_for(&c, name, &q);
	ck_assert_int_eq(config_quota_refusal(&c, &q, QUOTA_ALLOCATED_BYTES, name, 2198754099200ull,
					      1099511627776ull, why, sizeof(why)), -EDQUOT);
	ck_assert_msg(strstr(why, "[quotas] lab-0123456789-* allocated_bytes and reload mrd"),
		      "truncated (%zu bytes): %s", strlen(why), why);
	ck_assert_int_eq(config_set(&c, "quotas", pod, "allocated_bytes=2T"), 0);
	config_quota_for(&c, pod, &q);
	ck_assert_int_eq(config_quota_refusal(&c, &q, QUOTA_ALLOCATED_BYTES, pod, 2198754099200ull,
					      1099511627776ull, why, sizeof(why)), -EDQUOT);
	ck_assert_msg(strstr(why, "allocated_bytes and reload mrd"), "truncated (%zu bytes): %s",
		      strlen(why), why);
	config_done(&c);
}
END_TEST

/* [quotas]: the first line whose glob matches a domain's name sets the keys it names; the
 * others are [quota]'s. A refusal names the line where it set the key, else [quota]. */
START_TEST(test_quotas_lines)
{
	struct config c;
	struct quota q;
	char why[256];

	write_file("[quota]\n"
		   "allocated_bytes = 6G\n"
		   "arenas = 16\n"
		   "[quotas]\n"
		   "ctr-* = pinned_bytes=1G\n"
		   "lab = allocated_bytes=64G  arenas=32 window_bytes=2G\n"
		   "l* = clients=3 mempools=7 allocations=9\n"
		   "pod-[0-9a-f]* = allocated_bytes= pinned_bytes=64G\n");
	config_init(&c);
	ck_assert_int_eq(config_load_file(&c, path), 0);
	config_fit_host(&c, 16ULL << 30);

	config_quota_for(&c, "lab", &q);
	ck_assert_uint_eq(q.allocated_bytes, 64ULL << 30);
	ck_assert_uint_eq(q.arenas, 32);
	ck_assert_uint_eq(config_window_bytes(&c, &q), 2ULL << 30);
	ck_assert_uint_eq(q.clients, c.quota.clients); /* the first match only */
	ck_assert_uint_eq(q.pinned_bytes, c.quota.pinned_bytes);

	config_quota_for(&c, "ctr-3f2a9b1c0d4e", &q);
	ck_assert_uint_eq(q.pinned_bytes, 1ULL << 30);
	ck_assert_uint_eq(q.allocated_bytes, 6ULL << 30);
	ck_assert_uint_eq(q.arenas, 16);
	ck_assert_int_eq(config_quota_refusal(&c, &q, QUOTA_PINNED_BYTES, "ctr-3f2a9b1c0d4e",
					      1ULL << 30, 4096, why, sizeof(why)), -EDQUOT);
	ck_assert_msg(strstr(why, "; raise [quotas] ctr-* pinned_bytes and reload mrd"), "%s",
		      why);
	ck_assert_int_eq(config_quota_refusal(&c, &q, QUOTA_ALLOCATED_BYTES, "ctr-3f2a9b1c0d4e",
					      6ULL << 30, 4096, why, sizeof(why)), -EDQUOT);
	ck_assert_msg(strstr(why, "; raise [quota] allocated_bytes in mrd.conf"), "%s", why);

	config_quota_for(&c, "lx", &q);
	ck_assert_uint_eq(q.clients, 3);
	ck_assert_uint_eq(q.mempools, 7);
	ck_assert_uint_eq(q.allocations, 9);
	ck_assert_uint_eq(q.arenas, 16);

	/* An empty byte value is the host's share, and a pinned one above the host is cut to it,
	 * as in [quota]. */
	config_quota_for(&c, "pod-0a1b", &q);
	ck_assert_uint_eq(q.allocated_bytes, 8ULL << 30);
	ck_assert_uint_eq(q.pinned_bytes, 16ULL << 30);

	config_quota_for(&c, "uid-1000", &q);
	ck_assert_uint_eq(q.allocated_bytes, 6ULL << 30);
	ck_assert_uint_eq(q.pinned_bytes, c.quota.pinned_bytes);
	ck_assert_uint_eq(q.arenas, 16);
	ck_assert_uint_eq(q.clients, c.quota.clients);

	/* A glob again (a later drop-in) replaces its line where it stands: lab still wins. */
	ck_assert_int_eq(config_set(&c, "quotas", "lab", "clients=5"), 0);
	config_quota_for(&c, "lab", &q);
	ck_assert_uint_eq(q.clients, 5);
	ck_assert_uint_eq(q.allocated_bytes, 6ULL << 30);
	ck_assert_uint_eq(c.n_quotas, 4);
	/* A line's window_bytes is held to [memory] arena_size, as [quota]'s. */
	ck_assert_int_eq(config_finish(&c), 0);
	ck_assert_int_eq(config_set(&c, "quotas", "lab", "window_bytes=1M"), 0);
	ck_assert_int_eq(config_finish(&c), -EINVAL);
	config_done(&c);
}
END_TEST

/* A bad [quotas] line fails the load with one error naming file:line and what is wrong. */
START_TEST(test_quotas_errors)
{
	static const struct {
		const char *line, *error;
	} bad[] = {
		{ "ctr-* = color=red", "unknown key 'color'" },
		{ "ctr-* = arenas=0", "bad value for 'arenas'" },
		{ "ctr-* = arenas=many", "bad value for 'arenas'" },
		{ "ctr-* = pinned_bytes=4Q", "bad value for 'pinned_bytes'" },
		{ "ctr-* = arenas", "expected key=value" },
		{ "ctr-* =", "expected key=value" },
		{ "ctr-[ab = arenas=1", "bad glob" },
		{ "ctr/* = arenas=1", "bad glob" },
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char text[128], want[256], out[1024];
		int saved = dup(STDERR_FILENO), cap = memfd_create("log", MFD_CLOEXEC);
		struct config c;
		ssize_t k;
		int r;

		snprintf(text, sizeof(text), "[quotas]\nlab = arenas=2\n%s\n", bad[i].line);
		write_file(text);
		config_init(&c);
		ck_assert_int_ge(saved, 0);
		ck_assert_int_ge(cap, 0);
		ck_assert_int_eq(dup2(cap, STDERR_FILENO), STDERR_FILENO);
		r = config_load_file(&c, path);
		ck_assert_int_eq(dup2(saved, STDERR_FILENO), STDERR_FILENO);
		close(saved);
		k = pread(cap, out, sizeof(out) - 1, 0);
		close(cap);
		ck_assert_int_ge(k, 0);
		out[k] = '\0';
		ck_assert_msg(r == -EINVAL, "accepted (%d): %s", r, bad[i].line);
		snprintf(want, sizeof(want), "%s:3: [quotas] ", path);
		ck_assert_msg(strstr(out, want) && strstr(out, bad[i].error),
			      "%s: logged '%s'", bad[i].line, out);
		config_done(&c);
		teardown();
	}
}
END_TEST

START_TEST(test_fit_host)
{
	const uint64_t host = 16ULL << 30;
	struct config c;

	config_init(&c);
	config_fit_host(&c, host);
	ck_assert_uint_eq(c.quota.allocated_bytes, host / 2);
	ck_assert_uint_eq(c.quota.pinned_bytes, host / 4);
	ck_assert_uint_eq(c.max_pinned_bytes, host / 2);
	config_done(&c);

	config_init(&c);
	ck_assert_int_eq(config_set(&c, "quota", "pinned_bytes", "64G"), 0);
	ck_assert_int_eq(config_set(&c, "quota", "allocated_bytes", "1G"), 0);
	ck_assert_int_eq(config_set(&c, "limits", "pinned_bytes", "0"), 0);
	config_fit_host(&c, host);
	ck_assert_uint_eq(c.quota.pinned_bytes, host);
	ck_assert_uint_eq(c.quota.allocated_bytes, 1ULL << 30);
	ck_assert_uint_eq(c.max_pinned_bytes, 0);
	config_done(&c);

	/* Allocated memory is sparse (ODP takes pages where touched): more than the host stays. */
	config_init(&c);
	ck_assert_int_eq(config_set(&c, "quota", "allocated_bytes", "64G"), 0);
	ck_assert_int_eq(config_set(&c, "limits", "pinned_bytes", "1T"), 0);
	config_fit_host(&c, host);
	ck_assert_uint_eq(c.quota.allocated_bytes, 64ULL << 30);
	ck_assert_uint_eq(c.max_pinned_bytes, host);
	config_done(&c);
}
END_TEST

/* The socket mrd binds: 0660 and group mrd unless told; the mode in octal, the group by name
 * or number, one that does not exist refused. */
START_TEST(test_socket_settings)
{
	struct config c;

	config_init(&c);
	ck_assert_uint_eq(c.socket_mode, 0660);
	ck_assert_int_eq(config_set(&c, "mrd", "socket_mode", "0600"), 0);
	ck_assert_uint_eq(c.socket_mode, 0600);
	ck_assert_int_eq(config_set(&c, "mrd", "socket_mode", "666"), 0);
	ck_assert_uint_eq(c.socket_mode, 0666);
	ck_assert_int_eq(config_set(&c, "mrd", "socket_mode", "1777"), -ERANGE);
	ck_assert_int_eq(config_set(&c, "mrd", "socket_mode", "0668"), -EINVAL);
	ck_assert_int_eq(config_set(&c, "mrd", "socket_mode", "rw"), -EINVAL);
	ck_assert_uint_eq(c.socket_mode, 0666);
	ck_assert_int_eq(config_set(&c, "mrd", "socket_group", "65534"), 0);
	ck_assert_int_eq(config_finish(&c), 0);
	ck_assert_uint_eq(c.socket_gid, 65534);
	ck_assert(!c.socket_group_missing);
	ck_assert_int_eq(config_set(&c, "mrd", "socket_group", "no-such-group-here"), 0);
	ck_assert_int_eq(config_finish(&c), -ENOENT);
	config_done(&c);
}
END_TEST

/* conf/mrd.conf shows every key commented out at its default: with them all uncommented (the
 * [domains] example names users this host may not have) it reads as no file at all. */
START_TEST(test_shipped_conf_is_the_defaults)
{
	static char text[65536];
	char conf[512], line[512], section[64] = "";
	const char *src = getenv("MRD_SRCDIR");
	struct config c, d;
	size_t n = 0;
	FILE *f;

	snprintf(conf, sizeof(conf), "%s/conf/mrd.conf", src ? src : "..");
	f = fopen(conf, "re");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f)) {
		size_t key = strspn(line + 1, "abcdefghijklmnopqrstuvwxyz_");
		bool setting = line[0] == '#' && key > 0 && strncmp(line + 1 + key, " =", 2) == 0;

		if (line[0] == '[')
			sscanf(line, "[%63[^]]", section);
		n += (size_t)snprintf(text + n, sizeof(text) - n, "%s",
				      setting && strcmp(section, "domains") ? line + 1 : line);
		ck_assert_uint_lt(n, sizeof(text));
	}
	fclose(f);
	write_file(text);
	config_init(&c);
	ck_assert_int_eq(config_load_file(&c, path), 0);
	ck_assert_int_eq(config_finish(&c), 0);
	config_init(&d);
	ck_assert_int_eq(config_finish(&d), 0);
	ck_assert_str_eq(c.socket_path, d.socket_path);
	ck_assert_uint_eq(c.socket_mode, d.socket_mode);
	ck_assert_uint_eq(c.socket_gid, d.socket_gid);
	ck_assert_uint_eq(c.max_clients, d.max_clients);
	ck_assert_uint_eq(c.max_pinned_bytes, d.max_pinned_bytes);
	ck_assert_uint_eq(c.window_base, d.window_base);
	ck_assert_uint_eq(c.window_size, d.window_size);
	ck_assert_uint_eq(c.arena_size, d.arena_size);
	ck_assert_int_eq(c.hugepages, d.hugepages);
	ck_assert_int_eq(c.mr_policy, d.mr_policy);
	ck_assert_uint_eq(c.quota.allocated_bytes, d.quota.allocated_bytes);
	ck_assert_uint_eq(c.quota.pinned_bytes, d.quota.pinned_bytes);
	ck_assert_uint_eq(c.quota.arenas, d.quota.arenas);
	ck_assert_uint_eq(c.quota.allocations, d.quota.allocations);
	ck_assert_uint_eq(c.quota.clients, d.quota.clients);
	ck_assert_uint_eq(c.quota.mempools, d.quota.mempools);
	ck_assert_uint_eq(c.pools.max_queued, d.pools.max_queued);
	config_done(&c);
	config_done(&d);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("config");
	TCase *tc = tcase_create("parse");

	tcase_add_checked_fixture(tc, NULL, teardown);
	tcase_add_test(tc, test_defaults);
	tcase_add_test(tc, test_full_file);
	tcase_add_test(tc, test_bad_files);
	tcase_add_test(tc, test_missing_file);
	tcase_add_test(tc, test_drop_in_folder);
	tcase_add_test(tc, test_set_errors);
	tcase_add_test(tc, test_devices);
	tcase_add_test(tc, test_memory_keys);
	tcase_add_test(tc, test_admin_group_names);
	tcase_add_test(tc, test_cache_keys);
	tcase_add_test(tc, test_per_user_keys);
	tcase_add_test(tc, test_pools_keys);
	tcase_add_test(tc, test_fit_host);
	tcase_add_test(tc, test_quota_refusal_fits_a_reply);
	tcase_add_test(tc, test_quotas_lines);
	tcase_add_test(tc, test_quotas_errors);
	tcase_add_test(tc, test_socket_settings);
	tcase_add_test(tc, test_shipped_conf_is_the_defaults);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
