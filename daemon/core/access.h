/* SPDX-License-Identifier: MIT */
/* The access rules, one set for the socket (manager.c) and the bus (bus.c): who administers
 * mrd, what the read-only views show whom, and which domain an identity belongs to. They read
 * the configuration alone. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <sys/types.h>

#include "base/config.h"

/* An identity as the kernel or the bus vouches for it. Its supplementary groups are the socket
 * peer's when fd >= 0 (SO_PEERGROUPS, asked only when a rule needs them), else groups. */
struct access_peer {
	uid_t uid;
	gid_t gid; /* primary; (gid_t)-1 when unknown */
	int fd;    /* -1: no socket, groups instead */
	const gid_t *groups;
	size_t n_groups;
	/* Its place (base/process.h: process_place), all false/NULL where unknown: a peer in a
	 * pid namespace below mrd's is in a container; one in another pid or user namespace is
	 * not the host's, and so no admin. */
	bool nested_pidns;
	bool other_userns;
	const char *cgroup;
	/* The cgroup is one a user made (its folder is not root's: a delegated subtree), where
	 * any name may be had: its container domain's name is told apart from root's cgroups'. */
	bool cgroup_user_made;
};

/* An identity known by its uid alone (Flush by uid): it gets its uid's domain. */
#define ACCESS_PEER_UID(u) ((struct access_peer){ .uid = (u), .gid = (gid_t)-1, .fd = -1 })

/* Root, or a member of admin_group (primary or supplementary group), in mrd's pid and user
 * namespaces (the host's initial ones, where systemd starts mrd): never from a container. */
bool access_is_admin(const struct config *cfg, const struct access_peer *p);

/* The name of p's domain, in buf: the first [domains] group listing its uid, its primary gid,
 * one of its supplementary groups, or a cgroup glob its cgroup or an ancestor matches; else, in
 * a container, its container's (pod-UID for a Kubernetes pod, ctr-ID for another container:
 * access.c); else uid-N. */
const char *access_domain_name(const struct config *cfg, const struct access_peer *p, char *buf,
			       size_t size);

/* Whether name is one mrd gives a container (ctr-…, pod-…), which no [domains] line may take. */
static inline bool access_is_container_domain(const char *name)
{
	return strncmp(name, "ctr-", 4) == 0 || strncmp(name, "pod-", 4) == 0;
}

/* Whether a container domain of cgroup is named by a Kubernetes pod's uid or a runtime's
 * container id, as a runtime names the cgroups it makes, not by another cgroup's name (a login
 * session's scope, a service). */
bool access_cgroup_of_runtime(const char *cgroup);

/* What the read-only views (Status, Clients, Mempools, FrmrPools, DomainDump, the bus
 * properties) show: NULL, everything, to an admin; to anyone else the name of its own domain,
 * and nothing of another domain nor any daemon-wide count. */
static inline const char *access_view(bool admin, const char *domain)
{
	return admin ? NULL : domain;
}

/* access_view for p (its domain's name, when it is not an admin, in buf). */
const char *access_peer_view(const struct config *cfg, const struct access_peer *p, char *buf,
			     size_t size);

/* Whether view (access_view's) shows the domain named name. */
static inline bool access_view_shows(const char *view, const char *name)
{
	return !view || strcmp(view, name) == 0;
}

/* Whether gid is among the supplementary groups of the peer of socket fd. */
bool access_peer_in_group(int fd, gid_t gid);
