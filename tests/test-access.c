/* SPDX-License-Identifier: MIT */
/* The access rules (core/access.c) over a configuration built here: who is an admin, what the
 * views show whom, which domain an identity joins. No manager, no daemon socket. */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/config.h"
#include "core/access.h"
#include "macro.h"
#include "check-run.h"

#define ADMIN_GID 4000
#define TEAM_GID 2000
#define LAB_GID 3000

static struct config cfg;

/* admin_group 4000; [domains] team = uid 1001 or gid 2000; lab = gid 3000 or uid 1005. */
static void setup(void)
{
	config_init(&cfg);
	ck_assert_int_eq(config_set(&cfg, "mrd", "admin_group", "4000"), 0);
	ck_assert_int_eq(config_set(&cfg, "domains", "team", "uid:1001, gid:2000"), 0);
	ck_assert_int_eq(config_set(&cfg, "domains", "lab", "gid:3000 uid:1005"), 0);
	ck_assert_int_eq(config_finish(&cfg), 0);
	ck_assert_uint_eq(cfg.admin_gid, ADMIN_GID);
}

static void teardown(void)
{
	config_done(&cfg);
}

static struct access_peer peer(uid_t uid, gid_t gid, const gid_t *groups, size_t n)
{
	return (struct access_peer){ .uid = uid, .gid = gid, .fd = -1, .groups = groups,
				     .n_groups = n };
}

static const char *name_of(struct access_peer p)
{
	static char buf[64];

	return access_domain_name(&cfg, &p, buf, sizeof(buf));
}

START_TEST(test_admin)
{
	const gid_t with_admin[] = { 10, ADMIN_GID, 20 }, without[] = { 10, 20 };
	struct access_peer p;

	p = peer(0, 0, NULL, 0); /* root, whatever its groups */
	ck_assert(access_is_admin(&cfg, &p));
	p = peer(1000, ADMIN_GID, NULL, 0); /* primary group */
	ck_assert(access_is_admin(&cfg, &p));
	p = peer(1000, 1000, with_admin, ELEMENTSOF(with_admin)); /* supplementary group */
	ck_assert(access_is_admin(&cfg, &p));
	p = peer(1000, 1000, without, ELEMENTSOF(without));
	ck_assert(!access_is_admin(&cfg, &p));
	p = peer(1000, (gid_t)-1, NULL, 0); /* a bus caller whose gid nobody vouches for */
	ck_assert(!access_is_admin(&cfg, &p));
	p = ACCESS_PEER_UID(1001);
	ck_assert(!access_is_admin(&cfg, &p));
}
END_TEST

/* Without admin_group only root administers, whatever gid equals the unset admin_gid. */
START_TEST(test_admin_without_group)
{
	const gid_t groups[] = { 0 };
	struct config plain;
	struct access_peer p;

	config_init(&plain);
	ck_assert_int_eq(config_finish(&plain), 0);
	p = peer(0, 0, NULL, 0);
	ck_assert(access_is_admin(&plain, &p));
	p = peer(1000, plain.admin_gid, groups, 1);
	ck_assert(!access_is_admin(&plain, &p));
	config_done(&plain);
}
END_TEST

START_TEST(test_views)
{
	const gid_t with_admin[] = { ADMIN_GID }, team[] = { TEAM_GID };
	struct access_peer p;
	char buf[64];

	ck_assert_ptr_null(access_view(true, "team"));
	ck_assert_str_eq(access_view(false, "team"), "team");
	/* NULL shows everything; a name shows that domain alone, not one it is a prefix of. */
	ck_assert(access_view_shows(NULL, "team"));
	ck_assert(access_view_shows(NULL, ""));
	ck_assert(access_view_shows("team", "team"));
	ck_assert(!access_view_shows("team", "lab"));
	ck_assert(!access_view_shows("team", "team2"));
	ck_assert(!access_view_shows("team2", "team"));
	ck_assert(!access_view_shows("", "team"));

	p = peer(1000, 1000, with_admin, 1);
	ck_assert_ptr_null(access_peer_view(&cfg, &p, buf, sizeof(buf)));
	p = peer(0, 0, NULL, 0);
	ck_assert_ptr_null(access_peer_view(&cfg, &p, buf, sizeof(buf)));
	p = peer(1000, 1000, team, 1);
	ck_assert_str_eq(access_peer_view(&cfg, &p, buf, sizeof(buf)), "team");
	p = peer(1000, 1000, NULL, 0);
	ck_assert_str_eq(access_peer_view(&cfg, &p, buf, sizeof(buf)), "uid-1000");
}
END_TEST

