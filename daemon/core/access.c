/* SPDX-License-Identifier: MIT */
#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "macro.h"
#include "core/access.h"

bool access_peer_in_group(int fd, gid_t gid)
{
	_cleanup_free_ gid_t *groups = NULL;
	socklen_t len = 64 * sizeof(gid_t);

	/* The kernel reports the size it needs with ERANGE; a peer has at most NGROUPS_MAX. */
	for (;;) {
		gid_t *g = realloc(groups, len);

		if (!g)
			return false;
		groups = g;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
			break;
		if (errno != ERANGE)
			return false;
	}
	for (size_t i = 0; i < len / sizeof(gid_t); i++)
		if (groups[i] == gid)
			return true;
	return false;
}

static bool in_groups(const gid_t *groups, size_t n, gid_t gid)
{
	for (size_t i = 0; i < n; i++)
		if (groups[i] == gid)
			return true;
	return false;
}

static bool in_uids(const uid_t *uids, size_t n, uid_t uid)
{
	for (size_t i = 0; i < n; i++)
		if (uids[i] == uid)
			return true;
	return false;
}

/* Whether gid is one of p's supplementary groups. */
static bool peer_has_group(const struct access_peer *p, gid_t gid)
{
	return p->fd >= 0 ? access_peer_in_group(p->fd, gid) : in_groups(p->groups, p->n_groups, gid);
}

bool access_is_admin(const struct config *cfg, const struct access_peer *p)
{
	/* Root in a container is uid 0 to SO_PEERCRED too. */
	if (p->nested_pidns || p->other_userns)
		return false;
	if (p->uid == 0)
		return true;
	if (!cfg->admin_group)
		return false;
	return p->gid == cfg->admin_gid || peer_has_group(p, cfg->admin_gid);
}

static bool all_hex(const char *s, size_t n)
{
	return strspn(s, "0123456789abcdef") >= n;
}

/* A Kubernetes pod's uid in a cgroup path component: "pod<uid>" (cgroupfs driver) or
 * "kubepods-<class>-pod<uid>.slice" (systemd driver, '_' for '-'), in buf with '-'. */
static bool pod_uid(const char *comp, size_t len, char *buf, size_t size)
{
	for (size_t i = 0; i + 3 < len; i++) {
		size_t n;

		if (strncmp(comp + i, "pod", 3) != 0 || (i > 0 && comp[i - 1] != '-'))
			continue;
		n = strspn(comp + i + 3, "0123456789abcdef-_");
		if (n < 32 || n > len - i - 3 || size <= n) /* a uid: 32 hex digits and dashes */
			continue;
		if (i + 3 + n != len && comp[i + 3 + n] != '.')
			continue;
		for (size_t k = 0; k < n; k++)
			buf[k] = comp[i + 3 + k] == '_' ? '-' : comp[i + 3 + k];
		buf[n] = '\0';
		return true;
	}
	return false;
}

/* A cgroup path component's short name, in buf: a pod's uid, a container's id cut to 12 hex
 * digits as podman and docker show it, else the component less its runtime prefix and unit
 * suffix, with what a domain name may not hold as '_'. Whether it was a container's id. */
static bool short_name(const char *comp, size_t len, char *buf, size_t size)
{
	static const char *const prefixes[] = { "libpod-", "docker-", "cri-containerd-", "crio-",
						"containerd-" };
	static const char *const suffixes[] = { ".scope", ".slice", ".service" };
	size_t n;

	if (pod_uid(comp, len, buf, size))
		return false;
	for (size_t i = 0; i < ELEMENTSOF(prefixes); i++)
		if (len > strlen(prefixes[i]) && strncmp(comp, prefixes[i], strlen(prefixes[i])) == 0) {
			comp += strlen(prefixes[i]);
			len -= strlen(prefixes[i]);
			break;
		}
	for (size_t i = 0; i < ELEMENTSOF(suffixes); i++)
		if (len > strlen(suffixes[i]) &&
		    strncmp(comp + len - strlen(suffixes[i]), suffixes[i], strlen(suffixes[i])) == 0) {
			len -= strlen(suffixes[i]);
			break;
		}
	if (len >= 32 && all_hex(comp, len)) { /* a 64-digit id: its first 12 */
		snprintf(buf, size, "%.12s", comp);
		return true;
	}
	n = len < size - 1 ? len : size - 1;
	for (size_t i = 0; i < n; i++)
		buf[i] = isalnum((unsigned char)comp[i]) || strchr("_.-", comp[i]) ? comp[i] : '_';
	buf[n] = '\0';
	return false;
}

