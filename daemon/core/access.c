/* SPDX-License-Identifier: MIT */
#include <errno.h>
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
	if (p->uid == 0)
		return true;
	if (!cfg->admin_group)
		return false;
	return p->gid == cfg->admin_gid || peer_has_group(p, cfg->admin_gid);
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
	}
	snprintf(buf, size, "uid-%u", (unsigned)p->uid);
	return buf;
}

const char *access_peer_view(const struct config *cfg, const struct access_peer *p, char *buf,
			     size_t size)
{
	if (access_is_admin(cfg, p))
		return NULL;
	return access_domain_name(cfg, p, buf, size);
}