START_TEST(test_domain_names)
{
	const gid_t team[] = { 10, TEAM_GID }, lab[] = { LAB_GID }, both[] = { LAB_GID, TEAM_GID };
	const gid_t none[] = { 10, 11 };

	ck_assert_str_eq(name_of(peer(1001, 1001, NULL, 0)), "team");   /* by uid */
	ck_assert_str_eq(name_of(peer(1002, TEAM_GID, NULL, 0)), "team"); /* by primary gid */
	ck_assert_str_eq(name_of(peer(1002, 1002, team, 2)), "team");   /* by supplementary gid */
	ck_assert_str_eq(name_of(peer(1002, 1002, lab, 1)), "lab");
	ck_assert_str_eq(name_of(peer(1005, 1005, NULL, 0)), "lab");    /* uid after a gid */
	ck_assert_str_eq(name_of(peer(1002, 1002, none, 2)), "uid-1002");
	ck_assert_str_eq(name_of(peer(1002, 1002, NULL, 0)), "uid-1002");
	/* The first group that lists any of the identity wins: team before lab. */
	ck_assert_str_eq(name_of(peer(1005, 1005, team, 2)), "team");
	ck_assert_str_eq(name_of(peer(1002, LAB_GID, team, 2)), "team");
	ck_assert_str_eq(name_of(peer(1002, 1002, both, 2)), "team");
	/* By uid alone (Flush by uid): groups do not count, the uid does. */
	ck_assert_str_eq(name_of(ACCESS_PEER_UID(1001)), "team");
	ck_assert_str_eq(name_of(ACCESS_PEER_UID(2000)), "uid-2000");
	ck_assert_str_eq(name_of(ACCESS_PEER_UID(0)), "uid-0");
	ck_assert_str_eq(name_of(ACCESS_PEER_UID((uid_t)-2)), "uid-4294967294");
}
END_TEST

/* Group names are at most 63 bytes, so they fit a 64-byte name; a shorter buffer cuts. */
START_TEST(test_names_too_long)
{
	char longest[64], too_long[65], buf[64], small[8];
	struct access_peer p = peer(1009, 1009, NULL, 0);

	memset(longest, 'a', 63);
	longest[63] = '\0';
	memset(too_long, 'b', 64);
	too_long[64] = '\0';
	ck_assert_int_eq(config_set(&cfg, "domains", too_long, "uid:1009"), -EINVAL);
	ck_assert_str_eq(name_of(p), "uid-1009");
	ck_assert_int_eq(config_set(&cfg, "domains", longest, "uid:1009"), 0);
	ck_assert_str_eq(access_domain_name(&cfg, &p, buf, sizeof(buf)), longest);
	ck_assert_ptr_eq(access_domain_name(&cfg, &p, small, sizeof(small)), small);
	ck_assert_str_eq(small, "aaaaaaa");
	p = peer(4000000000u, 1009, NULL, 0);
	ck_assert_str_eq(access_domain_name(&cfg, &p, small, sizeof(small)), "uid-400");
}
END_TEST

#define PODMAN_ID "3f2a9b1c0d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccddeeff"
#define OTHER_ID "aa11bb22cc33dd44ee55ff6600112233445566778899aabbccddeeff00112233"
#define POD_UID "1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901"

/* A peer of uid in a pid namespace below mrd's (a container), in cgroup. */
static struct access_peer contained(uid_t uid, const char *cgroup)
{
	return (struct access_peer){ .uid = uid, .gid = uid, .fd = -1, .nested_pidns = true,
				     .other_userns = uid != 0, .cgroup = cgroup };
}

/* A client in a container that no [domains] line names gets its container's domain, named as
 * the runtimes name containers; a pod's containers share the pod's; not its uid's. */