/* Whether a cgroup component may stand above a Kubernetes pod's: a systemd slice, or the
 * cgroupfs driver's kubepods and QoS classes. */
static bool above_pods(const char *comp, size_t len)
{
	static const char *const names[] = { "kubepods", "besteffort", "burstable" };

	if (len > 6 && strncmp(comp + len - 6, ".slice", 6) == 0)
		return true;
	for (size_t i = 0; i < ELEMENTSOF(names); i++)
		if (len == strlen(names[i]) && strncmp(comp, names[i], len) == 0)
			return true;
	return false;
}

/* The container of a cgroup path in found (the short name of the component that names it),
 * and its kind, "pod" or "ctr"; whether that component holds a runtime's id (ret_id).
 *
 * In a cgroup root made, only the runtime's own components count: root in a container may
 * have a subtree of its own to write (systemd-nspawn, podman --systemd=always, Delegate=),
 * and make cgroups named like another container's below its own. So a pod is the shallowest
 * pod component with nothing but slices (or kubepods' own folders) above it, and a container
 * the shallowest component that is neither — or its child, where that one holds an id and
 * it does not (cgroupfs runtimes: /docker/ID). Below those, a container writes what it likes.
 * In a cgroup the user made, the user names what it likes anyway (the name says the user):
 * the shallowest pod component, else the deepest id (a runtime may put the processes in a
 * leaf below the container's cgroup), else the last component. */
static bool cgroup_container(const char *cgroup, bool user_made, char *found, size_t size,
			     const char **ret_kind, bool *ret_id)
{
	char name[64];
	const char *comp, *end;
	bool slices_only = true, found_id = false, took = false;

	*ret_kind = "ctr";
	found[0] = '\0';
	for (comp = cgroup + 1; *comp; comp = *end ? end + 1 : end) {
		size_t len;

		end = comp + strcspn(comp, "/");
		len = (size_t)(end - comp);
		if (len == 0)
			continue;
		if ((user_made || slices_only) && pod_uid(comp, len, found, size)) {
			*ret_kind = "pod";
			*ret_id = true;
			return true;
		}
		slices_only = slices_only && above_pods(comp, len);
		if (!user_made && took) {
			/* the child of a root container's component: its id, if that had none */
			if (short_name(comp, len, name, sizeof(name))) {
				snprintf(found, size, "%s", name);
				found_id = true;
			}
			break;
		}
		if (!user_made && slices_only)
			continue; /* a slice, or kubepods' own folders, above the container */
		if (short_name(comp, len, name, sizeof(name)))
			found_id = true;
		else if (found_id)
			continue;
		snprintf(found, size, "%s", name);
		took = true;
		if (!user_made && found_id)
			break;
	}
	*ret_id = found_id;
	return found[0] != '\0';
}

/* The domain of a client in a container that no [domains] line names: its pod's, else its
 * container's (cgroup_container) — and, for any
 * user but root, "-uN" for the user who answers for it (uid): a user may make cgroups of any
 * name in its own systemd subtree and a pid namespace to be "in" them, and must not so join
 * another user's container. In a cgroup a user made (user_made) "-userN": nor may the user
 * so join a container root made that runs processes of its uid (podman run --user, a pod's
 * runAsUser), whose id anyone reads in /proc/PID/cgroup. False for no cgroup or the root
 * one, which tell no container from another. */