START_TEST(test_container_domains)
{
	struct access_peer host = peer(1002, 1002, NULL, 0);

	/* podman, rootful and rootless, with or without a leaf below the scope */
	ck_assert_str_eq(name_of(contained(0, "/machine.slice/libpod-" PODMAN_ID ".scope")),
			 "ctr-3f2a9b1c0d4e");
	ck_assert_str_eq(name_of(contained(0, "/machine.slice/libpod-" PODMAN_ID
					      ".scope/container")),
			 "ctr-3f2a9b1c0d4e");
	/* Another user's the same id: a user may name a cgroup of its own subtree so, and make a
	 * pid namespace to be "in" it, but does not so join root's container (nor another's). */
	ck_assert_str_eq(name_of(contained(1002, "/machine.slice/libpod-" PODMAN_ID ".scope")),
			 "ctr-3f2a9b1c0d4e-u1002");
	{ /* rootless podman: a cgroup the user made (systemd delegates user@UID.service) */
		struct access_peer rootless = contained(1002, "/user.slice/user-1002.slice/user@"
							      "1002.service/user.slice/libpod-" OTHER_ID
							      ".scope/container");

		rootless.cgroup_user_made = true;
		ck_assert_str_eq(name_of(rootless), "ctr-aa11bb22cc33-user1002");
	}
	/* Review: in a cgroup the user made, even of a rootful container's or a pod's name, the
	 * name is told from root's cgroup's of the same uid (-userN), whole for the longest. */
	{
		struct access_peer own = contained(1002, "/user.slice/user-1002.slice/user@1002"
							 ".service/libpod-" PODMAN_ID ".scope");
		char buf[64];

		own.cgroup_user_made = true;
		ck_assert_str_eq(name_of(own), "ctr-3f2a9b1c0d4e-user1002");
		own.cgroup = "/u/kubepods-pod" POD_UID ".slice";
		ck_assert_str_eq(name_of(own), "pod-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901-user1002");
		own.uid = 4294967294u;
		own.cgroup = "/u/g123456789h123456789i123456789j123456789k123456789l12345678.scope";
		access_domain_name(&cfg, &own, buf, sizeof(buf));
		ck_assert_str_eq(buf, "ctr-g123456789h123456789i123456789j123456789k1-user4294967294");
	}
	/* Root in a container with a subtree of its own to write (systemd-nspawn, podman
	 * --systemd=always) makes cgroups named like another container or pod below its own:
	 * the runtime's component names it, not what it made. */
	ck_assert_str_eq(name_of(contained(0, "/machine.slice/libpod-" OTHER_ID ".scope/libpod-"
					      PODMAN_ID ".scope")),
			 "ctr-aa11bb22cc33");
	ck_assert_str_eq(name_of(contained(0, "/machine.slice/systemd-nspawn@foo.service/payload/"
					      "libpod-" PODMAN_ID ".scope")),
			 "ctr-systemd-nspawn_foo");
	ck_assert_str_eq(name_of(contained(0, "/machine.slice/libpod-" OTHER_ID ".scope/"
					      "kubepods.slice/kubepods-pod" POD_UID ".slice")),
			 "ctr-aa11bb22cc33");
	ck_assert_str_eq(name_of(contained(0, "/docker/" OTHER_ID "/libpod-" PODMAN_ID ".scope")),
			 "ctr-aa11bb22cc33");
	ck_assert_str_eq(name_of(contained(0, "/kubepods/burstable/pod1b2c3d4e-5f60-7182-93a4-"
					      "b5c6d7e8f901/" OTHER_ID "/kubepods-pod00000000_0000_"
					      "0000_0000_000000000000.slice")),
			 "pod-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901");
	/* Review: which cgroups a runtime made (an id, a pod), which not (counted per user) */
	ck_assert(access_cgroup_of_runtime("/machine.slice/libpod-" PODMAN_ID ".scope/container"));
	ck_assert(access_cgroup_of_runtime("/kubepods/besteffort/pod1b2c3d4e-5f60-7182-93a4-"
					   "b5c6d7e8f901"));
	ck_assert(!access_cgroup_of_runtime("/user.slice/user-1000.slice/session-3.scope"));
	ck_assert(!access_cgroup_of_runtime("/"));
	ck_assert(!access_cgroup_of_runtime(NULL));
	/* docker, and a cgroupfs runtime's bare id */
	ck_assert_str_eq(name_of(contained(0, "/system.slice/docker-" OTHER_ID ".scope")),
			 "ctr-aa11bb22cc33");
	ck_assert_str_eq(name_of(contained(0, "/docker/" PODMAN_ID)), "ctr-3f2a9b1c0d4e");
	/* Kubernetes, systemd and cgroupfs drivers: every container of the pod in the pod's */
	ck_assert_str_eq(name_of(contained(1002, "/kubepods.slice/kubepods-burstable.slice/"
						 "kubepods-burstable-pod" POD_UID ".slice/"
						 "cri-containerd-" PODMAN_ID ".scope")),
			 "pod-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901-u1002");
	ck_assert_str_eq(name_of(contained(1002, "/kubepods.slice/kubepods-pod" POD_UID ".slice/"
						 "crio-" OTHER_ID ".scope")),
			 "pod-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901-u1002");
	ck_assert_str_eq(name_of(contained(1002, "/kubepods/besteffort/pod1b2c3d4e-5f60-7182-93a4-"
						 "b5c6d7e8f901/" OTHER_ID)),
			 "pod-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901-u1002");
	/* A cgroup that is no container id: its last component, less its unit suffix */
	ck_assert_str_eq(name_of(contained(1002, "/user.slice/user-1000.slice/session-3.scope")),
			 "ctr-session-3-u1002");
	ck_assert_str_eq(name_of(contained(1002, "/a b/wei:rd")), "ctr-a_b-u1002");
	/* No cgroup, or the root one, tells no container from another: the uid's */
	ck_assert_str_eq(name_of(contained(1002, "/")), "uid-1002");
	ck_assert_str_eq(name_of(contained(1002, NULL)), "uid-1002");
	/* [domains] lines come first: uid 1001 is team's in a container too */
	ck_assert_str_eq(name_of(contained(1001, "/machine.slice/libpod-" PODMAN_ID ".scope")),
			 "team");
	/* Outside a container, the cgroup alone changes nothing */
	host.cgroup = "/machine.slice/libpod-" PODMAN_ID ".scope";
	ck_assert_str_eq(name_of(host), "uid-1002");
}
END_TEST