static bool container_domain(const char *cgroup, uid_t uid, bool user_made, char *buf,
			     size_t size, bool *ret_runtime)
{
	const char *kind;
	char found[64];
	bool id;

	if (!cgroup || cgroup[0] != '/' || cgroup[1] == '\0' ||
	    !cgroup_container(cgroup, user_made, found, sizeof(found), &kind, &id))
		return false;
	if (ret_runtime)
		*ret_runtime = id;
	if (uid != 0 && user_made)
		snprintf(buf, size, "%s-%.42s-user%u", kind, found, (unsigned)uid);
	else if (uid != 0)
		snprintf(buf, size, "%s-%.45s-u%u", kind, found, (unsigned)uid);
	else
		snprintf(buf, size, "%s-%.58s", kind, found);
	return true;
}

/* Whether cgroup or one of its ancestors matches glob; the shortest that does is named
 * in buf by the short name of its last component. */
static bool cgroup_matches(const char *glob, const char *cgroup, char *buf, size_t size)
{
	_cleanup_free_ char *path = cgroup ? strdup(cgroup) : NULL;

	if (!path)
		return false;
	for (char *slash = path + 1;; slash++) {
		char keep;

		slash += strcspn(slash, "/");
		keep = *slash;
		*slash = '\0';
		if (fnmatch(glob, path, FNM_PATHNAME) == 0) {
			char *last = strrchr(path, '/') + 1;

			short_name(last, strlen(last), buf, size);
			return true;
		}
		*slash = keep;
		if (!keep)
			return false;
	}
}

/* The name of group g for a client of cgroup: its own, or with its '*' for the short name of
 * the cgroup its glob matched. */
/* Whether a name a '*' line made is one mrd gives otherwise (uid-N, a container's) or another
 * line's: a cgroup named uid-0.service must not make a line "*" (cgroup: members over
 * system.slice's services) root's domain. */
static bool name_taken(const struct config *cfg, const struct domain_group *g, const char *name)
{
	if (strncmp(name, "uid-", 4) == 0 || access_is_container_domain(name))
		return true;
	for (size_t i = 0; i < cfg->n_groups; i++)
		if (&cfg->groups[i] != g && strcmp(cfg->groups[i].name, name) == 0)
			return true;
	return false;
}

static bool group_matches_cgroup(const struct config *cfg, const struct domain_group *g,
				 const char *cgroup, char *buf, size_t size)
{
	char name[64];
	const char *star;

	for (size_t i = 0; i < g->n_cgroups; i++) {
		if (!cgroup_matches(g->cgroups[i], cgroup, name, sizeof(name)))
			continue;
		star = strchr(g->name, '*');
		if (!star)
			return snprintf(buf, size, "%s", g->name), true;
		snprintf(buf, size, "%.*s%s%s", (int)(star - g->name), g->name, name, star + 1);
		if (!name_taken(cfg, g, buf))
			return true;
	}
	return false;
}

const char *access_domain_name(const struct config *cfg, const struct access_peer *p, char *buf,
			       size_t size)
{
	for (size_t i = 0; i < cfg->n_groups; i++) {
		const struct domain_group *g = &cfg->groups[i];

		if (in_uids(g->uids, g->n_uids, p->uid) || in_groups(g->gids, g->n_gids, p->gid))
			return snprintf(buf, size, "%s", g->name), buf;
		for (size_t j = 0; j < g->n_gids; j++)
			if (peer_has_group(p, g->gids[j]))
				return snprintf(buf, size, "%s", g->name), buf;
		if (group_matches_cgroup(cfg, g, p->cgroup, buf, size))
			return buf;
	}
	if (p->nested_pidns &&
	    container_domain(p->cgroup, p->uid, p->cgroup_user_made, buf, size, NULL))
		return buf;
	snprintf(buf, size, "uid-%u", (unsigned)p->uid);
	return buf;
}

bool access_cgroup_of_runtime(const char *cgroup)
{
	bool runtime = false;
	char buf[64];

	return container_domain(cgroup, 0, false, buf, sizeof(buf), &runtime) && runtime;
}

const char *access_peer_view(const struct config *cfg, const struct access_peer *p, char *buf,
			     size_t size)
{
	if (access_is_admin(cfg, p))
		return NULL;
	return access_domain_name(cfg, p, buf, size);
}