/* [domains] cgroup: members: a fixed name shares one domain among every match; a name with a
 * '*' is a domain per cgroup matched, named by its short name. */
START_TEST(test_cgroup_members)
{
	ck_assert_int_eq(config_set(&cfg, "domains", "batch", "cgroup:/batch.slice/*"), 0);
	ck_assert_int_eq(config_set(&cfg, "domains", "unit-*", "cgroup:/system.slice/*.service"), 0);
	ck_assert_int_eq(config_set(&cfg, "domains", "pods-*",
				    "cgroup:/kubepods.slice/*/kubepods-*-pod*.slice"),
			 0);
	ck_assert_str_eq(name_of(contained(1002, "/batch.slice/job1.scope")), "batch");
	ck_assert_str_eq(name_of(contained(1003, "/batch.slice/job2.scope/leaf")), "batch");
	ck_assert_str_eq(name_of(contained(1002, "/batch.slicex/job1.scope")),
			 "ctr-batch.slicex-u1002");
	{ /* not in a container: a cgroup line still names it */
		struct access_peer p = peer(1002, 1002, NULL, 0);

		p.cgroup = "/system.slice/postgres.service";
		ck_assert_str_eq(name_of(p), "unit-postgres");
		p.cgroup = "/system.slice/nginx.service/worker";
		ck_assert_str_eq(name_of(p), "unit-nginx");
		p.cgroup = "/system.slice/cron.scope"; /* '*' stops at '/' and must match */
		ck_assert_str_eq(name_of(p), "uid-1002");
	}
	ck_assert_str_eq(name_of(contained(1002, "/kubepods.slice/kubepods-besteffort.slice/"
						 "kubepods-besteffort-pod" POD_UID ".slice/x")),
			 "pods-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901");
	/* A '*' name that comes out as one mrd gives otherwise, or another line's, is no match */
	ck_assert_int_eq(config_set(&cfg, "domains", "*", "cgroup:/srv.slice/*.service"), 0);
	{
		struct access_peer p = peer(1002, 1002, NULL, 0);

		p.cgroup = "/srv.slice/uid-0.service";
		ck_assert_str_eq(name_of(p), "uid-1002");
		p.cgroup = "/srv.slice/ctr-3f2a9b1c0d4e.service";
		ck_assert_str_eq(name_of(p), "uid-1002");
		p.cgroup = "/srv.slice/team.service";
		ck_assert_str_eq(name_of(p), "uid-1002");
		p.cgroup = "/srv.slice/web.service";
		ck_assert_str_eq(name_of(p), "web");
	}
	/* Malformed: a relative glob, no glob, two '*', a '*' beside uids, the names mrd gives */
	ck_assert_int_eq(config_set(&cfg, "domains", "x", "cgroup:batch.slice"), -EINVAL);
	ck_assert_int_eq(config_set(&cfg, "domains", "x", "cgroup:"), -EINVAL);
	ck_assert_int_eq(config_set(&cfg, "domains", "a*b*", "cgroup:/x/*"), -EINVAL);
	ck_assert_int_eq(config_set(&cfg, "domains", "a*", "cgroup:/x/* uid:7"), -EINVAL);
	ck_assert_int_eq(config_set(&cfg, "domains", "a*", "uid:7"), -EINVAL);
	ck_assert_int_eq(config_set(&cfg, "domains", "ctr-3f2a9b1c0d4e", "uid:7"), -EINVAL);
	ck_assert_int_eq(config_set(&cfg, "domains", "pod-x", "gid:7"), -EINVAL);
	ck_assert_int_eq(config_set(&cfg, "domains", "uid-*", "cgroup:/x/*"), -EINVAL);
	ck_assert_int_eq(config_set(&cfg, "domains", "ctr-*", "cgroup:/x/*"), -EINVAL);
}
END_TEST

/* Admin rights need mrd's pid and user namespaces: root in a container is refused them, and
 * sees only its own domain. */
START_TEST(test_no_admin_in_container)
{
	struct access_peer p = contained(0, "/machine.slice/libpod-" PODMAN_ID ".scope");
	char buf[64];

	ck_assert(!access_is_admin(&cfg, &p));
	ck_assert_str_eq(access_peer_view(&cfg, &p, buf, sizeof(buf)), "ctr-3f2a9b1c0d4e");
	p = peer(0, 0, NULL, 0);
	p.other_userns = true; /* root of a user namespace of its own, in mrd's pid namespace */
	ck_assert(!access_is_admin(&cfg, &p));
	p = peer(1000, ADMIN_GID, NULL, 0);
	p.nested_pidns = true; /* the admin group, in a container */
	ck_assert(!access_is_admin(&cfg, &p));
	p.nested_pidns = false;
	ck_assert(access_is_admin(&cfg, &p));
	p = peer(0, 0, NULL, 0);
	p.cgroup = "/system.slice/sshd.service"; /* a cgroup alone is no container */
	ck_assert(access_is_admin(&cfg, &p));
}
END_TEST

/* A socket peer's supplementary groups are the kernel's (SO_PEERGROUPS), not a list. */
START_TEST(test_socket_peer_groups)
{
	const gid_t mine[] = { 10, ADMIN_GID, LAB_GID }, listed[] = { TEAM_GID };
	struct access_peer p;
	int sv[2];

	if (setgroups(ELEMENTSOF(mine), mine) < 0) {
		fprintf(stderr, "test_socket_peer_groups: setgroups: %m (needs root): skipped\n");
		return;
	}
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	ck_assert(access_peer_in_group(sv[0], ADMIN_GID));
	ck_assert(access_peer_in_group(sv[0], LAB_GID));
	ck_assert(!access_peer_in_group(sv[0], TEAM_GID));
	ck_assert(!access_peer_in_group(-1, ADMIN_GID));

	p = (struct access_peer){ .uid = 1002, .gid = 1002, .fd = sv[0], .groups = listed,
				  .n_groups = 1 };
	ck_assert(access_is_admin(&cfg, &p));
	ck_assert_str_eq(name_of(p), "lab"); /* the socket's groups, not the list's team */
	p.fd = -1;
	ck_assert(!access_is_admin(&cfg, &p));
	ck_assert_str_eq(name_of(p), "team");
	close(sv[0]);
	close(sv[1]);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("access");
	TCase *tc = tcase_create("rules");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_admin);
	tcase_add_test(tc, test_admin_without_group);
	tcase_add_test(tc, test_views);
	tcase_add_test(tc, test_domain_names);
	tcase_add_test(tc, test_names_too_long);
	tcase_add_test(tc, test_socket_peer_groups);
	tcase_add_test(tc, test_container_domains);
	tcase_add_test(tc, test_cgroup_members);
	tcase_add_test(tc, test_no_admin_in_container);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
